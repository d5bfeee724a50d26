"""A packed stream's samples through the stream's interfaces: its window space and its order.

:class:`PackedSpace` stands where :class:`tokstream._space.WindowSpace` stands for windows: it
numbers the samples (``num_windows`` rows per epoch) and says which pieces each row holds, as
the checked tables :func:`tokstream._kernels.packed_copy.fill_packed` copies from (the call
itself is :mod:`tokstream._batch`'s). :class:`PackedOrder` is the window order over row
positions, so ranks, ``drop_last``, the epoch tail, the state dict and elastic resume are the
windows' own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np

from tokstream._kernels.advice import advise_at
from tokstream._kernels.packed_copy import piece_addresses
from tokstream._options import StreamOptions
from tokstream._order import WindowOrder
from tokstream._state import Cursor
from tokstream._validate import INT64_MAX, token_id
from tokstream.corpus import Corpus
from tokstream.mixture import Mixture, MixtureOrder, mixture_windows
from tokstream.packing import Packing, RowPieces
from tokstream.shards.source import Readable


class PackedSpace:
    """A packed stream's samples, in the stream's window-space interface.

    The stream's window index of a sample is ``epoch * num_windows + position`` (its order
    position in that epoch, all ranks together): a packed row depends on its epoch, and the
    order hands it over in the index (:class:`PackedOrder`).
    """

    def __init__(self, corpus: Corpus, options: StreamOptions, source: int = 0) -> None:
        self.corpus = corpus
        self.block = options.block
        self.pad = token_id(options.pad, corpus.dtype, "pad")
        boundaries = (
            corpus.document_boundaries
            if options.eos is None
            else corpus.boundaries_with_eos(options.eos)
        )
        self.packing = Packing(
            boundaries, options.block, shuffle=options.shuffle, seed=options.seed, source=source
        )
        self.num_windows = self.packing.num_rows
        # Private copies: the kernel's addresses come only from what was validated here.
        self._shards = corpus.shards
        self._shard_starts = corpus.shard_starts.copy()
        self._shard_ends = self._shard_starts + corpus.lengths
        # Shards read on demand have no address until a batch reads them: their tables hold
        # each piece's shard and byte offset, and row_runs asks the source for the addresses.
        self._source = corpus.source
        self._shard_addresses = (
            np.array([s.ctypes.data for s in self._shards], np.uint64)
            if self._source is None
            else None
        )
        largest = int(corpus.lengths.max(initial=0)) * corpus.dtype.itemsize
        self._shard_shift = max(1, largest.bit_length())
        if self._shard_shift + max(1, len(self._shards) - 1).bit_length() > 63:
            raise ValueError("too many shards, or shards too large, for 64-bit addresses")
        # What a piece's address counts from: its shard's first token, or shard << shift.
        self._shard_bases = (
            self._shard_addresses
            if self._shard_addresses is not None
            else np.arange(len(self._shards), dtype=np.uint64) << np.uint64(self._shard_shift)
        )
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

    def current_group(
        self, windows_index: np.ndarray
    ) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        """``(low, table)`` when the batch's rows (rising) all lie in the group the last
        batch ended in and its shards are in memory: window index ``w`` is then row ``w -
        low`` of that checked ``table`` (see :meth:`row_runs`), whose addresses stay valid
        while the corpus lives. None otherwise: :meth:`row_runs` then."""
        return None if self._source is not None else self._in_current(windows_index)

    def _in_current(
        self, windows_index: np.ndarray
    ) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        """``(low, table)`` of the group the last batch ended in, if every row of this one (a
        nonempty rising batch) lies in it."""
        current = self._current
        if current is None:
            return None
        low, high, table = current
        if low <= windows_index[0] and windows_index[-1] < high:
            return low, table
        return None

    def row_runs(
        self, windows_index: np.ndarray
    ) -> Iterator[tuple[int, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray], Readable]]:
        """``(first row, table rows, table, readable)`` for each run of the batch's rows that
        lie in one group: the batch's rows ``first, first + 1, ...`` are rows ``table rows`` of
        that group's checked table ``(row offsets, piece addresses, piece lengths)`` (see
        :meth:`_table`), which :func:`tokstream._kernels.packed_copy.fill_packed` copies from. The
        addresses of those rows' pieces are valid until ``readable`` is released: release it
        right after the kernel call (shards read on demand are mapped for it)."""
        rows = windows_index.shape[0]
        if not rows:
            return
        # The order's indices rise through the batch, so the rows of one group are a run; most
        # batches lie in the group the last one ended in.
        current = self._in_current(windows_index)
        if current is not None:
            low, table = current
            yield self._resolved(0, self._checked(windows_index - low, table), table)
            return
        per_epoch = max(1, self.num_windows)
        begin = 0
        while begin < rows:
            # The group of the run's first row, in its epoch (a mixture's source may start its
            # next one inside a batch); the run is the batch's rows before that group's end.
            epoch, position = divmod(int(windows_index[begin]), per_epoch)
            base = epoch * per_epoch
            order, offsets = self.packing.epoch_offsets(epoch)
            slot = int(np.searchsorted(offsets, position, side="right")) - 1
            low, high = base + int(offsets[slot]), base + int(offsets[slot + 1])
            end = begin + int(np.searchsorted(windows_index[begin:], high))
            table = self._table(int(order[slot]), epoch)
            self._current = (low, high, table)
            local = self._checked(windows_index[begin:end] - low, table)
            yield self._resolved(begin, local, table)
            begin = end

    @staticmethod
    def _checked(local: np.ndarray, table: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """``local``, rising table rows, checked to lie in ``table``."""
        if local[0] < 0 or local[-1] >= table[0].shape[0] - 1:
            raise RuntimeError("a packed sample outside its group: a packing bug")
        return local

    def _resolved(
        self, first: int, local: np.ndarray, table: tuple[np.ndarray, np.ndarray, np.ndarray]
    ) -> tuple[int, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray], Readable]:
        """A run of :meth:`row_runs` with its pieces' addresses and what keeps them readable."""
        if self._source is None:
            return first, local, table, Readable(table[1])
        # The pieces of these rows, made readable; the rest of the table is never read.
        row_offsets, encoded, lengths = table
        begin, count = row_offsets[local], row_offsets[local + 1] - row_offsets[local]
        ramp = np.arange(int(count.sum()), dtype=np.int64)
        pieces = ramp + np.repeat(begin - (np.cumsum(count) - count), count)
        shift = np.uint64(self._shard_shift)
        readable = self._source.readable(
            (encoded[pieces] >> shift).astype(np.int64),
            (encoded[pieces] & ((np.uint64(1) << shift) - np.uint64(1))).astype(np.int64),
            lengths[pieces] * self.corpus.dtype.itemsize,
        )
        addresses = np.zeros(encoded.shape[0], np.uint64)
        addresses[pieces] = readable.addresses
        return first, local, (row_offsets, addresses, lengths), readable

    def _table(self, group: int, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(row offsets, piece addresses, piece lengths)`` of a group's rows in streamed
        order, checked once for the kernel: every piece inside one shard, every row within
        ``block + 1`` slots (the last group asked for is kept)."""
        if self._cached is not None and self._cached[0] == (group, epoch):
            return self._cached[1]
        table = self.packing.group_table(group, epoch)
        addresses = self._addresses(table)
        lengths = table.lengths
        for array in (table.row_offsets, addresses, lengths):
            array.flags.writeable = False
        result = (table.row_offsets, addresses, lengths)
        self._cached = ((group, epoch), result)
        return result

    def _addresses(self, pieces: RowPieces) -> np.ndarray:
        """Each piece's address (shards read on demand: ``(shard << shift) + byte offset``,
        resolved per batch in :meth:`row_runs`), checked in the same pass: every piece inside one
        shard, every row within ``block + 1`` slots."""
        addresses = np.empty(pieces.starts.shape[0], np.uint64)
        broken = piece_addresses(
            pieces.starts,
            pieces.lengths,
            pieces.row_offsets,
            self.block + 1,
            self._shard_starts,
            self._shard_ends,
            self._shard_bases,
            self.corpus.dtype.itemsize,
            addresses,
        )
        if broken:
            raise RuntimeError("packed rows outside the corpus or their row: a packing bug")
        return addresses

    def piece_addresses(self, windows_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(addresses, byte lengths)`` of the pieces of these rows, where the kernel will
        copy them from: for read-ahead, nothing is read through them. Shards read on demand
        have no address before a batch maps them: none is given for them."""
        itemsize = self.corpus.dtype.itemsize
        addresses, lengths = [np.empty(0, np.uint64)], [np.empty(0, np.int64)]
        if self._shard_addresses is not None and windows_index.shape[0]:
            epochs, positions = np.divmod(windows_index, max(1, self.num_windows))
            for begin, end in _runs(epochs):
                pieces = self.packing.rows(int(epochs[begin]), positions[begin:end])
                addresses.append(self._addresses(pieces))
                lengths.append(pieces.lengths * itemsize)
        return np.concatenate(addresses), np.concatenate(lengths)

    def advise(self, windows_index: np.ndarray, sample: int) -> int:
        """Ask the OS to start reading these rows' pieces, unless a sample of them is in memory
        (see :func:`advise_pieces`)."""
        return advise_pieces(self, windows_index, sample)

    def token_starts(self, windows_index: np.ndarray) -> np.ndarray:
        """Each row's first token (its first piece's) in the shards laid end to end; -1 for a
        row that holds no piece."""
        if not windows_index.shape[0]:
            return np.empty(0, np.int64)
        epochs, positions = np.divmod(windows_index, max(1, self.num_windows))
        starts = np.full(windows_index.shape[0], -1, np.int64)
        for begin, end in _runs(epochs):
            pieces = self.packing.rows(int(epochs[begin]), positions[begin:end])
            first = pieces.row_offsets[:-1]
            has_piece = first < pieces.row_offsets[1:]
            starts[begin:end][has_piece] = pieces.starts[first[has_piece]]
        return starts


class PackedOrder(WindowOrder):
    """The order of a packed stream's samples: positions ``0 .. num_rows - 1`` of each epoch,
    shared by the ranks as windows are; the shuffle is the packing's own (groups and rows in
    keyed orders per epoch), so the positions themselves are not permuted again."""

    def batch_windows(self, cursor: Cursor, count: int) -> np.ndarray:
        first = cursor.epoch * max(1, self.num_windows) + cursor.position + self._rank
        return np.arange(first, first + self._world * count, self._world, dtype=np.int64)


class PackedMixtureSpace:
    """A packed stream over a :func:`tokstream.mix` mixture: each source packs its own
    documents (a :class:`PackedSpace` of its own, keyed by its number), in the interface of
    :class:`PackedSpace`.

    The window index of a sample is ``j * S + s``: source ``s`` of the ``S`` sources, ``j`` that
    source's local sample (its own space's window index: its packing epoch times its rows, plus
    the position), as :class:`PackedMixtureOrder` hands it over.
    """

    def __init__(self, mixture: Mixture, options: StreamOptions) -> None:
        self.corpus = mixture.corpus
        self.block = options.block
        self.pad = token_id(options.pad, self.corpus.dtype, "pad")
        self.sources = [
            PackedSpace(corpus, options, source)
            for source, corpus in enumerate(mixture.sources.values())
        ]
        self.num_windows = sum(space.num_windows for space in self.sources)
        # Each source's first token in the mixture's corpus (its sources laid end to end).
        tokens = [0, *(corpus.num_tokens for corpus in mixture.sources.values())]
        self._token_offsets = np.cumsum(tokens[:-1], dtype=np.int64)

    def segments_sha256(self) -> str:
        """A hash of every source's documents and groups."""
        digest = hashlib.sha256()
        for space in self.sources:
            digest.update(space.segments_sha256().encode())
        return digest.hexdigest()

    def current_group(
        self, windows_index: np.ndarray
    ) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        """None: a mixture's batch is read source by source (:meth:`row_runs`)."""
        return None

    def row_runs(
        self, windows_index: np.ndarray
    ) -> Iterator[tuple[int, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray], Readable]]:
        """:meth:`PackedSpace.row_runs` over the sources: each run of the batch's rows of one
        source and one of its groups."""
        local, source = np.divmod(windows_index, len(self.sources))
        for begin, end in _runs(source):
            space = self.sources[int(source[begin])]
            for first, rows, table, readable in space.row_runs(local[begin:end]):
                yield begin + first, rows, table, readable

    def piece_addresses(self, windows_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`PackedSpace.piece_addresses` over the sources."""
        local, source = np.divmod(windows_index, len(self.sources))
        found = [(np.empty(0, np.uint64), np.empty(0, np.int64))]
        if windows_index.shape[0]:
            found += [
                self.sources[int(source[begin])].piece_addresses(local[begin:end])
                for begin, end in _runs(source)
            ]
        return np.concatenate([f[0] for f in found]), np.concatenate([f[1] for f in found])

    def advise(self, windows_index: np.ndarray, sample: int) -> int:
        """:meth:`PackedSpace.advise` over the sources."""
        return advise_pieces(self, windows_index, sample)

    def token_starts(self, windows_index: np.ndarray) -> np.ndarray:
        """Each row's first token in the mixture's corpus; -1 for a row of no piece."""
        local, source = np.divmod(windows_index, len(self.sources))
        starts = np.full(windows_index.shape[0], -1, np.int64)
        for s in np.unique(source).tolist():
            where = np.flatnonzero(source == s)
            found = self.sources[s].token_starts(local[where])
            starts[where] = np.where(found < 0, -1, found + self._token_offsets[s])
        return starts


class PackedMixtureOrder(MixtureOrder):
    """The order of a packed mixture's samples: the mixture's schedule (its stages and ranks as
    for windows) picks each sample's source ``s`` and that source's local sample ``j``; the
    window index is ``j * S + s`` (:class:`PackedMixtureSpace`). A source's local samples run
    through its packed rows in order, epoch after epoch of its own packing: the shuffle is the
    packing's, so no permutation is drawn on top."""

    def __init__(self, mixture: Mixture, space: PackedMixtureSpace, options: StreamOptions) -> None:
        counts = np.array([source.num_windows for source in space.sources], np.int64)
        for name, count in zip(mixture.names, counts.tolist(), strict=True):
            if count == 0:
                raise ValueError(
                    f"sources[{name!r}] holds no document of at least 2 tokens, so no packed "
                    "row: it cannot give its share of the samples"
                )
        samples = int(counts.sum()) if options.samples is None else options.samples
        self._sources = len(space.sources)
        if options.epochs * samples * self._sources > INT64_MAX:
            raise ValueError(
                f"epochs * samples per epoch * sources = {options.epochs} * {samples} * "
                f"{self._sources} must stay below 2**63 with windows='packed'"
            )
        WindowOrder.__init__(self, samples, options)
        self._mixture = mixture
        firsts = np.cumsum(counts) - counts
        self._kernel = mixture_windows(mixture, firsts, counts, int(counts.sum()), options)

    def fill_extras(self, windows_index: np.ndarray, buffers: dict[str, np.ndarray]) -> None:
        """The ``"source"`` extra: each row's source."""
        if "source" in buffers:
            np.remainder(windows_index, self._sources, out=buffers["source"])

    def batch_windows(self, cursor: Cursor, count: int) -> np.ndarray:
        """Window indices ``j * S + s`` of this rank's batch at ``cursor``."""
        first = cursor.epoch * self.num_windows + cursor.position + self.options.rank
        schedule = self._kernel.schedule(first, self.options.world_size, count)
        return schedule[:, 1] * self._sources + schedule[:, 0]


def packed_parts(
    source: Corpus | Mixture, options: StreamOptions
) -> tuple[PackedSpace | PackedMixtureSpace, WindowOrder]:
    """The space and the order of a packed stream over a corpus or a mixture."""
    if isinstance(source, Mixture):
        space = PackedMixtureSpace(source, options)
        return space, PackedMixtureOrder(source, space, options)
    packed = PackedSpace(source, options)
    return packed, PackedOrder(packed.num_windows, options)


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """``(begin, end)`` of each run of equal consecutive ``values`` (at least one value)."""
    cuts = (np.flatnonzero(values[1:] != values[:-1]) + 1).tolist()
    return list(zip([0, *cuts], [*cuts, values.shape[0]], strict=True))


def advise_pieces(
    space: PackedSpace | PackedMixtureSpace, windows_index: np.ndarray, sample: int
) -> int:
    """``madvise(MADV_WILLNEED)`` on the pieces of rows ``windows_index`` where the kernel will
    copy them from (:func:`tokstream._kernels.advice.advise_at`), the read-ahead's hook
    (:class:`tokstream._readahead.ReadAhead`). Returns how many pieces were advised: 0 when the
    sampled pieces were all resident, or none has an address yet (shards read on demand, which
    a batch maps for its own pieces only)."""
    addresses, lengths = space.piece_addresses(windows_index)
    return advise_at(addresses, 0, sample, lengths)
