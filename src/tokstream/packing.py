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

import bisect
import hashlib
from typing import NamedTuple

import numpy as np

from tokstream import _order
from tokstream._options import StreamOptions
from tokstream._order import WindowOrder
from tokstream._state import Cursor
from tokstream._validate import token_id
from tokstream.corpus import Corpus

#: About this many rows per group: enough that the group's last, partly filled rows are a small
#: share of its slots (best fit decreasing over such a group pads about 0.05-0.2% of the slots
#: of lognormal documents at block 2048 and 8192), few enough to pack one in a fraction of a ms.
GROUP_ROWS = 1024

#: A group never holds more documents than this (tiny documents would otherwise make one group
#: of millions).
MAX_GROUP_DOCUMENTS = 1 << 16

#: Shuffled epochs sort short pieces by length in quanta this wide, in a new order within each:
#: wide enough to change most rows from epoch to epoch, narrow enough that best fit still fits
#: the canonical row count plus one spare (a simulation over lognormal documents: never more).
JITTER_QUANTUM = 16

# Keys of the implicit permutations (tokstream._order.implicit_round_keys' ``stream``), far
# from a mixture's source numbers: the documents' fixed order, each epoch's group order, and
# per group and epoch, the short pieces' order and the rows' order.
_DOCUMENT_ORDER = 1 << 62
_GROUP_ORDER = _DOCUMENT_ORDER + 1
_PIECE_ORDER = 1 << 63
_ROW_ORDER = _PIECE_ORDER + (1 << 40)


def piece_counts(lengths: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """``(full pieces, short piece length or 0)`` of documents of ``lengths`` tokens."""
    labels = np.maximum(lengths.astype(np.int64) - 1, 0)
    full, rest = np.divmod(labels, block)
    return full, np.where(rest > 0, rest + 1, 0)


def permuted(n: int, seed: int, epoch: int, stream: int, first: int, count: int) -> np.ndarray:
    """Positions ``first .. first + count - 1`` of the keyed permutation of ``[0, n)``."""
    out = np.empty(count, np.int64)
    if count:
        low_bits, high_size = _order.implicit_domain(n)
        keys = _order.implicit_round_keys(seed, epoch, stream=stream & _order.MASK64)
        _order.permuted_positions(out, first, 1, n, low_bits, high_size, keys)
    return out


def best_fit(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """The row of each item placed in the given order by best fit: into the open row whose free
    slots it leaves fewest (the earliest such row on a tie), else a new row."""
    rows = np.empty(lengths.shape[0], np.int64)
    free: list[tuple[int, int]] = []  # (free slots, row) of rows with room, sorted
    opened = 0
    for i, length in enumerate(lengths.tolist()):
        at = bisect.bisect_left(free, (length, -1))
        if at == len(free):
            row, left = opened, capacity - length
            opened += 1
        else:
            left, row = free.pop(at)
            left -= length
        rows[i] = row
        if left:
            bisect.insort(free, (left, row))
    return rows


class PackedGroup(NamedTuple):
    """One group's rows in one epoch, in the group's row order.

    Rows ``[0, full_offsets[-1])`` hold one full piece each: row ``r`` is piece ``r -
    full_offsets[d]`` of the group's document ``d`` (the last ``d`` with ``full_offsets[d] <=
    r``). Row ``full_offsets[-1] + b`` holds short pieces ``row_offsets[b] ..
    row_offsets[b + 1] - 1``, whose first tokens and lengths are ``piece_starts`` and
    ``piece_lengths``. ``row_order[k]`` is the row streamed ``k``-th.
    """

    document_starts: np.ndarray
    full_offsets: np.ndarray
    row_offsets: np.ndarray
    piece_starts: np.ndarray
    piece_lengths: np.ndarray
    row_order: np.ndarray | None


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
    ) -> None:
        self.block = block
        self.shuffle = shuffle
        self.seed = seed
        self._boundaries = boundaries
        self.num_documents = boundaries.shape[0] - 1
        if group_documents is None:
            mean = max(1.0, float(boundaries[-1] - boundaries[0]) / max(1, self.num_documents))
            group_documents = int(min(MAX_GROUP_DOCUMENTS, -(-GROUP_ROWS * (block + 1) // mean)))
        self.group_documents = max(1, min(group_documents, max(1, self.num_documents)))
        self.num_groups = -(-self.num_documents // self.group_documents)
        counts = np.empty(self.num_groups, np.int64)
        for group in range(self.num_groups):
            counts[group] = self._row_count(group)
        self.group_rows = counts
        self.group_offsets = np.zeros(self.num_groups + 1, np.int64)
        np.cumsum(counts, out=self.group_offsets[1:])
        self.num_rows = int(self.group_offsets[-1])
        self._epoch_offsets: tuple[int, np.ndarray, np.ndarray] | None = None
        self._packed: tuple[int, int, PackedGroup] | None = None

    # ------------------------------------------------------------------ groups

    def group_documents_of(self, group: int) -> np.ndarray:
        """The indices of group ``group``'s documents, in group order."""
        first = group * self.group_documents
        count = min(self.group_documents, self.num_documents - first)
        if not self.shuffle:
            return np.arange(first, first + count, dtype=np.int64)
        return permuted(self.num_documents, self.seed, 0, _DOCUMENT_ORDER, first, count)

    def _pieces(self, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(document starts, full pieces, short piece lengths, short piece starts)``."""
        documents = self.group_documents_of(group)
        starts = self._boundaries[documents]
        full, short = piece_counts(self._boundaries[documents + 1] - starts, self.block)
        return starts, full, short, starts + full * self.block

    def _canonical(self, short: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(short pieces in placement order, their rows)`` of best fit decreasing."""
        items = np.flatnonzero(short)
        items = items[np.argsort(-short[items], kind="stable")]
        return items, best_fit(short[items], self.block + 1)

    def _row_count(self, group: int) -> int:
        _, full, short, _ = self._pieces(group)
        items, rows = self._canonical(short)
        packed = int(rows.max(initial=-1)) + 1
        spare = 1 if self.shuffle and items.shape[0] > packed else 0
        return int(full.sum()) + packed + spare

    def group(self, group: int, epoch: int) -> PackedGroup:
        """Group ``group``'s rows in ``epoch`` (cached: the last group asked for)."""
        cached = self._packed
        if cached is not None and cached[0] == group and cached[1] == epoch:
            return cached[2]
        packed = self._pack(group, epoch)
        self._packed = (group, epoch, packed)
        return packed

    def _pack(self, group: int, epoch: int) -> PackedGroup:
        starts, full, short, short_starts = self._pieces(group)
        full_offsets = np.zeros(full.shape[0] + 1, np.int64)
        np.cumsum(full, out=full_offsets[1:])
        total = int(self.group_rows[group])
        packed_rows = total - int(full_offsets[-1])
        items, rows = self._canonical(short)
        if self.shuffle and items.shape[0]:
            order = permuted(items.shape[0], self.seed, epoch, _PIECE_ORDER + group, 0, len(items))
            shuffled = np.flatnonzero(short)[order]
            shuffled = shuffled[np.argsort(-(short[shuffled] // JITTER_QUANTUM), kind="stable")]
            jittered = best_fit(short[shuffled], self.block + 1)
            if jittered.max() < packed_rows:
                items, rows = shuffled, jittered
        rows = _fill_empty_rows(rows, packed_rows)
        by_row = np.argsort(rows, kind="stable")
        items, rows = items[by_row], rows[by_row]
        row_offsets = np.searchsorted(rows, np.arange(packed_rows + 1), side="left")
        row_order = None
        if self.shuffle:
            row_order = permuted(total, self.seed, epoch, _ROW_ORDER + group, 0, total)
        return PackedGroup(
            starts, full_offsets, row_offsets, short_starts[items], short[items], row_order
        )

    # ------------------------------------------------------------------ samples

    def epoch_offsets(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(groups in epoch order, the first sample of each then the sample count)``."""
        cached = self._epoch_offsets
        if cached is None or cached[0] != epoch:
            if self.shuffle:
                order = permuted(
                    self.num_groups, self.seed, epoch, _GROUP_ORDER, 0, self.num_groups
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
        starts: list[np.ndarray] = [np.empty(0, np.int64)] * samples.shape[0]
        lengths: list[np.ndarray] = [np.empty(0, np.int64)] * samples.shape[0]
        for slot in np.unique(slots).tolist():
            where = np.flatnonzero(slots == slot)
            packed = self.group(int(order[slot]), epoch)
            local = samples[where] - offsets[slot]
            if packed.row_order is not None:
                local = packed.row_order[local]
            for i, row in zip(where.tolist(), local.tolist(), strict=True):
                starts[i], lengths[i] = self._row(packed, row)
                counts[i] = lengths[i].shape[0]
        row_offsets = np.zeros(samples.shape[0] + 1, np.int64)
        np.cumsum(counts, out=row_offsets[1:])
        if not samples.shape[0]:
            return RowPieces(row_offsets, np.empty(0, np.int64), np.empty(0, np.int64))
        return RowPieces(row_offsets, np.concatenate(starts), np.concatenate(lengths))

    def _row(self, packed: PackedGroup, row: int) -> tuple[np.ndarray, np.ndarray]:
        fulls = int(packed.full_offsets[-1])
        if row < fulls:
            document = int(np.searchsorted(packed.full_offsets, row, side="right")) - 1
            piece = row - int(packed.full_offsets[document])
            start = int(packed.document_starts[document]) + piece * self.block
            return np.array([start], np.int64), np.array([self.block + 1], np.int64)
        low, high = packed.row_offsets[row - fulls], packed.row_offsets[row - fulls + 1]
        return packed.piece_starts[low:high], packed.piece_lengths[low:high]


def _fill_empty_rows(rows: np.ndarray, count: int) -> np.ndarray:
    """``rows`` spread over ``count`` rows: each row beyond the last used takes the last piece
    of the row holding the most (the earliest on a tie). The caller guarantees more pieces
    than ``count`` whenever a row is left empty."""
    used = int(rows.max(initial=-1)) + 1
    if used >= count:
        return rows
    rows = rows.copy()
    members = [[] for _ in range(used)]
    for i, row in enumerate(rows.tolist()):
        members[row].append(i)
    for row in range(used, count):
        fullest = max(range(len(members)), key=lambda r: (len(members[r]), -r))
        moved = members[fullest].pop()
        rows[moved] = row
        members.append([moved])
    return rows


def fill_rows(
    shards: tuple[np.ndarray, ...],
    shard_starts: np.ndarray,
    pieces: RowPieces,
    block: int,
    pad: int,
) -> dict[str, np.ndarray]:
    """A packed batch of the rows ``pieces`` in NumPy: every array the stream can return.

    ``input_ids`` and ``labels`` (slots ``[0, block)`` and ``[1, block + 1)``, padding ``pad``),
    ``loss_mask`` (False where the label is padding or starts another piece), ``document_ids``
    (the piece of each input slot within its row, the padding a piece of its own),
    ``position_ids`` (restarting at every piece and at the padding) and ``cu_seqlens`` with
    ``max_seqlen`` (the pieces of the flattened inputs, the padding one of them).
    """
    rows, width = pieces.row_offsets.shape[0] - 1, block + 1
    lengths = pieces.lengths
    per_row = np.diff(pieces.row_offsets)
    # Each piece's first slot: its row's first slot plus the tokens before it in the row.
    ends = np.cumsum(lengths)
    firsts = ends - lengths
    before = np.concatenate([[0], ends])[pieces.row_offsets]  # tokens before each row
    filled = np.diff(before)
    row_of_piece = np.repeat(np.arange(rows, dtype=np.int64), per_row)
    first_slots = row_of_piece * width + firsts - before[row_of_piece]
    slots = np.full(rows * width, pad, np.int64)
    piece_of_slot = np.repeat(np.arange(lengths.shape[0]), lengths)
    within = np.arange(piece_of_slot.shape[0]) - np.repeat(firsts, lengths)
    tokens = np.repeat(pieces.starts, lengths) + within
    shard_of = np.searchsorted(shard_starts, tokens, side="right") - 1
    values = np.empty(tokens.shape[0], np.int64)
    for shard in np.unique(shard_of).tolist():
        where = shard_of == shard
        values[where] = shards[shard][tokens[where] - shard_starts[shard]]
    slots[np.repeat(first_slots, lengths) + within] = values
    slots = slots.reshape(rows, width)
    used = np.zeros(rows * width, bool)
    used[np.repeat(first_slots, lengths) + within] = True
    starts = np.zeros(rows * width, bool)
    starts[first_slots] = True
    # The padding starts a piece of its own where the row's pieces end before its last slot.
    padded = np.flatnonzero(filled < width)
    starts[padded * width + filled[padded]] = True
    used, starts = used.reshape(rows, width), starts.reshape(rows, width)
    document_ids = np.cumsum(starts, axis=1, dtype=np.int64) - 1
    columns = np.broadcast_to(np.arange(width), (rows, width))
    position_ids = columns - np.maximum.accumulate(np.where(starts, columns, 0), axis=1)
    piece_starts = np.flatnonzero(starts[:, :block].ravel())
    cu_seqlens = np.append(piece_starts, rows * block).astype(np.int32)
    return {
        "input_ids": np.ascontiguousarray(slots[:, :block]),
        "labels": np.ascontiguousarray(slots[:, 1:]),
        "loss_mask": used[:, 1:] & ~starts[:, 1:],
        "document_ids": np.ascontiguousarray(document_ids[:, :block]).astype(np.int32),
        "position_ids": np.ascontiguousarray(position_ids[:, :block]),
        "cu_seqlens": cu_seqlens,
        "max_seqlen": int(np.diff(cu_seqlens).max(initial=0)),
    }


# ---------------------------------------------------------------------------------------------
# The stream's side: packed rows as its window index space, and their order


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
        self._shard_starts = corpus.shard_starts.copy()

    def segments_sha256(self) -> str:
        """A hash of the documents packed and of the groups they are cut into."""
        packing = self.packing
        digest = hashlib.sha256(np.ascontiguousarray(packing._boundaries, "<i8").data)
        digest.update(np.ascontiguousarray(packing.group_rows, "<i8").data)
        digest.update(str(packing.group_documents).encode())
        return digest.hexdigest()

    def __call__(
        self,
        windows_index: np.ndarray,
        windows: np.ndarray,
        next_tokens: np.ndarray | None = None,
        targets: np.ndarray | None = None,
        position_ids: np.ndarray | None = None,
        label_continues: np.ndarray | None = None,
        document_ids: np.ndarray | None = None,
    ) -> None:
        """Fill a batch's buffers with the rows of ``windows_index`` (see the class)."""
        rows, wide = windows_index.shape[0], (windows_index.shape[0], self.block)
        buffers = (windows, targets, position_ids, label_continues, document_ids)
        if next_tokens is not None or any(b is not None and b.shape != wide for b in buffers):
            raise ValueError(f"a batch buffer is not {wide}: reshaped in place?")
        if not rows:
            return
        epoch, positions = np.divmod(windows_index, max(1, self.num_windows))
        pieces = self.packing.rows(int(epoch[0]), positions)
        batch = fill_rows(self.corpus.shards, self._shard_starts, pieces, self.block, self.pad)
        windows[...] = batch["input_ids"]
        targets[...] = batch["labels"]
        if position_ids is not None:
            position_ids[...] = batch["position_ids"]
        if label_continues is not None:
            label_continues[...] = batch["loss_mask"]
        if document_ids is not None:
            document_ids[...] = batch["document_ids"]


class PackedOrder(WindowOrder):
    """The order of a packed stream's samples: positions ``0 .. num_rows - 1`` of each epoch,
    shared by the ranks as windows are; the shuffle is the packing's own (groups and rows in
    keyed orders per epoch), so the positions themselves are not permuted again."""

    def batch_windows(self, cursor: Cursor, count: int) -> np.ndarray:
        first = cursor.position + self._rank
        positions = np.arange(first, first + self._world * count, self._world, dtype=np.int64)
        return positions + cursor.epoch * max(1, self.num_windows)
