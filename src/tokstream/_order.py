"""Which window each batch holds: epoch orders, their positions, and each rank's share of them.

Every epoch has an order, a bijection of the ``num_windows`` window indices: the identity
(``shuffle=False``), one ``RandomState.permutation`` per epoch drawn from a single generator
(``permutation="materialized"``, the reference generator's order), or a keyed Feistel network
evaluated per position (``permutation="implicit"``, no O(windows) memory).

Sharding follows ``torch.utils.data.DistributedSampler``: with ``world_size = W`` the epoch order
is cut to its first ``(n // W) * W`` positions (the at most ``W - 1`` left over are skipped that
epoch, so that every rank yields the same number of batches of the same sizes) and rank ``r``
takes positions ``r, r + W, r + 2W, ...``. Global step ``k`` (all ranks together) therefore
consumes positions ``[k * W * batch_size, (k + 1) * W * batch_size)`` of the order.

The tail: each epoch, the last ``n % W`` positions of that epoch's order are not streamed (a
shuffled order puts different windows there every epoch). ``drop_last=True`` also drops the
final partial global batch, so an epoch streams the first ``(n // (W * B)) * W * B``
positions. Every full global batch is therefore the same for any ``W`` of the same ``W * B``;
without ``drop_last`` the final partial one holds the positions up to ``(n // W) * W`` and so
depends on ``W``.

Any shape on resume: the cursor counts positions (global samples), not batches, so a state
saved with one ``(W, B)`` loads into any other. The run continues from the first position not
yet consumed, the global sequence of positions unchanged: from position ``p`` the batches hold
``[p, p + W' B')``, ``[p + W' B', ...)``, ... and the epoch ends with the new world's tail rule
applied to what is left: the ``(n - p) % W'`` positions left over are skipped, and with
``drop_last`` a final global batch of fewer than ``W' B'`` positions too (a cursor with no
batch left starts the next epoch). From position 0, and from any ``p`` that is a multiple of
``W'``, that is exactly the rule above.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from tokstream._kernels.order import permuted_positions, round_keys
from tokstream._memory import available_memory
from tokstream._options import StreamOptions
from tokstream._state import Cursor

MASK64 = (1 << 64) - 1
FEISTEL_ROUNDS = 6


class WindowOrder:
    """The window indices of every batch of a stream over ``num_windows`` windows.

    Pure in the cursor: the windows of a batch depend only on the :class:`Cursor` they are asked
    for, so a cursor from a state dict reproduces the uninterrupted run. The one drawn epoch
    order (materialized shuffle) and the implicit permutation's round keys are cached for the
    epoch they belong to.
    """

    def __init__(self, num_windows: int, options: StreamOptions) -> None:
        self.num_windows = num_windows
        self.options = options
        self.draws_orders = options.shuffle and options.permutation == "materialized"
        # Positions of the order used per epoch: a multiple of world_size, so ranks stay equal.
        world, global_batch = options.world_size, options.global_batch_size
        self.positions_per_epoch = (num_windows // world) * world
        self._batch_size, self._world, self._drop_last = (
            options.batch_size,
            world,
            options.drop_last,
        )
        self.batches_per_epoch = self.batches_from(0)
        # Largest number of rows any batch of this rank holds.
        self.max_rows = min(options.batch_size, self.positions_per_epoch // world)
        # The per-batch arithmetic reads these, not the options, to keep the fixed cost small.
        self._rank, self._shuffle, self._global_batch = options.rank, options.shuffle, global_batch
        if self.draws_orders:
            check_order_fits(num_windows)
        self._implicit_domain = implicit_domain(max(num_windows, 1))
        self._implicit_keys: tuple[int, np.ndarray | None] = (-1, None)
        # (epoch, its order, the generator's state after drawing it) for the drawn epoch.
        self._drawn: tuple[int, np.ndarray, tuple] | None = None

    def first_cursor(self) -> Cursor:
        """The cursor of the run's first batch."""
        rng_state = np.random.RandomState(self.options.seed).get_state()
        return Cursor(0, 0, rng_state if self.draws_orders else None)

    def rows_at(self, cursor: Cursor) -> int:
        """How many windows this rank's batch at ``cursor`` holds; 0 when the epoch has no
        batch left there (fewer than ``W`` positions, or with ``drop_last`` a partial batch)."""
        rows = min(self._batch_size, max(0, self.num_windows - cursor.position) // self._world)
        return 0 if self._drop_last and rows < self._batch_size else rows

    def batches_from(self, position: int) -> int:
        """Global batches of an epoch from order position ``position`` to the epoch's end."""
        rows = max(0, self.num_windows - position) // self._world
        full, rest = divmod(rows, self._batch_size)
        return full + (1 if rest and not self._drop_last else 0)

    def batch_windows(self, cursor: Cursor, count: int) -> np.ndarray:
        """Window indices of this rank's batch at ``cursor``: order positions ``p + r + k W``.

        ``count`` is at most :meth:`rows_at`, so every position ``p + r + k W < p + count W <=
        num_windows`` (a loaded cursor's ``p`` is at most ``num_windows``, checked by
        :func:`tokstream._state.decode`), and every order maps ``[0, num_windows)`` onto itself:
        each index is a valid window for the kernel.
        """
        world = self._world
        first = cursor.position + self._rank
        if not self._shuffle:
            return np.arange(first, first + world * count, world, dtype=np.int64)
        if not self.draws_orders:
            return self._implicit(cursor.epoch, first, world, count)
        order = self._order(cursor)
        return order[first : first + world * count : world]

    def after(self, cursor: Cursor) -> Cursor:
        """The cursor after the global batch at ``cursor``: the next one, or the next epoch's."""
        return self.following(cursor) or self.next_epoch(cursor)

    def following(self, cursor: Cursor) -> Cursor | None:
        """The cursor of the next global batch of ``cursor``'s epoch; None after its last.

        Unlike :meth:`after`, it never crosses into the next epoch, so it changes nothing.
        """
        following = Cursor(cursor.epoch, cursor.position + self._global_batch, cursor.rng_state)
        return following if self.rows_at(following) else None

    def cursor_at(self, epoch: int, position: int, known: Cursor) -> Cursor:
        """The cursor at order position ``position`` of ``epoch``.

        O(1) but for drawn orders, whose cursor carries the generator at the epoch's start:
        that is found by drawing the orders of the epochs before it, from ``known`` (a cursor
        of this stream) when it is not past ``epoch``, else from the seed.
        """
        if not self.draws_orders:
            return Cursor(epoch, position, None)
        start = known if known.epoch <= epoch else self.first_cursor()
        rng = np.random.RandomState()
        rng.set_state(start.rng_state)
        for _ in range(epoch - start.epoch):
            rng.permutation(self.num_windows)
        return Cursor(epoch, position, rng.get_state())

    def next_epoch(self, cursor: Cursor) -> Cursor:
        """The first cursor of the epoch after ``cursor``'s."""
        rng_state = None
        if self.draws_orders:
            self._order(cursor)
            rng_state = self._drawn[2]
            self._drawn = None  # freed before the next epoch's order is drawn
        return Cursor(cursor.epoch + 1, 0, rng_state)

    def fingerprint(self) -> dict[str, Any]:
        """What decides the order beyond the corpus and the options (a mixture's sources)."""
        return {}

    def fill_extras(self, windows_index: np.ndarray, buffers: dict[str, np.ndarray]) -> None:
        """Write the extras only the order knows (a mixture's ``"source"``) for the rows of
        ``windows_index`` into ``buffers``; one corpus has none."""

    def release(self) -> None:
        """Drop the cached epoch order (it is drawn again if asked for)."""
        self._drawn = None

    def _order(self, cursor: Cursor) -> np.ndarray:
        drawn = self._drawn
        if drawn is None or drawn[0] != cursor.epoch:
            rng = np.random.RandomState()
            rng.set_state(cursor.rng_state)
            order = rng.permutation(self.num_windows)
            # One assignment: a Ctrl-C that lands here leaves the cache empty or whole.
            drawn = self._drawn = (cursor.epoch, order, rng.get_state())
        return drawn[1]

    def _implicit(self, epoch: int, first: int, step: int, count: int) -> np.ndarray:
        if self._implicit_keys[0] != epoch:
            self._implicit_keys = (epoch, implicit_round_keys(self.options.seed, epoch))
        low_bits, high_size = self._implicit_domain
        windows = np.empty(count, dtype=np.int64)
        permuted_positions(
            windows, first, step, self.num_windows, low_bits, high_size, self._implicit_keys[1]
        )
        return windows


#: A materialized order may take at most this fraction of the memory available when the stream
#: is made; a larger one is refused rather than left to swap or be killed minutes later.
ORDER_MEMORY_FRACTION = 0.5


def check_order_fits(num_windows: int) -> None:
    """Refuse a materialized order that would not fit in memory, before anything is allocated.

    Drawing ``RandomState.permutation(n)`` holds ``n`` int64 window indices (and takes about a
    minute per 10**9 of them); at more than :data:`ORDER_MEMORY_FRACTION` of the available
    memory the stream is refused with a ValueError naming ``permutation="implicit"``, which
    orders the same windows with no O(windows) memory. Where the available memory cannot be
    known, nothing is refused.
    """
    available = available_memory()
    needed = 8 * num_windows
    if available is None or needed <= ORDER_MEMORY_FRACTION * available:
        return
    raise ValueError(
        f"permutation='materialized' would hold an order of {num_windows:,} windows, "
        f"{needed / 2**30:,.1f} GiB of int64, more than {ORDER_MEMORY_FRACTION:.0%} of the "
        f"{available / 2**30:,.1f} GiB of memory available; pass permutation='implicit' (the "
        "same windows in a keyed pseudo-random order, no O(windows) memory; not the reference "
        "generator's order)"
    )


#: From this many windows on, drawing a materialized order takes about a second or more
#: (``RandomState.permutation`` draws ~7 million a second on a quiet core, far fewer on a busy
#: one), paid before the first batch and again every epoch.
SLOW_DRAW_WINDOWS = 1 << 22


def warn_if_slow_draw(num_windows: int) -> None:
    """Warn, before anything is drawn, when a materialized order would take seconds to draw.

    Called when a stream's order is materialized by default, never when it was asked for.
    Decided from the window count alone (never timed). The message names
    ``permutation="implicit"``, which needs no draw; Python's warning filter shows it once per
    place it is raised from, not once per stream or epoch.
    """
    if num_windows < SLOW_DRAW_WINDOWS:
        return
    warnings.warn(
        f"permutation='materialized' draws an order of {num_windows:,} windows "
        f"({8 * num_windows / 2**20:,.0f} MiB of int64, about a second per 7 million windows) "
        "before the first batch and again every epoch, for byte parity with the reference "
        "generator; pass permutation='implicit' for the same windows in a keyed pseudo-random "
        "order with no draw and no O(windows) memory",
        UserWarning,
        stacklevel=2,
    )


def implicit_domain(n: int) -> tuple[int, int]:
    """``(low_bits, high_size)`` of the implicit permutation's domain for ``n >= 1`` windows.

    The domain ``high_size * 2**low_bits`` is the smallest multiple of ``2**low_bits`` that is
    ``>= n``, with ``2**low_bits`` about ``sqrt(n)``: it overshoots n by less than ``2**low_bits``.
    """
    low_bits = ((n - 1).bit_length() + 1) // 2
    high_size = -(-n // (1 << low_bits))
    return low_bits, high_size


def implicit_round_keys(
    seed: int, epoch: int, rounds: int = FEISTEL_ROUNDS, stream: int = 0
) -> np.ndarray:
    """Round keys of the implicit permutation of ``epoch``: splitmix64 seeded by both.

    ``stream`` keeps apart permutations of one seed and epoch (a mixture's sources); 0 is a
    single corpus.
    """
    keys = np.empty(rounds, dtype=np.uint64)
    round_keys(keys, seed, epoch & MASK64, stream)
    return keys
