"""The packed rows' copy: a batch's rows filled from the pieces best fit placed in them.

Which piece goes in which row is :mod:`tokstream._kernels.pack`. Nothing here validates or
allocates; the Python side (``tokstream.plan.packed``) proves every index and address in range.
"""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t, uintptr_t

from libc.string cimport memset

from tokstream._kernels.copy cimport convert, fill_run, prefetch_window, ramp_run, tokstream_fill_int32
from tokstream._kernels.types cimport out_t, token_t

cdef extern from *:
    """
    #ifndef TOKSTREAM_DEBUG
    #define TOKSTREAM_DEBUG 0
    #endif
    """
    const bint TOKSTREAM_DEBUG


cdef inline bint _holds(Py_ssize_t *shape, Py_ssize_t rows, Py_ssize_t width) noexcept:
    # Whether a buffer of ``shape`` has at least ``rows`` rows of exactly ``width``.
    return shape[0] >= rows and shape[1] == width


cdef inline void _count_piece(
    int32_t *starts,
    Py_ssize_t capacity,
    Py_ssize_t *found,
    Py_ssize_t *longest,
    Py_ssize_t start,
    Py_ssize_t length,
) noexcept nogil:
    # One more piece of ``length`` input slots from flat index ``start``: written into
    # ``starts`` while it has room (``capacity``), counted either way.
    if found[0] < capacity:
        starts[found[0]] = <int32_t>start
    found[0] += 1
    if length > longest[0]:
        longest[0] = length


# Cython embeds the signature of a fused function's dispatcher; the docstring states it instead.
@cython.embedsignature(False)
def fill_packed(
    const token_t[::1] anchor,
    const uint64_t[::1] addresses,
    const int64_t[::1] lengths,
    const int64_t[::1] row_offsets,
    const int64_t[::1] rows,
    int64_t row_base,
    Py_ssize_t first_row,
    Py_ssize_t block,
    int64_t pad,
    out_t[:, ::1] input_ids,
    out_t[:, ::1] labels,
    uint8_t[:, ::1] label_continues,
    out_t[:, ::1] position_ids,
    int32_t[:, ::1] document_ids,
    Py_ssize_t cache_ahead=0,
    int32_t[::1] piece_starts=None,
):
    """fill_packed(const token_t[::1] anchor, const uint64_t[::1] addresses, const int64_t[::1] lengths, const int64_t[::1] row_offsets, const int64_t[::1] rows, int64_t row_base, Py_ssize_t first_row, Py_ssize_t block, int64_t pad, out_t[:, ::1] input_ids, out_t[:, ::1] labels, uint8_t[:, ::1] label_continues, out_t[:, ::1] position_ids, int32_t[:, ::1] document_ids, Py_ssize_t cache_ahead=0, int32_t[::1] piece_starts=None) -> tuple

    Row ``first_row + k`` of the batch is row ``t = rows[k] - row_base`` of the table: pieces
    ``row_offsets[t] .. row_offsets[t + 1] - 1`` laid side by side from slot 0 of ``block + 1``
    slots, piece ``i`` the ``lengths[i]`` tokens of the
    corpus dtype (``anchor``'s, which only picks the specialisation) from address
    ``addresses[i]``; the slots after them ``pad``. ``input_ids`` gets slots ``[0, block)``,
    ``labels`` slots ``[1, block + 1)``, ``label_continues`` 1 where the label continues the
    piece of the slot before it (0 at a piece's first token and in the padding),
    ``position_ids`` each input slot's place in its piece and ``document_ids`` its piece's
    number in the row, the padding counting as a piece of its own. The last three may be
    None, and are then not written. Tokens and position ids are written in ``out_t`` (int64 or
    int32).

    Returns ``(fitted, pieces, longest)``: ``fitted`` False when a token does not fit
    ``out_t`` (the rows are then wrong and must not be handed out); ``pieces`` the pieces of
    the rows' input slots (each piece's, the padding's), ``longest`` the most input slots one
    of them holds. The first ``len(piece_starts)`` of their starts, as flat indices of the
    batch (``row * block + slot``, row counted in the buffers), go into ``piece_starts`` in
    order: ``cu_seqlens`` without its end (the pieces ``position_ids`` restarts at).
    With ``cache_ahead=d > 0`` the pieces of the batch's row ``k + d`` (of
    this call) are requested into the cache (a software prefetch) before row ``k`` is filled
    (:func:`tokstream._batch.rows_ahead` chooses ``d``).

    The rows and the buffers are checked here: a row outside the table, a buffer not
    ``block`` wide or without rows ``first_row .. first_row + len(rows) - 1`` is a ValueError
    before anything is written (a caller that reshaped a buffer through ``.base`` is refused,
    never written past). The table is the caller's to guarantee, as
    :func:`piece_addresses` checks it: every address readable for its piece's length (a piece
    of a shard the caller keeps alive), every length >= 1, each table row's lengths summing
    to at most ``block + 1``, ``row_offsets`` nondecreasing from 0 to ``len(lengths)``; and
    ``pad`` (and ``block``) fitting out_t.
    """
    cdef Py_ssize_t count = rows.shape[0], table_rows = row_offsets.shape[0] - 1
    cdef Py_ssize_t k, r, t, i, j, slot, length, inputs, piece
    cdef Py_ssize_t found = 0, longest = 0
    cdef Py_ssize_t capacity = piece_starts.shape[0] if piece_starts is not None else 0
    cdef int32_t *starts = &piece_starts[0] if capacity > 0 else NULL
    if not (
        first_row >= 0
        and _holds(input_ids.shape, first_row + count, block)
        and _holds(labels.shape, first_row + count, block)
        and (label_continues is None or _holds(label_continues.shape, first_row + count, block))
        and (position_ids is None or _holds(position_ids.shape, first_row + count, block))
        and (document_ids is None or _holds(document_ids.shape, first_row + count, block))
    ):
        raise ValueError(
            f"a batch buffer is not {block} wide with rows {first_row} .. "
            f"{first_row + count - 1} (input_ids {tuple(input_ids.shape)[:2]}): reshaped in place?"
        )
    for k in range(count):
        if not 0 <= rows[k] - row_base < table_rows:
            raise ValueError(f"fill_packed: row {rows[k]} outside the table's {table_rows} rows")
    cdef bint write_mask = label_continues is not None
    cdef bint write_positions = position_ids is not None
    cdef bint write_documents = document_ids is not None
    cdef const token_t *tokens
    cdef out_t *inputs_row
    cdef out_t *labels_row
    cdef uint8_t *mask_row = NULL
    cdef out_t *positions_row = NULL
    cdef int32_t *documents_row = NULL
    cdef uint64_t outside = 0
    with nogil:
        for k in range(count):
            # first_row + k is a row of every buffer, rows[k] - row_base a table row (checked
            # above).
            r = first_row + k
            if cache_ahead > 0 and cache_ahead < count - k:
                # Row rows[k + cache_ahead]'s pieces: each readable for its length.
                t = rows[k + cache_ahead] - row_base
                for i in range(row_offsets[t], row_offsets[t + 1]):
                    prefetch_window(<const token_t *><uintptr_t>addresses[i], lengths[i] - 1)
            t = rows[k] - row_base
            inputs_row = &input_ids[r, 0]
            labels_row = &labels[r, 0]
            if write_mask:
                mask_row = &label_continues[r, 0]
            if write_positions:
                positions_row = &position_ids[r, 0]
            if write_documents:
                documents_row = &document_ids[r, 0]
            slot = 0
            piece = 0
            for i in range(row_offsets[t], row_offsets[t + 1]):
                tokens = <const token_t *><uintptr_t>addresses[i]
                length = lengths[i]
                if TOKSTREAM_DEBUG and not (1 <= length and slot + length <= block + 1):
                    with gil:
                        raise IndexError(f"piece {i} of {length} tokens does not fit its row")
                # Inputs are the slots below block; slot + length <= block + 1.
                inputs = min(length, block - slot)
                outside |= convert(tokens, inputs, &inputs_row[slot])
                # Labels straight from the tokens (reading them back from inputs_row right
                # after writing it stalls when the two rows' addresses alias modulo 4 KiB):
                # slot slot + j is label slot + j - 1, for slot + j in [1, block] (the last
                # slot is a label only, so every token is checked by one of the two copies).
                j = 1 if slot == 0 else 0
                outside |= convert(
                    &tokens[j], min(length, block + 1 - slot) - j, &labels_row[slot + j - 1]
                )
                if write_mask:
                    # The label of slot slot starts the piece; labels slot .. slot + length - 2
                    # continue it.
                    if slot > 0:
                        mask_row[slot - 1] = 0
                    memset(&mask_row[slot], 1, length - 1)
                if write_positions:
                    ramp_run(&positions_row[slot], inputs)
                if write_documents:
                    tokstream_fill_int32(documents_row + slot, inputs, <int32_t>piece)
                if inputs > 0:
                    _count_piece(starts, capacity, &found, &longest, r * block + slot, inputs)
                slot += length
                piece += 1
            # The padding: slots slot .. block (the last is a label only).
            if slot < block:
                _count_piece(starts, capacity, &found, &longest, r * block + slot, block - slot)
                fill_run(&inputs_row[slot], block - slot, pad)
                if write_positions:
                    ramp_run(&positions_row[slot], block - slot)
                if write_documents:
                    tokstream_fill_int32(documents_row + slot, block - slot, <int32_t>piece)
            # Labels max(slot, 1) - 1 .. block - 1 are padding (a row of no piece: all of them).
            j = max(slot, 1)
            if j <= block:
                fill_run(&labels_row[j - 1], block + 1 - j, pad)
                if write_mask:
                    memset(&mask_row[j - 1], 0, block + 1 - j)
    return outside == 0, found, longest


cdef inline Py_ssize_t _shard_of(
    const int64_t[::1] shard_starts, int64_t token
) noexcept nogil:
    # The last shard starting at or before token (an empty shard before it starts there too, so
    # the one found is the shard holding it), -1 before the first: numpy's
    # searchsorted(shard_starts, token, side="right") - 1.
    cdef Py_ssize_t low = 0, high = shard_starts.shape[0], middle
    while low < high:
        # low <= middle < high <= len(shard_starts).
        middle = low + ((high - low) >> 1)
        if shard_starts[middle] <= token:
            low = middle + 1
        else:
            high = middle
    return low - 1


cdef Py_ssize_t _piece_addresses(
    const int64_t[::1] starts,
    const int64_t[::1] lengths,
    const int64_t[::1] row_offsets,
    Py_ssize_t row_slots,
    const int64_t[::1] shard_starts,
    const int64_t[::1] shard_ends,
    const uint64_t[::1] shard_bases,
    Py_ssize_t itemsize,
    uint64_t[::1] addresses,
) noexcept nogil:
    # piece_addresses' loops (its docstring), the tables' lengths checked to agree.
    cdef Py_ssize_t pieces = starts.shape[0], rows = row_offsets.shape[0] - 1, i, k, shard
    cdef int64_t used, low, high
    for i in range(pieces):
        shard = _shard_of(shard_starts, starts[i])
        # 0 <= shard < len(shard_starts) once checked: the shard tables' rows.
        if lengths[i] < 1 or shard < 0 or starts[i] > shard_ends[shard] - lengths[i]:
            return i + 1
        addresses[i] = shard_bases[shard] + <uint64_t>((starts[i] - shard_starts[shard]) * itemsize)
    for k in range(rows):
        low, high = row_offsets[k], row_offsets[k + 1]
        if low < 0 or high < low or high > pieces:
            return -(k + 1)
        used = 0
        # low <= i < high <= len(lengths): checked just above.
        for i in range(low, high):
            used += lengths[i]
        if used > row_slots:
            return -(k + 1)
    return 0


def piece_addresses(
    const int64_t[::1] starts,
    const int64_t[::1] lengths,
    const int64_t[::1] row_offsets,
    Py_ssize_t row_slots,
    const int64_t[::1] shard_starts,
    const int64_t[::1] shard_ends,
    const uint64_t[::1] shard_bases,
    Py_ssize_t itemsize,
    uint64_t[::1] addresses,
):
    """Each piece's address, checked against the shards and its row, in one pass.

    Piece ``i`` holds the ``lengths[i]`` tokens from token ``starts[i]`` of the shards laid end
    to end (shard ``s`` holds tokens ``shard_starts[s] .. shard_ends[s] - 1``, the starts
    nondecreasing); row ``k`` holds pieces ``row_offsets[k] .. row_offsets[k + 1] - 1``.
    ``addresses[i]`` gets ``shard_bases[s] + (starts[i] - shard_starts[s]) * itemsize`` for the
    shard ``s`` holding the piece's first token (the last shard starting at or before it).

    Returns 0 when every piece has at least one token and lies inside that shard, and every row
    is a run of pieces (``row_offsets`` nondecreasing within ``[0, len(lengths)]``) whose lengths
    sum to at most ``row_slots``: what :func:`fill_packed` is promised; otherwise the index of
    the first piece (plus one) or row (plus one, negated) that breaks it, the addresses then
    partly written. Every index is checked here, so any values are safe; tables whose lengths
    disagree (``lengths`` and ``addresses`` as long as ``starts``, ``shard_ends`` and
    ``shard_bases`` as long as ``shard_starts``) are a ValueError.
    """
    cdef Py_ssize_t pieces = starts.shape[0], broken
    if not (
        lengths.shape[0] == addresses.shape[0] == pieces
        and shard_ends.shape[0] == shard_bases.shape[0] == shard_starts.shape[0]
    ):
        raise ValueError("piece_addresses: the tables' lengths disagree")
    with nogil:
        broken = _piece_addresses(
            starts, lengths, row_offsets, row_slots, shard_starts, shard_ends, shard_bases,
            itemsize, addresses,
        )
    return broken
