"""Writing token files (:func:`write_tokens`): the ids in any format, with their documents.

Beside :mod:`tokstream.files`, which detects and opens the same formats (its table says what
each stores); :class:`~tokstream.formats.writer.TokenFileWriter` streams one file in bounded
chunks. The dtype a file stores is decided here once, for the writers and ``tokstream
tokenize``/``convert`` alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tokstream import _validate
from tokstream.corpus import Corpus
from tokstream.formats import arrow, llmc, megatron
from tokstream.formats.common import PathLike, atomic_writer, output_path
from tokstream.formats.table import FORMAT_TABLE, FORMATS
from tokstream.formats.writer import TokenFileWriter
from tokstream.shards.source import present


def write_tokens(path: PathLike, ids: Any, format: str = "npy", dtype: Any = None) -> Path:
    """Write token ids to ``path`` in one of :data:`FORMATS`, with documents where it has them.

    Parameters
    ----------
    path
        Where to write; for ``"megatron"`` the dataset's prefix (or its ``.bin`` or ``.idx``
        name): ``PREFIX.bin`` and ``PREFIX.idx`` are written. Each file is written beside its
        name under a temporary name and renamed into place, so a reader never sees half a file
        and a corpus mapping the old file keeps reading the old tokens.
    ids
        Anything :func:`tokstream.stream_token_source` accepts as token ids, or a
        :class:`~tokstream.Corpus`: its shards are written one after the other, and its
        documents (each shard a document when it records none) go into the formats that hold
        documents (``"megatron"``, ``"arrow"``). Converted in bounded chunks, so writing a
        memory map does not copy it into memory (Arrow excepted when the dtype changes: its
        single record batch is converted whole).
    format
        ``"npy"`` (the dtype in the header), ``"bin"`` (no header, native byte order: the
        reader must pass the same ``dtype``), ``"llmc"`` (version 1 for uint16, version 7 for
        uint32), ``"megatron"`` or ``"arrow"`` (an IPC stream with an ``input_ids`` column).
    dtype
        The stored dtype. ``None`` picks uint16 when every id fits in it, else uint32 (int32
        for Megatron, whose index has no uint32).

    Returns
    -------
    Path
        ``path`` (for Megatron, the prefix).

    Raises
    ------
    TypeError
        ``ids`` is not token ids, ``dtype`` not an integer dtype, ``format`` not a string.
    ImportError
        ``"arrow"`` without pyarrow.
    ValueError
        An unknown format; a dtype the format cannot store; ids that do not fit the dtype; more
        tokens than llm.c's int32 count; a path that names no file (``""``, a directory) or
        holds a name longer than the file system allows.
    OSError
        A file cannot be written or renamed into place (the message names it, and the temporary
        file is removed).
    """
    path = output_path(path)
    _validate.choice(format, "format", FORMATS)
    arrays, offsets = _tokens_and_documents(ids)
    bounds = [b for b in (_validate.value_range(a) for a in arrays) if b is not None]
    low = min((b[0] for b in bounds), default=0)
    high = max((b[1] for b in bounds), default=0)
    stored = stored_dtype(low, high, format, dtype)
    count = sum(a.shape[0] for a in arrays)
    if format == "llmc" and count > llmc.MAX_TOKENS:
        raise ValueError(
            f"llm.c's int32 header cannot count {count} tokens; split the ids into several shards"
        )
    if format == "arrow":
        arrow.require()
        tokens = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        with atomic_writer(path) as f:
            arrow.write(f, tokens, offsets, stored)
        return path
    with TokenFileWriter(path, format, stored) as writer:
        for array in arrays:
            for chunk in _validate.chunks(array):
                writer.write(chunk)
        writer.document_offsets = offsets
    return megatron.prefix(path) if format == "megatron" else path


def _tokens_and_documents(ids: Any) -> tuple[list[np.ndarray], np.ndarray | None]:
    """The arrays to write one after the other, and the documents over all of them (or None).

    A corpus of several shards keeps its shard boundaries as document boundaries.
    """
    if not isinstance(ids, Corpus):
        return [_validate.token_array(ids, "ids")], None
    arrays = [present(shard) for shard in ids.shards]  # remote shards fetched whole
    if ids.has_documents or len(arrays) > 1:
        return arrays, np.asarray(ids.document_boundaries, dtype=np.int64)
    return arrays, None


def kept_dtype(dtype: np.dtype, format: str) -> str | None:
    """``dtype`` when ``format`` can store it (a conversion keeps it), else None: let
    :func:`write_tokens` pick (llm.c's uint16/uint32 by the ids, Megatron's has no unsigned
    32/64-bit code)."""
    if format == "llmc" or (format == "megatron" and dtype.name in ("uint32", "uint64")):
        return None
    return str(dtype.name)


def stored_dtype(low: int, high: int, format: str, dtype: Any) -> np.dtype:
    """The dtype to store ids in ``[low, high]`` as ``format``: ``dtype``, checked, or a pick."""
    if dtype is not None:
        stored = _validate.integer_dtype(dtype, "dtype")
        if FORMAT_TABLE[format].little_endian:
            if stored.newbyteorder("<") != stored:
                raise ValueError(
                    f"format={format!r} stores little-endian tokens, got the big-endian "
                    f"dtype={stored.str!r}; pass dtype={stored.name!r}"
                )
            stored = stored.newbyteorder("<")
        if format == "llmc" and llmc.kind_for(stored) is None:
            raise ValueError(f"format='llmc' stores uint16 or uint32 tokens, got dtype={stored}")
        if format == "megatron":
            megatron.code_for(stored)
        info = np.iinfo(stored)
        if low < info.min or high > info.max:
            raise ValueError(
                f"ids range over [{low}, {high}], which does not fit dtype={stored} "
                f"([{info.min}, {info.max}])"
            )
        return stored
    wide = np.dtype(np.int32 if format == "megatron" else np.uint32)
    for candidate in (np.dtype(np.uint16), wide):
        info = np.iinfo(candidate)
        if low >= info.min and high <= info.max:
            return candidate
    raise ValueError(
        f"ids range over [{low}, {high}], which fits neither uint16 nor {wide}"
        + (
            "; llm.c stores nothing wider"
            if format == "llmc"
            else "; pass an explicit dtype (e.g. dtype=np.int64)"
        )
    )
