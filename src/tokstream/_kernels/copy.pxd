# A window's cache prefetch and copy, inlined in every kernel that copies windows.
#
# They work on pointers: each caller proves that the window's block + 1 tokens lie inside its
# corpus and that the rows it writes are rows of its buffers. The debug build checks the
# windows where the caller takes the pointers (bounds-checked &tokens[start], &windows[row, 0])
# and reads tokens[start + block].
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

from tokstream._kernels.types cimport out_t, token_t

cdef extern from "portable.h":
    void TOKSTREAM_PREFETCH(const void *p) noexcept nogil

cdef extern from "convert.h":
    uint64_t tokstream_convert_int8_int32(const int8_t *source, int64_t count, int32_t *out) noexcept nogil
    uint64_t tokstream_convert_int16_int32(const int16_t *source, int64_t count, int32_t *out) noexcept nogil
    uint64_t tokstream_convert_int64_int32(const int64_t *source, int64_t count, int32_t *out) noexcept nogil
    uint64_t tokstream_convert_uint8_int32(const uint8_t *source, int64_t count, int32_t *out) noexcept nogil
    uint64_t tokstream_convert_uint16_int32(const uint16_t *source, int64_t count, int32_t *out) noexcept nogil
    uint64_t tokstream_convert_uint32_int32(const uint32_t *source, int64_t count, int32_t *out) noexcept nogil
    uint64_t tokstream_convert_uint64_int32(const uint64_t *source, int64_t count, int32_t *out) noexcept nogil
    uint64_t tokstream_convert_int8_int64(const int8_t *source, int64_t count, int64_t *out) noexcept nogil
    uint64_t tokstream_convert_int16_int64(const int16_t *source, int64_t count, int64_t *out) noexcept nogil
    uint64_t tokstream_convert_int32_int64(const int32_t *source, int64_t count, int64_t *out) noexcept nogil
    uint64_t tokstream_convert_uint8_int64(const uint8_t *source, int64_t count, int64_t *out) noexcept nogil
    uint64_t tokstream_convert_uint16_int64(const uint16_t *source, int64_t count, int64_t *out) noexcept nogil
    uint64_t tokstream_convert_uint32_int64(const uint32_t *source, int64_t count, int64_t *out) noexcept nogil
    uint64_t tokstream_convert_uint64_int64(const uint64_t *source, int64_t count, int64_t *out) noexcept nogil
    void tokstream_fill_int32(int32_t *out, int64_t count, int32_t value) noexcept nogil
    void tokstream_fill_int64(int64_t *out, int64_t count, int64_t value) noexcept nogil
    void tokstream_ramp_int32(int32_t *out, int64_t count) noexcept nogil
    void tokstream_ramp_int64(int64_t *out, int64_t count) noexcept nogil


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


cdef inline uint64_t convert(const token_t *source, Py_ssize_t count, out_t *out) noexcept nogil:
    # out[:count] = source[:count] in out_t; nonzero when a token does not fit out_t (see
    # outside_out). Tokens already of out_t are copied by memcpy, any other pair by the
    # converting loops of convert.h (chosen for the CPU when the module is loaded).
    if (token_t is int64_t and out_t is int64_t) or (token_t is int32_t and out_t is int32_t):
        memcpy(out, source, count * sizeof(out_t))
        return 0
    elif out_t is int32_t and token_t is int8_t:
        return tokstream_convert_int8_int32(source, count, out)
    elif out_t is int32_t and token_t is int16_t:
        return tokstream_convert_int16_int32(source, count, out)
    elif out_t is int32_t and token_t is int64_t:
        return tokstream_convert_int64_int32(source, count, out)
    elif out_t is int32_t and token_t is uint8_t:
        return tokstream_convert_uint8_int32(source, count, out)
    elif out_t is int32_t and token_t is uint16_t:
        return tokstream_convert_uint16_int32(source, count, out)
    elif out_t is int32_t and token_t is uint32_t:
        return tokstream_convert_uint32_int32(source, count, out)
    elif out_t is int32_t and token_t is uint64_t:
        return tokstream_convert_uint64_int32(source, count, out)
    elif out_t is int64_t and token_t is int8_t:
        return tokstream_convert_int8_int64(source, count, out)
    elif out_t is int64_t and token_t is int16_t:
        return tokstream_convert_int16_int64(source, count, out)
    elif out_t is int64_t and token_t is int32_t:
        return tokstream_convert_int32_int64(source, count, out)
    elif out_t is int64_t and token_t is uint8_t:
        return tokstream_convert_uint8_int64(source, count, out)
    elif out_t is int64_t and token_t is uint16_t:
        return tokstream_convert_uint16_int64(source, count, out)
    elif out_t is int64_t and token_t is uint32_t:
        return tokstream_convert_uint32_int64(source, count, out)
    elif out_t is int64_t and token_t is uint64_t:
        return tokstream_convert_uint64_int64(source, count, out)


cdef inline void fill_run(out_t *out, Py_ssize_t count, int64_t value) noexcept nogil:
    # out[:count] = value (which fits out_t: the caller's guarantee).
    if out_t is int32_t:
        tokstream_fill_int32(out, count, <int32_t>value)
    else:
        tokstream_fill_int64(out, count, value)


cdef inline void ramp_run(out_t *out, Py_ssize_t count) noexcept nogil:
    # out[:count] = 0, 1, 2, ... (count - 1 fits out_t: the caller's guarantee).
    if out_t is int32_t:
        tokstream_ramp_int32(out, count)
    else:
        tokstream_ramp_int64(out, count)


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
    cdef uint64_t outside = convert(source, block, window)
    if target != NULL:
        outside |= convert(&source[1], block, target)
    else:
        next_token[0] = <out_t>source[block]
        outside |= outside_out(source[block], window)
    return outside
