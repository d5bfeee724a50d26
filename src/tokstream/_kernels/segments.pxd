# The segment a window index falls in (shards, documents, a mixture's sources), inlined in every
# kernel that looks windows up: the caller proves the tables it passes are whole.
from libc.stdint cimport int64_t


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
