"""The format table, and the shards a path holds, read by its format.

What the format readers of :mod:`tokstream.formats` share above one layout: each format's
entry (:data:`FORMAT_TABLE`), telling a file's format (:func:`detect_format`), the files a path,
a pattern or a list names, and a file read by its format's reader into
:class:`~tokstream.formats.common.Shard` objects. :func:`tokstream.open_tokens` builds a corpus
from them; a manifest's shards and ``tokstream manifest`` read files through them too.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokstream import _validate
from tokstream.formats import arrow, detect, llmc, megatron, npy, raw, tokenized
from tokstream.formats.common import PathLike, Shard, existing_file


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
# Reading by format


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


def resolve_paths(spec: Any) -> list[Path]:
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
        return [path for item in resolve_paths(spec) for path in expand_pattern(item)]
    return resolve_paths(spec)


def shards_with_formats(path: Path, want: np.dtype | None, column: str) -> list[tuple[Shard, str]]:
    """The shards of one path :func:`input_paths` gave, each with its file's format."""
    if os.path.isdir(path) and tokenized.is_directory(path):
        found = str(tokenized.load(path)["format"])
        return [(shard, found) for shard in tokenized.read(path)]
    found = detect_format(path)
    return [(shard, found) for shard in open_one(path, want, found, column)]


def shards_of(file: Path, want: np.dtype, format: str, column: str) -> list[Shard]:
    """The shards of one token file read as ``format`` (what a manifest says it holds): its
    reader checks the file's own header, with no sniffing of its first bytes beforehand (on a
    network filesystem each look at a file is a round trip)."""
    return _read_as(file, want, format, column)


def open_one(path: Path, want: np.dtype | None, format: str | None, column: str) -> list[Shard]:
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
