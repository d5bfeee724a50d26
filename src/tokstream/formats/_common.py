"""What every format reader and writer shares: shards, size checks, mapping, atomic writes."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

PathLike = str | os.PathLike


class Shard(NamedTuple):
    """One independent token stream read from a file, and its documents when the file has them.

    ``document_offsets`` is None (the shard is one stream without recorded documents) or a
    nondecreasing int64 array that starts at 0 and ends at ``len(tokens)``: document ``i`` is
    ``tokens[offsets[i]:offsets[i + 1]]`` (empty documents allowed).
    """

    tokens: np.ndarray
    document_offsets: np.ndarray | None
    name: str


def check_size(path: Path, offset: int, count: int, dtype: np.dtype, source: str) -> None:
    """The file at ``path`` must be exactly ``offset`` bytes plus ``count`` items of ``dtype``."""
    size = path.stat().st_size
    expected = offset + count * dtype.itemsize
    if size < expected:
        raise ValueError(
            f"token file {path}: truncated: {source} promises {count} {dtype} tokens "
            f"({expected} bytes in all), the file has {size} bytes"
        )
    if size > expected:
        raise ValueError(
            f"token file {path}: token count mismatch: {source} says {count} {dtype} tokens "
            f"({expected} bytes in all), the file has {size} bytes "
            f"({size - expected} bytes more)"
        )


def map_tokens(path: Path, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
    """A read-only ``np.memmap`` of ``count`` items at byte ``offset`` (the caller checked size)."""
    if count == 0:
        # mmap cannot map zero bytes; an empty shard needs no mapping anyway.
        empty = np.empty(0, dtype=dtype)
        empty.flags.writeable = False
        return empty
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


def existing_file(path: Any) -> Path:
    """``path`` as a Path to an existing regular file, else FileNotFoundError or ValueError."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"token file path must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, "token file not found", os.fspath(path))
    if path.is_dir():
        raise ValueError(f"token file {path} is a directory; pass a pattern such as '{path}/*'")
    return path


def check_offsets(offsets: np.ndarray, count: int, where: str) -> np.ndarray:
    """Document offsets as int64, checked: start at 0, nondecreasing, end at ``count``."""
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.shape[0] == 0:
        raise ValueError(f"{where}: document offsets must be a nonempty 1-D array")
    if offsets[0] != 0 or offsets[-1] != count:
        raise ValueError(
            f"{where}: document offsets run from {int(offsets[0])} to {int(offsets[-1])}, "
            f"they must run from 0 to the token count {count}"
        )
    if offsets.shape[0] > 1 and np.any(np.diff(offsets) < 0):
        raise ValueError(f"{where}: document offsets decrease")
    return offsets


class atomic_writer:
    """A binary file under a temporary name beside ``path``, renamed onto it on success.

    A reader never sees half a file, and a corpus mapping the old file keeps reading the old
    tokens.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        # Not tempfile.mkstemp: its 0600 mode would stick to the renamed file.
        self.temp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")

    def __enter__(self) -> BinaryIO:
        self.file = open(self.temp, "xb")
        return self.file

    def commit(self) -> None:
        """Close the file and rename it onto ``path``."""
        self.file.close()
        os.replace(self.temp, self.path)

    def abandon(self) -> None:
        """Close the file and remove it; ``path`` is left as it was."""
        self.file.close()
        self.temp.unlink(missing_ok=True)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abandon()
