"""Shards read on demand, and the hook every batch over them goes through.

A corpus opened from a manifest holds no shard when it is opened: its table of contents gives
each shard's dtype, length and documents, and a shard's file is mapped (and checked against the
table) when a batch first reads it. Such a corpus has a :class:`ShardSource`, and the window
space asks it, just before each kernel call, to make the bytes that call reads readable:

``source.readable(shards, offsets, nbytes)``
    For each range ``i``: ``nbytes`` bytes (a scalar, or one count per range) from byte
    ``offsets[i]`` of shard ``shards[i]``. Returns a :class:`Readable` whose ``addresses[i]``
    is the address of range ``i``'s first byte. Those bytes stay readable and unchanged until
    the :class:`Readable` is released (``with``, or :meth:`Readable.release`); the kernel is
    called in between and keeps no address beyond the call. A range outside its shard is a
    ValueError, and so is a shard whose file disagrees with the table of contents (raised by
    the call that first needs it, before any address is returned).

How a source keeps that promise is its own: :class:`MappedShards` maps whole shard files and
pins the shards a live :class:`Readable` points into; it keeps at most ``capacity`` maps
(least recently used first out) beyond those pinned, so it holds at most ``max(capacity, P)``
maps at any moment, ``P`` being the distinct shards the live Readables point into (the batches
being copied right now, and a read-ahead's batch for the moment it is advised): a batch whose
windows lie in more shards than ``capacity`` has them all mapped while it is copied, and the
maps beyond ``capacity`` are dropped when it is released. A source over object storage may
fetch just the ranges into buffers the :class:`Readable` holds. No address table outlives the
call it was made for, and a pinned map is never dropped, so no kernel reads an unmapped address.

Bytes fetched on demand (object storage) add a second promise, kept by a :class:`Residency`:
before a kernel call reads windows it makes their bytes present and pins them until the call
returns, and it fetches the windows of upcoming batches ahead. A stream asks its corpus for one
through :func:`residency_of`: the corpus' source's (:meth:`ShardSource.residency`; None for local
files, whose bytes the OS pages in), or for shards held as arrays, the one the arrays' memory
makes (:class:`OnDemandTokens`). Python code that reads tokens itself goes through
:func:`present`. Nothing outside the storage kinds needs to know which kind a corpus has.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tokstream._arrays import frozen, frozen_state
from tokstream.shards.filemap import FileMap

if TYPE_CHECKING:
    from tokstream.corpus import Corpus

#: Shard maps a :class:`MappedShards` keeps open by default (a batch in flight whose windows
#: lie in more shards keeps them all until it is copied).
DEFAULT_CAPACITY = 1024


class Readable:
    """Byte ranges made readable by :meth:`ShardSource.readable`: ``addresses``, one a range,
    valid until :meth:`release` (also on leaving a ``with`` block)."""

    def __init__(self, addresses: np.ndarray, release: Any = None, keep: Any = None) -> None:
        self.addresses = addresses
        self._release = release
        self._keep = keep  # what the addresses point into, held until released

    def release(self) -> None:
        """The addresses may be invalid from now on; calling it again does nothing."""
        release, self._release, self._keep = self._release, None, None
        if release is not None:
            release()

    def __enter__(self) -> np.ndarray:
        return self.addresses

    def __exit__(self, *exc: object) -> None:
        self.release()


class Names(Protocol):
    """Shard names by index, for messages (a list, or names made when one is asked for)."""

    def __getitem__(self, index: int, /) -> str: ...

    def __len__(self) -> int: ...


class ShardSource:
    """Where a lazily read corpus' shards come from (see the module).

    ``dtype``, ``lengths`` (tokens per shard, a read-only int64 array) and ``names`` (for
    messages) are known without reading any shard; :meth:`shard` gives a whole shard, checked,
    as an array whose memory lives as long as it; :meth:`readable` is the batch hook.
    """

    dtype: np.dtype
    lengths: np.ndarray
    names: Names
    #: Whether the shards are memory maps of local files, which a shuffled stream reads ahead
    #: (``madvise`` through :meth:`readable`'s addresses).
    maps_files = False
    #: Whether the shards live in object storage (a forked process cannot read them).
    remote = False

    def __setattr__(self, name: str, value: Any) -> None:
        # The checks of every range and shard rest on these two: set once, never replaced, and
        # the lengths a copy nothing can make writeable.
        if name in ("dtype", "lengths"):
            if name in self.__dict__:
                raise AttributeError(f"a shard source's {name} is read-only")
            if name == "lengths":
                value = frozen(np.asarray(value, np.int64))
        super().__setattr__(name, value)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Past __setattr__: the lengths (and every other table) frozen again as unpickled.
        self.__dict__.update(frozen_state(state))

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def shard(self, index: int) -> np.ndarray:
        """Shard ``index`` whole, read-only; its memory is held by the array."""
        raise NotImplementedError

    def readable(self, shards: np.ndarray, offsets: np.ndarray, nbytes: Any) -> Readable:
        """Make the byte ranges readable (the module's contract)."""
        raise NotImplementedError

    def document_boundaries(self) -> np.ndarray | None:
        """Every recorded document's first token in the shards laid end to end, then the token
        count (:attr:`tokstream.Corpus.document_boundaries`); None when none are recorded."""
        return None

    def document_counts(self) -> np.ndarray | None:
        """Documents per shard as :meth:`document_boundaries` counts them (a shard that records
        none is one), or None when none are recorded."""
        return None

    def memory_maps(self) -> Iterator[mmap.mmap | FileMap]:
        """The maps open now (for OS advice)."""
        return iter(())

    def residency(self) -> Residency | None:
        """What a stream asks of these shards around its kernel calls when their bytes are
        fetched on demand (see the module); None: :meth:`readable` suffices."""
        return None

    def advise(self, advice: int | None) -> None:
        """``mmap.MADV_*`` for the maps open now and those made later (None: none)."""

    def check_ranges(self, shards: np.ndarray, offsets: np.ndarray, nbytes: Any) -> None:
        """ValueError unless every range lies inside its shard (the last line of defence: the
        window space computes ranges from the same lengths)."""
        sizes = self.lengths * self.dtype.itemsize
        if shards.shape[0] and (
            int(shards.min()) < 0
            or int(shards.max()) >= sizes.shape[0]
            or int(offsets.min()) < 0
            or bool(np.any(offsets + nbytes > sizes[shards]))
        ):
            raise ValueError("a byte range outside its shard was asked for: a tokstream bug")


class MappedShards(ShardSource):
    """Shards mapped from their files on first use, at most ``capacity`` maps kept.

    Subclasses give :meth:`_open` (map shard ``index`` and check it against what the table of
    contents says, raising ValueError naming the file). Each shard a live :class:`Readable`
    points into is pinned (each Readable's shards are kept until it is released and looked at
    only when a map must be dropped: no cost a batch while the maps fit); maps are dropped
    least recently used first, never a pinned one, before a new one is made, so it holds at most
    ``max(capacity, P)`` maps, ``P`` the distinct pinned shards (a batch whose shards
    outnumber ``capacity`` keeps them all until it is copied; releasing it drops the excess).
    Dropping a map only drops this object's reference: an array a caller holds (from
    :meth:`shard`) keeps its map, outside this count. Thread-safe.
    """

    maps_files = True

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if type(capacity) is not int:
            raise TypeError(f"max_open_maps must be an int, got {type(capacity).__name__}")
        if capacity < 1:
            raise ValueError(f"max_open_maps must be at least 1, got {capacity}")
        self.capacity = capacity
        self._reset()

    def _reset(self) -> None:
        count = len(self)
        self._lock = threading.Lock()
        self._arrays: dict[int, np.ndarray] = {}
        # Zeroed pages: nothing is touched per shard until a shard is used.
        self._bases = np.zeros(count, np.uint64)
        self._resident = np.zeros(count, np.bool_)
        self._stamps = np.zeros(count, np.int64)
        self._tick = 0
        self._live: dict[int, np.ndarray] = {}  # the shards of each live Readable, by number
        self._serial = 0
        self._advice: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_lock", "_arrays", "_bases", "_resident", "_stamps", "_live"):
            del state[key]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._reset()

    def _open(self, index: int) -> np.ndarray:
        raise NotImplementedError

    def shard(self, index: int) -> np.ndarray:
        with self._lock:
            self._tick += 1
            self._stamps[index] = self._tick
            array = self._arrays.get(index)
            if array is None:
                self._evict(1)
                array = self._map(index)
            return array

    def readable(self, shards: np.ndarray, offsets: np.ndarray, nbytes: Any) -> Readable:
        shards = np.array(shards, np.int64)  # a copy: the pins are these, whatever the caller does
        offsets = np.asarray(offsets, np.int64)
        self.check_ranges(shards, offsets, nbytes)
        with self._lock:
            self._tick += 1
            self._stamps[shards] = self._tick
            # The shards stay pinned while the Readable lives: only an eviction looks at them.
            self._serial += 1
            key = self._serial
            self._live[key] = shards
            try:
                missing = shards[~self._resident[shards]]
                if missing.shape[0]:
                    missing = np.unique(missing)
                    self._evict(missing.shape[0])  # room first: never more maps than the bound
                    for index in missing.tolist():
                        self._map(index)
            except BaseException:
                del self._live[key]
                raise
            addresses = self._bases[shards] + offsets.astype(np.uint64)
        return Readable(addresses, lambda: self._released(key))

    def _released(self, key: int) -> None:
        with self._lock:
            del self._live[key]
            if len(self._arrays) > self.capacity:
                self._evict(0)  # a batch over more shards than the bound leaves the bound

    def _map(self, index: int) -> np.ndarray:
        """Map and check shard ``index`` (the lock is held)."""
        array = self._open(index)
        if array.dtype != self.dtype or array.shape != (int(self.lengths[index]),):
            raise ValueError(
                f"token file {self.names[index]}: holds {array.shape[0]} {array.dtype} tokens, "
                f"the manifest says {int(self.lengths[index])} {self.dtype}"
            )
        self._arrays[index] = array
        self._bases[index] = array.ctypes.data
        self._resident[index] = True
        base: object = array.base  # a FileMap for a mapped file (NumPy types it an array)
        if self._advice is not None and isinstance(base, FileMap):
            try:
                base.madvise(self._advice)
            except OSError:
                pass  # advice is a hint
        return array

    def _evict(self, adding: int) -> None:
        """Drop the least recently used unpinned maps until ``adding`` more fit in ``capacity``
        (or none is left unpinned); the lock is held."""
        excess = len(self._arrays) + adding - self.capacity
        if excess <= 0:
            return
        # A batch over many shards evicts once for a while: down to 7/8 of the capacity.
        excess += self.capacity // 8
        unpinned = self._resident.copy()
        for shards in self._live.values():
            unpinned[shards] = False
        candidates = np.flatnonzero(unpinned)
        if candidates.shape[0] > excess:
            oldest = np.argpartition(self._stamps[candidates], excess - 1)[:excess]
            candidates = candidates[oldest]
        for index in candidates.tolist():
            del self._arrays[index]
            self._bases[index] = 0
            self._resident[index] = False

    @property
    def open_maps(self) -> int:
        """How many shards are mapped by this source now."""
        return len(self._arrays)

    def memory_maps(self) -> Iterator[mmap.mmap | FileMap]:
        with self._lock:
            arrays = list(self._arrays.values())
        for array in arrays:
            base: object = array.base  # a FileMap for a mapped file (NumPy types it an array)
            if isinstance(base, FileMap):
                yield base

    def advise(self, advice: int | None) -> None:
        self._advice = advice


class LazyShards(Sequence[np.ndarray]):
    """``Corpus.shards`` of a lazily read corpus: indexing maps (and checks) a shard."""

    def __init__(self, source: ShardSource) -> None:
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self.source.shard(i) for i in range(*index.indices(len(self)))]
        position = range(len(self))[index]  # IndexError and negative indices as a tuple's
        return self.source.shard(position)

    def __iter__(self) -> Iterator[np.ndarray]:
        for index in range(len(self)):
            yield self.source.shard(index)

    def __repr__(self) -> str:
        return f"LazyShards({len(self)} shards)"


class Residency(Protocol):
    """Bytes a kernel reads that must be fetched first, and are fetched ahead (see the module).

    Each ``ensure_*`` returns once every byte the coming kernel call reads is in memory (or
    raises, before the kernel runs), with a context manager: the call runs inside it, and none
    of those bytes is evicted before it leaves.
    """

    #: Windows to keep requested ahead of the batch being copied.
    windows_ahead: int

    def ensure_windows(self, space: Any, windows_index: np.ndarray) -> AbstractContextManager[Any]:
        """The ``(block + 1)``-token windows ``windows_index`` of a window space."""
        ...

    def ensure_at(
        self, addresses: np.ndarray, nbytes: np.ndarray | int
    ) -> AbstractContextManager[Any]:
        """``nbytes`` at each of ``addresses`` (those inside these shards)."""
        ...

    def ensure_pieces(
        self, rows: np.ndarray, row_offsets: np.ndarray, addresses: np.ndarray, lengths: np.ndarray
    ) -> AbstractContextManager[Any]:
        """The pieces of packed rows ``rows``: ``row_offsets[r]:row_offsets[r + 1]`` of the
        pieces, ``lengths[i]`` tokens at ``addresses[i]``."""
        ...

    def advisor(self, space: Any) -> Any:
        """A stand-in for ``space`` in the stream's read-ahead, whose advice fetches ahead."""
        ...

    def close(self) -> None:
        """Cancel what is in flight; end the threads and connections fetching."""
        ...


class OnDemandTokens:
    """The memory a token array held in hand is a view of, when its bytes are fetched on
    demand (object storage): bytes not fetched (or evicted since) read as zeros.

    Subclasses say how: :meth:`residency` for streams over corpora of such arrays,
    :meth:`present` for Python code reading the tokens itself. ``count`` is the array's length.
    """

    count: int

    def residency(self, shards: Sequence[np.ndarray]) -> Residency:
        """The residency of a corpus' shards (this array's among them)."""
        raise NotImplementedError

    def present(self, shard: np.ndarray, start: int, stop: int) -> np.ndarray:
        """``shard[start:stop]`` (``shard`` is exactly this memory's array), its bytes made
        present and kept there for as long as the array returned lives."""
        raise NotImplementedError


def on_demand_of(array: np.ndarray) -> OnDemandTokens | None:
    """The :class:`OnDemandTokens` ``array`` is exactly (not a slice or view of it), else None."""
    base: object = array.base
    if isinstance(base, OnDemandTokens) and array.shape == (base.count,):
        return base
    return None


def present(shard: np.ndarray, start: int = 0, stop: int | None = None) -> np.ndarray:
    """``shard[start:stop]`` as it is stored: for a shard fetched on demand, its bytes fetched
    first and pinned while the array returned lives (read through it, not ``shard``)."""
    stop = shard.shape[0] if stop is None else min(stop, shard.shape[0])
    memory = on_demand_of(shard)
    if memory is None or stop <= start:
        return shard[start:stop]
    return memory.present(shard, start, stop)


def residency_of(corpus: Corpus) -> Residency | None:
    """What a stream over ``corpus`` asks around its kernel calls (see the module); None when
    its bytes need no fetching. A corpus whose shards are read on demand is asked through its
    source (its shards are not all taken: that would map every one)."""
    if corpus.source is not None:
        return corpus.source.residency()
    for shard in corpus.shards:
        memory = on_demand_of(shard)
        if memory is not None:
            return memory.residency(corpus.shards)
    return None


def reads_object_storage(source: Any) -> bool:
    """Whether any shard of a corpus (or of a mixture's sources) lives in object storage, which
    a forked process cannot read."""
    sources = getattr(source, "sources", None)  # a tokstream.mix() mixture
    corpora = list(sources.values()) if isinstance(sources, dict) else [source]
    return any(
        corpus.source.remote
        if corpus.source is not None
        else any(on_demand_of(shard) is not None for shard in corpus.shards)
        for corpus in corpora
    )
