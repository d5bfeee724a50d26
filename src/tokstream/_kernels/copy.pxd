# A window's cache prefetch and copy, inlined in every kernel that copies windows.
#
# They work on pointers: each caller proves that the window's block + 1 tokens lie inside its
# corpus and that the rows it writes are rows of its buffers. The debug build checks the
# windows where the caller takes the pointers (bounds-checked &tokens[start], &windows[row, 0])
# and reads tokens[start + block].
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

from tokstream._kernels.types cimport out_t, token_t

cdef extern from "portable.h":
    void TOKSTREAM_PREFETCH(const void *p) noexcept nogil


cdef inline void prefetch_window(const token_t *window, Py_ssize_t block) noexcept nogil:
    # Ask for every cache line of the window's block + 1 tokens.
    cdef Py_ssize_t j = 0, line = max(1, 64 // <Py_ssize_t>sizeof(token_t))
    while j < block:
        TOKSTREAM_PREFETCH(&window[j])
        j += line
    TOKSTREAM_PREFETCH(&window[block])


cdef inline uint64_t outside_out(token_t value, const out_t *output) noexcept nogil:
    # Nonzero when ``value`` does not fit out_t (``output`` only names it): only a 32-bit
    # output of uint32, int64 or uint64 tokens can lose one (every other pair widens or keeps
    # the width). Branch-free, so the copy loops that OR it up stay vectorised.
    cdef uint64_t outside = 0
    if out_t is int32_t:
        if token_t is int64_t:
            # -2**31 <= value < 2**31 iff value + 2**31 (modulo 2**64) < 2**32.
            outside = (<uint64_t>value + 0x80000000ULL) >> 32
        elif token_t is uint32_t or token_t is uint64_t:
            outside = <uint64_t>value >> 31
    return outside


cdef inline uint64_t copy_window(
    const token_t *source,
    Py_ssize_t block,
    out_t *window,
    out_t *target,
    out_t *next_token,
) noexcept nogil:
    # window[:block] = source[:block] in out_t; then target[:block] = source[1:], or (target
    # NULL) next_token[0] = source[block]. Returns nonzero when one of the block + 1 tokens
    # does not fit out_t (the values written are then wrong: the caller must not hand the
    # batch out).
    cdef Py_ssize_t j
    cdef uint64_t outside = 0
    if (token_t is int64_t and out_t is int64_t) or (token_t is int32_t and out_t is int32_t):
        memcpy(window, source, block * sizeof(out_t))
        if target != NULL:
            memcpy(target, &source[1], block * sizeof(out_t))
    else:
        for j in range(block):
            window[j] = <out_t>source[j]
            outside |= outside_out(source[j], window)
        outside |= outside_out(source[block], window)
        if target != NULL:
            for j in range(block):
                target[j] = <out_t>source[1 + j]
    if target == NULL:
        next_token[0] = <out_t>source[block]
    return outside
