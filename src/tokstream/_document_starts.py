"""Documents given to a corpus, checked into its one table of document starts.

A corpus records documents as arrays of one dtype (:meth:`tokstream.Corpus.from_documents`) or
as each shard's offsets (the formats that store documents); either way the starts it keeps are
the values checked as they were copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def same_dtype_arrays(documents: Sequence[Any]) -> list[np.ndarray] | None:
    """``documents`` as they are when all are 1-D ndarrays of one integer dtype, else None."""
    first = documents[0]
    if not isinstance(first, np.ndarray) or first.dtype.kind not in "iu":
        return None
    dtype = first.dtype
    for document in documents:
        if type(document) is not np.ndarray or document.dtype != dtype or document.ndim != 1:
            return None
    return list(documents)


def offsets_array(offsets: Any, name: str) -> np.ndarray | None:
    """A shard's document offsets as given (None: no recorded documents), once they are a 1-D
    integer array of at least one offset; their values are checked as they are copied
    (:func:`write_document_starts`)."""
    if offsets is None:
        return None
    array = np.asarray(offsets)
    # A lone [0] is an empty shard of no documents (Megatron's index of an empty partition, an
    # Arrow record batch of no rows).
    if array.ndim != 1 or array.dtype.kind not in "iu" or array.shape[0] < 1:
        raise ValueError(
            f"{name}: document boundaries must be a 1-D integer array of at least 1 offset, "
            f"got shape {array.shape} and dtype {array.dtype}"
        )
    return array


def write_document_starts(
    offsets: np.ndarray | None, length: int, name: str, out: np.ndarray, base: int
) -> None:
    """A shard's document starts (its offsets less the last; ``[0]`` without documents) plus
    ``base``, into ``out``. Checked as copied: what the corpus keeps is what was checked,
    whatever happens to ``offsets`` meanwhile."""
    if offsets is None:
        out[0] = base
        return
    np.copyto(out, offsets[:-1], casting="unsafe")  # beyond int64 wraps negative: a fall
    falls = bool(np.any(out[1:] < out[:-1]))
    if (
        offsets[0] != 0
        or offsets[-1] != length
        or (out.shape[0] > 0 and (out[0] != 0 or out[-1] > length or falls))
    ):
        raise ValueError(
            f"{name}: document boundaries must rise from 0 to the shard's {length} tokens, "
            f"got {offsets[0]} ... {offsets[-1]}"
            + (" with a decrease" if falls or np.any(offsets[1:] < offsets[:-1]) else "")
        )
    out += base
