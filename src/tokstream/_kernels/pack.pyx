"""The packing kernel: best fit over a group's pieces (which piece goes in which row).

The rows' copy into a batch is :mod:`tokstream._kernels.packed_copy`.

Nothing here validates or allocates; the Python side (``tokstream.packing``) proves every index
and address in range and hands in the scratch arrays.
"""

from libc.stdint cimport int64_t, uint64_t

cdef extern from "portable.h":
    void TOKSTREAM_PREFETCH(const void *p) noexcept nogil

#: Documents ahead whose boundaries canonical_rows asks the CPU to load (shuffled documents are
#: random reads of the boundaries: overlapped, their cache misses cost a fraction).
cdef enum:
    PREFETCH_DOCUMENTS = 16

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    static inline int tokstream_lowest_bit(unsigned long long x) { return __builtin_ctzll(x); }
    #else
    static inline int tokstream_lowest_bit(unsigned long long x) {
        int n = 0;
        while (!(x & 1ULL)) { x >>= 1; n++; }
        return n;
    }
    #endif
    """
    int tokstream_lowest_bit(unsigned long long x) noexcept nogil


# ---------------------------------------------------------------------------------------------
# Best fit
#
# Rows with room are kept on one stack per free count (stack_heads[f], linked through
# stack_next; -1 ends a stack), and nonempty has bit f set while stack f holds a row, so the
# tightest row an item fits is the first set bit at or above its length: a few word reads,
# whatever the number of rows. Every caller hands in stack_heads of capacity + 1 entries all -1,
# nonempty of capacity // 64 + 1 zero words, stack_next of one entry per item.


cdef inline int64_t _place(
    int64_t length,
    int64_t capacity,
    int64_t *opened,
    int64_t *stack_heads,
    uint64_t *nonempty,
    Py_ssize_t words,
    int64_t *stack_next,
) noexcept nogil:
    # The row an item of 1 <= length <= capacity goes to; opens one when none has room.
    cdef Py_ssize_t word = length >> 6
    cdef uint64_t bits = nonempty[word] & (~<uint64_t>0 << (length & 63))
    cdef int64_t free, row, left
    while bits == 0:
        word += 1
        if word == words:
            break
        bits = nonempty[word]
    if bits == 0:
        row = opened[0]
        opened[0] += 1
        left = capacity - length
    else:
        free = (<int64_t>word << 6) + tokstream_lowest_bit(bits)
        row = stack_heads[free]
        stack_heads[free] = stack_next[row]
        if stack_heads[free] < 0:
            nonempty[free >> 6] &= ~(<uint64_t>1 << (free & 63))
        left = free - length
    if left > 0:
        # left <= capacity: inside stack_heads; row < opened <= items: inside stack_next.
        stack_next[row] = stack_heads[left]
        stack_heads[left] = row
        nonempty[left >> 6] |= <uint64_t>1 << (left & 63)
    return row


cdef inline void _clear(
    int64_t capacity, int64_t *stack_heads, uint64_t *nonempty, Py_ssize_t words
) noexcept nogil:
    # Every stack emptied again, for the next group.
    cdef Py_ssize_t word, free
    cdef uint64_t bits
    for word in range(words):
        bits = nonempty[word]
        while bits:
            free = (word << 6) + tokstream_lowest_bit(bits)
            stack_heads[free] = -1
            bits &= bits - 1
        nonempty[word] = 0


def best_fit(
    const int64_t[::1] lengths,
    int64_t capacity,
    int64_t[::1] rows,
    int64_t[::1] stack_heads,
    uint64_t[::1] nonempty,
    int64_t[::1] stack_next,
):
    """best_fit(const int64_t[::1] lengths, int64_t capacity, int64_t[::1] rows, int64_t[::1] stack_heads, uint64_t[::1] nonempty, int64_t[::1] stack_next) -> int

    :func:`tokstream.packing.best_fit` into ``rows``; returns the number of rows opened.

    The caller guarantees ``1 <= lengths[i] <= capacity``, ``rows`` and ``stack_next`` of
    ``len(lengths)`` entries, and the stacks as the section comment says.
    """
    cdef Py_ssize_t i, count = lengths.shape[0], words = nonempty.shape[0]
    cdef int64_t opened = 0
    if count == 0:
        return 0
    with nogil:
        for i in range(count):
            rows[i] = _place(
                lengths[i], capacity, &opened, &stack_heads[0], &nonempty[0], words,
                &stack_next[0],
            )
    return opened


def canonical_rows(
    const int64_t[::1] boundaries,
    const int64_t[::1] documents,
    int64_t group_documents,
    int64_t block,
    int64_t[::1] rows,
    int64_t[::1] items,
    int64_t[::1] fulls,
    int64_t[::1] counts,
    int64_t[::1] stack_heads,
    uint64_t[::1] nonempty,
    int64_t[::1] stack_next,
):
    """canonical_rows(const int64_t[::1] boundaries, const int64_t[::1] documents, int64_t group_documents, int64_t block, int64_t[::1] rows, int64_t[::1] items, int64_t[::1] fulls, int64_t[::1] counts, int64_t[::1] stack_heads, uint64_t[::1] nonempty, int64_t[::1] stack_next) -> None

    For each run ``g`` of ``group_documents`` consecutive ``documents`` (the last may be
    shorter; document ``d`` holds tokens ``boundaries[d] .. boundaries[d + 1] - 1``): its full
    pieces into ``fulls[g]``, its short pieces into ``items[g]`` and the rows best fit
    decreasing packs them into into ``rows[g]`` (capacity ``block + 1``;
    :mod:`tokstream.packing` defines the pieces). Only the count matters, so the short pieces
    are taken longest first by counting them (``counts``: ``block + 2`` zeros, left zero).

    The caller guarantees ``0 <= documents[i] < len(boundaries) - 1``, ``boundaries``
    nondecreasing, ``group_documents >= 1``, ``block >= 1``, ``rows``, ``items`` and ``fulls``
    of one entry per run, ``stack_next`` of ``group_documents`` entries and the stacks as the
    section comment says (capacity ``block + 1``).
    """
    cdef Py_ssize_t n = documents.shape[0], words = nonempty.shape[0], first, end, i, g = 0
    cdef int64_t opened, length, placed, k, labels, full, capacity = block + 1
    with nogil:
        first = 0
        while first < n:
            end = min(first + group_documents, n)
            placed = 0
            full = 0
            for i in range(first, end):
                if i + PREFETCH_DOCUMENTS < n:
                    # documents[i + PREFETCH_DOCUMENTS] < len(boundaries) - 1 (a hint only).
                    TOKSTREAM_PREFETCH(&boundaries[documents[i + PREFETCH_DOCUMENTS]])
                # documents[i] + 1 < len(boundaries).
                labels = boundaries[documents[i] + 1] - boundaries[documents[i]] - 1
                if labels > 0:
                    full += labels // block
                    # A short piece of labels % block + 1 <= block tokens: inside counts.
                    if labels % block:
                        counts[labels % block + 1] += 1
            opened = 0
            length = capacity
            while length >= 2:
                for k in range(counts[length]):
                    _place(
                        length, capacity, &opened, &stack_heads[0], &nonempty[0], words,
                        &stack_next[0],
                    )
                placed += counts[length]
                counts[length] = 0
                length -= 1
            _clear(capacity, &stack_heads[0], &nonempty[0], words)
            rows[g] = opened
            items[g] = placed
            fulls[g] = full
            g += 1
            first = end


def group_pieces(
    const int64_t[::1] boundaries,
    const int64_t[::1] documents,
    int64_t block,
    int64_t[::1] starts,
    int64_t[::1] full,
    int64_t[::1] short,
):
    """group_pieces(const int64_t[::1] boundaries, const int64_t[::1] documents, int64_t block, int64_t[::1] starts, int64_t[::1] full, int64_t[::1] short) -> tuple

    For each of ``documents`` (document ``d`` holds tokens ``boundaries[d] .. boundaries[d +
    1] - 1``): its first token into ``starts``, its full pieces into ``full`` and its short
    piece's length (0: none) into ``short``, as :func:`tokstream.packing.piece_counts` counts
    them; returns ``(full pieces, short pieces)`` of them all, what :func:`pack_group` takes.

    One pass with the documents' boundaries requested ahead (a group's documents are random
    reads of them when shuffled). Every index is checked: a document outside ``boundaries``
    or tables of other lengths are a ValueError (nothing is then written past them).
    """
    cdef Py_ssize_t count = documents.shape[0], last = boundaries.shape[0] - 1, i
    cdef Py_ssize_t outside = -1
    cdef int64_t d, labels, fulls = 0, shorts = 0
    if not (starts.shape[0] == full.shape[0] == short.shape[0] == count) or block < 1:
        raise ValueError("group_pieces: the tables' lengths disagree, or block < 1")
    with nogil:
        for i in range(count):
            if i + PREFETCH_DOCUMENTS < count:
                d = documents[i + PREFETCH_DOCUMENTS]
                if 0 <= d < last:
                    TOKSTREAM_PREFETCH(&boundaries[d])
            d = documents[i]
            if not 0 <= d < last:
                outside = i
                break
            # d + 1 <= last: inside boundaries.
            starts[i] = boundaries[d]
            labels = boundaries[d + 1] - boundaries[d] - 1
            if labels > 0:
                full[i] = labels // block
                short[i] = labels % block + 1 if labels % block else 0
            else:
                full[i] = 0
                short[i] = 0
            fulls += full[i]
            shorts += short[i] > 0
    if outside >= 0:
        raise ValueError(f"group_pieces: document {documents[outside]} outside the boundaries")
    return fulls, shorts


# ---------------------------------------------------------------------------------------------
# Group tables
#
# One group's rows in one epoch (tokstream.packing's module docstring is the rule): the short
# pieces sorted by a counting sort, placed by best fit, empty rows filled, then every row's
# pieces written out in the order the rows are streamed.


cdef inline void _sort_descending(
    const int64_t *items,
    const int64_t *order,
    Py_ssize_t count,
    const int64_t *short,
    int64_t quantum,
    int64_t *counts,
    int64_t top,
    int64_t *placed,
) noexcept nogil:
    # placed = items (taken in the order ``order`` when given) stably sorted by short[item] //
    # quantum, largest first. Every key is at most top; counts holds top + 1 zeros, left zero.
    cdef Py_ssize_t k
    cdef int64_t item, key, position = 0, seen
    for k in range(count):
        item = items[order[k]] if order != NULL else items[k]
        counts[short[item] // quantum] += 1
    key = top
    while key >= 0:
        seen = counts[key]
        counts[key] = position
        position += seen
        key -= 1
    for k in range(count):
        item = items[order[k]] if order != NULL else items[k]
        key = short[item] // quantum
        placed[counts[key]] = item
        counts[key] += 1
    for key in range(top + 1):
        counts[key] = 0


cdef inline int64_t _best_fit_rows(
    const int64_t *placed,
    Py_ssize_t count,
    const int64_t *short,
    int64_t capacity,
    int64_t *rows,
    int64_t *stack_heads,
    uint64_t *nonempty,
    Py_ssize_t words,
    int64_t *stack_next,
) noexcept nogil:
    # Best fit of the pieces in placement order; the rows opened. The stacks are left empty.
    cdef Py_ssize_t k
    cdef int64_t opened = 0
    for k in range(count):
        rows[k] = _place(
            short[placed[k]], capacity, &opened, stack_heads, nonempty, words, stack_next
        )
    _clear(capacity, stack_heads, nonempty, words)
    return opened


cdef int _pack_group(
    const int64_t[::1] starts,
    const int64_t[::1] full,
    const int64_t[::1] short,
    int64_t block,
    const int64_t[::1] piece_order,
    int64_t quantum,
    const int64_t[::1] row_order,
    int64_t[::1] row_offsets,
    int64_t[::1] piece_starts,
    int64_t[::1] piece_lengths,
    int64_t[::1] items,
    int64_t[::1] placed,
    int64_t[::1] rows,
    int64_t[::1] by_row,
    int64_t[::1] row_firsts,
    int64_t[::1] full_starts,
    int64_t[::1] counts,
    int64_t[::1] stack_heads,
    uint64_t[::1] nonempty,
    int64_t[::1] stack_next,
) except -1 nogil:
    # pack_group's work, its contract (a function so that it can return early without the GIL);
    # 1 where pack_group returns -1.
    cdef Py_ssize_t documents = starts.shape[0], words = nonempty.shape[0], d, k, q
    cdef Py_ssize_t total = row_offsets.shape[0] - 1, fulls = full_starts.shape[0]
    cdef Py_ssize_t pieces = 0, packed_rows = total - fulls, row, fullest, out
    cdef int64_t capacity = block + 1, opened = -1, p, t, item
    cdef const int64_t *order = &piece_order[0] if quantum > 0 and piece_order.shape[0] else NULL
    for d in range(documents):
        if short[d] > 0:
            items[pieces] = d
            pieces += 1
    if pieces:
        if quantum > 0:
            # Keys short // quantum <= block: inside counts.
            _sort_descending(
                &items[0], order, pieces, &short[0], quantum, &counts[0], block, &placed[0]
            )
            opened = _best_fit_rows(
                &placed[0], pieces, &short[0], capacity, &rows[0], &stack_heads[0],
                &nonempty[0], words, &stack_next[0],
            )
        if opened < 0 or opened > packed_rows:
            _sort_descending(
                &items[0], NULL, pieces, &short[0], 1, &counts[0], block, &placed[0]
            )
            opened = _best_fit_rows(
                &placed[0], pieces, &short[0], capacity, &rows[0], &stack_heads[0],
                &nonempty[0], words, &stack_next[0],
            )
        if opened > packed_rows:
            return 1
    else:
        opened = 0
    # row_firsts[r]: the pieces in row r (every row below packed_rows, checked above).
    for row in range(packed_rows + 1):
        row_firsts[row] = 0
    for k in range(pieces):
        row_firsts[rows[k]] += 1
    for row in range(opened, packed_rows):
        fullest = 0
        for q in range(1, row):
            if row_firsts[q] > row_firsts[fullest]:
                fullest = q
        if row_firsts[fullest] < 2:
            return 1
        k = pieces - 1
        while rows[k] != fullest:
            k -= 1
        rows[k] = row
        row_firsts[fullest] -= 1
        row_firsts[row] = 1
    # Counts to first positions (row_firsts[packed_rows] = pieces), then a stable bucket.
    p = 0
    for row in range(packed_rows + 1):
        t = row_firsts[row]
        row_firsts[row] = p
        p += t
    for k in range(pieces):
        # rows[k] < packed_rows; stack_next is free scratch of P entries now.
        stack_next[k] = row_firsts[rows[k]]
        row_firsts[rows[k]] += 1
    for k in range(pieces):
        by_row[stack_next[k]] = placed[k]
    # row_firsts[r] is now row r's end: shift back to its first position.
    row = packed_rows
    while row > 0:
        row_firsts[row] = row_firsts[row - 1]
        row -= 1
    row_firsts[0] = 0
    k = 0
    for d in range(documents):
        for p in range(full[d]):
            full_starts[k] = starts[d] + p * block
            k += 1
    out = 0
    row_offsets[0] = 0
    for k in range(total):
        t = row_order[k] if row_order.shape[0] else k
        if t < fulls:
            piece_starts[out] = full_starts[t]
            piece_lengths[out] = capacity
            out += 1
        else:
            t -= fulls
            for q in range(row_firsts[t], row_firsts[t + 1]):
                item = by_row[q]
                piece_starts[out] = starts[item] + full[item] * block
                piece_lengths[out] = short[item]
                out += 1
        row_offsets[k + 1] = out
    return 0


def pack_group(
    const int64_t[::1] starts,
    const int64_t[::1] full,
    const int64_t[::1] short,
    int64_t block,
    const int64_t[::1] piece_order,
    int64_t quantum,
    const int64_t[::1] row_order,
    int64_t[::1] row_offsets,
    int64_t[::1] piece_starts,
    int64_t[::1] piece_lengths,
    int64_t[::1] items,
    int64_t[::1] placed,
    int64_t[::1] rows,
    int64_t[::1] by_row,
    int64_t[::1] row_firsts,
    int64_t[::1] full_starts,
    int64_t[::1] counts,
    int64_t[::1] stack_heads,
    uint64_t[::1] nonempty,
    int64_t[::1] stack_next,
):
    """pack_group(const int64_t[::1] starts, const int64_t[::1] full, const int64_t[::1] short, int64_t block, const int64_t[::1] piece_order, int64_t quantum, const int64_t[::1] row_order, int64_t[::1] row_offsets, int64_t[::1] piece_starts, int64_t[::1] piece_lengths, int64_t[::1] items, int64_t[::1] placed, int64_t[::1] rows, int64_t[::1] by_row, int64_t[::1] row_firsts, int64_t[::1] full_starts, int64_t[::1] counts, int64_t[::1] stack_heads, uint64_t[::1] nonempty, int64_t[::1] stack_next) -> int

    One group's rows in one epoch: row ``k`` streamed holds pieces ``row_offsets[k] ..
    row_offsets[k + 1] - 1``, piece ``i`` the ``piece_lengths[i]`` tokens from
    ``piece_starts[i]``. The group's document ``d`` starts at token ``starts[d]`` and has
    ``full[d]`` full pieces and a short piece of ``short[d]`` tokens (0: none).

    Rows ``0 .. F - 1`` (``F`` the full pieces) hold one full piece each, in document order;
    rows ``F ..`` the short pieces, placed by best fit: with ``quantum`` > 0 in the order of
    ``piece_order`` (a permutation of the short pieces, in document order) stably sorted by
    ``length // quantum``, largest first, and if that opens more rows than the group has, as
    with ``quantum`` = 0: in document order stably sorted by length, largest first. Rows left
    empty each take the last piece placed in the row holding the most (the first such row).
    Row ``k`` streamed is row ``row_order[k]`` (``row_order`` empty: row ``k``). Returns 0, or
    -1 when the short pieces do not fit the group's rows (the table is then not whole).

    The caller guarantees ``1 <= block``; ``full`` and ``short`` of ``len(starts)`` entries,
    ``0 <= short[d] <= block``, ``full[d] >= 0``; ``piece_order`` a permutation of ``[0, P)``
    (``P`` the short pieces) when ``quantum`` > 0; ``row_order`` empty or a permutation of
    ``[0, R)``, ``R = len(row_offsets) - 1 >= F``; ``piece_starts``, ``piece_lengths`` of ``F + P``
    entries; ``items`` of ``len(starts)``; ``placed``, ``rows``, ``by_row``, ``stack_next`` of
    ``P``; ``row_firsts`` of ``R - F + 1``; ``full_starts`` of ``F``; ``counts`` of ``block + 3``
    zeros (left zero); the stacks as the best fit section says (capacity ``block + 1``).
    """
    cdef int failed
    with nogil:
        failed = _pack_group(
            starts,
            full,
            short,
            block,
            piece_order,
            quantum,
            row_order,
            row_offsets,
            piece_starts,
            piece_lengths,
            items,
            placed,
            rows,
            by_row,
            row_firsts,
            full_starts,
            counts,
            stack_heads,
            nonempty,
            stack_next,
        )
    return -failed
