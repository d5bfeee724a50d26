"""A slow NumPy oracle of packed batches: every array of the rows given by their pieces.

The compiled fill (:func:`tokstream._kernels.pack.fill_packed`) is checked against it; the
packing contract itself is checked by ``tests/test_packing.py`` from the document boundaries.
"""

from __future__ import annotations

import numpy as np

from tokstream.packing import RowPieces


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
