"""Ask the OS to read a memory-mapped corpus' upcoming windows ahead of the gather.

A shuffled stream over a file that is not in the page cache waits on one page fault at a time:
the gather touches a window, the thread sleeps until the device returns that page, and only then
touches the next. ``madvise(MADV_WILLNEED)`` on each upcoming window's pages starts their reads
without waiting for them, so the device sees a whole batch of reads at once (its queue full) and
the gather later finds the pages resident. The advice is given on the mapping's own addresses,
so no file descriptor is needed.

Before advising a batch, :func:`advise_at` asks ``mincore`` whether a few of its windows
are already resident; when all of them are (a corpus in the page cache), it advises nothing.
That keeps a warm corpus from paying one system call per window.

Where ``madvise`` does not exist (Windows) every function here is a harmless no-op:
:data:`AVAILABLE` is False, nothing is advised and every page counts as resident.
"""

cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from tokstream._kernels.types cimport token_t

cdef extern from *:
    """
    #if !defined(_WIN32) && (defined(__unix__) || defined(__APPLE__))
    #include <sys/mman.h>
    #include <unistd.h>
    #endif
    #if defined(MADV_WILLNEED)
    #define TOKSTREAM_READAHEAD 1
    #else
    #define TOKSTREAM_READAHEAD 0
    #endif
    #if TOKSTREAM_READAHEAD && (defined(__linux__) || defined(__APPLE__) || defined(__FreeBSD__))
    #define TOKSTREAM_MINCORE 1
    #else
    #define TOKSTREAM_MINCORE 0
    #endif

    static size_t tokstream_page_size(void) {
    #if TOKSTREAM_READAHEAD
        long size = sysconf(_SC_PAGESIZE);
        if (size > 0) return (size_t)size;
    #endif
        return 4096;
    }

    /* Whether the page holding p is in memory; 1 when that cannot be asked. */
    static int tokstream_resident(const void *p, size_t page) {
    #if TOKSTREAM_MINCORE
        unsigned char vec[1] = {1};
        uintptr_t first = (uintptr_t)p & ~(uintptr_t)(page - 1);
        if (mincore((void *)first, page, (void *)vec) != 0) return 1;
        return vec[0] & 1;
    #else
        (void)p; (void)page;
        return 1;
    #endif
    }

    /* Resident pages among the n pages from the page holding p; n when that cannot be asked. */
    static size_t tokstream_resident_pages(const void *p, size_t n, size_t page, unsigned char *vec) {
    #if TOKSTREAM_MINCORE
        size_t i, count = 0;
        uintptr_t first = (uintptr_t)p & ~(uintptr_t)(page - 1);
        if (mincore((void *)first, n * page, (void *)vec) != 0) return n;
        for (i = 0; i < n; i++) count += vec[i] & 1;
        return count;
    #else
        (void)p; (void)page; (void)vec;
        return n;
    #endif
    }

    /* Start reading the pages of [p, p + len) without waiting; 1 if the OS took the advice. */
    static int tokstream_willneed(const void *p, size_t len, size_t page) {
    #if TOKSTREAM_READAHEAD
        uintptr_t first = (uintptr_t)p & ~(uintptr_t)(page - 1);
        return madvise((void *)first, (uintptr_t)p + len - first, MADV_WILLNEED) == 0;
    #else
        (void)p; (void)len; (void)page;
        return 0;
    #endif
    }
    """
    const bint TOKSTREAM_READAHEAD
    size_t tokstream_page_size() noexcept nogil
    int tokstream_resident(const void *p, size_t page) noexcept nogil
    size_t tokstream_resident_pages(
        const void *p, size_t n, size_t page, unsigned char *vec) noexcept nogil
    int tokstream_willneed(const void *p, size_t length, size_t page) noexcept nogil

from libc.stdlib cimport free, malloc


#: True when this platform has ``madvise(MADV_WILLNEED)``; otherwise every call is a no-op.
AVAILABLE = bool(TOKSTREAM_READAHEAD)

cdef size_t _PAGE = tokstream_page_size()


def advise_at(
    const uint64_t[::1] addresses,
    Py_ssize_t window_bytes,
    Py_ssize_t sample,
    const int64_t[::1] lengths=None,
):
    """Start reading the ``window_bytes`` bytes from each of ``addresses`` (or, given
    ``lengths``, the ``lengths[i]`` bytes from ``addresses[i]``: a packed row's pieces), unless
    resident.

    ``addresses`` are the windows' first tokens as the gather finds them
    (:func:`tokstream._windows.lookup_windows`), or the pieces' as the packed-row kernel
    reads them, in any shards. First ``sample`` of them spread evenly are checked with
    ``mincore``: if the first page of each (and a range's last) is resident, the batch is
    taken to be in memory and
    nothing is advised (return 0). Otherwise every range's pages get ``MADV_WILLNEED`` and the
    number of ranges the OS accepted the advice for is returned. ``sample=0`` advises without
    checking.

    Nothing is read or written at these addresses: they are only handed to the OS, which rejects
    any outside a mapping. The caller still passes ranges of the corpus (looked-up windows and
    their ``block + 1`` tokens, or pieces) so that the advice lands on it; ``lengths`` has an
    entry per address.
    """
    cdef Py_ssize_t count = addresses.shape[0]
    cdef Py_ssize_t checks = min(sample, count)
    cdef Py_ssize_t i, advised = 0
    cdef bint cold = checks <= 0
    cdef bint per_range = lengths is not None
    if count == 0 or not TOKSTREAM_READAHEAD or (window_bytes <= 0 and not per_range):
        return 0
    if per_range and lengths.shape[0] != count:
        raise ValueError("advise_at: lengths must have an entry per address")
    cdef Py_ssize_t k
    with nogil:
        for i in range(checks):
            # i * count // checks < count: an index of addresses.
            k = i * count // checks
            # A range's first page, and its last: a piece often begins on a page its
            # document's previous piece brought in.
            if not tokstream_resident(<const void *><size_t>addresses[k], _PAGE) or (
                per_range and lengths[k] > 0 and not tokstream_resident(
                    <const void *>(<size_t>addresses[k] + <size_t>lengths[k] - 1), _PAGE
                )
            ):
                cold = True
                break
        if cold:
            for i in range(count):
                if per_range and lengths[i] <= 0:
                    continue
                advised += tokstream_willneed(
                    <const void *><size_t>addresses[i],
                    <size_t>lengths[i] if per_range else <size_t>window_bytes,
                    _PAGE,
                )
    return advised


@cython.embedsignature(False)
def resident_fraction(const token_t[::1] tokens):
    """resident_fraction(const token_t[::1] tokens) -> float

    The fraction of the pages under ``tokens`` that are in memory (1.0 where ``mincore`` is
    unavailable, and for an empty array). For benchmarks and tests: did eviction or read-ahead
    work?
    """
    cdef size_t nbytes = <size_t>tokens.shape[0] * sizeof(token_t)
    cdef const token_t *base
    cdef size_t pages, resident
    cdef unsigned char *vec
    if nbytes == 0:
        return 1.0
    base = &tokens[0]
    pages = ((<size_t>base % _PAGE) + nbytes + _PAGE - 1) // _PAGE
    vec = <unsigned char *>malloc(pages)
    if vec == NULL:
        raise MemoryError()
    try:
        with nogil:
            resident = tokstream_resident_pages(base, pages, _PAGE, vec)
    finally:
        free(vec)
    return resident / <double>pages
