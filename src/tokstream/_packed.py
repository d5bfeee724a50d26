"""A packed stream's samples through the stream's interfaces: its window space and its order.

:class:`PackedSpace` stands where :class:`tokstream._space.WindowSpace` stands for windows: it
numbers the samples (``num_windows`` rows per epoch) and says which pieces each row holds, as
the checked tables :func:`tokstream._kernels.pack.fill_packed` copies from (the call itself is
:mod:`tokstream._batch`'s). :class:`PackedOrder` is the window order over row
positions, so ranks, ``drop_last``, the epoch tail, the state dict and elastic resume are the
windows' own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np

from tokstream._options import StreamOptions
from tokstream._order import WindowOrder
from tokstream._state import Cursor
from tokstream._validate import token_id
from tokstream.corpus import Corpus
from tokstream.packing import Packing


class PackedSpace:
    """A packed stream's samples, in the stream's window-space interface.

    The stream's window index of a sample is ``epoch * num_windows + position`` (its order
    position in that epoch, all ranks together): a packed row depends on its epoch, and the
    order hands it over in the index (:class:`PackedOrder`).
    """

    def __init__(self, corpus: Corpus, options: StreamOptions) -> None:
        self.corpus = corpus
        self.block = options.block
        self.pad = token_id(options.pad, corpus.dtype, "pad")
        boundaries = (
            corpus.document_boundaries
            if options.eos is None
            else corpus.boundaries_with_eos(options.eos)
        )
        self.packing = Packing(
            boundaries, options.block, shuffle=options.shuffle, seed=options.seed
        )
        self.num_windows = self.packing.num_rows
        # Private copies: the kernel's addresses come only from what was validated here.
        self._shards = corpus.shards
        self._shard_starts = corpus.shard_starts.copy()
        self._shard_ends = self._shard_starts + corpus.lengths
        self._shard_addresses = np.array([s.ctypes.data for s in self._shards], np.uint64)
        # ((group, epoch), its checked table): the last group filled from.
        self._cached: tuple[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] | None = (
            None
        )
        # (first, end, table): the window indices [first, end) of the last group filled from.
        self._current: tuple[int, int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None

    def segments_sha256(self) -> str:
        """A hash of the documents packed and of the groups they are cut into."""
        packing = self.packing
        digest = hashlib.sha256(np.ascontiguousarray(packing.boundaries, "<i8").data)
        digest.update(np.ascontiguousarray(packing.group_rows, "<i8").data)
        digest.update(str(packing.group_documents).encode())
        return digest.hexdigest()

    def row_runs(
        self, windows_index: np.ndarray
    ) -> Iterator[tuple[int, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        """``(first row, table rows, table)`` for each run of the batch's rows that lie in one
        group: the batch's rows ``first, first + 1, ...`` are rows ``table rows`` of that
        group's checked table ``(row offsets, piece addresses, piece lengths)`` (see
        :meth:`_table`), which :func:`tokstream._kernels.pack.fill_packed` copies from."""
        rows = windows_index.shape[0]
        if not rows:
            return
        # The order's indices rise through the batch, so the rows of one group are a run; most
        # batches lie in the group the last one ended in.
        first, last = int(windows_index[0]), int(windows_index[-1])
        current = self._current
        if current is not None and current[0] <= first and last < current[1]:
            yield 0, self._checked(windows_index - current[0], current[2]), current[2]
            return
        per_epoch = max(1, self.num_windows)
        epoch = first // per_epoch  # one batch, one epoch
        base = epoch * per_epoch
        order, offsets = self.packing.epoch_offsets(epoch)
        slots = np.searchsorted(offsets, windows_index - base, side="right") - 1
        runs = np.flatnonzero(slots[1:] != slots[:-1]) + 1
        for begin, end in zip([0, *runs.tolist()], [*runs.tolist(), rows], strict=True):
            slot = int(slots[begin])
            table = self._table(int(order[slot]), epoch)
            low = base + int(offsets[slot])
            self._current = (low, base + int(offsets[slot + 1]), table)
            yield begin, self._checked(windows_index[begin:end] - low, table), table

    @staticmethod
    def _checked(local: np.ndarray, table: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """``local``, rising table rows, checked to lie in ``table``."""
        if local[0] < 0 or local[-1] >= table[0].shape[0] - 1:
            raise RuntimeError("a packed sample outside its group: a packing bug")
        return local

    def _table(self, group: int, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(row offsets, piece addresses, piece lengths)`` of a group's rows in streamed
        order, checked once for the kernel: every piece inside one shard, every row within
        ``block + 1`` slots (the last group asked for is kept)."""
        if self._cached is not None and self._cached[0] == (group, epoch):
            return self._cached[1]
        table = self.packing.group_table(group, epoch)
        starts, lengths = table.starts, table.lengths
        shard = np.searchsorted(self._shard_starts, starts, side="right") - 1
        before = np.zeros(lengths.shape[0] + 1, np.int64)
        np.cumsum(lengths, out=before[1:])
        used = np.diff(before[table.row_offsets])
        if (
            (lengths < 1).any()
            or (shard < 0).any()
            or (starts + lengths > self._shard_ends[shard]).any()
            or (used > self.block + 1).any()
            or (np.diff(table.row_offsets) < 0).any()
        ):
            raise RuntimeError("packed rows outside the corpus or their row: a packing bug")
        local = (starts - self._shard_starts[shard]).astype(np.uint64)
        itemsize = np.uint64(self.corpus.dtype.itemsize)
        addresses = self._shard_addresses[shard] + local * itemsize
        for array in (table.row_offsets, addresses, lengths):
            array.flags.writeable = False
        result = (table.row_offsets, addresses, lengths)
        self._cached = ((group, epoch), result)
        return result

    def token_starts(self, windows_index: np.ndarray) -> np.ndarray:
        """Each row's first token (its first piece's) in the shards laid end to end; -1 for a
        row that holds no piece."""
        if not windows_index.shape[0]:
            return np.empty(0, np.int64)
        epoch, positions = np.divmod(windows_index, max(1, self.num_windows))
        pieces = self.packing.rows(int(epoch[0]), positions)
        first = pieces.row_offsets[:-1]
        has_piece = first < pieces.row_offsets[1:]
        starts = np.full(windows_index.shape[0], -1, np.int64)
        starts[has_piece] = pieces.starts[first[has_piece]]
        return starts


class PackedOrder(WindowOrder):
    """The order of a packed stream's samples: positions ``0 .. num_rows - 1`` of each epoch,
    shared by the ranks as windows are; the shuffle is the packing's own (groups and rows in
    keyed orders per epoch), so the positions themselves are not permuted again."""

    def batch_windows(self, cursor: Cursor, count: int) -> np.ndarray:
        first = cursor.epoch * max(1, self.num_windows) + cursor.position + self._rank
        return np.arange(first, first + self._world * count, self._world, dtype=np.int64)
