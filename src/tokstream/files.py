"""Token files: open them as memory-mapped corpora, write them for data preparation.

Three formats, told apart by their first bytes rather than by their names:

``"npy"``
    NumPy's ``.npy`` (magic ``\\x93NUMPY``): a 1-D integer array of any dtype the kernel reads.
``"llmc"``
    llm.c's token shard: a header of 256 little-endian int32 (``header[0]`` the magic 20240520,
    ``header[1]`` the version, 1 meaning uint16 tokens, ``header[2]`` the token count) and then
    the tokens, little-endian uint16.
``"bin"``
    Anything else: raw tokens without a header, as nanoGPT's prepare scripts write them with
    ``ndarray.tofile`` (native byte order). The file cannot say its dtype, so the reader must;
    uint16 by default.

A raw file whose first two uint16 tokens happen to spell llm.c's magic (54216, 308: beyond
GPT-2's vocabulary) would be taken for an llm.c shard; ``format="bin"`` reads it raw.

Every corpus :func:`open_tokens` returns is read-only and memory-mapped: opening a file reads
its header and, for a uint64 file, scans its values in bounded chunks; the tokens are paged in by
the OS only when a window touches them. A mapping keeps no file descriptor open
(:mod:`tokstream._filemap`), so a corpus of thousands of shards opens under ``ulimit -n 1024``,
and pickling it (for spawned DataLoader workers) sends each file's name, not its tokens.
"""

from __future__ import annotations

import errno
import glob
import os
import secrets
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tokstream import _validate
from tokstream._filemap import map_tokens
from tokstream.corpus import Corpus

NPY_MAGIC = b"\x93NUMPY"
LLMC_MAGIC = 20240520
LLMC_VERSION = 1
LLMC_HEADER_INTS = 256
LLMC_HEADER_BYTES = LLMC_HEADER_INTS * 4
LLMC_TOKEN_DTYPE = np.dtype("<u2")


@dataclass(frozen=True)
class FileFormat:
    """What the readers, :func:`write_tokens` and the command line know about one format."""

    name: str
    #: The output file suffix that names this format when none is given (None: it must be
    #: asked for by name, as llm.c shards are, whose files are called ``*.bin`` too).
    suffix: str | None
    #: Bytes before the tokens in a file :func:`write_tokens` writes (a 1-D ``.npy`` header
    #: is 128 bytes).
    header_bytes: int


#: Every format, by name, in the order messages list them.
FORMAT_TABLE = {
    spec.name: spec
    for spec in (
        FileFormat("npy", ".npy", 128),
        FileFormat("bin", ".bin", 0),
        FileFormat("llmc", None, LLMC_HEADER_BYTES),
    )
}
FORMATS = tuple(FORMAT_TABLE)
#: Output formats by file suffix (lower case).
SUFFIX_FORMATS = {spec.suffix: name for name, spec in FORMAT_TABLE.items() if spec.suffix}

# Other llm.c files that share the header layout but hold something this reader does not (the
# llama-3 shards of uint32 tokens, the evaluation files): named in the error instead of being
# mistaken for raw tokens.
_OTHER_LLMC_MAGICS = {20240801: "an llm.c llama-3 token shard", 20240522: "an llm.c eval file"}

GLOB_CHARS = frozenset("*?[")

PathLike = str | os.PathLike


# ---------------------------------------------------------------------------------------------
# Detection


def detect_format(path: PathLike) -> str:
    """Return the format of the token file at ``path``: ``"npy"``, ``"llmc"`` or ``"bin"``.

    Decided by the file's magic: NumPy's ``\\x93NUMPY``, llm.c's int32 20240520, else raw tokens.
    A file named ``*.npy`` without NumPy's magic is not quietly read as raw tokens.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        ``path`` is a directory, a ``.npy`` file lacks NumPy's magic, or the file carries the
        magic of an llm.c file that holds something other than uint16 tokens.
    """
    path = _existing_file(path)
    with open(path, "rb") as f:
        head = f.read(max(len(NPY_MAGIC), 4))
    if head.startswith(NPY_MAGIC):
        return "npy"
    if path.suffix.lower() == ".npy":
        raise ValueError(
            f"token file {path}: bad magic {head!r}: a .npy file must start with {NPY_MAGIC!r}"
        )
    magic = int.from_bytes(head[:4], "little") if len(head) >= 4 else None
    if magic == LLMC_MAGIC:
        return "llmc"
    if magic in _OTHER_LLMC_MAGICS:
        raise ValueError(
            f"token file {path}: magic {magic} marks {_OTHER_LLMC_MAGICS[magic]}; tokstream reads "
            f"llm.c token shards with magic {LLMC_MAGIC}, version {LLMC_VERSION} (uint16 tokens)"
        )
    return "bin"


# ---------------------------------------------------------------------------------------------
# Reading


def open_tokens(
    path_or_paths_or_glob: PathLike | Sequence[PathLike],
    dtype: Any = None,
    *,
    format: str | None = None,
) -> Corpus:
    """Open one token file, a list of them, or a glob pattern as a read-only memory-mapped corpus.

    Parameters
    ----------
    path_or_paths_or_glob
        A path; a list or tuple of paths (one shard each, in the given order); or a pattern with
        ``*``, ``?`` or ``[`` whose matches become the shards in sorted (lexicographic) order, so
        number shards with zero padding. A path that exists is never treated as a pattern.
    dtype
        For raw ``.bin`` files, the stored token dtype (default uint16). For ``.npy`` and llm.c
        files, which record their dtype, an expectation: a file of another dtype is an error.
    format
        ``None`` detects each file's format (:func:`detect_format`). ``"npy"``, ``"llmc"`` or
        ``"bin"`` insists on it: a file without that format's magic is an error, and ``"bin"``
        reads any file raw.

    Returns
    -------
    Corpus
        One shard per file, each a read-only memory map of the file in its own dtype
        (an empty file's shard is an empty read-only array). Windows never cross from one file
        into the next. A file in non-native byte order is the one exception to "no copy": the
        kernel reads native integers, so it is copied into memory once.

    Raises
    ------
    FileNotFoundError
        A named file does not exist (its path in the message and in ``.filename``).
    ValueError
        An empty list, a pattern that matches no file, or a bad file: bad magic, an unknown
        llm.c version, a truncated file, a token count that disagrees with the file's size, a
        raw file whose size is not a multiple of the dtype, a non-1-D or non-integer ``.npy``,
        a dtype other than the one requested, files of different dtypes, a uint64 value beyond
        int64. Every message names the file and what is wrong with it.
    TypeError
        ``dtype`` is not an integer dtype, ``format`` is not a string, or the paths are neither
        a path nor a sequence of paths.
    """
    if format is not None:
        _validate.choice(format, "format", FORMATS)
    want = None if dtype is None else _validate.integer_dtype(dtype, "dtype")
    paths = _resolve_paths(path_or_paths_or_glob)
    arrays = [_open_one(path, want, format) for path in paths]
    return Corpus._from_arrays(arrays, [str(p) for p in paths], name="token files")


def expand_pattern(spec: PathLike) -> list[Path]:
    """``spec`` as one path, or a pattern's matches in sorted order.

    A path that exists is never a pattern; anything else holding ``*``, ``?`` or ``[`` is one,
    and a pattern that matches nothing is a ValueError (never an empty corpus).
    """
    text = os.fspath(spec)
    if not os.path.exists(text) and GLOB_CHARS & set(text):
        matches = sorted(glob.glob(text))
        if not matches:
            raise ValueError(f"token file pattern {text!r} matched no files")
        return [Path(m) for m in matches]
    return [Path(spec)]


def _resolve_paths(spec: Any) -> list[Path]:
    if isinstance(spec, (str, os.PathLike)):
        return expand_pattern(spec)
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise ValueError("open_tokens got an empty list of token files")
        for i, item in enumerate(spec):
            if not isinstance(item, (str, os.PathLike)):
                raise TypeError(
                    f"token file paths[{i}] must be a str or os.PathLike, got "
                    f"{item!r} ({type(item).__name__})"
                )
        return [Path(item) for item in spec]
    raise TypeError(
        "open_tokens takes a path, a glob pattern or a list of paths, got "
        f"{type(spec).__name__}"
    )


def _open_one(path: Path, want: np.dtype | None, format: str | None) -> np.ndarray:
    if format == "bin":
        _existing_file(path)
    else:
        found = detect_format(path)
        if format is None:
            format = found
        elif format != found:
            raise ValueError(
                f"token file {path}: bad magic: format={format!r} was asked, the file's first "
                f"bytes say {found!r}"
            )
    if format == "npy":
        tokens = _open_npy(path)
    elif format == "llmc":
        tokens = _open_llmc(path)
    else:
        tokens = _open_raw(path, np.dtype(np.uint16) if want is None else want)
    if want is not None and tokens.dtype.newbyteorder("=") != want.newbyteorder("="):
        raise ValueError(f"token file {path} holds {tokens.dtype} tokens, dtype={want} was asked")
    tokens = _validate.token_array(tokens, f"token file {path}")
    # A byte-swapped file is copied into memory (and an empty one may be): read-only all the same.
    tokens.flags.writeable = False
    return tokens


def _open_npy(path: Path) -> np.ndarray:
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {version}")
        except (ValueError, SyntaxError, TypeError, tokenize.TokenError) as exc:
            # NumPy parses the header with tokenize and ast.literal_eval, whose errors leak out.
            raise ValueError(f"token file {path}: unreadable .npy header: {exc}") from None
        offset = f.tell()
    if any(isinstance(length, bool) for length in shape):
        # NumPy's header check takes a bool for an int: (True,) would map 1 token, (False,) none.
        raise ValueError(f"token file {path}: unreadable .npy header: shape {shape} is not ints")
    if len(shape) != 1:
        raise ValueError(f"token file {path}: a .npy token file must be 1-D, it has shape {shape}")
    # Kinds, not np.issubdtype: NumPy files timedelta64 under np.integer.
    if dtype.kind not in "iu":
        raise ValueError(
            f"token file {path}: a .npy token file must hold integers, it holds {dtype}"
        )
    count = shape[0]
    _check_size(path, offset, count, dtype, "its .npy header")
    return _map(path, dtype, offset, count)


def _open_llmc(path: Path) -> np.ndarray:
    size = path.stat().st_size
    if size < LLMC_HEADER_BYTES:
        raise ValueError(
            f"token file {path}: truncated llm.c header: {size} bytes, the header alone needs "
            f"{LLMC_HEADER_BYTES}"
        )
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(LLMC_HEADER_BYTES), dtype="<i4")
    magic, version, count = (int(v) for v in header[:3])
    if magic != LLMC_MAGIC:
        raise ValueError(
            f"token file {path}: bad magic {magic}, llm.c token shards start with {LLMC_MAGIC}"
        )
    if version != LLMC_VERSION:
        raise ValueError(
            f"token file {path}: unknown llm.c version {version}; only version {LLMC_VERSION} "
            "(uint16 tokens) is supported"
        )
    if count < 0:
        raise ValueError(f"token file {path}: llm.c header gives a negative token count {count}")
    _check_size(path, LLMC_HEADER_BYTES, count, LLMC_TOKEN_DTYPE, "its llm.c header")
    return _map(path, LLMC_TOKEN_DTYPE, LLMC_HEADER_BYTES, count)


def _open_raw(path: Path, dtype: np.dtype) -> np.ndarray:
    size = path.stat().st_size
    count, extra = divmod(size, dtype.itemsize)
    if extra:
        raise ValueError(
            f"token file {path}: raw size {size} bytes is not a multiple of {dtype}'s "
            f"{dtype.itemsize} bytes ({extra} trailing bytes); wrong dtype or a truncated file?"
        )
    return _map(path, dtype, 0, count)


def _check_size(path: Path, offset: int, count: int, dtype: np.dtype, source: str) -> None:
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


def _map(path: Path, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
    if count == 0:
        # mmap cannot map zero bytes; an empty shard needs no mapping anyway.
        empty = np.empty(0, dtype=dtype)
        empty.flags.writeable = False
        return empty
    return map_tokens(os.fspath(path), offset, dtype, count)


def _existing_file(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"token file path must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    try:
        exists = path.exists()
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise _name_too_long(path) from None
        raise
    if not exists:
        raise FileNotFoundError(2, "token file not found", os.fspath(path))
    if path.is_dir():
        raise ValueError(f"token file {path} is a directory; pass a pattern such as '{path}/*'")
    return path


def _name_too_long(path: Path) -> ValueError:
    return ValueError(
        f"token file path {os.fspath(path)!r}: a name in it (or the whole path) is longer than "
        "the file system allows"
    )


# ---------------------------------------------------------------------------------------------
# Writing


def write_tokens(path: PathLike, ids: Any, format: str = "npy", dtype: Any = None) -> Path:
    """Write token ids to ``path`` as a ``"npy"``, raw ``"bin"`` or llm.c ``"llmc"`` file.

    Parameters
    ----------
    path
        Where to write. The file is written beside it under a temporary name and renamed into
        place, so a reader never sees half a file and a corpus mapping the old file keeps
        reading the old tokens.
    ids
        Anything :func:`tokstream.stream_token_source` accepts as token ids. Converted in
        bounded chunks, so writing a memory map does not copy it into memory.
    format
        ``"npy"`` (the dtype in the header), ``"bin"`` (no header, native byte order: the reader
        must pass the same ``dtype``) or ``"llmc"`` (llm.c version 1, uint16 only).
    dtype
        The stored dtype, any integer dtype for ``"npy"`` and ``"bin"``. ``None`` picks uint16
        when every id fits in it and uint32 otherwise.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    TypeError
        ``ids`` is not token ids, ``dtype`` not an integer dtype, ``format`` not a string.
    ValueError
        An unknown format; ids that do not fit the requested dtype (or, with ``dtype=None``,
        uint32; or, for ``"llmc"``, uint16); ids beyond llm.c's int32 token count; a path that
        names no file (``""``, a directory) or holds a name longer than the file system allows.
    OSError
        The file cannot be written or renamed into place (the message names ``path``, and the
        temporary file is removed).
    """
    path = _output_path(path)
    _validate.choice(format, "format", FORMATS)
    tokens = _validate.token_array(ids, "ids")
    low, high = _validate.value_range(tokens) or (0, 0)
    if dtype is None:
        stored = _smallest_unsigned(low, high, format)
    else:
        stored = _validate.integer_dtype(dtype, "dtype")
        info = np.iinfo(stored)
        if format == "llmc" and stored.newbyteorder("=") != LLMC_TOKEN_DTYPE.newbyteorder("="):
            raise ValueError(
                f"format='llmc' (llm.c version {LLMC_VERSION}) stores uint16 tokens, "
                f"got dtype={stored}"
            )
        if low < info.min or high > info.max:
            raise ValueError(
                f"ids range over [{low}, {high}], which does not fit dtype={stored} "
                f"([{info.min}, {info.max}])"
            )
    if format == "llmc":
        stored = LLMC_TOKEN_DTYPE
        if tokens.shape[0] > np.iinfo(np.int32).max:
            raise ValueError(
                f"llm.c's int32 header cannot count {tokens.shape[0]} tokens; split the ids "
                "into several shards"
            )
    with _atomic_writer(path) as f:
        if format == "npy":
            header = {
                "descr": np.lib.format.dtype_to_descr(stored),
                "fortran_order": False,
                "shape": (tokens.shape[0],),
            }
            np.lib.format.write_array_header_1_0(f, header)
        elif format == "llmc":
            header = np.zeros(LLMC_HEADER_INTS, dtype="<i4")
            header[:3] = (LLMC_MAGIC, LLMC_VERSION, tokens.shape[0])
            f.write(header.tobytes())
        for chunk in _validate.chunks(tokens):
            f.write(chunk.astype(stored, copy=False).tobytes())
    return path


def _smallest_unsigned(low: int, high: int, format: str) -> np.dtype:
    if low >= 0 and high <= np.iinfo(np.uint16).max:
        return np.dtype(np.uint16)
    if format == "llmc":
        raise ValueError(
            f"format='llmc' (llm.c version {LLMC_VERSION}) stores uint16 tokens, but the ids "
            f"range over [{low}, {high}]; write them as 'npy' or 'bin' instead"
        )
    if low >= 0 and high <= np.iinfo(np.uint32).max:
        return np.dtype(np.uint32)
    raise ValueError(
        f"ids range over [{low}, {high}], which fits neither uint16 nor uint32; pass an explicit "
        "dtype (e.g. dtype=np.int64)"
    )


def _output_path(path: Any) -> Path:
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


class _atomic_writer:
    """A binary file under a temporary name beside ``path``, renamed onto it on success.

    On any failure (writing, closing, renaming) the temporary file is removed, and an OSError
    names ``path``, not the temporary the caller never asked for.
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

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.file.close()
            if exc_type is None:
                os.replace(self.temp, self.path)
        except BaseException as error:
            self.temp.unlink(missing_ok=True)
            if isinstance(error, OSError):
                raise self._error(error) from None
            raise
        if exc_type is not None:
            self.temp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise self._error(exc) from None

    def _error(self, error: OSError) -> Exception:
        if error.errno == errno.ENAMETOOLONG:
            return _name_too_long(self.path)
        if error.errno is None:
            return OSError(f"cannot write token file {os.fspath(self.path)!r}: {error}")
        return OSError(
            error.errno, f"cannot write token file: {error.strerror}", os.fspath(self.path)
        )
