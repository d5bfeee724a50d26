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
module of :mod:`tokstream.formats` knows one layout and :mod:`tokstream.formats.table` detects
and dispatches; this module opens a manifest, URLs (:mod:`tokstream.shards.remote`) or files as
a corpus; :mod:`tokstream.writing` writes the same formats.

Every corpus :func:`open_tokens` returns is read-only and backed by memory maps (or, for an
in-memory Arrow table, by its buffers): opening reads headers and indexes and, for uint64 tokens,
scans the values in bounded chunks; the tokens are paged in only when a window touches them. A
mapping keeps no file descriptor open (:mod:`tokstream.shards.filemap`), so a corpus of thousands of
shards opens under ``ulimit -n 1024``, and pickling it (for spawned DataLoader workers) sends each
file's name, not its tokens.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tokstream import _validate, manifest
from tokstream.corpus import Corpus
from tokstream.formats import arrow, tokenized
from tokstream.formats.common import Shard
from tokstream.formats.table import FORMATS, checked_tokens, open_one, resolve_paths
from tokstream.formats.table import detect_format as detect_format
from tokstream.shards.url import is_url

__all__ = ["detect_format", "open_tokens"]


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
    corpus = _open_tokens(path_or_paths_or_glob, dtype, format, column, max_open_maps, remote)
    directory = _tokenize_directory(path_or_paths_or_glob)
    if directory is not None:
        masks = tokenized.read_loss_masks(directory, corpus.lengths.tolist())
        if masks is not None:
            corpus = corpus._with_loss_masks(masks)
    return corpus


def _tokenize_directory(spec: Any) -> Path | None:
    """The local ``tokstream tokenize`` directory ``spec`` names (itself, or the manifest the
    run wrote in it), else None."""
    if not isinstance(spec, (str, os.PathLike)) or remote_urls(spec):
        return None
    path = Path(spec)
    if path.name == manifest.MANIFEST_NAME and path.is_file():
        path = path.parent
    return path if path.is_dir() and tokenized.is_directory(path) else None


def _open_tokens(
    path_or_paths_or_glob: Any,
    dtype: Any,
    format: str | None,
    column: str,
    max_open_maps: int | None,
    remote: Any,
) -> Corpus:
    if format is not None:
        _validate.choice(format, "format", FORMATS)
    if not isinstance(column, str):
        raise TypeError(f"column must be a str, got {type(column).__name__}")
    want = None if dtype is None else _validate.integer_dtype(dtype, "dtype")
    remote_shards: list[Shard] | None = None
    listed: Any
    if remote_urls(path_or_paths_or_glob):
        from tokstream.shards.remote import open_url

        remote_shards, listed = open_url(path_or_paths_or_glob, want, format, remote)
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
        for path in resolve_paths(path_or_paths_or_glob)
        for shard in open_one(path, want, format, column)
    ]
    return _corpus(shards, want, "token files")


def remote_urls(spec: Any) -> bool:
    """Whether ``spec`` names objects in object storage: a URL, or a list of URLs only."""
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
