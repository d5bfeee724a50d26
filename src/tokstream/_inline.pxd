# The small pieces several kernels share, one definition each, inlined where they are used: a
# window's prefetch and copy, and the segment a window index falls in.
#
# They work on pointers: each caller proves that the window's block + 1 tokens lie inside its
# corpus, that the rows it writes are rows of its buffers and that the tables it passes are
# whole. The debug build checks the windows where the caller takes the pointers
# (bounds-checked &tokens[start], &windows[row, 0]) and reads tokens[start + block].
from libc.stdint cimport int64_t
from libc.string cimport memcpy

from tokstream._types cimport token_t

cdef extern from "_portable.h":
    void TOKSTREAM_PREFETCH(const void *p) noexcept nogil


cdef inline void prefetch_window(const token_t *window, Py_ssize_t block) noexcept nogil:
    # Ask for every cache line of the window's block + 1 tokens.
    cdef Py_ssize_t j = 0, line = max(1, 64 // <Py_ssize_t>sizeof(token_t))
    while j < block:
        TOKSTREAM_PREFETCH(&window[j])
        j += line
    TOKSTREAM_PREFETCH(&window[block])


cdef inline void copy_window(
    const token_t *source,
    Py_ssize_t block,
    int64_t *window,
    int64_t *target,
    int64_t *next_token,
) noexcept nogil:
    # window[:block] = source[:block], widened to int64; then target[:block] = source[1:], or
    # (target NULL) next_token[0] = source[block].
    cdef Py_ssize_t j
    if token_t is int64_t:
        memcpy(window, source, block * sizeof(int64_t))
        if target != NULL:
            memcpy(target, &source[1], block * sizeof(int64_t))
    else:
        for j in range(block):
            window[j] = source[j]
        if target != NULL:
            for j in range(block):
                target[j] = source[1 + j]
    if target == NULL:
        next_token[0] = source[block]


cdef inline Py_ssize_t segment_in(
    int64_t window, Py_ssize_t low, Py_ssize_t high, const int64_t *offsets, int probes
) noexcept nogil:
    # The segment j in [low, high] with offsets[j] <= window < offsets[j + 1], given that it
    # lies there. A binary search written for conditional moves and run ``probes`` times
    # (enough for the widest bucket, so its branches are taken alike for every window, where
    # random windows make a branchy search's a coin flip); a last loop finishes the search
    # whatever ``probes`` says.
    cdef Py_ssize_t size = high - low + 1
    cdef Py_ssize_t half
    cdef int probe
    for probe in range(probes):
        # low + half <= low + size - 1: the probe stays inside the bucket's segments.
        half = size >> 1
        low = low + half if offsets[low + half] <= window else low
        size -= half
    while size > 1:
        half = size >> 1
        low = low + half if offsets[low + half] <= window else low
        size -= half
    return low


cdef inline void find_segments(
    const char *windows, Py_ssize_t windows_stride, Py_ssize_t count,
    const int64_t *offsets, const int64_t *bucket_segments, int shift, int probes,
    int64_t *segments,
) noexcept nogil:
    # segments[i] = the segment j with offsets[j] <= w < offsets[j + 1] of window w, the int64
    # at windows + i * windows_stride (bytes: an index array may be a strided view):
    # bucket_segments[b] is the segment of window b << shift, so it lies between the segments
    # of its bucket and the next one's. Two passes over the batch (every bucket, then every
    # search), each of loads independent of each other, so that their cache misses overlap
    # where one loop per window would chain them.
    cdef Py_ssize_t i
    cdef int64_t window
    for i in range(count):
        window = (<const int64_t *>(windows + i * windows_stride))[0]
        segments[i] = bucket_segments[window >> shift]
    for i in range(count):
        window = (<const int64_t *>(windows + i * windows_stride))[0]
        segments[i] = segment_in(
            window, segments[i], bucket_segments[(window >> shift) + 1], offsets, probes
        )
