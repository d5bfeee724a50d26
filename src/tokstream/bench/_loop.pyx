"""Plain C loops over random windows: the single-thread limits tokstream is held to.

Written independently of tokstream's kernels (no shared code, not even the token type) so that
they measure the machine, not tokstream. :func:`copy_windows`: one ``memcpy`` (or widening loop)
per window into a reused buffer, with software prefetch of the window ``distance`` windows
ahead; :func:`tokstream.bench.baselines.c_loop` drives it with the best distance it finds on the
machine at hand. :func:`copy_rows`: the bytes of a batch with shifted labels, and optionally the
extras' bytes, written in an int32 or int64 output dtype: the floor
``benchmarks/test_out_dtype.py`` holds ``out_dtype="int32"`` to. :func:`copy_document_rows`:
the same with each document's extras (restarting at every document start, or one piece a row
for windows inside documents) and their ``cu_seqlens``: the floor of a document stream's whole
batch.
"""

cimport cython

import numpy as np
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

# The eight fixed-width integer dtypes a corpus may be held in.
ctypedef fused token_t:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define BASELINE_PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 0)
    #elif defined(_MSC_VER)
    #include <xmmintrin.h>
    #define BASELINE_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_NTA)
    #else
    #define BASELINE_PREFETCH(p) ((void)(p))
    #endif
    """
    void BASELINE_PREFETCH(const void *p) noexcept nogil


# The rows' loops in C: one function per (token dtype, output dtype), each built, where GCC 12
# or later targets Linux x86-64, for the AVX-512, AVX2 and baseline instruction sets with the
# loader picking the CPU's (target_clones), so that the floor narrows and widens as fast as this
# CPU can (a baseline-only loop narrows int64 tokens slower than memcpy copies them).
cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__) && \
        defined(__linux__) && defined(__GLIBC__)
    #define FLOOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
    #else
    #define FLOOR_CLONES
    #endif
    #if defined(__GNUC__) || defined(__clang__)
    #define FLOOR_UNUSED __attribute__((unused))
    #else
    #define FLOOR_UNUSED
    #endif

    /* inputs[j] = source[j], labels[j] = source[j + 1] for j < block, in TO. */
    #define FLOOR_ROW(FROM, TO)                                                              \
        FLOOR_CLONES FLOOR_UNUSED static void floor_row_##FROM##_##TO(                       \
            const FROM##_t *source, int64_t block, TO##_t *inputs, TO##_t *labels) {         \
            int64_t j;                                                                       \
            for (j = 0; j < block; j++) {                                                    \
                inputs[j] = (TO##_t)source[j];                                               \
                labels[j] = (TO##_t)source[j + 1];                                           \
            }                                                                                \
        }                                                                                    \
        /* Row i of the batch from window starts[i], the window distance rows ahead (0:      \
         * none) prefetched first, every cache line of it. */                                \
        FLOOR_UNUSED static void floor_copy_row_##FROM##_##TO(                               \
            const FROM##_t *tokens, const int64_t *starts, int64_t count, int64_t i,         \
            int64_t block, void *inputs, void *labels, int64_t distance) {                   \
            int64_t j, line = 64 / (int64_t)sizeof(FROM##_t);                                \
            if (line < 1) line = 1;                                                          \
            if (distance > 0 && i + distance < count) {                                      \
                const FROM##_t *ahead = tokens + starts[i + distance];                       \
                for (j = 0; j <= block; j += line) BASELINE_PREFETCH(ahead + j);             \
                BASELINE_PREFETCH(ahead + block);                                            \
            }                                                                                \
            floor_row_##FROM##_##TO(tokens + starts[i], block, (TO##_t *)inputs + i * block, \
                                    (TO##_t *)labels + i * block);                           \
        }
    /* The extras' bytes of a row of one piece: position ids 0, 1, 2, ..., a mask of ones and
     * piece numbers 0. Ramps count in INDEX, as wide as TO (vectorised without narrowing). */
    #define FLOOR_EXTRAS(TO, INDEX)                                                          \
        FLOOR_CLONES FLOOR_UNUSED static void floor_extras_##TO(                             \
            int64_t block, TO##_t *positions, uint8_t *mask, int32_t *pieces) {              \
            INDEX j;                                                                         \
            for (j = 0; j < (INDEX)block; j++) {                                             \
                positions[j] = (TO##_t)j;                                                    \
            }                                                                                \
            memset(mask, 1, (size_t)block);                                                  \
            memset(pieces, 0, (size_t)block * sizeof(int32_t));                              \
        }
    FLOOR_EXTRAS(int32, uint32_t)
    FLOOR_EXTRAS(int64, int64_t)
    #define FLOOR_ROWS(FROM, TO)                                                             \
        FLOOR_ROW(FROM, TO)                                                                  \
        FLOOR_UNUSED static void floor_rows_##FROM##_##TO(                                   \
            const void *all_tokens, const int64_t *starts, int64_t count, int64_t block,     \
            void *inputs, void *labels, void *positions, uint8_t *mask, int32_t *pieces,     \
            int64_t distance) {                                                              \
            int64_t i;                                                                       \
            for (i = 0; i < count; i++) {                                                    \
                floor_copy_row_##FROM##_##TO((const FROM##_t *)all_tokens, starts, count, i, \
                                             block, inputs, labels, distance);               \
                if (positions != NULL)                                                       \
                    floor_extras_##TO(block, (TO##_t *)positions + i * block,                \
                                      mask + i * block, pieces + i * block);                 \
            }                                                                                \
        }
    #define FLOOR_BOTH(FROM) FLOOR_ROWS(FROM, int32) FLOOR_ROWS(FROM, int64)
    FLOOR_BOTH(int8) FLOOR_BOTH(int16) FLOOR_BOTH(int32) FLOOR_BOTH(int64)
    FLOOR_BOTH(uint8) FLOOR_BOTH(uint16) FLOOR_BOTH(uint32) FLOOR_BOTH(uint64)

    /* The first index of the sorted values[0 .. count) above value, searched from table[value
     * >> shift] (the answer for the bucket's first value, so a step or two on). */
    FLOOR_UNUSED static int64_t floor_find(const int64_t *values, int64_t count,
                                           const int64_t *table, int64_t shift, int64_t value) {
        int64_t d = table[value >> shift];
        while (d < count && values[d] <= value) d++;
        return d;
    }
    /* Where each row's window starts: starts[i] itself across documents (window_ends NULL),
     * else the start of window number starts[i] of the windows inside documents (window_ends[d]:
     * the windows of documents 0 .. d, cumulative); -1 if a start is not below windows, else 0.
     * table and shift index the searched values (window_ends, else ends). */
    FLOOR_UNUSED static int floor_addresses(
        const int64_t *ends, int64_t documents, const int64_t *window_ends, const int64_t *table,
        int64_t shift, int64_t windows, const int64_t *starts, int64_t count, int64_t *addresses) {
        int64_t i, d;
        for (i = 0; i < count; i++) {
            if (starts[i] < 0 || starts[i] >= windows) return -1;
            addresses[i] = starts[i];
            if (window_ends != NULL) {
                d = floor_find(window_ends, documents, table, shift, starts[i]);
                if (d > 0) addresses[i] += ends[d - 1] - window_ends[d - 1];
            }
        }
        return 0;
    }
    /* A row's extras, its window starting at start: position ids from 0 and piece numbers going
     * up at every document start inside it (ends[d], the first end above start, onwards; d ==
     * documents: one piece), the mask 0 where a label starts a document, the pieces' ends
     * (offset by the row's) appended to cu_seqlens[*n ..]. Whatever ends holds, each piece lies
     * inside the row: every end the walk reads lies above the piece before. */
    #define FLOOR_DOCUMENT_EXTRAS(TO, INDEX)                                                 \
        FLOOR_UNUSED static void floor_document_extras_##TO(                                 \
            const int64_t *ends, int64_t documents, int64_t d, int64_t start, int64_t block,  \
            int64_t offset, TO##_t *positions, uint8_t *mask, int32_t *pieces,               \
            int32_t *cu_seqlens, int64_t *n, int64_t *longest) {                             \
            int64_t first, last, piece;                                                      \
            INDEX j;                                                                         \
            for (first = 0, piece = 0; first < block; first = last, piece++) {               \
                last = d < documents && ends[d] - start < block ? ends[d] - start : block;   \
                if (last <= first) break; /* never: each end read lies above the last */     \
                for (j = 0; j < (INDEX)(last - first); j++) {                                \
                    positions[first + j] = (TO##_t)j;                                        \
                    pieces[first + j] = (int32_t)piece;                                      \
                }                                                                            \
                memset(mask + first, 1, (size_t)(last - first));                             \
                if (d < documents && ends[d] - start == last) mask[last - 1] = 0;            \
                if (last - first > *longest) *longest = last - first;                        \
                cu_seqlens[(*n)++] = (int32_t)(offset + last);                               \
                while (d < documents && ends[d] - start <= last) d++;                        \
            }                                                                                \
        }
    FLOOR_DOCUMENT_EXTRAS(int32, uint32_t)
    FLOOR_DOCUMENT_EXTRAS(int64, int64_t)
    /* Rows with each document's own extras (ends[d]: where document d ends): windows across
     * documents (window_ends NULL) or inside them (one piece a row), found by floor_addresses.
     * Writes cu_seqlens (at most count * block + 1 values) and returns its length, *longest the
     * longest piece; -1, nothing written, if a start is not below windows. */
    #define FLOOR_DOCUMENT_ROWS(FROM, TO)                                                    \
        FLOOR_UNUSED static int64_t floor_document_rows_##FROM##_##TO(                       \
            const void *all_tokens, const int64_t *ends, int64_t documents,                  \
            const int64_t *window_ends, const int64_t *table, int64_t shift, int64_t windows, \
            const int64_t *starts, int64_t *addresses, int64_t count, int64_t block,         \
            void *inputs, void *labels, void *positions, uint8_t *mask, int32_t *pieces,     \
            int32_t *cu_seqlens, int64_t *longest, int64_t distance) {                       \
            int64_t i, n = 0;                                                                \
            if (floor_addresses(ends, documents, window_ends, table, shift, windows, starts, \
                                count, addresses) < 0)                                       \
                return -1;                                                                   \
            *longest = 0;                                                                    \
            cu_seqlens[n++] = 0;                                                             \
            for (i = 0; i < count; i++) {                                                    \
                floor_copy_row_##FROM##_##TO((const FROM##_t *)all_tokens, addresses, count, \
                                             i, block, inputs, labels, distance);            \
                floor_document_extras_##TO(                                                  \
                    ends, documents,                                                         \
                    window_ends == NULL                                                      \
                        ? floor_find(ends, documents, table, shift, addresses[i])            \
                        : documents,                                                         \
                    addresses[i], block, i * block, (TO##_t *)positions + i * block,         \
                    mask + i * block, pieces + i * block, cu_seqlens, &n, longest);          \
            }                                                                                \
            return n;                                                                        \
        }
    #define FLOOR_DOCUMENTS_BOTH(FROM) FLOOR_DOCUMENT_ROWS(FROM, int32) FLOOR_DOCUMENT_ROWS(FROM, int64)
    FLOOR_DOCUMENTS_BOTH(int8) FLOOR_DOCUMENTS_BOTH(int16) FLOOR_DOCUMENTS_BOTH(int32)
    FLOOR_DOCUMENTS_BOTH(int64) FLOOR_DOCUMENTS_BOTH(uint8) FLOOR_DOCUMENTS_BOTH(uint16)
    FLOOR_DOCUMENTS_BOTH(uint32) FLOOR_DOCUMENTS_BOTH(uint64)

    /* A loop's 16 versions by token dtype kind (int8, int16, int32, int64, then unsigned) and
     * output dtype (int32, int64). */
    #define FLOOR_VERSIONS(NAME) {                                                           \
        {NAME##_int8_int32, NAME##_int8_int64}, {NAME##_int16_int32, NAME##_int16_int64},    \
        {NAME##_int32_int32, NAME##_int32_int64}, {NAME##_int64_int32, NAME##_int64_int64},  \
        {NAME##_uint8_int32, NAME##_uint8_int64}, {NAME##_uint16_int32, NAME##_uint16_int64}, \
        {NAME##_uint32_int32, NAME##_uint32_int64}, {NAME##_uint64_int32, NAME##_uint64_int64} }
    typedef void (*floor_rows_t)(const void *, const int64_t *, int64_t, int64_t, void *,
                                 void *, void *, uint8_t *, int32_t *, int64_t);
    /* The rows' loop of token dtype kind into int64 (wide) or int32. */
    static floor_rows_t floor_rows(int kind, int wide) {
        static const floor_rows_t loops[8][2] = FLOOR_VERSIONS(floor_rows);
        return loops[kind][wide != 0];
    }
    typedef int64_t (*floor_document_rows_t)(
        const void *, const int64_t *, int64_t, const int64_t *, const int64_t *, int64_t, int64_t,
        const int64_t *, int64_t *, int64_t, int64_t, void *, void *, void *, uint8_t *, int32_t *,
        int32_t *, int64_t *, int64_t);
    /* The document rows' loop of token dtype kind into int64 (wide) or int32. */
    static floor_document_rows_t floor_document_rows(int kind, int wide) {
        static const floor_document_rows_t loops[8][2] = FLOOR_VERSIONS(floor_document_rows);
        return loops[kind][wide != 0];
    }
    """
    ctypedef void (*floor_rows_t)(
        const void *, const int64_t *, int64_t, int64_t, void *, void *, void *, uint8_t *,
        int32_t *, int64_t
    ) noexcept nogil
    floor_rows_t floor_rows(int kind, int wide) noexcept nogil
    ctypedef int64_t (*floor_document_rows_t)(
        const void *, const int64_t *, int64_t, const int64_t *, const int64_t *, int64_t, int64_t,
        const int64_t *, int64_t *, int64_t, int64_t, void *, void *, void *, uint8_t *, int32_t *,
        int32_t *, int64_t *, int64_t
    ) noexcept nogil
    floor_document_rows_t floor_document_rows(int kind, int wide) noexcept nogil

# The two output dtypes of copy_rows.
ctypedef fused out_t:
    int32_t
    int64_t


cdef int _kind(const token_t[::1] tokens) noexcept:
    """The C loops' number of the token dtype: 0-3 for signed 8, 16, 32 and 64 bits, 4-7 for
    unsigned."""
    cdef int width = 0 if sizeof(token_t) == 1 else 1 if sizeof(token_t) == 2 else (
        2 if sizeof(token_t) == 4 else 3
    )
    return width + (4 if <token_t>-1 > 0 else 0)


@cython.embedsignature(False)
def copy_windows(
    const token_t[::1] tokens,
    const int64_t[:] starts,
    int64_t[:, ::1] windows,
    int64_t[::1] next_tokens,
    Py_ssize_t distance,
):
    """copy_windows(const token_t[::1] tokens, const int64_t[:] starts, int64_t[:, ::1] windows, int64_t[::1] next_tokens, Py_ssize_t distance)

    ``windows[i] = tokens[starts[i] : starts[i] + block]`` and ``next_tokens[i] =
    tokens[starts[i] + block]``, prefetching every cache line of window ``i + distance`` first
    (``distance=0``: no prefetch). The caller guarantees ``starts[i] + block < len(tokens)``
    and ``len(starts) <= len(windows) == len(next_tokens)``.
    """
    cdef Py_ssize_t count = starts.shape[0]
    cdef Py_ssize_t block = windows.shape[1]
    cdef Py_ssize_t line = max(1, 64 // <Py_ssize_t>sizeof(token_t))
    cdef Py_ssize_t i, j, start, ahead
    with nogil:
        for i in range(count):
            if distance > 0 and i + distance < count:
                ahead = starts[i + distance]
                j = 0
                while j < block:
                    BASELINE_PREFETCH(&tokens[ahead + j])
                    j += line
                BASELINE_PREFETCH(&tokens[ahead + block])
            start = starts[i]
            if token_t is int64_t:
                memcpy(&windows[i, 0], &tokens[start], block * sizeof(int64_t))
            else:
                for j in range(block):
                    windows[i, j] = tokens[start + j]
            next_tokens[i] = tokens[start + block]


@cython.embedsignature(False)
def copy_rows(
    const token_t[::1] tokens,
    const int64_t[::1] starts,
    out_t[:, ::1] inputs,
    out_t[:, ::1] labels,
    out_t[:, ::1] positions,
    uint8_t[:, ::1] mask,
    int32_t[:, ::1] pieces,
    Py_ssize_t distance,
):
    """copy_rows(const token_t[::1] tokens, const int64_t[::1] starts, out_t[:, ::1] inputs, out_t[:, ::1] labels, out_t[:, ::1] positions, uint8_t[:, ::1] mask, int32_t[:, ::1] pieces, Py_ssize_t distance)

    ``inputs[i] = tokens[starts[i] : starts[i] + block]`` and ``labels[i] = tokens[starts[i] +
    1 : starts[i] + block + 1]``, converted to ``out_t`` (int32 or int64; no range check), in
    one pass over each window, the window ``distance`` rows ahead prefetched first (0: none).
    With ``positions`` (then ``mask`` and ``pieces`` too), each row also gets the extras' bytes
    of a row of one piece: ``positions[i] = 0, 1, 2, ...``, ``mask[i]`` ones, ``pieces[i]``
    zeros; None writes no extras. A start whose window does not lie inside ``tokens``, buffers
    of other shapes than ``(len(starts), block)`` or some of the extras' buffers without the
    others are a ValueError, before anything is written.
    """
    cdef Py_ssize_t count = starts.shape[0]
    cdef Py_ssize_t block = inputs.shape[1]
    cdef int kind = _kind(tokens)
    cdef void *positions_out = NULL
    cdef uint8_t *mask_out = NULL
    cdef int32_t *pieces_out = NULL
    cdef int64_t lowest = 0, highest = 0
    cdef Py_ssize_t i
    cdef bint extras = positions is not None
    if (mask is not None) != extras or (pieces is not None) != extras:
        raise ValueError("copy_rows: positions, mask and pieces are given together or not at all")
    if not (
        labels.shape[0] == inputs.shape[0] == count
        and labels.shape[1] == block
        and (
            not extras
            or positions.shape[0] == mask.shape[0] == pieces.shape[0] == count
            and positions.shape[1] == mask.shape[1] == pieces.shape[1] == block
        )
    ):
        raise ValueError(f"copy_rows: every buffer must be ({count}, {block})")
    if count == 0 or block == 0:
        return
    with nogil:
        lowest = highest = starts[0]
        for i in range(count):
            lowest = min(lowest, starts[i])
            highest = max(highest, starts[i])
    if lowest < 0 or highest + block >= tokens.shape[0]:
        raise ValueError("copy_rows: a window does not lie inside tokens")
    if extras:
        positions_out = &positions[0, 0]
        mask_out = &mask[0, 0]
        pieces_out = &pieces[0, 0]
    with nogil:
        floor_rows(kind, out_t is int64_t)(
            &tokens[0], &starts[0], count, block, &inputs[0, 0], &labels[0, 0], positions_out,
            mask_out, pieces_out, distance,
        )


def _token_kind(const token_t[::1] tokens) -> int:
    """:func:`_kind` of a token array (the buffer's dtype picks the specialisation)."""
    return _kind(tokens)


cdef class Documents:
    """Tokens cut into documents, their windows of one block numbered, for
    :func:`copy_document_rows`: across documents (``within=False``) window ``w`` starts at token
    ``w`` (``w < len(tokens) - block``); within documents the windows of ``block + 1`` tokens
    inside each document are numbered in order. Checked and indexed once here (the documents'
    ends, a table of where each bucket of window numbers starts its search), so that no value a
    caller passes later can make the loop read outside them.
    """

    cdef readonly object tokens
    cdef const uint8_t[::1] data
    cdef int kind
    cdef const int64_t[::1] ends
    cdef const int64_t[::1] window_ends
    cdef const int64_t[::1] table
    cdef int64_t shift
    cdef readonly Py_ssize_t block
    cdef readonly int64_t windows
    cdef readonly bint within

    def __init__(self, tokens, lengths, Py_ssize_t block, bint within):
        tokens = np.ascontiguousarray(tokens)
        if tokens.dtype.kind not in "iu":
            raise TypeError(f"Documents: tokens must hold integers, got {tokens.dtype}")
        if tokens.ndim != 1:
            raise ValueError("Documents: tokens must be one-dimensional")
        self.kind = _token_kind(tokens)
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or lengths.shape[0] == 0 or lengths.dtype.kind not in "iu":
            raise ValueError("Documents: lengths must be a non-empty array of integers")
        if block < 1:
            raise ValueError(f"Documents: block must be at least 1, got {block}")
        if (lengths < 0).any() or int(lengths.sum()) != tokens.shape[0]:
            raise ValueError("Documents: lengths must be >= 0 and add up to len(tokens)")
        ends = np.cumsum(lengths, dtype=np.int64)
        window_ends = None
        searched = ends
        if within:
            searched = window_ends = np.cumsum(np.maximum(lengths.astype(np.int64) - block, 0))
            windows = int(searched[searched.shape[0] - 1])
        else:
            windows = max(0, tokens.shape[0] - block)
        # Buckets about as wide as the searched values lie apart: a step or two a search.
        shift = max(0, (windows // searched.shape[0]).bit_length() - 1)
        buckets = ((windows - 1) >> shift) + 1 if windows else 1
        table = np.searchsorted(
            searched, np.arange(buckets, dtype=np.int64) << shift, side="right"
        ).astype(np.int64)
        # All made before any is set: __init__ called again and failing leaves the old whole.
        self.tokens, self.data, self.ends, self.window_ends = (
            tokens, tokens.view(np.uint8), ends, window_ends
        )
        self.table, self.shift, self.windows = table, shift, windows
        self.block, self.within = block, within


@cython.embedsignature(False)
def copy_document_rows(
    Documents documents not None,
    const int64_t[::1] starts,
    out_t[:, ::1] inputs,
    out_t[:, ::1] labels,
    out_t[:, ::1] positions,
    uint8_t[:, ::1] mask,
    int32_t[:, ::1] pieces,
    int32_t[::1] cu_seqlens,
    Py_ssize_t distance,
):
    """copy_document_rows(Documents documents, const int64_t[::1] starts, out_t[:, ::1] inputs, out_t[:, ::1] labels, out_t[:, ::1] positions, uint8_t[:, ::1] mask, int32_t[:, ::1] pieces, int32_t[::1] cu_seqlens, Py_ssize_t distance)

    :func:`copy_rows` with each document's extras: the floor of a document stream's batch. Row
    ``i`` holds window number ``starts[i]`` of ``documents``. Across documents, its position ids
    restart at 0 and its piece numbers go up by one at every document start inside it, and its
    mask is 0 where the label starts a document; within documents the row is one piece.
    ``cu_seqlens`` gets the pieces' boundaries in the flattened batch (at most ``len(starts) *
    block + 1``). Returns ``(boundaries, longest piece)``. A window number outside
    ``[0, documents.windows)``, or buffers of other shapes, is a ValueError before anything is
    written.
    """
    cdef Py_ssize_t count = starts.shape[0]
    cdef Py_ssize_t block = documents.block
    cdef int64_t written = 0, longest = 0
    cdef int64_t *addresses
    cdef const int64_t *window_ends = NULL
    if not (
        inputs.shape[0] == labels.shape[0] == positions.shape[0] == mask.shape[0]
        == pieces.shape[0] == count
        and inputs.shape[1] == labels.shape[1] == positions.shape[1] == mask.shape[1]
        == pieces.shape[1] == block
    ):
        raise ValueError(f"copy_document_rows: every row buffer must be ({count}, {block})")
    if count * block >= 2**31:
        raise ValueError("copy_document_rows: cu_seqlens is int32; rows x block must be below 2**31")
    if cu_seqlens.shape[0] < count * block + 1:
        raise ValueError(f"copy_document_rows: cu_seqlens must hold {count * block + 1} values")
    if count == 0:
        return 0, 0
    if documents.windows == 0:
        raise ValueError("copy_document_rows: a window number is not below documents.windows")
    if documents.within:
        window_ends = &documents.window_ends[0]
    addresses = <int64_t *>malloc(count * sizeof(int64_t))
    if addresses == NULL:
        raise MemoryError()
    try:
        with nogil:
            written = floor_document_rows(documents.kind, out_t is int64_t)(
                &documents.data[0], &documents.ends[0], documents.ends.shape[0], window_ends,
                &documents.table[0], documents.shift, documents.windows, &starts[0], addresses,
                count, block, &inputs[0, 0], &labels[0, 0], &positions[0, 0], &mask[0, 0],
                &pieces[0, 0], &cu_seqlens[0], &longest, distance,
            )
    finally:
        free(addresses)
    if written < 0:
        raise ValueError("copy_document_rows: a window number is not below documents.windows")
    return written, longest
