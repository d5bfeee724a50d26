"""Old import paths kept for one deprecation period: each warns once on import, then forwards.

A module that moved leaves behind a two-line module calling :func:`moved`, so ``import`` of the
old path keeps working (with a DeprecationWarning naming the new one) and every attribute,
public or not, is the new module's own object.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved(old: str, new: str, why: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Warn that ``old`` is now ``new``; return the ``__getattr__``/``__dir__`` forwarding there."""
    warnings.warn(
        f"{old} is deprecated and will be removed: {why}; import from {new} instead",
        DeprecationWarning,
        stacklevel=3,
    )
    module = importlib.import_module(new)

    def __getattr__(name: str) -> Any:
        return getattr(module, name)

    def __dir__() -> list[str]:
        return dir(module)

    return __getattr__, __dir__
