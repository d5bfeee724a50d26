"""A slow NumPy oracle of packed batches: every array of the rows given by their pieces.

The compiled fill (:func:`tokstream._kernels.packed_copy.fill_packed`) is checked against it, and
the compiled group packing (:func:`tokstream._kernels.pack.pack_group`) against :func:`group_table`;
the packing contract itself is checked by ``tests/test_packing.py`` from the document boundaries.
"""

from __future__ import annotations

import numpy as np

from tokstream.packing import (
    _PIECE_ORDER,
    _ROW_ORDER,
    JITTER_QUANTUM,
    Packing,
    RowPieces,
    permuted,
    piece_counts,
)


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
    # A piece lies in one shard (documents never cross shards).
    shard_of = np.searchsorted(shard_starts, pieces.starts, side="right") - 1
    if len(shards) == 1:
        values = shards[0][tokens]
    else:
        shard_of = np.repeat(shard_of, lengths)
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


def best_fit(lengths: list[int], capacity: int) -> list[int]:
    """Best fit by its definition: each item into the open row it leaves the fewest free slots
    in (of several, the one that reached that count last), else into a new row."""
    free: list[int] = []  # free slots of each row
    reached: list[int] = []  # when each row reached its free count
    rows = []
    for step, length in enumerate(lengths):
        fitting = [r for r in range(len(free)) if 0 < free[r] and length <= free[r]]
        if fitting:
            row = min(fitting, key=lambda r: (free[r], -reached[r]))
        else:
            row = len(free)
            free.append(capacity)
            reached.append(step)
        free[row] -= length
        reached[row] = step
        rows.append(row)
    return rows


def group_table(packing: Packing, group: int, epoch: int) -> RowPieces:
    """Group ``group``'s rows in ``epoch`` in streamed order, by the rule of
    :mod:`tokstream.packing`'s docstring in NumPy: the compiled group packing's oracle."""
    block, capacity = packing.block, packing.block + 1
    documents = packing.group_documents_of(group)
    starts = packing.boundaries[documents]
    full, short = piece_counts(packing.boundaries[documents + 1] - starts, block)
    full_offsets = np.concatenate([[0], np.cumsum(full)])
    total = int(packing.group_rows[group])
    packed_rows = total - int(full_offsets[-1])
    items = np.flatnonzero(short)
    rows = None
    if packing.shuffle and packed_rows:
        count = items.shape[0]
        shuffled = items[
            permuted(count, packing.seed, epoch, packing._key + _PIECE_ORDER + group, 0, count)
        ]
        shuffled = shuffled[np.argsort(-(short[shuffled] // JITTER_QUANTUM), kind="stable")]
        rows = np.array(best_fit(short[shuffled].tolist(), capacity), np.int64)
        items = shuffled
        if rows.shape[0] and rows.max() >= packed_rows:
            rows = None  # more rows than the group has: the canonical packing this epoch
    if rows is None:
        items = np.flatnonzero(short)
        items = items[np.argsort(-short[items], kind="stable")]
        rows = np.array(best_fit(short[items].tolist(), capacity), np.int64)
    # Rows left empty each take the last piece placed in the row holding the most.
    members = np.bincount(rows, minlength=packed_rows)
    for row in range(int(rows.max(initial=-1)) + 1, packed_rows):
        fullest = int(np.argmax(members))
        moved = int(np.flatnonzero(rows == fullest)[-1])
        rows[moved] = row
        members[fullest] -= 1
        members[row] = 1
    by_row = np.argsort(rows, kind="stable")
    items, rows = items[by_row], rows[by_row]
    order = np.arange(total)
    if packing.shuffle:
        order = permuted(total, packing.seed, epoch, packing._key + _ROW_ORDER + group, 0, total)
    pieces: list[tuple[int, int]] = []
    row_offsets = [0]
    for row in order.tolist():
        if row < full_offsets[-1]:
            document = int(np.searchsorted(full_offsets, row, side="right")) - 1
            piece = row - int(full_offsets[document])
            pieces.append((int(starts[document]) + piece * block, capacity))
        else:
            for item in items[rows == row - full_offsets[-1]].tolist():
                pieces.append((int(starts[item] + full[item] * block), int(short[item])))
        row_offsets.append(len(pieces))
    table = np.array(pieces, np.int64).reshape(-1, 2)
    return RowPieces(np.array(row_offsets, np.int64), table[:, 0].copy(), table[:, 1].copy())
