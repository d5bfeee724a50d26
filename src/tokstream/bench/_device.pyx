"""The device's random-read rate: the ceiling a cold-cache benchmark holds tokstream's reads to.

``benchmarks/test_storage.py`` runs :func:`read_at` from many threads at once, so that many reads
are in flight, and compares the stream's throughput on a file evicted from the page cache with
this rate. A separate concern from the window-copy loop in ``_loop.pyx``: it measures storage,
not memory.
"""

from libc.stdint cimport int64_t


cdef extern from *:
    """
    #if defined(_WIN32)
    static long long baseline_pread(int fd, char *buffer, size_t nbytes, long long offset) {
        (void)fd; (void)buffer; (void)nbytes; (void)offset;
        return -1;
    }
    #else
    #include <unistd.h>
    static long long baseline_pread(int fd, char *buffer, size_t nbytes, long long offset) {
        return (long long)pread(fd, buffer, nbytes, (off_t)offset);
    }
    #endif
    """
    long long baseline_pread(int fd, char *buffer, size_t nbytes, long long offset) noexcept nogil


def read_at(int fd, const int64_t[:] offsets, char[::1] buffer):
    """Read ``len(buffer)`` bytes of ``fd`` at each offset in turn, without the GIL.

    The device-rate baseline of a cold-cache benchmark: run it from many threads at once to keep
    that many reads in flight. Returns how many reads succeeded in full (``pread`` is POSIX;
    on Windows every read fails and 0 is returned).
    """
    cdef Py_ssize_t i, done = 0
    cdef size_t nbytes = buffer.shape[0]
    with nogil:
        for i in range(offsets.shape[0]):
            if baseline_pread(fd, &buffer[0], nbytes, offsets[i]) == <long long>nbytes:
                done += 1
    return done
