"""A manifest in object storage: ``open_tokens("s3://bucket/dir/manifest.json")`` (or ``.../dir``).

Opening reads the manifest only (one GET; :mod:`tokstream.manifest` parses and checks its table
as it does a local one). A shard is opened when a batch first reads it: one range GET of its
first bytes gives its header, size and ETag, checked against its entry as a local file is
(size, header, documents: a Megatron index, or a ``tokstream tokenize`` shard's
``.documents.npy``, is read then); the manifest's documents sidecar is read when a stream first
needs documents. The tokens are fetched the way every remote corpus fetches them
(:mod:`tokstream.shards.remote._session`): :meth:`RemoteManifestShards.readable`, the hook run
before every kernel call, returns only once the call's byte ranges are in memory, pinned until its
:class:`~tokstream.shards.source.Readable` is released after the call.
"""

from __future__ import annotations

import io
import posixpath
import re
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from tokstream.formats import megatron, tokenized
from tokstream.formats.common import Shard, check_offsets
from tokstream.shards.manifest import ManifestShards
from tokstream.shards.remote._cache import Pin
from tokstream.shards.remote._client import RemoteChangedError
from tokstream.shards.remote._memory import ObjectBytes, remote_tokens_of
from tokstream.shards.remote._open import (
    HEAD_BYTES,
    header_tokens,
    open_megatron,
    read_whole,
    remote_tokens,
)
from tokstream.shards.remote._resident import AHEAD_PER_GET
from tokstream.shards.remote._session import Session
from tokstream.shards.source import DEFAULT_CAPACITY, Readable
from tokstream.shards.url import split_url

#: The formats a manifest in object storage may list (Arrow files are not read remotely).
FORMATS = ("npy", "bin", "llmc", "megatron")


class Url(str):
    """A URL with the few path operations the manifest reader uses on its paths (``parent``,
    ``/``, ``name``); never a local file."""

    @property
    def parent(self) -> Url:
        root, key = split_url(self)
        return Url(f"{root}/{posixpath.dirname(key)}".rstrip("/"))

    @property
    def name(self) -> str:
        return posixpath.basename(self)

    def __truediv__(self, other: str) -> Url:
        root, key = split_url(self)
        joined = posixpath.normpath(posixpath.join(key, other)) if other else key
        if joined == ".." or joined.startswith("../"):
            raise ValueError(f"{other!r} leads out of the bucket of {self}")
        return Url(f"{root}/{joined}".rstrip("/").removesuffix("/."))

    def is_file(self) -> bool:
        return False


class RemoteManifestShards(ManifestShards):
    """The shards a manifest at a URL lists, fetched on demand (see the module)."""

    #: Not memory maps of local files: no OS read-ahead advice applies.
    maps_files = False
    #: The shards live in object storage (a forked process cannot read them).
    remote = True

    def __init__(
        self, path: Url, manifest: Any, capacity: int = DEFAULT_CAPACITY, *, session: Session
    ) -> None:
        self.session = session
        super().__init__(path, manifest, capacity)  # type: ignore[arg-type]

    def _reset(self) -> None:
        super()._reset()
        # Each open shard's object (held alive by the shard's array while it is mapped).
        self._objects: weakref.WeakValueDictionary[int, ObjectBytes] = weakref.WeakValueDictionary()
        self._ahead = threading.local()  # set while this thread only starts fetches

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        del state["_objects"], state["_ahead"]
        return state

    def residency(self) -> SourceResidency:
        """What a stream's batch filler and read-ahead ask of this source."""
        return SourceResidency(self)

    @contextmanager
    def fetching_ahead(self) -> Iterator[None]:
        """Within the block, :meth:`readable` (in this thread) starts fetching its ranges and
        returns at once, for addresses that are only looked at, never read."""
        self._ahead.on = True
        try:
            yield
        finally:
            self._ahead.on = False

    def readable(self, shards: np.ndarray, offsets: np.ndarray, nbytes: Any) -> Readable:
        """The ranges' addresses once their bytes are in memory, pinned until released."""
        readable = super().readable(shards, offsets, nbytes)
        try:
            shards = np.asarray(shards, np.int64)
            starts = np.asarray(offsets, np.int64) + self._offsets[shards]
            ends = starts + np.broadcast_to(np.asarray(nbytes, np.int64), starts.shape)
            objects = self._objects
            requests = [
                (objects[shard], start, end)
                for shard, start, end in zip(
                    shards.tolist(), starts.tolist(), ends.tolist(), strict=True
                )
            ]
            if getattr(self._ahead, "on", False):
                self.session.fetch(requests)
                return readable
            pin = self.session.ensure(requests)
        except BaseException:
            readable.release()
            raise

        def release() -> None:
            pin.release()
            readable.release()

        return Readable(readable.addresses, release)

    def close(self) -> None:
        """Cancel what is in flight; end the fetch thread and its connections."""
        self.session.close()

    def _read_sidecar(self, sidecar: Any) -> np.ndarray:
        root, key = split_url(sidecar)
        data = self.session.run(read_whole(self.session, self.session.client(root), key))
        sidecar_array: np.ndarray = np.load(io.BytesIO(data), allow_pickle=False)
        return sidecar_array

    def _open(self, index: int) -> np.ndarray:
        """Open shard ``index`` from its first bytes and check it against its entry."""
        url = self.file(index)
        where = f"token file {url}"
        format = self._formats[index]
        if format not in FORMATS:
            raise ValueError(
                f"{where}: {format!r} files are not read from object storage (the manifest "
                f"{self.path})"
            )
        # file() gives the shard's Url here: the manifest was opened at one
        shard, offset = self.session.run(self._fetch(index, url, format))  # type: ignore[arg-type]
        obj = remote_tokens_of(shard.tokens)
        if obj is not None:
            self._check_version(index, obj.object.etag, where, "its ETags", RemoteChangedError)
        tokens = self._checked(index, shard, offset, where)
        if obj is not None:
            self._objects[index] = obj.object
        return tokens

    async def _fetch(self, index: int, url: str, format: str) -> tuple[Shard, int]:
        session = self.session
        root, key = split_url(url)
        client = session.client(root)
        size = int(self._sizes[index])
        where = f"token file {url}"
        if format == "megatron":
            shard = await open_megatron(session, client, megatron.prefix(key).as_posix())
            found = remote_tokens_of(shard.tokens)
            found_size = 0 if found is None else found.object.size
            offset = 0
        else:
            head, found_size, etag = await client.read_head(key, HEAD_BYTES)
            if found_size == size:
                dtype, offset, count = header_tokens(format, head, size, url, self.dtype)
                obj = ObjectBytes(session, root, key, size, etag)
                offsets = await self._documents_beside(client, key, count)
                shard = Shard(remote_tokens(obj, offset, dtype, count), offsets, url)
        if found_size != size:
            raise ValueError(f"{where}: {found_size} bytes, the manifest {self.path} says {size}")
        return shard, offset

    async def _documents_beside(self, client: Any, key: str, count: int) -> np.ndarray | None:
        """The document offsets of a ``tokstream tokenize`` shard (its ``.documents.npy``
        beside it), or None for any other file."""
        folder, _, name = key.rpartition("/")
        match = re.fullmatch(r"shard_(\d{6})(\.npy|\.bin)?", name)
        if match is None:
            return None
        documents = tokenized.documents_file(int(match.group(1)))
        documents_key = f"{folder}/{documents}" if folder else documents
        try:
            stored = np.load(
                io.BytesIO(await read_whole(self.session, client, documents_key)),
                allow_pickle=False,
            )
        except FileNotFoundError:
            return None
        return check_offsets(stored, count, f"token file {client.url(documents_key)}")


def open_listed(url: str, body: Any, session: Session) -> Any:
    """The factory :func:`tokstream.manifest.open_manifest` makes the shard source with, and
    the manifest's path, for a manifest at ``url``."""

    def source(path: Any, manifest: Any, capacity: int) -> RemoteManifestShards:
        return RemoteManifestShards(path, manifest, capacity, session=session)

    return Url(url), source


class SourceResidency:
    """What a stream over a remote manifest corpus asks of its residency: nothing before a
    kernel call (the source's readable hook fetches and pins the bytes), windows fetched ahead
    (:meth:`advisor`, for :class:`~tokstream._readahead.ReadAhead`), and :meth:`close` (the
    stream's close, seek or last batch) ending the fetch thread."""

    def __init__(self, source: RemoteManifestShards) -> None:
        self._source = source
        #: Windows to keep requested ahead of the batch being copied.
        self.windows_ahead = AHEAD_PER_GET * source.session.options.max_in_flight

    def ensure_windows(self, space: Any, windows_index: np.ndarray) -> Pin:
        return Pin()

    def ensure_at(self, addresses: np.ndarray, nbytes: Any) -> Pin:
        return Pin()

    def ensure_pieces(self, *pieces: Any) -> Pin:
        return Pin()

    def advisor(self, space: Any) -> _Ahead:
        return _Ahead(self._source, space)

    def close(self) -> None:
        self._source.close()


class _Ahead:
    def __init__(self, source: RemoteManifestShards, space: Any) -> None:
        self._source, self._space = source, space

    def advise(self, windows_index: np.ndarray, sample: int) -> int:
        """Start fetching the windows (opening their shards first); never "all resident".
        Packed rows over shards read on demand are fetched when their batch reads them."""
        if not hasattr(self._space, "locate"):
            return max(1, int(windows_index.shape[0]))
        with self._source.fetching_ahead():
            _, _, readable = self._space.locate(np.ascontiguousarray(windows_index, np.int64))
            readable.release()
        return max(1, int(windows_index.shape[0]))
