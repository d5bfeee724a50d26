"""Plain C loops over random windows: the single-thread limits tokstream is held to.

Written independently of tokstream's kernels (no shared code, not even the token type) so that
they measure the machine, not tokstream. :func:`copy_windows`: one ``memcpy`` (or widening loop)
per window into a reused buffer, with software prefetch of the window ``distance`` windows
ahead; :func:`tokstream.bench.baselines.c_loop` drives it with the best distance it finds on the
machine at hand. :func:`copy_rows`: the bytes of a batch with shifted labels, and optionally the
extras' bytes, written in an int32 or int64 output dtype: the floor ``benchmarks/out_dtype.py``
holds ``out_dtype="int32"`` to.
"""

cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
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
        }
    /* The extras' bytes of a row of one piece: position ids 0, 1, 2, ..., a mask of ones and
     * piece numbers 0. */
    #define FLOOR_EXTRAS(TO)                                                                 \
        FLOOR_CLONES FLOOR_UNUSED static void floor_extras_##TO(                             \
            int64_t block, TO##_t *positions, uint8_t *mask, int32_t *pieces) {              \
            int64_t j;                                                                       \
            for (j = 0; j < block; j++) {                                                    \
                positions[j] = (TO##_t)j;                                                    \
            }                                                                                \
            memset(mask, 1, (size_t)block);                                                  \
            memset(pieces, 0, (size_t)block * sizeof(int32_t));                              \
        }
    FLOOR_EXTRAS(int32)
    FLOOR_EXTRAS(int64)
    #define FLOOR_ROWS(FROM, TO)                                                             \
        FLOOR_ROW(FROM, TO)                                                                  \
        FLOOR_UNUSED static void floor_rows_##FROM##_##TO(                                   \
            const void *all_tokens, const int64_t *starts, int64_t count, int64_t block,     \
            void *inputs, void *labels, void *positions, uint8_t *mask, int32_t *pieces,     \
            int64_t distance) {                                                              \
            const FROM##_t *tokens = (const FROM##_t *)all_tokens;                           \
            int64_t i, j, line = 64 / (int64_t)sizeof(FROM##_t);                             \
            if (line < 1) line = 1;                                                          \
            for (i = 0; i < count; i++) {                                                    \
                if (distance > 0 && i + distance < count) {                                  \
                    const FROM##_t *ahead = tokens + starts[i + distance];                   \
                    for (j = 0; j <= block; j += line) BASELINE_PREFETCH(ahead + j);         \
                    BASELINE_PREFETCH(ahead + block);                                        \
                }                                                                            \
                floor_row_##FROM##_##TO(tokens + starts[i], block,                           \
                                        (TO##_t *)inputs + i * block,                        \
                                        (TO##_t *)labels + i * block);                       \
                if (positions != NULL)                                                       \
                    floor_extras_##TO(block, (TO##_t *)positions + i * block,                \
                                      mask + i * block, pieces + i * block);                 \
            }                                                                                \
        }
    #define FLOOR_BOTH(FROM) FLOOR_ROWS(FROM, int32) FLOOR_ROWS(FROM, int64)
    FLOOR_BOTH(int8) FLOOR_BOTH(int16) FLOOR_BOTH(int32) FLOOR_BOTH(int64)
    FLOOR_BOTH(uint8) FLOOR_BOTH(uint16) FLOOR_BOTH(uint32) FLOOR_BOTH(uint64)

    typedef void (*floor_rows_t)(const void *, const int64_t *, int64_t, int64_t, void *,
                                 void *, void *, uint8_t *, int32_t *, int64_t);
    /* The rows' loop of token dtype kind (int8, int16, int32, int64, then unsigned) into int64
     * (wide) or int32. */
    static floor_rows_t floor_rows(int kind, int wide) {
        static const floor_rows_t loops[8][2] = {
            {floor_rows_int8_int32, floor_rows_int8_int64},
            {floor_rows_int16_int32, floor_rows_int16_int64},
            {floor_rows_int32_int32, floor_rows_int32_int64},
            {floor_rows_int64_int32, floor_rows_int64_int64},
            {floor_rows_uint8_int32, floor_rows_uint8_int64},
            {floor_rows_uint16_int32, floor_rows_uint16_int64},
            {floor_rows_uint32_int32, floor_rows_uint32_int64},
            {floor_rows_uint64_int32, floor_rows_uint64_int64},
        };
        return loops[kind][wide != 0];
    }
    """
    ctypedef void (*floor_rows_t)(
        const void *, const int64_t *, int64_t, int64_t, void *, void *, void *, uint8_t *,
        int32_t *, int64_t
    ) noexcept nogil
    floor_rows_t floor_rows(int kind, int wide) noexcept nogil

# The two output dtypes of copy_rows.
ctypedef fused out_t:
    int32_t
    int64_t


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
    cdef int kind
    cdef void *positions_out = NULL
    cdef uint8_t *mask_out = NULL
    cdef int32_t *pieces_out = NULL
    if token_t is int8_t:
        kind = 0
    elif token_t is int16_t:
        kind = 1
    elif token_t is int32_t:
        kind = 2
    elif token_t is int64_t:
        kind = 3
    elif token_t is uint8_t:
        kind = 4
    elif token_t is uint16_t:
        kind = 5
    elif token_t is uint32_t:
        kind = 6
    else:
        kind = 7
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
