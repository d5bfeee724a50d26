"""Frozen arrays: the tables a stream's bounds come from, which nothing can make writeable again."""

from __future__ import annotations

from typing import Any

import numpy as np


def read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def frozen(array: np.ndarray) -> np.ndarray:
    """A read-only copy of ``array`` that nothing can make writeable again.

    A flag alone is no protection: ``setflags(write=True)`` undoes it on any array that owns
    its memory (or whose base does). The copy's memory is an immutable ``bytes`` object, so
    NumPy refuses to make it, or any view of it, writeable. For the arrays the kernel's bounds
    are computed from. An array already frozen (contiguous, its memory a ``bytes`` object) is
    returned as it is: a corpus and its source share one copy of their O(documents) tables.
    """
    root: object = array
    while isinstance(root, np.ndarray):
        root = root.base
    if type(root) is bytes and array.flags.c_contiguous:
        return array
    array = np.ascontiguousarray(array)
    return np.frombuffer(array.tobytes(), dtype=array.dtype).reshape(array.shape)


def frozen_state(state: dict[str, Any]) -> dict[str, Any]:
    """An unpickled object's ``__dict__`` with every array frozen again (NumPy unpickles arrays
    writeable, whatever they were): what :func:`frozen` protected stays protected in a spawned
    worker. Arrays that were one object stay one."""
    copies: dict[int, np.ndarray] = {}
    refrozen = {}
    for key, value in state.items():
        if isinstance(value, np.ndarray):
            if id(value) not in copies:
                copies[id(value)] = frozen(value)
            value = copies[id(value)]
        refrozen[key] = value
    return refrozen
