"""Where a remote object's bytes live in this process: one map of the object's full size.

The kernels read shards through raw addresses with no bounds checks, so a remote shard is a
real, fixed mapping of the whole object from the moment the corpus opens: an anonymous map
(``MAP_NORESERVE``: untouched pages cost nothing and read as zeros), or with a cache directory a
sparse file of the object's size mapped shared, which the OS pages out to disk and a later run
finds filled. Bytes are written in once a range GET brings them and never change afterwards (an
object is immutable for as long as it is read; its size and ETag are checked at open), and the
map is never unmapped while any array over it lives (the arrays' base keeps it). Which bytes are
present is the session's to know (:mod:`tokstream.remote._session`): a kernel call reads only
windows whose bytes were made present first.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tokstream.remote._session import Session

#: With a cache directory, presence is recorded per granule of this many bytes (one byte each
#: in a side file), and fetched ranges are widened to whole granules.
GRANULE = 64


class ObjectBytes:
    """The bytes of the object ``key`` under ``root`` (``size`` bytes, ``etag``), mapped.

    Picklable as where the object is: a spawned worker maps an empty (or its cached) copy of
    its own and fetches what its windows need.
    """

    def __init__(self, session: Session, root: str, key: str, size: int, etag: str | None) -> None:
        self.session, self.root, self.key, self.size, self.etag = session, root, key, size, etag
        self.url = f"{root}/{key}"
        self.filled: np.ndarray | None = None
        length = max(size, 1)  # mmap cannot map zero bytes
        cache = session.cache_dir
        if cache is None:
            flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20)
            flags |= getattr(mmap, "MAP_NORESERVE", 0)
            self._map = mmap.mmap(-1, length, flags=flags)
        else:
            self._map, self.filled = _cached_map(Path(cache), self.url, size, etag, length)
        # A buffer export pins the mapping: mmap.close() raises while it exists, so no array a
        # kernel may read through can outlive the memory behind it.
        self.view = np.frombuffer(self._map, np.uint8)
        self.address = int(self.view.ctypes.data)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ObjectBytes, (self.session, self.root, self.key, self.size, self.etag))

    def __repr__(self) -> str:
        return f"ObjectBytes({self.url!r}, size={self.size})"

    def write(self, start: int, data: Any) -> None:
        """Put bytes ``[start, start + len(data))`` of the object in place (and mark them)."""
        chunk = np.frombuffer(data, np.uint8)
        self.view[start : start + chunk.shape[0]] = chunk
        if self.filled is not None:
            # Granules wholly inside the range, and the object's last (partial) granule.
            first = -(-start // GRANULE)
            end = start + chunk.shape[0]
            last = self.size // GRANULE if end >= self.size else end // GRANULE
            self.filled[first : last + (1 if end >= self.size else 0)] = 1

    def missing(self, start: int, end: int) -> tuple[int, int] | None:
        """The granule-aligned part of ``[start, end)`` not yet cached (None: all present);
        without a cache, ``(start, end)`` itself: presence is then the session's to track."""
        if self.filled is None:
            return start, end
        first, last = start // GRANULE, -(-end // GRANULE)
        absent = np.flatnonzero(self.filled[first:last] == 0)
        if absent.shape[0] == 0:
            return None
        return (
            (first + int(absent[0])) * GRANULE,
            min((first + int(absent[-1]) + 1) * GRANULE, self.size),
        )


def _cached_map(
    cache: Path, url: str, size: int, etag: str | None, length: int
) -> tuple[mmap.mmap, np.ndarray]:
    """The object's sparse cache file and its granule marks, both mapped shared.

    Named by a hash of the URL, size and ETag: a changed object gets a new file. Bytes and
    marks written by one process are seen by every other mapping the same files (DataLoader
    workers); a mark is set only after its bytes are written.
    """
    name = hashlib.sha256(f"{url}\n{size}\n{etag}".encode()).hexdigest()[:32]
    marks_length = max(-(-size // GRANULE), 1)
    maps = []
    for path, nbytes in ((cache / f"{name}.data", length), (cache / f"{name}.marks", marks_length)):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            if os.fstat(fd).st_size != nbytes:
                os.ftruncate(fd, nbytes)
            maps.append(mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED))
        finally:
            os.close(fd)
    return maps[0], np.frombuffer(maps[1], np.uint8)


class RemoteTokens:
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
