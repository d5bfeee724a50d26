"""What every format reader and writer shares: shards, size checks, mapping, atomic writes."""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from tokstream import _validate
from tokstream.shards import filemap

PathLike = str | os.PathLike[str]


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
    check_length(str(path), path.stat().st_size, offset, count, dtype, source)


def check_length(
    path: str, size: int, offset: int, count: int, dtype: np.dtype, source: str
) -> None:
    """:func:`check_size` of a file (or object) named ``path`` that holds ``size`` bytes."""
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


def read_header(path: Path, nbytes: int, what: str, where: str) -> bytes:
    """The first ``nbytes`` of ``path``; ValueError (naming ``where``) when the file is shorter."""
    size = path.stat().st_size
    if size < nbytes:
        raise ValueError(
            f"{where}: truncated {what}: {size} bytes, its header alone needs {nbytes}"
        )
    with open(path, "rb") as f:
        return f.read(nbytes)


def map_tokens(path: Path, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
    """A read-only map of ``count`` items at byte ``offset`` (the caller checked the size).

    The map keeps no file descriptor open (:mod:`tokstream.shards.filemap`).
    """
    if count == 0:
        # mmap cannot map zero bytes; an empty shard needs no mapping anyway.
        empty = np.empty(0, dtype=dtype)
        empty.flags.writeable = False
        return empty
    return filemap.map_tokens(os.fspath(path), offset, dtype, count)


def existing_file(given: Any) -> Path:
    """``given`` as a Path to an existing regular file, else FileNotFoundError or ValueError."""
    if not isinstance(given, (str, os.PathLike)):
        raise TypeError(f"token file path must be a str or os.PathLike, got {type(given).__name__}")
    path = Path(given)
    try:
        exists = path.exists()
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise name_too_long(path) from None
        raise
    if not exists:
        raise FileNotFoundError(2, "token file not found", os.fspath(path))
    if path.is_dir():
        raise ValueError(f"token file {path} is a directory; pass a pattern such as '{path}/*'")
    # A device or a pipe has no size to map and may never end (/dev/zero): refused unread.
    if not path.is_file():
        raise ValueError(f"token file {path} is not a regular file (a device, pipe or socket)")
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


def name_too_long(path: Path) -> ValueError:
    return ValueError(
        f"token file path {os.fspath(path)!r}: a name in it (or the whole path) is longer than "
        "the file system allows"
    )


def output_path(path: Any) -> Path:
    """``path`` as a Path naming a file to write; TypeError or ValueError otherwise."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    as_path = Path(path)
    if as_path.name in ("", ".."):  # Path("") is Path("."), whose name is ""
        raise ValueError(f"path must name a file, got {os.fspath(path)!r}")
    if os.path.isdir(as_path):
        raise ValueError(f"token file {as_path} is a directory; name a file inside it")
    return as_path


# Bytes in one file name on every common file system (NAME_MAX).
_NAME_MAX = 255


class atomic_writer:
    """A binary file under a temporary name beside ``path``, renamed onto it on success.

    A reader never sees half a file, and a corpus mapping the old file keeps reading the old
    tokens. On any failure (writing, closing, renaming) the temporary file is removed, and an
    OSError names ``path``, not the temporary the caller never asked for. Used as a context
    manager, or through :meth:`commit` and :meth:`abandon` when two files (Megatron's) are put
    in place one right after the other.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> BinaryIO:
        token = secrets.token_hex(8)
        name = f".{self.path.name}.{token}.tmp"
        if len(os.fsencode(name)) > _NAME_MAX:  # a long but valid name must stay writable
            name = f".tokstream.{token}.tmp"
        # Not tempfile.mkstemp: its 0600 mode would stick to the renamed file.
        self.temp = self.path.with_name(name)
        try:
            self.file = open(self.temp, "xb")
        except OSError as exc:
            raise self._error(exc) from None
        return self.file

    def commit(self) -> None:
        """Close the file and rename it onto ``path``."""
        try:
            self.file.close()
            os.replace(self.temp, self.path)
        except BaseException as error:
            self.temp.unlink(missing_ok=True)
            if isinstance(error, OSError):
                raise self._error(error) from None
            raise

    def abandon(self) -> None:
        """Close the file and remove it; ``path`` is left as it was."""
        try:
            self.file.close()
        finally:
            self.temp.unlink(missing_ok=True)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
            return
        self.abandon()
        if isinstance(exc, OSError):
            raise self._error(exc) from None

    def _error(self, error: OSError) -> Exception:
        if error.errno == errno.ENAMETOOLONG:
            return name_too_long(self.path)
        if error.errno is None:
            return OSError(f"cannot write token file {os.fspath(self.path)!r}: {error}")
        return OSError(
            error.errno, f"cannot write token file: {error.strerror}", os.fspath(self.path)
        )


def check_kind(body: Any, kind: str, version: int, where: str) -> dict[str, Any]:
    """``body``, the parsed JSON of one of tokstream's own files (a manifest, a tokenize
    directory's record), checked to be a ``kind`` of ``version``; else a ValueError starting
    with ``where``."""
    if not isinstance(body, dict) or body.get("kind") != kind:
        raise ValueError(f'{where}: not a {kind} ("kind" must be {kind!r})')
    if body.get("version") != version:
        raise ValueError(
            f"{where}: manifest version {body.get('version')!r}, this tokstream reads version "
            f"{version}"
        )
    return body


def manifest_dtype(body: dict[str, Any], where: str) -> np.dtype:
    """The token dtype ``body`` (as :func:`check_kind` passed it) names: a native-order integer
    dtype, else a ValueError starting with ``where``."""
    try:
        dtype = _validate.integer_dtype(body.get("dtype"), "dtype")
    except TypeError as exc:
        raise ValueError(f"{where}: bad 'dtype': {exc}") from None
    if not dtype.isnative:
        raise ValueError(f"{where}: bad 'dtype': {dtype.str} is not in native byte order")
    return dtype
