"""Token files: tell their format and open them as memory-mapped corpora.

The formats, told apart by their content rather than by their names (:func:`detect_format`):

``"npy"``
    NumPy's ``.npy``: a 1-D integer array of any dtype the kernel reads.
``"llmc"``
    llm.c's token shards: GPT-2's (version 1, uint16 tokens) and llama-3's (version 7, uint32).
``"megatron"``
    Megatron-LM's indexed datasets, ``PREFIX.bin`` + ``PREFIX.idx``, opened by the prefix or
    either file: dtype and documents come from the index.
``"arrow"``
    Arrow IPC files and streams (Hugging Face ``datasets`` files, Feather v2) and
    ``save_to_disk`` directories: a column of integer lists, one document per row. Needs the
    ``arrow`` extra (pyarrow).
``"bin"``
    Anything else: raw tokens without a header, as nanoGPT's prepare scripts write them. The
    file cannot say its dtype, so the reader must; uint16 by default.

A directory written by ``tokstream tokenize`` opens as its shards with their documents. Each
module of :mod:`tokstream.formats` knows one layout; this module detects, dispatches and checks;
:mod:`tokstream.writing` writes the same formats.

Every corpus :func:`open_tokens` returns is read-only and backed by memory maps (or, for an
in-memory Arrow table, by its buffers): opening reads headers and indexes and, for uint64 tokens,
scans the values in bounded chunks; the tokens are paged in only when a window touches them. A
mapping keeps no file descriptor open (:mod:`tokstream.shards.filemap`), so a corpus of thousands of
shards opens under ``ulimit -n 1024``, and pickling it (for spawned DataLoader workers) sends each
file's name, not its tokens.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokstream import _validate, manifest
from tokstream.corpus import Corpus
from tokstream.formats import arrow, detect, llmc, megatron, npy, raw, tokenized
from tokstream.formats._common import PathLike, Shard, existing_file


@dataclass(frozen=True)
class FileFormat:
    """What the readers, :func:`write_tokens` and the command line know about one format."""

    name: str
    #: The output file suffix that names this format when none is given (None: it must be
    #: asked for by name, as llm.c shards and Megatron datasets are, whose files are ``*.bin``).
    suffix: str | None
    #: Bytes before the tokens in a file :func:`write_tokens` writes (a 1-D ``.npy`` header
    #: is 128 bytes; an Arrow stream's schema message is about as long).
    header_bytes: int
    #: Whether the format records document boundaries.
    documents: bool
    #: Whether its tokens are little-endian whatever the machine (the header says so): a
    #: big-endian ``dtype`` is refused rather than written under that header.
    little_endian: bool


#: Every format, by name, in the order messages list them.
FORMAT_TABLE = {
    spec.name: spec
    for spec in (
        FileFormat("npy", ".npy", npy.HEADER_BYTES, False, False),
        FileFormat("bin", ".bin", 0, False, False),
        FileFormat("llmc", None, llmc.HEADER_BYTES, False, True),
        FileFormat("megatron", None, 0, True, True),
        FileFormat("arrow", ".arrow", 0, True, True),
    )
}
FORMATS = tuple(FORMAT_TABLE)
#: Output formats by file suffix (lower case).
SUFFIX_FORMATS = {spec.suffix: name for name, spec in FORMAT_TABLE.items() if spec.suffix}

GLOB_CHARS = frozenset("*?[")


# ---------------------------------------------------------------------------------------------
# Detection


def detect_format(path: PathLike) -> str:
    """Return the format of the token file at ``path``: one of :data:`FORMATS`.

    Decided by content (:mod:`tokstream.formats.detect`): NumPy's magic, llm.c's, Megatron's
    index magic, Arrow's file or stream marker; raw tokens when nothing is recognised, except
    that a ``.bin`` beside a Megatron index of the same prefix is Megatron. A Megatron prefix
    (no file of that name, ``PREFIX.idx`` beside it) is ``"megatron"``, a ``save_to_disk``
    directory ``"arrow"``, a ``tokstream tokenize`` directory the format of its shards.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        A directory of no known kind; a file that looks like an archive, a compressed file,
        Parquet or JSON; an llm.c file that holds no tokens; a ``.npy`` name without the magic.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"token file path must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    # os.path, not Path: a name too long for the file system is existing_file's error to give.
    if os.path.isdir(path):
        if tokenized.is_directory(path):
            return str(tokenized.load(path)["format"])
        if (path / arrow.STATE_FILE).is_file() or (path / arrow.DATASET_DICT_FILE).is_file():
            return "arrow"
        if megatron.is_index(megatron.paths(path)[0]):
            # Megatron-core keeps its index cache in PREFIX/cache/ beside PREFIX.bin/.idx.
            return "megatron"
        raise ValueError(
            f"token file {path} is a directory (neither a `tokstream tokenize` output nor a "
            f"save_to_disk dataset); pass a pattern such as '{path}/*.bin'"
        )
    if not os.path.exists(path) and megatron.is_index(megatron.paths(path)[0]):
        return "megatron"
    return detect.sniff(existing_file(path))


# ---------------------------------------------------------------------------------------------
# Reading


def open_tokens(
    path_or_paths_or_glob: Any,
    dtype: Any = None,
    *,
    format: str | None = None,
    column: str = arrow.DEFAULT_COLUMN,
    max_open_maps: int | None = None,
    remote: Any = None,
) -> Corpus:
    """Open token files (or an in-memory Arrow table) as a read-only corpus, without copying.

    Parameters
    ----------
    path_or_paths_or_glob
        A path (a file, a Megatron prefix, a ``save_to_disk`` or ``tokstream tokenize``
        directory); a list or tuple of paths (their shards in the given order); a pattern with
        ``*``, ``?`` or ``[`` whose matches are taken in sorted order (a Megatron ``.bin`` and
        ``.idx`` pair counts once), so number shards with zero padding. A path that exists is
        never a pattern. Or a ``pyarrow.Table``, ``pyarrow.RecordBatch`` or
        ``datasets.Dataset``. Or a manifest (:mod:`tokstream.manifest`: a ``.json`` file
        ``tokstream manifest`` wrote, or a directory holding ``manifest.json``): only it is
        read, and each shard is mapped and checked against it when first read.
    dtype
        For raw ``.bin`` files, the stored token dtype (default uint16). For the formats that
        record their dtype, an expectation: a file of another dtype is an error.
    format
        ``None`` detects each file's format (:func:`detect_format`); a name from
        :data:`FORMATS` insists on it, and ``"bin"`` reads any file raw.
    column
        For Arrow data, the column of token lists (or of plain integer tokens).
    max_open_maps
        For a manifest: how many shard maps stay open at most (default 1024; the least
        recently used is unmapped first), beyond the shards of the batches being copied
        right now, which stay mapped until each is copied (see docs/files.md).
    remote
        For URLs of object storage (``s3://``, ``gs://``, ``az://``, ``http(s)://``: a file,
        a pattern, a Megatron prefix, a ``tokstream tokenize`` directory, or a list of them):
        a :class:`tokstream.shards.remote.RemoteOptions` (requests in flight, retry deadline, a
        local cache directory); None takes the defaults. Needs the ``remote`` extra (obstore).

    Returns
    -------
    Corpus
        One shard per file (per record batch for Arrow), each in the file's own dtype, with
        the documents where the format records them. Windows never cross from one shard into
        the next. A byte-swapped ``.npy`` is the one exception to "no copy": it is copied into
        memory once, since the kernel reads native integers.

    Raises
    ------
    FileNotFoundError
        A named file does not exist (its path in the message and in ``.filename``).
    ImportError
        Arrow data without pyarrow installed (the message names the extra).
    ValueError
        An empty list, a pattern that matches no file, or a bad file: a bad magic, version or
        dtype code, a truncated file, counts, lengths or pointers that disagree with the file
        sizes, a column of the wrong type, a dtype other than the one requested, files of
        different dtypes, a uint64 value beyond int64. Every message names the file.
    TypeError
        ``dtype`` is not an integer dtype, ``format`` or ``column`` not a string, or the paths
        are neither a path nor a sequence of paths.
    """
    if format is not None:
        _validate.choice(format, "format", FORMATS)
    if not isinstance(column, str):
        raise TypeError(f"column must be a str, got {type(column).__name__}")
    want = None if dtype is None else _validate.integer_dtype(dtype, "dtype")
    remote_shards = None
    if remote_urls(path_or_paths_or_glob):
        from tokstream.shards.remote import _manifest, _open

        opened = _open.open_remote(path_or_paths_or_glob, want, format, _open.options(remote))
        if isinstance(opened, _open.Listed):
            url, source = _manifest.open_listed(*opened)
            listed: Any = (url, opened.body, source)
        else:
            listed, remote_shards = None, opened
    else:
        found = manifest.find(path_or_paths_or_glob)
        listed = None if found is None else (*found, manifest.ManifestShards)
    if listed is not None:
        if format is not None:
            raise ValueError(f"token file {listed[0]} is a manifest; format= does not apply")
        custom = None if column == arrow.DEFAULT_COLUMN else column
        return manifest.open_manifest(
            listed[0], want, custom, max_open_maps, body=listed[1], source=listed[2]
        )
    if max_open_maps is not None:
        raise ValueError("max_open_maps applies to a manifest; open_tokens got token files")
    if remote_shards is not None:
        return _corpus(remote_shards, want, "token files")
    if arrow.is_arrow_object(path_or_paths_or_glob):
        shards = arrow.read_object(path_or_paths_or_glob, column)
        return _corpus(shards, want, "Arrow table")
    shards = [
        shard
        for path in _resolve_paths(path_or_paths_or_glob)
        for shard in _open_one(path, want, format, column)
    ]
    return _corpus(shards, want, "token files")


def remote_urls(spec: Any) -> bool:
    """Whether ``spec`` names objects in object storage: a URL, or a list of URLs only."""
    from tokstream.shards.remote import is_url

    if isinstance(spec, (list, tuple)) and spec and all(is_url(item) for item in spec):
        return True
    return is_url(spec)


def _corpus(shards: list[Shard], want: np.dtype | None, name: str) -> Corpus:
    arrays = []
    for shard in shards:
        tokens = checked_tokens(shard, want)
        # A byte-swapped file is copied into memory (and an empty one may be): read-only all
        # the same.
        tokens.flags.writeable = False
        arrays.append(tokens)
    names = [shard.name for shard in shards]
    return Corpus._from_arrays(arrays, names, name, [shard.document_offsets for shard in shards])


def checked_tokens(shard: Shard, want: np.dtype | None) -> np.ndarray:
    """``shard``'s tokens as the kernel reads them, of dtype ``want`` (if not None) or a
    ValueError naming its file."""
    tokens = shard.tokens
    if want is not None and tokens.dtype.newbyteorder("=") != want.newbyteorder("="):
        raise ValueError(
            f"token file {shard.name} holds {tokens.dtype} tokens, dtype={want} was asked"
        )
    return _validate.token_array(tokens, f"token file {shard.name}")


def expand_pattern(spec: PathLike) -> list[Path]:
    """``spec`` as one path, or a pattern's matches in sorted order.

    A path that exists (or a Megatron prefix) is never a pattern; anything else holding ``*``,
    ``?`` or ``[`` is one, and a pattern that matches nothing is a ValueError (never an empty
    corpus). The two files of a Megatron dataset (a ``.bin`` beside an ``.idx`` that starts
    with the index magic) count once, as the first of them; the document offsets files of a
    ``tokstream tokenize`` directory (``shard_*.documents.npy``) are not token files and are
    left out.
    """
    text = os.fspath(spec)
    if not GLOB_CHARS & set(text) or os.path.exists(text):
        return [Path(spec)]
    if megatron.is_index(megatron.paths(text)[0]):
        return [Path(spec)]  # a Megatron prefix (its files exist, not the name itself)
    matches = sorted(glob.glob(text))
    if not matches:
        raise ValueError(f"token file pattern {text!r} matched no files")
    seen: set[Path] = set()
    paths = []
    for match in matches:
        index = megatron.paths(match)[0]
        if match.endswith((".bin", ".idx")) and megatron.is_index(index):
            if index in seen:
                continue
            seen.add(index)
        elif tokenized.is_documents_file(Path(match)):
            continue
        paths.append(Path(match))
    if not paths:
        raise ValueError(
            f"token file pattern {text!r} matched only the document offsets of a `tokstream "
            "tokenize` directory; open the directory itself"
        )
    return paths


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
        "open_tokens takes a path, a glob pattern, a list of paths or an Arrow table, got "
        f"{type(spec).__name__}"
    )


def input_paths(spec: Any) -> list[Path]:
    """The files a path, a pattern or a list of paths and patterns names, in order."""
    if isinstance(spec, (list, tuple)):
        return [path for item in _resolve_paths(spec) for path in expand_pattern(item)]
    return _resolve_paths(spec)


def shards_with_formats(path: Path, want: np.dtype | None, column: str) -> list[tuple[Shard, str]]:
    """The shards of one path :func:`input_paths` gave, each with its file's format."""
    if os.path.isdir(path) and tokenized.is_directory(path):
        found = str(tokenized.load(path)["format"])
        return [(shard, found) for shard in tokenized.read(path)]
    found = detect_format(path)
    return [(shard, found) for shard in _open_one(path, want, found, column)]


def shards_of(file: Path, want: np.dtype, format: str, column: str) -> list[Shard]:
    """The shards of one token file read as ``format`` (what a manifest says it holds): its
    reader checks the file's own header, with no sniffing of its first bytes beforehand (on a
    network filesystem each look at a file is a round trip)."""
    return _read_as(file, want, format, column)


def _open_one(path: Path, want: np.dtype | None, format: str | None, column: str) -> list[Shard]:
    if os.path.isdir(path) and tokenized.is_directory(path):
        shards = tokenized.read(path)
        found = tokenized.load(path)["format"]
        if format is not None and format != found:
            raise ValueError(f"token file {path}: format={format!r} was asked, it holds {found!r}")
        return shards
    if format == "bin":
        path = existing_file(path)
    else:
        found = detect_format(path)
        if format is None:
            format = found
        elif format != found:
            raise ValueError(
                f"token file {path}: bad magic: format={format!r} was asked, the file's first "
                f"bytes say {found!r}"
            )
    return _read_as(path, want, format, column)


def _read_as(path: Path, want: np.dtype | None, format: str, column: str) -> list[Shard]:
    """The shards of ``path`` read by ``format``'s reader (which checks its own header)."""
    if format == "megatron":
        if path.is_file() and megatron.is_index(path) and path.suffix != ".idx":
            raise ValueError(
                f"token file {path} holds a Megatron index, whose name must be PREFIX.idx "
                "(beside PREFIX.bin)"
            )
        return [megatron.read(path)]
    if format == "arrow":
        if os.path.isdir(path):
            return arrow.read_directory(path, column)
        return arrow.read_file(path, column)
    if format == "npy":
        tokens = npy.read(path)
    elif format == "llmc":
        tokens = llmc.read(path)
    else:
        tokens = raw.read(path, raw.DEFAULT_DTYPE if want is None else want)
    return [Shard(tokens, None, str(path))]
