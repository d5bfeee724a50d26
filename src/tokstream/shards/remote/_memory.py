"""Where a remote object's bytes live in this process: one map of the object's full size.

The kernels read shards through raw addresses with no bounds checks, so a remote shard is a
real, fixed mapping of the whole object from the moment the corpus opens: an anonymous map
(``MAP_NORESERVE``: untouched pages cost nothing and read as zeros), or with a cache directory a
sparse file of the object's size mapped shared, which the OS pages out to disk and a later run
finds filled. Bytes are written in once a range GET brings them (an object is immutable for
as long as it is read; its size and ETag are checked at open) and change only when the cache
evicts their extent, after which they read as zeros until fetched again
(:mod:`tokstream.shards.remote._cache`); the map is never unmapped while any array over it
lives (the arrays' base keeps it). A kernel call reads only windows whose bytes were pinned and made
present first (:mod:`tokstream.shards.remote._session`).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tokstream.shards.remote._cache import EXTENT, Pin
from tokstream.shards.remote._resident import PIECE_BYTES, Residency
from tokstream.shards.source import OnDemandTokens

if TYPE_CHECKING:
    from tokstream.shards.remote._session import Session

#: When the cache keeps bytes, presence is recorded per granule of this many bytes (one byte
#: each), and fetched ranges are widened to whole granules.
GRANULE = 64


class ObjectBytes:
    """The bytes of the object ``key`` under ``root`` (``size`` bytes, ``etag``), mapped.

    Which of them hold the object's bytes: when the session's cache keeps bytes, one mark per
    granule (in a file beside the cache file, or per resident extent in memory); otherwise a
    range is present only while its fetch is pending (:mod:`tokstream.shards.remote._session`).
    Pages are handed back by :meth:`evict`, extent by extent
    (:mod:`tokstream.shards.remote._cache`).
    Picklable as where the object is: a spawned worker maps an empty (or its cached) copy of
    its own and fetches what its windows need.
    """

    def __init__(self, session: Session, root: str, key: str, size: int, etag: str | None) -> None:
        self.session, self.root, self.key, self.size, self.etag = session, root, key, size, etag
        self.url = f"{root}/{key}"
        cache = self.cache = session.cache
        #: Whether fetched ranges are widened to whole granules and marked present.
        self.granular = cache.keeps
        self.filled: np.ndarray | None = None  # granule marks of a cache file
        self._marks: dict[int, np.ndarray] = {}  # granule marks in memory, by extent
        self.pages: np.ndarray | None = None  # a cache file's page masks, by extent
        length = max(size, 1)  # mmap cannot map zero bytes
        if cache.directory is None:
            flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20)
            flags |= getattr(mmap, "MAP_NORESERVE", 0)
            self._map = mmap.mmap(-1, length, flags=flags)
        else:
            self._map, self.filled, self.pages = _cached_map(
                cache.directory, self.url, size, etag, length, cache.bounded
            )
        # A buffer export pins the mapping: mmap.close() raises while it exists, so no array a
        # kernel may read through can outlive the memory behind it.
        self.view = np.frombuffer(self._map, np.uint8)
        self.address = int(self.view.ctypes.data)
        self.number = cache.register(self, self.pages)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ObjectBytes, (self.session, self.root, self.key, self.size, self.etag))

    def __repr__(self) -> str:
        return f"ObjectBytes({self.url!r}, size={self.size})"

    def write(self, start: int, data: Any) -> None:
        """Put bytes ``[start, start + len(data))`` of the object in place (and mark them).

        The range's extents are pinned (a fetch pins what it brings), so none of them is
        evicted between the copy and the marks.
        """
        chunk = np.frombuffer(data, np.uint8)
        end = start + chunk.shape[0]
        self.view[start:end] = chunk
        with self.cache.lock:
            if self.granular:
                # Granules wholly inside the range, and the object's last (partial) granule.
                stop = -(-self.size // GRANULE) if end >= self.size else end // GRANULE
                for marks, first, last in self._marks_between(-(-start // GRANULE), stop, True):
                    marks[first:last] = 1
            if end > start:
                self.cache.wrote(self, start, end)

    def missing(self, start: int, end: int) -> tuple[int, int] | None:
        """The granule-aligned part of ``[start, end)`` not yet present (None: all present);
        when the cache keeps nothing, ``(start, end)`` itself."""
        if not self.granular:
            return start, end
        first, last = start // GRANULE, -(-end // GRANULE)
        absent = np.flatnonzero(
            np.concatenate([marks[a:b] for marks, a, b in self._marks_between(first, last)]) == 0
        )
        if absent.shape[0] == 0:
            return None
        return (
            (first + int(absent[0])) * GRANULE,
            min((first + int(absent[-1]) + 1) * GRANULE, self.size),
        )

    def _marks_between(
        self, first: int, last: int, create: bool = False
    ) -> list[tuple[np.ndarray, int, int]]:
        """Granules ``[first, last)`` as ``(marks, a, b)`` slices (of absent marks' zeros when
        not ``create``)."""
        if self.filled is not None:
            return [(self.filled, first, last)]
        per = EXTENT // GRANULE
        pieces = []
        while first < last:
            extent = first // per
            stop = min(last, (extent + 1) * per)
            marks = self._marks.get(extent)
            if marks is None:
                marks = np.zeros(per, np.uint8)
                if create:
                    self._marks[extent] = marks
            pieces.append((marks, first - extent * per, stop - extent * per))
            first = stop
        return pieces

    def pages_written(self, extent: int, mask: int) -> None:
        """Record that the pages of ``mask`` of ``extent`` hold bytes (in the cache file's
        page masks, for a later run)."""
        if self.pages is not None:
            self.pages[extent] = mask

    def evict(self, extent: int) -> None:
        """Hand the pages of ``extent`` back to the OS and forget its bytes (the cache's lock
        is held and the extent is not pinned)."""
        start = extent * EXTENT
        length = max(min(EXTENT, self.size - start), 1)
        per = EXTENT // GRANULE
        if self.filled is not None:
            self.filled[extent * per : (extent + 1) * per] = 0
            # A hole punched in the file: the disk and the page cache both let go.
            self._map.madvise(mmap.MADV_REMOVE, start, length)
        else:
            self._marks.pop(extent, None)
            self._map.madvise(mmap.MADV_DONTNEED, start, length)
        if self.pages is not None:
            self.pages[extent] = 0


def _cached_map(
    cache: Path, url: str, size: int, etag: str | None, length: int, bounded: bool
) -> tuple[mmap.mmap, np.ndarray, np.ndarray | None]:
    """The object's sparse cache file and its granule marks, both mapped shared (and for a
    bounded cache, its page masks per extent).

    Named by a hash of the URL, size and ETag: a changed object gets a new file. Bytes and
    marks written by one process are seen by every other mapping the same files (DataLoader
    workers); a mark is set only after its bytes are written.
    """
    name = hashlib.sha256(f"{url}\n{size}\n{etag}".encode()).hexdigest()[:32]
    files = [(cache / f"{name}.data", length), (cache / f"{name}.marks", -(-size // GRANULE))]
    if bounded:
        files.append((cache / f"{name}.pages", 2 * -(-size // EXTENT)))
    maps = []
    for path, nbytes in files:
        nbytes = max(nbytes, 1)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            if os.fstat(fd).st_size != nbytes:
                os.ftruncate(fd, nbytes)
            maps.append(mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED))
        finally:
            os.close(fd)
    marks = np.frombuffer(maps[1], np.uint8)
    pages = np.frombuffer(maps[2], np.uint16) if bounded else None
    return maps[0], marks, pages


class RemoteTokens(OnDemandTokens):
    """``count`` tokens of ``dtype`` at byte ``offset`` of a remote object, as an array base.

    ``np.asarray(remote_tokens)`` is the read-only token array over the object's map; the array
    keeps this (and so the map) alive. Pickles as where the tokens are.
    """

    def __init__(self, bytes_: ObjectBytes, offset: int, dtype: np.dtype, count: int) -> None:
        self.object, self.offset, self.dtype, self.count = bytes_, offset, np.dtype(dtype), count
        self.__array_interface__ = {
            "shape": (count,),
            "typestr": self.dtype.str,
            "data": (bytes_.address + offset, True),
            "version": 3,
        }

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteTokens, (self.object, self.offset, self.dtype, self.count))

    def __repr__(self) -> str:
        return f"RemoteTokens({self.object.url!r}, offset={self.offset}, count={self.count})"

    def residency(self, shards: Sequence[np.ndarray]) -> Residency:
        remote = [tokens for tokens in map(remote_tokens_of, shards) if tokens is not None]
        return Residency(remote)

    def present(self, shard: np.ndarray, start: int, stop: int) -> np.ndarray:
        """For Python code that reads tokens itself (an eos scan, a conversion) rather than
        through a stream's kernels: the piece's bytes are fetched in GETs of
        :data:`~tokstream.shards.remote._resident.PIECE_BYTES`, and the array returned keeps
        them pinned in the cache for as long as it lives."""
        piece = shard[start:stop]
        residency = Residency([self])
        begin, end = int(piece.ctypes.data), int(piece.ctypes.data) + piece.nbytes
        firsts = np.arange(begin, end, PIECE_BYTES, dtype=np.uint64)
        pin = residency.ensure(residency.requests_at(firsts, np.minimum(PIECE_BYTES, end - firsts)))
        return np.asarray(_Pinned(piece, pin))


def tokens_array(bytes_: ObjectBytes, offset: int, dtype: np.dtype, count: int) -> np.ndarray:
    """The read-only array of ``count`` tokens at ``offset`` of the object."""
    if count == 0:
        empty = np.empty(0, dtype=dtype)
        empty.flags.writeable = False
        return empty
    return np.asarray(RemoteTokens(bytes_, offset, dtype, count))


def remote_tokens_of(array: np.ndarray) -> RemoteTokens | None:
    """The :class:`RemoteTokens` ``array`` is exactly (not a slice or view of it), else None."""
    base: Any = array.base
    if isinstance(base, RemoteTokens) and array.shape == (base.count,):
        return base
    return None


class _Pinned:
    """An array's memory with a pin released when the last array over it is dropped."""

    def __init__(self, array: np.ndarray, pin: Pin) -> None:
        self.__array_interface__ = array.__array_interface__
        self._array = array
        # Dropping an array may happen anywhere, even under the cache's lock: deferred.
        weakref.finalize(self, pin.release_later)
