"""The shards a manifest lists (:mod:`tokstream.manifest`), mapped from their files on first read.

:class:`ManifestShards` checks a manifest's table when it is made (nothing but the parsed JSON
is read) and is the :class:`~tokstream.shards.source.MappedShards` of the corpus
:func:`tokstream.manifest.open_manifest` returns: a shard's file is mapped with its format's
reader when a batch first reads it, and checked against its entry then (size, header, documents).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tokstream import _validate
from tokstream._arrays import frozen
from tokstream._windowing import cumulative
from tokstream.formats import table
from tokstream.formats.common import Shard, check_kind, check_offsets, manifest_dtype
from tokstream.shards.filemap import file_map_of
from tokstream.shards.source import DEFAULT_CAPACITY, MappedShards

KIND = "tokstream manifest"
#: The name :func:`tokstream.open_tokens` looks for in a directory.
MANIFEST_NAME = "manifest.json"
VERSION = 1
#: The columns of the shard table, each a list with one value per shard.
COLUMNS = ("path", "format", "offset", "tokens", "documents", "size", "fingerprint", "batch")


class ManifestShards(MappedShards):
    """The shards a manifest lists, mapped from their files on first use (see the module)."""

    def __init__(self, path: Path, manifest: Any, capacity: int = DEFAULT_CAPACITY) -> None:
        self.path = path
        where = f"token file {path}"
        self.dtype = manifest_dtype(check_kind(manifest, KIND, VERSION, where), where)
        column = manifest.get("column")
        if not isinstance(column, str):
            raise ValueError(f"{where}: bad 'column': {column!r}")
        self.column = column
        table = manifest.get("shards")
        if not isinstance(table, dict) or not all(isinstance(table.get(c), list) for c in COLUMNS):
            raise ValueError(f"{where}: 'shards' must hold the lists {', '.join(COLUMNS)}")
        count = len(table["path"])
        if any(len(table[c]) != count for c in COLUMNS) or manifest.get("num_shards") != count:
            raise ValueError(f"{where}: the shard columns and 'num_shards' disagree in length")
        if count == 0:
            raise ValueError(f"{where}: lists no shards")
        self._paths = _strings(table["path"], "path", where)
        prefix = manifest.get("path_prefix")
        if not isinstance(prefix, str):
            raise ValueError(f"{where}: bad 'path_prefix': {prefix!r}")
        self._directory = path.parent / prefix
        self._formats = _strings(table["format"], "format", where)
        self.lengths = frozen(_counts(table["tokens"], "tokens", where))
        self._offsets = _counts(table["offset"], "offset", where)
        self._sizes = _counts(table["size"], "size", where)
        self._batches = table["batch"]
        self._document_counts = table["documents"]
        if int(self.lengths.sum()) != manifest.get("num_tokens"):
            raise ValueError(f"{where}: 'num_tokens' is not the sum of the shards' tokens")
        self._documents_file = manifest.get("documents_file")
        recorded = [c for c in self._document_counts if c is not None]
        if recorded and not isinstance(self._documents_file, str):
            raise ValueError(f"{where}: shards record documents but no 'documents_file' is named")
        _counts(recorded, "documents", where)
        self.names = _ShardNames(self._directory, self._paths)
        # The Arrow file of several record batches read last: they are the next shards to be
        # asked for. It keeps that one file mapped (one map beyond the bound at most).
        self._last_file: tuple[str, list[Shard]] | None = None
        self._documents_cache: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._tokenize_directories: dict[Path, bool] = {}
        #: The version of each shard's file when this process first opened it (kept when its
        #: map is dropped; not pickled: a worker records the versions it opens).
        self._versions: dict[int, Any] = {}
        super().__init__(capacity)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled as its table: nothing read from the files (documents included) travels.
        state = super().__getstate__()
        state.update(_last_file=None, _documents_cache=None, _tokenize_directories={}, _versions={})
        return state

    @property
    def sizes(self) -> np.ndarray:
        """Bytes of each shard's file, as the manifest lists them."""
        return self._sizes

    def file(self, index: int) -> Path:
        """The path of shard ``index``'s file."""
        return self._directory / self._paths[index]

    def document_counts(self) -> np.ndarray | None:
        if all(count is None for count in self._document_counts):
            return None
        return np.array([1 if c is None else c for c in self._document_counts], np.int64)

    def document_boundaries(self) -> np.ndarray | None:
        if self.document_counts() is None:
            return None
        return self._documents_table()[0]

    def _checked_boundaries(self, counts: np.ndarray) -> np.ndarray:
        """The sidecar's document boundaries, frozen, once they agree with the table."""
        sidecar = self.path.parent / str(self._documents_file)
        where = f"token file {sidecar}"
        boundaries = frozen(np.asarray(self._read_sidecar(sidecar), dtype=np.int64))
        starts = cumulative(self.lengths)
        firsts = cumulative(counts)
        if boundaries.shape != (int(firsts[-1]) + 1,) or boundaries[-1] != starts[-1]:
            raise ValueError(
                f"{where}: holds {boundaries.shape[0]} boundaries, the manifest's "
                f"{int(firsts[-1])} documents and {int(starts[-1])} tokens need "
                f"{int(firsts[-1]) + 1} ending at {int(starts[-1])}"
            )
        # Rising throughout, so a shard's documents lie in it when its first starts at its
        # first token and its last starts no later than its end: O(shards) beyond the one pass.
        has = counts > 0
        if (
            np.any(boundaries[1:] < boundaries[:-1])
            or np.any(boundaries[firsts[:-1][has]] != starts[:-1][has])
            or np.any(boundaries[firsts[1:][has] - 1] > starts[1:][has])
        ):
            raise ValueError(
                f"{where}: document boundaries must rise through each shard from its first token"
            )
        return boundaries

    def _read_sidecar(self, sidecar: Path) -> np.ndarray:
        """The document boundaries the sidecar holds, unchecked."""
        from tokstream.formats import npy

        return npy.read(sidecar)

    def _open(self, index: int) -> np.ndarray:
        """Map shard ``index`` with its format's reader and check it against its entry."""
        file = self.file(index)
        where = f"token file {file}"
        stat = file.stat()
        size = stat.st_size
        self._check_version(index, (size, stat.st_mtime_ns), where, "its size or modification time")
        if size != self._sizes[index]:
            raise ValueError(
                f"{where}: {size} bytes, the manifest {self.path} says {int(self._sizes[index])}"
            )
        format = self._formats[index]
        if format not in table.FORMATS:
            raise ValueError(f"{where}: unknown format {format!r} in the manifest {self.path}")
        key = os.fspath(file)
        if self._last_file is not None and self._last_file[0] == key:
            shards = self._last_file[1]
        else:
            shards = table.shards_of(file, self.dtype, format, self.column)
            self._last_file = (key, shards) if len(shards) > 1 else None
        batch = self._batches[index] or 0
        if not isinstance(batch, int) or not 0 <= batch < len(shards):
            raise ValueError(f"{where}: no record batch {batch!r} (the manifest {self.path})")
        shard = shards[batch]
        mapped = file_map_of(shard.tokens)
        return self._checked(index, shard, None if mapped is None else mapped.offset, where)

    def _check_version(
        self,
        index: int,
        version: Any,
        where: str,
        what: str,
        error: type[Exception] = ValueError,
    ) -> None:
        """Raise ``error`` when shard ``index`` is opened again (its map was dropped) and its
        file is no longer the version first read (``what`` says what tells them apart): batches
        before and after would hold tokens of two different files."""
        first = self._versions.setdefault(index, version)
        if first != version:
            raise error(
                f"{where}: changed after it was first read ({what} differ), so the tokens read "
                f"before and after would be of two files; open the manifest {self.path} again"
            )

    def _checked(self, index: int, shard: Shard, offset: int | None, where: str) -> np.ndarray:
        """Shard ``index``'s tokens, read-only, once they agree with its entry: dtype, count,
        the byte its tokens start at (``offset``; None: not a map of a file) and documents."""
        tokens = _validate.token_array(shard.tokens, where)
        tokens.flags.writeable = False
        said = (int(self.lengths[index]), int(self._offsets[index]))
        found = (tokens.shape[0], said[1] if offset is None else offset)
        if tokens.dtype != self.dtype or found != said:
            raise ValueError(
                f"{where}: holds {found[0]} {tokens.dtype} tokens from byte {found[1]}, the "
                f"manifest {self.path} says {said[0]} {self.dtype} tokens from byte {said[1]}"
            )
        self._check_documents(index, shard, where)
        return tokens

    def _check_documents(self, index: int, shard: Shard, where: str) -> None:
        said = self._document_counts[index]
        offsets = shard.document_offsets
        if offsets is None and said is not None:
            documents = self._documents_file_beside(self.file(index))
            if documents is not None:
                from tokstream.formats import npy

                offsets = check_offsets(
                    npy.read(documents), int(self.lengths[index]), f"token file {documents}"
                )
        found = None if offsets is None else offsets.shape[0] - 1
        if found != said:
            raise ValueError(
                f"{where}: records {found} documents, the manifest {self.path} says {said}"
            )
        if offsets is not None:
            boundaries, firsts, starts = self._documents_table()
            first, start = int(firsts[index]), int(starts[index])
            recorded, found_starts = boundaries[first : first + said], offsets[:-1]
            # In chunks: no copy of a shard's documents beside the two tables.
            for low in range(0, said, _validate.SCAN_CHUNK):
                high = low + _validate.SCAN_CHUNK
                if not np.array_equal(recorded[low:high] - start, found_starts[low:high]):
                    raise ValueError(
                        f"{where}: its documents are not those the manifest {self.path} records"
                    )

    def _documents_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(boundaries, each shard's first document, each shard's first token)``, read and
        checked once: the corpus's boundaries, and each shard's first read compares with them."""
        if self._documents_cache is None:
            counts = self.document_counts()
            assert counts is not None
            boundaries = self._checked_boundaries(counts)
            self._documents_cache = (boundaries, cumulative(counts), cumulative(self.lengths))
        return self._documents_cache

    def _documents_file_beside(self, file: Path) -> Path | None:
        """The ``.documents.npy`` beside a shard of a ``tokstream tokenize`` directory, or None
        (whether a directory is one is asked once)."""
        from tokstream.formats import tokenized

        name, parent = file.name, file.parent
        digits = name[len("shard_") : len("shard_") + 6]
        if not name.startswith("shard_") or not digits.isdigit():
            return None
        if parent not in self._tokenize_directories:
            self._tokenize_directories[parent] = tokenized.is_directory(parent)
        if not self._tokenize_directories[parent]:
            return None
        documents = parent / tokenized.documents_file(int(digits))
        return documents if documents.is_file() else None


class _ShardNames:
    """Shard names for messages, made when one is asked for (not 100,000 at open)."""

    def __init__(self, directory: Path, paths: list[str]) -> None:
        self._directory, self._paths = directory, paths

    def __getitem__(self, index: int) -> str:
        return os.fspath(self._directory / self._paths[index])

    def __len__(self) -> int:
        return len(self._paths)


def _strings(values: list[Any], name: str, where: str) -> list[str]:
    # Type checks over the whole list at C speed: 100,000 entries in a few milliseconds.
    if set(map(type, values)) - {str} or not all(values):
        raise ValueError(f"{where}: every '{name}' must be a nonempty string")
    return values


def _counts(values: list[Any], name: str, where: str) -> np.ndarray:
    # type(v) is int: a JSON true is a Python bool, which NumPy would take for 1.
    if set(map(type, values)) - {int}:
        raise ValueError(f"{where}: every '{name}' must be an integer >= 0")
    try:
        counts = np.array(values, np.int64)
    except OverflowError:
        raise ValueError(f"{where}: every '{name}' must be an integer below 2**63") from None
    if counts.shape[0] and int(counts.min()) < 0:
        raise ValueError(f"{where}: every '{name}' must be an integer >= 0")
    return counts
