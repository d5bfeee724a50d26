"""How many fetched bytes a remote corpus keeps, and which go first: a bounded LRU of extents.

Each remote object's map (:mod:`tokstream.shards.remote._memory`) is cut into extents of
:data:`EXTENT` bytes. The cache counts the pages of each extent that bytes were written into
(a page is memory, or disk with a cache directory, from its first byte written until evicted)
and, once they pass the budget, evicts whole extents, least recently used first: their pages go
back to the OS (``madvise``: ``MADV_DONTNEED`` for anonymous memory, ``MADV_REMOVE``, a hole
punched, for a cache file) and their presence marks are cleared, so a later read fetches them
again. The map itself stays: an evicted page reads as zeros, it never faults.

Pins make eviction safe for kernels that read raw addresses. A range is pinned before its
presence is checked and stays pinned until the kernel call reading it has returned
(:meth:`Session.ensure <tokstream.shards.remote._session.Session.ensure>` returns the pin, the batch
releases it after the call), and a range fetched ahead stays pinned until the batch that reads
it takes it over. A pinned extent is never evicted, so a kernel never reads an evicted byte;
a batch larger than the budget keeps its extents until it is copied.

The budget is ``RemoteOptions.cache_max_bytes``. Without a cache directory and without a budget
it is 0: bytes stay only while a batch in flight or a read ahead needs them, and every epoch
fetches its windows again. With a cache directory and no budget nothing is tracked or evicted
(every byte fetched stays in the files). With a cache directory and a budget, this process's
files live in a slot directory of their own, ``cache_dir/bounded-K``, held under an exclusive
lock for the life of the corpus: no other process punches holes under this one's batches, and a
later run takes a free slot and finds the bytes it kept (the slot's ``.pages`` files say which).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokstream.shards.remote._client import RemoteOptions
    from tokstream.shards.remote._memory import ObjectBytes

PAGE = mmap.PAGESIZE
#: Bytes of an extent: the unit of eviction (its pages are counted one by one).
EXTENT = 16 * PAGE
#: Slot directories tried in a cache directory before a bounded cache gives up.
MAX_SLOTS = 256

#: An extent's key: (the object's number in its cache, the extent's index in the object).
Key = tuple[int, int]


class Pin:
    """Extents a batch or a read ahead needs: not evicted until :meth:`release` (also on
    leaving a ``with`` block). Releasing twice does nothing."""

    __slots__ = ("_parts",)

    def __init__(self, parts: list[tuple[Cache, list[Key]]] | None = None) -> None:
        self._parts = parts

    @classmethod
    def join(cls, pins: Iterable[Pin]) -> Pin:
        """One pin holding what all of ``pins`` hold (each of them is then empty)."""
        parts: list[tuple[Cache, list[Key]]] = []
        for pin in pins:
            parts.extend(pin._parts or ())
            pin._parts = None
        return cls(parts)

    def release(self) -> None:
        parts, self._parts = self._parts, None
        for cache, keys in parts or ():
            cache.unpin(keys)

    def release_later(self) -> None:
        """:meth:`release` from a finalizer, which may run while this very thread holds the
        cache's lock: then (or while another thread holds it) the extents are unpinned by the
        cache's next pin or unpin instead of now."""
        parts, self._parts = self._parts, None
        for cache, keys in parts or ():
            cache.deferred.append(keys)
            cache.undo_deferred()

    def __enter__(self) -> Pin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Cache:
    """The extents of one session's objects: pins, last uses, pages, eviction (module doc)."""

    def __init__(self, options: RemoteOptions) -> None:
        self.max_bytes = options.cache_max_bytes
        #: Whether anything is ever evicted (and so whether uses and pins are tracked at all).
        self.bounded = options.cache_dir is None or self.max_bytes is not None
        #: Whether fetched bytes are remembered (presence marks), so a later read of them
        #: fetches nothing; otherwise a range is present only while its fetch is pending.
        self.keeps = options.cache_dir is not None or bool(self.max_bytes)
        #: Where the objects' cache files are (None: anonymous memory).
        self.directory: Path | None = None
        if options.cache_dir is not None:
            self.directory = Path(options.cache_dir)
            if self.max_bytes is not None:
                self.directory = self._claim_slot(self.directory)
        self._lock = threading.Lock()
        self._objects: weakref.WeakValueDictionary[int, ObjectBytes] = weakref.WeakValueDictionary()
        self._numbered = 0  # objects registered so far: numbers are never reused
        self._forgotten: list[int] = []  # objects dropped, their extents not yet uncounted
        # Resident extents, least recently used first, each with its bit mask of pages holding
        # bytes; and how many pins each pinned extent has.
        self._extents: OrderedDict[Key, int] = OrderedDict()
        self._pins: dict[Key, int] = {}
        #: Pins released by finalizers, undone under the lock by the next pin or unpin.
        self.deferred: list[list[Key]] = []
        #: Bytes of the pages holding fetched bytes now, and of the pages evicted so far.
        self.resident_bytes = 0
        self.evicted_bytes = 0

    def _claim_slot(self, cache: Path) -> Path:
        """The first slot directory of ``cache`` no other process holds, locked for this one."""
        for slot in range(MAX_SLOTS):
            fd = os.open(cache / f"bounded-{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            weakref.finalize(self, os.close, fd)
            directory = cache / f"bounded-{slot}"
            directory.mkdir(exist_ok=True)
            return directory
        raise ValueError(
            f"cache_dir {str(cache)!r}: all {MAX_SLOTS} bounded cache slots are held by other "
            "processes"
        )

    def register(self, obj: ObjectBytes, pages: Any = None) -> int:
        """The number of a new object in this cache; ``pages`` (one page mask per extent, from
        an earlier run's files) says which of its extents already hold bytes."""
        with self._lock:
            number = self._numbered
            self._numbered += 1
            self._objects[number] = obj
            # A dropped object's map is gone: so are its pages.
            weakref.finalize(obj, self.forget, number)
            if pages is not None and self.bounded:
                for extent in pages.nonzero()[0].tolist():
                    mask = int(pages[extent])
                    self._extents[(number, extent)] = mask
                    self.resident_bytes += mask.bit_count() * PAGE
        return number

    def pin(self, requests: Iterable[tuple[ObjectBytes, int, int]]) -> Pin:
        """Pin the extents of ``(object, start, end)`` ranges (and count them as used now)."""
        return self.pin_each([list(requests)])[0]

    def pin_each(self, groups: list[list[tuple[ObjectBytes, int, int]]]) -> list[Pin]:
        """:meth:`pin` of each group of ranges, one pin a group, under one lock."""
        if not self.bounded:
            return [Pin() for _ in groups]
        keyed = [
            [
                (obj.number, extent)
                for obj, start, end in group
                if end > start
                for extent in range(start // EXTENT, (end - 1) // EXTENT + 1)
            ]
            for group in groups
        ]
        with self._lock:
            self._undo_deferred()
            pins, extents = self._pins, self._extents
            for keys in keyed:
                for key in keys:
                    pins[key] = pins.get(key, 0) + 1
                    if key in extents:
                        extents.move_to_end(key)
        return [Pin([(self, keys)]) for keys in keyed]

    def unpin(self, keys: list[Key]) -> None:
        """Undo :meth:`pin` of ``keys``, then evict down to the budget if it is exceeded."""
        with self._lock:
            self._undo_deferred()
            self._unpin(keys)
            self._shrink()

    def _unpin(self, keys: list[Key]) -> None:
        pins = self._pins
        for key in keys:
            left = pins[key] - 1
            if left:
                pins[key] = left
            else:
                del pins[key]

    def undo_deferred(self) -> None:
        """Undo the deferred pins now, unless the lock is held (by any thread)."""
        if self._lock.acquire(blocking=False):
            try:
                self._undo_deferred()
                self._shrink()
            finally:
                self._lock.release()

    def _undo_deferred(self) -> None:
        while self.deferred:
            self._unpin(self.deferred.pop())
        if self._forgotten:
            gone = set(self._forgotten)
            self._forgotten.clear()
            for key in [key for key in self._extents if key[0] in gone]:
                self.resident_bytes -= self._extents.pop(key).bit_count() * PAGE

    def forget(self, number: int) -> None:
        """Object ``number`` was dropped (its map with it): its pages no longer count. Runs
        from a finalizer, so the extents are uncounted by the next pin or unpin."""
        self._forgotten.append(number)

    def wrote(self, obj: ObjectBytes, start: int, end: int) -> None:
        """Count the pages of ``[start, end)`` of ``obj`` as holding bytes (the lock is held)."""
        if not self.bounded:
            return
        extents = self._extents
        for extent in range(start // EXTENT, (end - 1) // EXTENT + 1):
            base = extent * EXTENT
            first = (max(start, base) - base) // PAGE
            last = (min(end, base + EXTENT) - 1 - base) // PAGE
            key = (obj.number, extent)
            old = extents.get(key, 0)
            mask = old | (((1 << (last - first + 1)) - 1) << first)
            if mask != old:
                extents[key] = mask
                self.resident_bytes += (mask.bit_count() - old.bit_count()) * PAGE
                obj.pages_written(extent, mask)

    @property
    def lock(self) -> threading.Lock:
        """Held while bytes are marked present or evicted."""
        return self._lock

    def _shrink(self) -> None:
        """Evict unpinned extents, least recently used first, until the resident bytes are
        7/8 of the budget (at once a while, not an extent a batch); the lock is held."""
        budget = self.max_bytes or 0
        if not self.bounded or self.resident_bytes <= budget:
            return
        excess = self.resident_bytes - (budget - budget // 8)
        victims: list[tuple[Key, int]] = []
        for key, mask in self._extents.items():
            if key not in self._pins:
                victims.append((key, mask))
                excess -= mask.bit_count() * PAGE
                if excess <= 0:
                    break
        for key, mask in victims:
            del self._extents[key]
            freed = mask.bit_count() * PAGE
            self.resident_bytes -= freed
            self.evicted_bytes += freed
            obj = self._objects.get(key[0])
            if obj is not None:
                obj.evict(key[1])

    def pinned_extents(self) -> int:
        """How many extents are pinned now (by batches in flight and reads ahead)."""
        with self._lock:
            return len(self._pins)
