"""A plain C loop over random windows: the single-thread random-window limit tokstream is held to.

Written independently of tokstream's kernels (no shared code, not even the token type) so that
it measures the machine, not tokstream: one ``memcpy`` (or widening loop) per window into a
reused buffer, with software prefetch of the window ``distance`` windows ahead.
:func:`tokstream.bench.baselines.c_loop` drives it with the best distance it finds on the
machine at hand.
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
