"""The packing kernels: best fit over a group's pieces, and packed rows copied into a batch.

Nothing here validates or allocates; the Python side (``tokstream.packing``) proves every index
and address in range and hands in the scratch arrays.
"""

cimport cython
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t, uintptr_t

from libc.string cimport memcpy

from tokstream._kernels.copy cimport outside_out
from tokstream._kernels.types cimport out_t, token_t

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


# ---------------------------------------------------------------------------------------------
# Packed rows


# Cython embeds the signature of a fused function's dispatcher; the docstring states it instead.
@cython.embedsignature(False)
def fill_packed(
    const token_t[::1] anchor,
    const uint64_t[::1] addresses,
    const int64_t[::1] lengths,
    const int64_t[::1] row_offsets,
    const int64_t[::1] rows,
    Py_ssize_t first_row,
    int64_t pad,
    out_t[:, ::1] input_ids,
    out_t[:, ::1] labels,
    uint8_t[:, ::1] label_continues,
    out_t[:, ::1] position_ids,
    int32_t[:, ::1] document_ids,
):
    """fill_packed(const token_t[::1] anchor, const uint64_t[::1] addresses, const int64_t[::1] lengths, const int64_t[::1] row_offsets, const int64_t[::1] rows, Py_ssize_t first_row, int64_t pad, out_t[:, ::1] input_ids, out_t[:, ::1] labels, uint8_t[:, ::1] label_continues, out_t[:, ::1] position_ids, int32_t[:, ::1] document_ids) -> bool

    Row ``first_row + k`` of the batch is row ``t = rows[k]`` of the table: pieces
    ``row_offsets[t] .. row_offsets[t + 1] - 1`` laid side by side from slot 0 of ``block + 1``
    slots, piece ``i`` the ``lengths[i]`` tokens of the
    corpus dtype (``anchor``'s, which only picks the specialisation) from address
    ``addresses[i]``; the slots after them ``pad``. ``input_ids`` gets slots ``[0, block)``,
    ``labels`` slots ``[1, block + 1)``, ``label_continues`` 1 where the label continues the
    piece of the slot before it (0 at a piece's first token and in the padding),
    ``position_ids`` each input slot's place in its piece and ``document_ids`` its piece's
    number in the row, the padding counting as a piece of its own. The last three may be
    None, and are then not written. Tokens and position ids are written in ``out_t`` (int64 or
    int32); returns False when a token does not fit it (the rows are then wrong and must not
    be handed out).

    The caller guarantees: every address readable for its piece's length (a piece of a shard
    the caller keeps alive), every length >= 1, each table row's lengths summing to at most
    ``block + 1``, ``row_offsets`` nondecreasing from 0 to ``len(lengths)``, every ``rows[k]``
    a table row (below ``len(row_offsets) - 1``), ``first_row + len(rows)`` at most the
    buffers' rows, every buffer of width ``block`` and ``pad`` (and ``block``) fitting out_t.
    """
    cdef Py_ssize_t count = rows.shape[0], block = input_ids.shape[1]
    cdef Py_ssize_t k, r, t, i, j, slot, length, inputs, piece
    cdef bint write_mask = label_continues is not None
    cdef bint write_positions = position_ids is not None
    cdef bint write_documents = document_ids is not None
    cdef const token_t *tokens
    cdef out_t *inputs_row
    cdef out_t *labels_row
    cdef out_t last = <out_t>pad
    cdef uint64_t outside = 0
    with nogil:
        for k in range(count):
            r = first_row + k
            t = rows[k]
            inputs_row = &input_ids[r, 0]
            labels_row = &labels[r, 0]
            slot = 0
            piece = 0
            for i in range(row_offsets[t], row_offsets[t + 1]):
                tokens = <const token_t *><uintptr_t>addresses[i]
                length = lengths[i]
                # Inputs are the slots below block; slot + length <= block + 1.
                inputs = min(length, block - slot)
                for j in range(inputs):
                    inputs_row[slot + j] = <out_t>tokens[j]
                    outside |= outside_out(tokens[j], inputs_row)
                # The last slot is a label only.
                if slot + length > block:
                    last = <out_t>tokens[block - slot]
                    outside |= outside_out(tokens[block - slot], inputs_row)
                if write_mask:
                    if slot > 0:
                        label_continues[r, slot - 1] = 0
                    for j in range(1, length):
                        label_continues[r, slot + j - 1] = 1
                if write_positions:
                    for j in range(inputs):
                        position_ids[r, slot + j] = <out_t>j
                if write_documents:
                    for j in range(inputs):
                        document_ids[r, slot + j] = <int32_t>piece
                slot += length
                piece += 1
            # The padding: slots slot .. block (the last is a label only).
            for j in range(slot, block):
                inputs_row[j] = <out_t>pad
                if write_positions:
                    position_ids[r, j] = <out_t>(j - slot)
                if write_documents:
                    document_ids[r, j] = <int32_t>piece
            if slot <= block:
                last = <out_t>pad
            for j in range(max(slot, 1), block + 1):
                if write_mask:
                    label_continues[r, j - 1] = 0
            # Label j is slot j + 1: the inputs shifted by one, then the last slot.
            memcpy(labels_row, inputs_row + 1, (block - 1) * sizeof(out_t))
            labels_row[block - 1] = last
    return outside == 0
