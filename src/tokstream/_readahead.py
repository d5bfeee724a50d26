"""Read-ahead: the OS reads the next batches' windows while the kernel copies this batch's.

A shuffled stream over a memory-mapped corpus that is not in the page cache waits on one page
fault at a time, so it reads at a fraction of what the device serves with many reads in flight.
A :class:`ReadAhead` works out the window indices of the next batches early (they depend only on
their cursor) and asks the OS to start reading them (``madvise(MADV_WILLNEED)`` through
:meth:`tokstream._space.WindowSpace.advise`), keeping about :data:`WINDOWS_AHEAD` windows,
and at least one batch, in flight ahead of the batch being copied, into the next epoch when the
current one ends (unless the next epoch's order would have to be drawn first: a materialized
shuffle). Each batch's indices are computed once: the batch takes them from the read-ahead when
its turn comes.

When a few sampled windows of each advised batch are all resident, the corpus is taken to be in
memory: after :data:`WARM_AFTER` such batches in a row the read-ahead stops looking ahead and
checks one batch in :data:`WARM_CHECK_EVERY`, so a corpus in the page cache costs next to
nothing; the first check that finds pages missing turns look-ahead back on. The read-ahead only
decides what is read and when; the batches are the same with or without it.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from tokstream._kernels import advice

if TYPE_CHECKING:
    from tokstream._options import StreamOptions
    from tokstream._order import WindowOrder
    from tokstream._space import WindowSpace
    from tokstream._state import Cursor
    from tokstream.shards.source import Residency

#: Windows whose reads are kept in flight ahead of the batch being copied (at least one batch):
#: enough to fill a device's queue, few enough that little is read for nothing if the stream
#: stops. Measured on a virtual disk, 64 to 2048 windows ahead all reached the device's rate.
WINDOWS_AHEAD = 256
#: Windows of a batch checked with ``mincore`` before it is advised.
SAMPLE = 4
#: Batches in a row found resident after which the corpus is taken to be in memory.
WARM_AFTER = 8
#: While the corpus is taken to be in memory, one batch in this many is checked.
WARM_CHECK_EVERY = 16


class ReadAhead:
    """Advises the windows of the next batches of one stream (see the module docstring).

    ``batch_windows(cursor, count)`` replaces ``order.batch_windows`` in the stream: it returns
    the same indices, and on the way advises the batches that follow ``cursor`` in its epoch.
    The caller serialises calls (the stream's lock) and calls :meth:`reset` whenever its cursor
    jumps (a loaded state), so that no batch is taken from a stale look-ahead.
    """

    def __init__(self, order: WindowOrder, gather: WindowSpace, batch_size: int) -> None:
        self._order = order
        self._gather = gather
        #: Batches advised ahead of the one being copied.
        self.depth = max(1, -(-WINDOWS_AHEAD // batch_size))
        self._ahead: deque[tuple[Cursor, np.ndarray]] = deque()
        self._resident_streak = 0
        self._until_check = 0
        # Told before a batch the stream waits for is advised (a remote corpus' fetches).
        self._cold_start = getattr(gather, "cold_start", None)

    @property
    def warm(self) -> bool:
        """Whether the corpus is taken to be in memory (look-ahead off, occasional checks)."""
        return self._resident_streak >= WARM_AFTER

    def batch_windows(self, cursor: Cursor, count: int) -> np.ndarray:
        """The ``count`` window indices of the batch at ``cursor``, as the order has them."""
        starts = self._take(cursor)
        if self.warm:
            if starts is None:
                starts = self._order.batch_windows(cursor, count)
            self._until_check -= 1
            if self._until_check <= 0:
                self._until_check = WARM_CHECK_EVERY
                self._advise(starts)
            return starts
        if starts is None:
            # Nothing was read ahead (the first batch, or a jump): read this one now, all of its
            # windows at once rather than one fault at a time.
            starts = self._order.batch_windows(cursor, count)
            if self._cold_start is not None:
                self._cold_start()
            self._advise(starts)
        last = self._ahead[-1][0] if self._ahead else cursor
        while len(self._ahead) < self.depth:
            following = self._following(last)
            if following is None:
                break
            last = following
            upcoming = self._order.batch_windows(last, self._order.rows_at(last))
            self._advise(upcoming)
            self._ahead.append((last, upcoming))
        return starts

    def _following(self, cursor: Cursor) -> Cursor | None:
        """The cursor of the stream's batch after ``cursor``'s, None after the run's last.

        Into the next epoch only where its cursor is known without drawing its order (every
        order but a materialized shuffle's): ``order.next_epoch`` then changes nothing.
        """
        order = self._order
        following = order.following(cursor)
        if following is not None or order.draws_orders:
            return following
        following = order.next_epoch(cursor)
        if following.epoch >= order.options.epochs or not order.rows_at(following):
            return None
        return following

    def reset(self) -> None:
        """Forget the batches read ahead (their pages stay advised; nothing else changes)."""
        self._ahead.clear()

    def _take(self, cursor: Cursor) -> np.ndarray | None:
        if not self._ahead:
            return None
        head, starts = self._ahead[0]
        if (
            head.epoch == cursor.epoch
            and head.position == cursor.position
            and head.rng_state is cursor.rng_state
        ):
            self._ahead.popleft()
            return starts
        self._ahead.clear()
        return None

    def _advise(self, starts: np.ndarray) -> None:
        if self._gather.advise(starts, SAMPLE):
            self._resident_streak = 0
        else:
            self._resident_streak += 1


def read_ahead(
    order: WindowOrder, space: WindowSpace, options: StreamOptions, residency: Residency | None
) -> ReadAhead | None:
    """A stream's read-ahead, or None.

    Random windows of a memory-mapped corpus are read ahead, and so are the pieces of shuffled
    packed rows (documents in a random order); sequential ones are left to the OS's own
    read-ahead (``MADV_SEQUENTIAL``), arrays in RAM need none. Every window (or packed row's
    pieces) of a remote corpus is fetched ahead (``residency``, :mod:`tokstream.shards.remote`).
    """
    if residency is not None:
        ahead = ReadAhead(order, residency.advisor(space), options.batch_size)
        ahead.depth = max(1, -(-residency.windows_ahead // options.batch_size))
        return ahead
    # A manifest's files are maps even before the first is made (ShardSource.maps_files).
    corpus = space.corpus
    mapped = next(corpus.memory_maps(), None) or getattr(corpus.source, "maps_files", False)
    if options.shuffle and advice.AVAILABLE and mapped:
        return ReadAhead(order, space, options.batch_size)
    return None
