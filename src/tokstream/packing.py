"""``windows="packed"``: whole documents packed into rows by best fit, new rows every epoch.

A packed sample is a row of ``block + 1`` token slots (``block`` inputs, each followed by its
label) holding whole documents back to back, the rest padding.

Pieces. A document of ``L >= 2`` tokens is cut the way ``stride=block`` windows cut a shard:
piece ``k`` holds tokens ``[k * block, min((k + 1) * block + 1, L))`` for ``k < ceil((L - 1) /
block)``, so each piece shares its last token with the next one's first. Every token of a
document but its first is then a non-first token of exactly one piece, which is what makes it a
label exactly once per epoch; a document of at most ``block + 1`` tokens is one piece, never
split. A document of 0 or 1 tokens has no label and holds no piece. Pieces of ``block + 1``
tokens (*full* pieces) fill a row alone; the others (each longer document's remainder, every
shorter document) are *short* pieces, which are packed.

Groups. The documents are laid out in a fixed order (the corpus order unshuffled; shuffled, a
keyed permutation of it by ``seed``, the same every epoch) and cut into groups of
``group_documents`` consecutive documents, sized so that a group fills about
:data:`GROUP_ROWS` rows. A group's rows are its full pieces, one row each, then its short pieces
packed by best fit decreasing: longest first (ties in group order), each into the open row it
fills most tightly, else into a new row. That *canonical* packing fixes the group's row count
``R_g`` once, for every epoch: the canonical count, and shuffled one spare row more when the
group has more short pieces than canonical rows. Fixing ``R_g`` is what keeps an epoch's sample
count fixed (``len()``, ranks, ``drop_last``, the state dict and elastic resume work on row
indices exactly as on windows) and makes any sample's row cost one group's packing, not a pass
over the epoch: the groups' row counts are the only table (O(groups)), and each epoch adds one
cumulative count in its group order (O(groups)). Padding is ``R_g * (block + 1)`` slots less the
group's pieces' tokens.

Epochs. Unshuffled, every epoch is the canonical packing, groups and rows in order. Shuffled,
epoch ``e`` packs each group's short pieces by best fit in a new order: by length in quanta of
:data:`JITTER_QUANTUM` tokens, longest first, a keyed permutation by ``(seed, e, group)``
ordering each quantum; if that needs more than the group's rows, the canonical packing is used
that epoch. Rows left empty each take one piece from the rows holding the most. Then the groups
come in a keyed order of the epoch, and each group's rows in a keyed order of its own. Two
epochs' rows differ wherever the quanta leave best fit a choice, and the documents of a group
are the only ones ever packed together (its documents are spread over the corpus when
shuffled).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tokstream import _permutation
from tokstream._kernels import pack as _pack
from tokstream._kernels.order import permuted_positions

#: About this many rows per group: enough that the group's last, partly filled rows are a small
#: share of its slots (best fit decreasing over such a group pads about 0.05-0.2% of the slots
#: of lognormal documents at block 2048 and 8192), few enough to pack one in a fraction of a ms.
GROUP_ROWS = 1024

#: A group never holds more documents than this (tiny documents would otherwise make one group
#: of millions).
MAX_GROUP_DOCUMENTS = 1 << 16

#: The row counts of the groups are found this many documents at a time (the scratch memory).
CHUNK_DOCUMENTS = 1 << 20

#: Shuffled epochs sort short pieces by length in quanta this wide, in a new order within each:
#: wide enough to change most rows from epoch to epoch, narrow enough that best fit still fits
#: the canonical row count plus one spare (a simulation over lognormal documents: never more).
JITTER_QUANTUM = 16

# Keys of the implicit permutations (tokstream._permutation.implicit_round_keys' ``stream``), far
# from a mixture's source numbers: the documents' fixed order, each epoch's group order, and
# per group and epoch, the short pieces' order and the rows' order.
_DOCUMENT_ORDER = 1 << 62
_GROUP_ORDER = _DOCUMENT_ORDER + 1
_PIECE_ORDER = 1 << 63
_ROW_ORDER = _PIECE_ORDER + (1 << 40)
# Source s of a mixture adds s << _SOURCE_SHIFT to each (groups stay below 1 << 40).
_SOURCE_SHIFT = 48

# "No order" for the group kernel (the identity, or no shuffled placement).
_NONE = np.empty(0, np.int64)
_NONE.flags.writeable = False


def piece_counts(lengths: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """``(full pieces, short piece length or 0)`` of documents of ``lengths`` tokens."""
    labels = np.maximum(lengths.astype(np.int64) - 1, 0)
    full, rest = np.divmod(labels, block)
    return full, np.where(rest > 0, rest + 1, 0)


def permuted(n: int, seed: int, epoch: int, stream: int, first: int, count: int) -> np.ndarray:
    """Positions ``first .. first + count - 1`` of the keyed permutation of ``[0, n)``."""
    out = np.empty(count, np.int64)
    if count:
        low_bits, high_size = _permutation.implicit_domain(n)
        keys = _permutation.implicit_round_keys(seed, epoch, stream=stream & _permutation.MASK64)
        permuted_positions(out, first, 1, n, low_bits, high_size, keys)
    return out


def best_fit(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """The row of each item placed in the given order by best fit: into an open row it leaves
    the fewest free slots in, else a new row. Of several such rows, the one that reached that
    free count last (a stack per free count, so the compiled loop finds it in O(1)).

    Every length must lie in ``[1, capacity]``.
    """
    count = lengths.shape[0]
    lengths = np.ascontiguousarray(lengths, np.int64)
    if count and not (1 <= lengths.min() and lengths.max() <= capacity):
        raise ValueError(f"best_fit: lengths must lie in [1, {capacity}]")
    rows = np.empty(count, np.int64)
    _pack.best_fit(
        lengths,
        capacity,
        rows,
        np.full(capacity + 1, -1, np.int64),
        np.zeros(capacity // 64 + 1, np.uint64),
        np.empty(count, np.int64),
    )
    return rows


class RowPieces(NamedTuple):
    """The pieces of some rows: row ``i`` holds pieces ``row_offsets[i] .. row_offsets[i + 1] -
    1``, piece ``j`` the ``lengths[j]`` tokens from ``starts[j]`` (in the shards laid end to
    end), laid side by side from the row's first slot."""

    row_offsets: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray


class Packing:
    """The rows of a packed stream: which pieces fill sample ``p`` of epoch ``e``.

    Parameters
    ----------
    boundaries
        Each document's first token in the shards laid end to end, then the token count (a
        corpus' ``document_boundaries``, or ``boundaries_with_eos(eos)``): O(documents), read,
        not copied.
    block
        Tokens per row less one: a row has ``block + 1`` slots.
    shuffle, seed
        Shuffled epochs (module docstring) keyed by ``seed``, or the corpus order every epoch.
    group_documents
        Documents per group (default: about :data:`GROUP_ROWS` rows' worth).

    Making one packs every group once (their row counts): O(documents) time and O(groups)
    memory. Afterwards any row costs at most one group's packing; the last group packed is kept.
    """

    def __init__(
        self,
        boundaries: np.ndarray,
        block: int,
        *,
        shuffle: bool,
        seed: int,
        group_documents: int | None = None,
        source: int = 0,
    ) -> None:
        self.block = block
        self.shuffle = shuffle
        self.seed = seed
        # A mixture's sources pack by keys of their own (source 0's are a lone corpus's).
        self._key = source << _SOURCE_SHIFT
        self.boundaries = boundaries
        self.num_documents = boundaries.shape[0] - 1
        if group_documents is None:
            mean = max(1.0, float(boundaries[-1] - boundaries[0]) / max(1, self.num_documents))
            group_documents = int(min(MAX_GROUP_DOCUMENTS, -(-GROUP_ROWS * (block + 1) // mean)))
        self.group_documents = max(1, min(group_documents, max(1, self.num_documents)))
        self.num_groups = -(-self.num_documents // self.group_documents)
        counts = np.empty(self.num_groups, np.int64)
        # Groups of about CHUNK_DOCUMENTS documents at a time: O(chunk) scratch, whatever the
        # corpus.
        per_chunk = max(1, CHUNK_DOCUMENTS // self.group_documents)
        for first in range(0, self.num_groups, per_chunk):
            last = min(first + per_chunk, self.num_groups)
            counts[first:last] = self._row_counts(first, last)
        self.group_rows = counts
        self.group_offsets = np.zeros(self.num_groups + 1, np.int64)
        np.cumsum(counts, out=self.group_offsets[1:])
        self.num_rows = int(self.group_offsets[-1])
        self._epoch_offsets: tuple[int, np.ndarray, np.ndarray] | None = None
        self._table: tuple[tuple[int, int], RowPieces] | None = None
        self._empty_stacks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    # ------------------------------------------------------------------ groups

    def group_documents_of(self, group: int) -> np.ndarray:
        """The indices of group ``group``'s documents, in group order."""
        first = group * self.group_documents
        count = min(self.group_documents, self.num_documents - first)
        if not self.shuffle:
            return np.arange(first, first + count, dtype=np.int64)
        return permuted(self.num_documents, self.seed, 0, self._key + _DOCUMENT_ORDER, first, count)

    def _row_counts(self, first: int, last: int) -> np.ndarray:
        """Groups ``first .. last - 1``'s row counts (see the module docstring)."""
        start = first * self.group_documents
        count = min(last * self.group_documents, self.num_documents) - start
        if self.shuffle:
            documents = permuted(
                self.num_documents, self.seed, 0, self._key + _DOCUMENT_ORDER, start, count
            )
        else:
            documents = np.arange(start, start + count, dtype=np.int64)
        groups = last - first
        packed, items, fulls = (np.empty(groups, np.int64) for _ in range(3))
        capacity = self.block + 1
        _pack.canonical_rows(
            self.boundaries,
            documents,
            self.group_documents,
            self.block,
            packed,
            items,
            fulls,
            np.zeros(capacity + 1, np.int64),
            np.full(capacity + 1, -1, np.int64),
            np.zeros(capacity // 64 + 1, np.uint64),
            np.empty(self.group_documents, np.int64),
        )
        spare = (items > packed) if self.shuffle else 0
        return fulls + packed + spare

    def group_table(self, group: int, epoch: int) -> RowPieces:
        """Every row of group ``group`` in ``epoch``, in the order they are streamed (cached:
        the last group asked for)."""
        cached = self._table
        if cached is not None and cached[0] == (group, epoch):
            return cached[1]
        table = self._pack(group, epoch)
        self._table = ((group, epoch), table)
        return table

    def _pack(self, group: int, epoch: int) -> RowPieces:
        documents = self.group_documents_of(group)
        # Each document's first token, full pieces and short piece length, in one pass.
        starts, full, short = np.empty((3, documents.shape[0]), np.int64)
        fulls, pieces = _pack.group_pieces(
            self.boundaries, documents, self.block, starts, full, short
        )
        total = int(self.group_rows[group])
        packed_rows = total - fulls
        if packed_rows < 0:
            raise RuntimeError("a group with fewer rows than full pieces: a packing bug")
        shuffled = self.shuffle and packed_rows > 0
        piece_order = (
            permuted(pieces, self.seed, epoch, self._key + _PIECE_ORDER + group, 0, pieces)
            if shuffled
            else _NONE
        )
        row_order = (
            permuted(total, self.seed, epoch, self._key + _ROW_ORDER + group, 0, total)
            if self.shuffle
            else _NONE
        )
        piece_starts, piece_lengths = np.empty((2, fulls + pieces), np.int64)
        table = RowPieces(np.empty(total + 1, np.int64), piece_starts, piece_lengths)
        # The kernel's scratch: a document each, a short piece each (four), a packed row each
        # and one, a full piece each.
        items = np.empty(documents.shape[0], np.int64)
        placed, rows, by_row, stack_next = np.empty((4, pieces), np.int64)
        row_firsts, full_starts = np.empty(packed_rows + 1, np.int64), np.empty(fulls, np.int64)
        # Taken out while in use: a thread packing meanwhile makes its own.
        stacks = self._take_stacks()
        failed = _pack.pack_group(
            starts, full, short, self.block, piece_order, JITTER_QUANTUM if shuffled else 0,
            row_order, *table, items, placed, rows, by_row, row_firsts, full_starts, *stacks,
            stack_next,
        )  # fmt: skip
        if failed:
            raise RuntimeError("a group's pieces do not fit its rows: a packing bug")
        self._empty_stacks.append(stacks)
        return table

    def _take_stacks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The group kernel's counts and best-fit stacks, empty (see
        :mod:`tokstream._kernels.pack`): kept from group to group (the kernel leaves them empty
        again when it packs a group whole), one set for each thread packing at once."""
        try:
            return self._empty_stacks.pop()  # one step: no two threads take the same set
        except IndexError:
            capacity = self.block + 1
            return (
                np.zeros(capacity + 2, np.int64),
                np.full(capacity + 1, -1, np.int64),
                np.zeros(capacity // 64 + 1, np.uint64),
            )

    # ------------------------------------------------------------------ samples

    def epoch_offsets(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(groups in epoch order, the first sample of each then the sample count)``."""
        cached = self._epoch_offsets
        if cached is None or cached[0] != epoch:
            if self.shuffle:
                order = permuted(
                    self.num_groups, self.seed, epoch, self._key + _GROUP_ORDER, 0, self.num_groups
                )
            else:
                order = np.arange(self.num_groups, dtype=np.int64)
            offsets = np.zeros(self.num_groups + 1, np.int64)
            np.cumsum(self.group_rows[order], out=offsets[1:])
            cached = self._epoch_offsets = (epoch, order, offsets)
        return cached[1], cached[2]

    def rows(self, epoch: int, samples: np.ndarray) -> RowPieces:
        """The pieces of samples ``samples`` (positions in ``[0, num_rows)``) of ``epoch``.

        Samples of one group are looked up together, so consecutive samples pack each group
        they touch once.
        """
        order, offsets = self.epoch_offsets(epoch)
        slots = np.searchsorted(offsets, samples, side="right") - 1
        counts = np.empty(samples.shape[0], np.int64)
        firsts = np.empty(samples.shape[0], np.int64)
        starts, lengths = [], []
        base = 0
        for slot in np.unique(slots).tolist():
            where = np.flatnonzero(slots == slot)
            table = self.group_table(int(order[slot]), epoch)
            local = samples[where] - offsets[slot]
            counts[where] = table.row_offsets[local + 1] - table.row_offsets[local]
            firsts[where] = table.row_offsets[local] + base
            starts.append(table.starts)
            lengths.append(table.lengths)
            base += table.starts.shape[0]
        row_offsets = np.zeros(samples.shape[0] + 1, np.int64)
        np.cumsum(counts, out=row_offsets[1:])
        # Piece j of the result is piece taken[j] of the groups' tables laid end to end.
        within = np.arange(int(row_offsets[-1])) - np.repeat(row_offsets[:-1], counts)
        taken = np.repeat(firsts, counts) + within
        if not samples.shape[0]:
            return RowPieces(row_offsets, np.empty(0, np.int64), np.empty(0, np.int64))
        return RowPieces(row_offsets, np.concatenate(starts)[taken], np.concatenate(lengths)[taken])


def packing_summary(boundaries: np.ndarray, block: int, seed: int = 0) -> dict[str, float | int]:
    """What ``windows="packed"`` makes of documents of ``boundaries`` at ``block``.

    ``documents`` (all, empty ones included), ``pieces``, ``split`` (the share of the documents
    of at least 2 tokens cut into several pieces: those longer than ``block + 1``), ``padding``
    (the share of a shuffled epoch's slots that are padding) and ``kept`` (the share of the
    tokens that are in a piece: all but those of documents of one token).
    """
    lengths = np.diff(boundaries)
    full, short = piece_counts(lengths, block)
    counted = lengths >= 2
    packing = Packing(boundaries, block, shuffle=True, seed=seed)
    slots = packing.num_rows * (block + 1)
    used = int((full * (block + 1) + short).sum())
    tokens = int(lengths.sum())
    return {
        "documents": int(lengths.shape[0]),
        "pieces": int(full.sum() + np.count_nonzero(short)),
        "split": round(float((lengths[counted] > block + 1).mean()), 4) if counted.any() else 0.0,
        "padding": round(1 - used / slots, 4) if slots else 0.0,
        "kept": round(int(lengths[counted].sum()) / tokens, 4) if tokens else 0.0,
    }
