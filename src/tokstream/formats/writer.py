"""Writing token files token by token, in bounded memory, put in place atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tokstream.formats import llmc, megatron, npy
from tokstream.formats.common import atomic_writer, check_offsets

#: Formats written token by token (Arrow's single record batch is written whole).
STREAMED = ("npy", "bin", "llmc", "megatron")


class TokenFileWriter:
    """A token file of one format and dtype, written chunk by chunk and put in place on success.

    Use as a context manager: :meth:`write` appends tokens, :attr:`document_offsets` (set before
    the block ends) records the documents where the format holds them (Megatron), and leaving
    the block without an exception fills in the header (the ``.npy`` shape, llm.c's count) or
    writes the Megatron index and renames the file(s) into place. An exception removes them.

    ``path`` is the file, or for ``"megatron"`` the dataset's prefix (or its ``.bin``/``.idx``).
    """

    def __init__(self, path: os.PathLike[str] | str, format: str, dtype: np.dtype) -> None:
        if format not in STREAMED:
            raise ValueError(f"format {format!r} is not written token by token")
        self.format = format
        self.dtype = dtype
        self.count = 0
        self.document_offsets: np.ndarray | None = None
        if format == "megatron":
            megatron.code_for(dtype)
            self.index_path, self.path = megatron.paths(path)
        else:
            self.path = Path(path)
        # Headers are made before any file is opened, so a failure there leaves nothing behind.
        self._header = b""
        if format == "npy":
            self._header = npy.header(0, dtype)
        elif format == "llmc":
            self._header = llmc.header(0, dtype)

    def __enter__(self) -> TokenFileWriter:
        self._writer = atomic_writer(self.path)
        self._file = self._writer.__enter__()
        self._file.write(self._header)
        return self

    def write(self, tokens: np.ndarray) -> None:
        """Append ``tokens`` (already checked to fit :attr:`dtype`)."""
        if self.format == "llmc" and self.count + tokens.shape[0] > llmc.MAX_TOKENS:
            raise ValueError(
                f"llm.c's int32 header cannot count more than {llmc.MAX_TOKENS} tokens; split "
                "the ids into several shards"
            )
        self._file.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self.count += tokens.shape[0]

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self._writer.abandon()
            return
        try:
            self._finish_header()
            index = self._write_index() if self.format == "megatron" else None
        except BaseException:
            self._writer.abandon()
            raise
        self._writer.commit()
        if index is not None:
            index.commit()

    def _finish_header(self) -> None:
        if self.format == "npy":
            final = npy.header(self.count, self.dtype)
            if len(final) != len(self._header):  # pragma: no cover - a 1-D header is 128 bytes
                raise ValueError(f"the .npy header of {self.count} tokens changed size")
        elif self.format == "llmc":
            final = llmc.header(self.count, self.dtype)
        else:
            return
        self._file.seek(0)
        self._file.write(final)

    def _write_index(self) -> atomic_writer:
        """The Megatron index, written under its temporary name (the caller renames it)."""
        offsets = self.document_offsets
        if offsets is None:
            offsets = np.array([0, self.count], dtype=np.int64)
        offsets = check_offsets(offsets, self.count, f"Megatron dataset {self.path}")
        index = atomic_writer(self.index_path)
        f = index.__enter__()
        try:
            megatron.write_index(f, offsets, self.dtype)
        except BaseException:
            index.abandon()
            raise
        return index
