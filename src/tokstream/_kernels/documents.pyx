"""The document kernel: windows gathered with where documents start inside each.

:func:`gather_documents` copies every window of a batch (from the addresses
:func:`tokstream._windows.lookup_windows` found), then writes each row's position ids
and loss mask, in one call; :func:`document_pieces` reads a batch's pieces back from its
position ids. Nothing here validates or allocates; the Python side (``tokstream._space``)
proves every index in range.
"""

cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from tokstream._kernels.copy cimport (
    copy_window, prefetch_window, ramp_run, tokstream_fill_int32
)
from tokstream._kernels.types cimport out_t, token_t
from libc.string cimport memset

cdef extern from "portable.h":
    int64_t tokstream_first_equal64(
        const int64_t *values, int64_t low, int64_t high, int64_t value
    ) noexcept nogil
    int64_t tokstream_first_equal32(
        const int32_t *values, int64_t low, int64_t high, int32_t value
    ) noexcept nogil
    int64_t tokstream_first_equal16(
        const uint16_t *tokens, int64_t low, int64_t high, uint16_t value
    ) noexcept nogil
    int64_t tokstream_last_equal16(
        const uint16_t *tokens, int64_t low, int64_t high, uint16_t value
    ) noexcept nogil

cdef extern from *:
    """
    #ifndef TOKSTREAM_DEBUG
    #define TOKSTREAM_DEBUG 0
    #endif
    """
    const bint TOKSTREAM_DEBUG


cdef inline Py_ssize_t _first_above(
    const int64_t[::1] sorted_values, Py_ssize_t low, Py_ssize_t high, int64_t value
) noexcept nogil:
    # Index of the first element > value, given that it lies in [low, high] (high: none in
    # the range): a binary search written so that the compiler can use conditional moves, as
    # random windows make every branch of a branchy search a coin flip.
    cdef Py_ssize_t base = low, size = high - low, half
    if size <= 0:
        return low
    while size > 1:
        # base + half < base + size <= high: the probe stays inside the range.
        half = size >> 1
        base = base + half if sorted_values[base + half] <= value else base
        size -= half
    return base + (sorted_values[base] <= value)


cdef inline int64_t _first_equal(
    const out_t *row, int64_t low, int64_t high, int64_t value
) noexcept nogil:
    # The first j in [low, high) with row[j] == value, else high; a value out_t cannot hold is
    # in no row (a token that does not fit makes the whole batch refused anyway).
    if out_t is int32_t:
        if <int64_t><int32_t>value != value:
            return high
        return tokstream_first_equal32(row, low, high, <int32_t>value)
    else:
        return tokstream_first_equal64(row, low, high, value)


# Cython embeds the signature of a fused function's dispatcher; the docstring states it instead.
@cython.embedsignature(False)
def gather_documents(
    const token_t[::1] anchor,
    const uint64_t[::1] addresses,
    const int64_t[::1] starts,
    out_t[:, ::1] input_ids,
    out_t[::1] next_tokens,
    out_t[:, ::1] targets,
    Py_ssize_t cache_ahead,
    const int64_t[::1] document_starts,
    const int64_t[::1] document_buckets,
    int bucket_shift,
    int64_t eos,
    bint use_eos,
    out_t[:, ::1] position_ids,
    uint8_t[:, ::1] label_continues,
    int32_t[:, ::1] document_ids,
    int64_t[:, ::1] window_scratch,
):
    """gather_documents(const token_t[::1] anchor, const uint64_t[::1] addresses, const int64_t[::1] starts, out_t[:, ::1] input_ids, out_t[::1] next_tokens, out_t[:, ::1] targets, Py_ssize_t cache_ahead, const int64_t[::1] document_starts, const int64_t[::1] document_buckets, int bucket_shift, int64_t eos, bint use_eos, out_t[:, ::1] position_ids, uint8_t[:, ::1] label_continues, int32_t[:, ::1] document_ids, int64_t[:, ::1] window_scratch) -> bool

    :func:`tokstream._windows.gather_at` (row ``i`` from ``addresses[i]``, the address
    of token ``starts[i]`` of the shards laid end to end; ``next_tokens`` or ``targets``;
    ``cache_ahead`` windows prefetched ahead), then each row's position ids and whether each
    label belongs to the same document as the token it is predicted from. Two loops: the
    copies run as in the plain kernel, then the metadata is written row by row, the ``eos``
    rule reading the copied row; one loop interleaving them was slower.

    A token starts a document when its position is in ``document_starts`` (sorted, a start
    repeated for each empty document) or, with ``use_eos``, when the token before it equals
    ``eos``. Row ``r`` gets ``position_ids[r, 0] = 0``, then 0 at every document start and one
    more than the token before elsewhere. ``label_continues`` is ``(b, block)`` for shifted
    targets (``[r, j]`` is 0 when token ``starts[r] + j + 1`` starts a document) or ``(b, 1)``
    for next tokens (``[r, 0]`` is 0 when token ``starts[r] + block`` does): the loss mask.
    ``document_ids[r, j]`` is the index of the piece (the run of tokens of one document) that
    column ``j`` lies in, counted from 0 at the row's first column. Each may be None, and is
    then not written (what the batch did not ask for costs nothing).

    ``document_buckets[k]`` counts the document starts ``<= k << bucket_shift`` (see
    :func:`tokstream._space.document_buckets`), so the first start after a window's is
    searched among the few of its bucket, not all of them. Those lookups come first, for every
    window, into ``window_scratch[i, 0]`` (scratch of at least ``len(starts)`` rows of 3):
    independent of each other, their cache misses overlap, where inside a loop each would stall
    it. For 16-bit tokens the copy loop also finds each window's first and last ``eos`` (into
    ``window_scratch[i, 1:]``) while its tokens are in cache; for other dtypes the metadata loop
    searches the copied row.

    The tokens and position ids are written in ``out_t`` (int64 or int32); returns False as
    :func:`tokstream._windows.gather_windows` does when a token does not fit it.

    The caller guarantees that each address is token ``starts[i]``'s, whose window's ``block +
    1`` tokens lie in a live token array (``lookup_windows`` checks it in the debug build);
    buffers of ``len(starts)`` rows: ``input_ids``, ``targets`` and ``position_ids`` of width
    ``block`` (``document_ids`` too), ``label_continues`` of width ``block`` or 1; exactly one of ``next_tokens`` and
    ``targets``; and ``document_buckets`` of ``(max(starts) >> bucket_shift) + 2`` or more
    nondecreasing counts.
    """
    cdef Py_ssize_t count = starts.shape[0]
    cdef Py_ssize_t block = input_ids.shape[1]
    cdef Py_ssize_t num_documents = document_starts.shape[0]
    cdef bint shifted = targets is not None
    cdef bint write_positions = position_ids is not None
    cdef bint write_mask = label_continues is not None
    cdef bint per_label = write_mask and label_continues.shape[1] == block
    cdef bint write_ids = document_ids is not None
    cdef int32_t piece_index
    cdef int32_t *ids
    cdef Py_ssize_t i, next_document, piece, end, next_piece, limit, found
    cdef Py_ssize_t next_eos = 0, last_eos = -1
    # 16-bit tokens are searched for eos in the copy loop, compared in their own dtype (an eos
    # it cannot hold is left to the copied row's search, which finds nothing).
    cdef bint eos_in_copy = False
    if token_t is uint16_t or token_t is int16_t:
        eos_in_copy = use_eos and <int64_t><token_t>eos == eos
    cdef int64_t start
    cdef uint64_t outside = 0
    cdef const token_t *window
    cdef out_t *out
    cdef uint8_t *continues
    with nogil:
        for i in range(count):
            # The index of the first document start after the window's first token.
            start = starts[i]
            window_scratch[i, 0] = _first_above(
                document_starts,
                document_buckets[start >> bucket_shift],
                document_buckets[(start >> bucket_shift) + 1],
                start,
            )
        for i in range(count):
            if cache_ahead > 0 and cache_ahead < count - i:
                # A looked-up window's address: its block + 1 tokens lie in a token array.
                prefetch_window(<const token_t *><size_t>addresses[i + cache_ahead], block)
            # Every window's block + 1 tokens lie in its segment (lookup_windows' guarantee).
            window = <const token_t *><size_t>addresses[i]
            outside |= copy_window(
                window,
                block,
                &input_ids[i, 0],
                &targets[i, 0] if shifted else NULL,
                NULL if shifted else &next_tokens[i],
            )
            if eos_in_copy:
                # The window's first and last eos column (block and block - 1: none).
                found = tokstream_first_equal16(<const uint16_t *>window, 0, block, <uint16_t>eos)
                window_scratch[i, 1] = found
                window_scratch[i, 2] = tokstream_last_equal16(
                    <const uint16_t *>window, found, block, <uint16_t>eos
                )
        for i in range(count):
            # The row's pieces, each a run of 0, 1, 2, ... ended by the first break after it.
            start = starts[i]
            out = &position_ids[i, 0] if write_positions else NULL
            continues = &label_continues[i, 0] if write_mask else NULL
            ids = &document_ids[i, 0] if write_ids else NULL
            piece_index = 0
            next_document = window_scratch[i, 0]
            if eos_in_copy:
                next_eos, last_eos = window_scratch[i, 1], window_scratch[i, 2]
            if write_mask and not per_label:
                continues[0] = 1
            piece = 0
            while True:
                # The next column a document starts at (0 < next_piece <= block; block + 1:
                # none): the recorded start, or the token after an eos if that comes first.
                next_piece = (
                    document_starts[next_document] - start
                    if next_document < num_documents else block + 1
                )
                # An eos at column j starts a document at j + 1.
                if eos_in_copy:
                    # The copy loop found the row's first and last; one between them is
                    # searched for in the corpus (a row of three or more).
                    if next_eos < piece:
                        next_eos = (
                            tokstream_first_equal16(
                                <const uint16_t *><size_t>addresses[i], piece, last_eos,
                                <uint16_t>eos,
                            )
                            if piece <= last_eos else block
                        )
                    if next_eos + 1 < next_piece:
                        next_piece = next_eos + 1
                elif use_eos:
                    # Searched for in the copied row, still cached where the corpus' lines went
                    # by with the copies, up to where the recorded start breaks the row anyway.
                    limit = next_piece - 1 if next_piece <= block else block
                    found = _first_equal(&input_ids[i, 0], piece, limit, eos)
                    if found < limit:
                        next_piece = found + 1
                end = next_piece if next_piece < block else block
                if TOKSTREAM_DEBUG and not piece < end <= block:
                    with gil:
                        raise IndexError(f"piece [{piece}, {end}) of row {i} is not in it")
                # piece < end <= block: the row's columns (checked above in debug builds); the
                # position ids count from 0 in the piece (end - piece <= block fits out_t).
                if write_positions:
                    ramp_run(out + piece, end - piece)
                if per_label:
                    memset(continues + piece, 1, end - piece)
                if write_ids:
                    tokstream_fill_int32(ids + piece, end - piece, piece_index)
                if next_piece > block:
                    break
                # A document starts at token start + next_piece.
                if per_label:
                    continues[next_piece - 1] = 0
                elif write_mask and next_piece == block:
                    continues[0] = 0
                # Empty documents repeat a start: step past every copy of this one.
                while (
                    next_document < num_documents
                    and document_starts[next_document] == start + next_piece
                ):
                    next_document += 1
                if next_piece == block:
                    break
                piece = next_piece
                piece_index += 1
    return outside == 0


cdef inline Py_ssize_t _piece_start(const out_t *row, Py_ssize_t j) noexcept nogil:
    # The first column of the piece that column j ends: j - row[j], for the position ids the
    # kernel wrote; any other value gives j (a piece of one), so the walk stays in the row.
    cdef int64_t position = row[j]
    return j - position if 0 <= position <= j else j


# Cython embeds the signature of a fused function's dispatcher; the docstring states it instead.
@cython.embedsignature(False)
def document_pieces(const out_t[:, ::1] position_ids, int32_t[::1] piece_starts):
    """document_pieces(const out_t[:, ::1] position_ids, int32_t[::1] piece_starts) -> tuple

    Count the document pieces of the flattened batch (a piece starts at every 0 of
    ``position_ids``) and write the first ``len(piece_starts)`` of their starts, as flat
    indices, into ``piece_starts``; return ``(count, longest piece)``. Pass an empty
    ``piece_starts`` to count.

    Within a piece starting at column ``a``, ``position_ids[r, j] == j - a``: the last column
    of a piece names its start. So each row is walked from its end, piece by piece, one read
    per piece (a row of one document is one read), and no search. Every index stays inside the
    row and inside ``piece_starts`` whatever the values are (a caller that overwrote the array
    gets wrong pieces, never a bad access).
    """
    cdef Py_ssize_t rows = position_ids.shape[0], block = position_ids.shape[1]
    cdef Py_ssize_t capacity = piece_starts.shape[0]
    cdef Py_ssize_t found = 0, longest = 0, r, j, first, count, slot
    cdef const out_t *row
    if block == 0:
        return 0, 0
    with nogil:
        for r in range(rows):
            row = &position_ids[r, 0]
            # The row's pieces, counted from its end.
            count = 0
            j = block - 1
            while j >= 0:
                first = _piece_start(row, j)
                longest = max(longest, j - first + 1)
                count += 1
                j = first - 1
            # Walked again, each start written in its slot, the last piece's first.
            slot = found + count
            j = block - 1
            while j >= 0 and found < capacity:
                first = _piece_start(row, j)
                slot -= 1
                if slot < capacity:
                    piece_starts[slot] = <int32_t>(r * block + first)
                j = first - 1
            found += count
    return found, longest
