# A window's cache prefetch and copy, inlined in every kernel that copies windows.
#
# They work on pointers: each caller proves that the window's block + 1 tokens lie inside its
# corpus and that the rows it writes are rows of its buffers. The debug build checks the
# windows where the caller takes the pointers (bounds-checked &tokens[start], &windows[row, 0])
# and reads tokens[start + block].
from libc.stdint cimport int64_t
from libc.string cimport memcpy

from tokstream._kernels.types cimport token_t

cdef extern from "portable.h":
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
