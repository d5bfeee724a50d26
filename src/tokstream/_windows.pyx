"""The compiled kernels: copy context windows out of a token array, and walk a keyed permutation.

Nothing here validates or allocates. The Python side (``tokstream._validate``,
``tokstream.corpus`` and ``tokstream.stream``) hands in C-contiguous int64 output buffers of the
right shapes and start positions it has proven to be in range; the release build then runs with
bounds checks off, the debug build (``TOKSTREAM_DEBUG=1`` at build time) with them on.
"""

cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef extern from *:
    """
    #ifndef TOKSTREAM_DEBUG
    #define TOKSTREAM_DEBUG 0
    #endif
    """
    const bint TOKSTREAM_DEBUG

cdef extern from "_portable.h":
    void TOKSTREAM_PREFETCH(const void *p) noexcept nogil
    uint64_t tokstream_mulhi64(uint64_t a, uint64_t b) noexcept nogil

ctypedef fused token_t:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t

#: True when this module was compiled with bounds checks on (``TOKSTREAM_DEBUG=1``).
DEBUG_BUILD = bool(TOKSTREAM_DEBUG)

cdef enum:
    _CACHE_LINE = 64

# ---------------------------------------------------------------------------------------------
# Window gather


# Cython embeds the signature of a fused function's dispatcher ("signatures, args, kwargs,
# defaults"), not this one; the docstring states it instead.
@cython.embedsignature(False)
def gather_windows(
    const token_t[::1] tokens,
    const int64_t[:] starts,
    int64_t[:, ::1] windows,
    int64_t[::1] next_tokens=None,
    int64_t[:, ::1] targets=None,
    const int64_t[:] rows=None,
    Py_ssize_t prefetch=0,
):
    """gather_windows(const token_t[::1] tokens, const int64_t[:] starts, int64_t[:, ::1] windows, int64_t[::1] next_tokens=None, int64_t[:, ::1] targets=None, const int64_t[:] rows=None, Py_ssize_t prefetch=0)

    Copy window ``i`` (``tokens[starts[i] : starts[i] + block]``) into row ``rows[i]``.

    ``block`` is ``windows.shape[1]``. With ``next_tokens`` the token after each window goes to
    ``next_tokens[row]``; with ``targets`` the window shifted by one token goes to
    ``targets[row]``; exactly one of the two is given. ``rows`` defaults to ``0, 1, 2, ...``.
    With ``prefetch=d > 0`` every cache line of window ``i + d`` is prefetched before window
    ``i`` is copied (:func:`tokstream.corpus.prefetch_distance` chooses ``d``); 0 skips the
    software prefetch, for consecutive windows, which the hardware prefetcher already streams.

    The caller guarantees ``0 <= starts[i]`` and ``starts[i] + block < len(tokens)``, that every
    row index is below ``windows.shape[0]``, and that the target buffer has the matching shape.
    """
    cdef Py_ssize_t count = starts.shape[0]
    cdef Py_ssize_t block = windows.shape[1]
    cdef bint shifted = targets is not None
    cdef bint indirect = rows is not None
    cdef Py_ssize_t line_tokens = max(1, _CACHE_LINE // <Py_ssize_t>sizeof(token_t))
    cdef Py_ssize_t i, j, row, start, ahead
    with nogil:
        for i in range(count):
            if prefetch > 0 and prefetch < count - i:
                # starts[i + prefetch] is a validated window start, so every address from
                # tokens[ahead] to tokens[ahead + block] lies inside ``tokens``.
                ahead = starts[i + prefetch]
                j = 0
                while j < block:
                    TOKSTREAM_PREFETCH(&tokens[ahead + j])
                    j += line_tokens
                TOKSTREAM_PREFETCH(&tokens[ahead + block])
            # Validated on the Python side: start + block < len(tokens), row < windows.shape[0].
            start = starts[i]
            row = rows[i] if indirect else i
            if token_t is int64_t and not TOKSTREAM_DEBUG:
                memcpy(&windows[row, 0], &tokens[start], block * sizeof(int64_t))
                if shifted:
                    memcpy(&targets[row, 0], &tokens[start + 1], block * sizeof(int64_t))
            else:
                for j in range(block):
                    windows[row, j] = tokens[start + j]
                if shifted:
                    for j in range(block):
                        targets[row, j] = tokens[start + 1 + j]
            if not shifted:
                next_tokens[row] = tokens[start + block]


# ---------------------------------------------------------------------------------------------
# Keyed permutation of [0, n): an alternating Feistel network on a mixed-radix domain


cdef inline uint64_t _mix64(uint64_t z) noexcept nogil:
    # The splitmix64 finaliser: a cheap bijective avalanche on 64 bits.
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EB
    return z ^ (z >> 31)


cdef inline uint64_t _encrypt(
    uint64_t x, const uint64_t[::1] keys, int low_bits, uint64_t high_size
) noexcept nogil:
    # x = high * 2**low_bits + low, with low < 2**low_bits and high < high_size. Round r adds
    # a keyed hash of one half to the other half, modulo that half's size: (low, high) ->
    # ((low + F(high)) mod 2**low_bits, high), then (low, (high + F(low)) mod high_size). Each
    # round is invertible whatever F is, so the whole is a bijection of [0, high_size << low_bits).
    cdef uint64_t low_mask = (<uint64_t>1 << low_bits) - 1
    cdef uint64_t low = x & low_mask
    cdef uint64_t high = x >> low_bits
    cdef Py_ssize_t r
    for r in range(keys.shape[0]):
        if r % 2 == 0:
            low = (low + _mix64(high ^ keys[r])) & low_mask
        else:
            # mulhi(hash, size) maps a 64-bit hash evenly onto [0, size) without a division.
            high = high + tokstream_mulhi64(_mix64(low ^ keys[r]), high_size)
            if high >= high_size:
                high -= high_size
    return (high << low_bits) | low


def permuted_positions(
    int64_t[::1] out,
    int64_t first,
    int64_t stride,
    int64_t n,
    int low_bits,
    int64_t high_size,
    const uint64_t[::1] keys,
):
    """Write ``pi(first + stride * i)`` to ``out[i]``, with ``pi`` a keyed bijection of [0, n).

    ``pi`` is a Feistel network on ``[0, high_size * 2**low_bits)``, a domain less than
    ``2**low_bits`` larger than n, restricted to ``[0, n)`` by cycle walking: an output ``>= n``
    is encrypted again until it lands inside (rare: the domain overshoots n by about sqrt(n)).
    The walk stays in the cycle of its input, so it comes back below n and the restriction is a
    bijection. The caller guarantees ``high_size << low_bits >= n``, ``low_bits <= 32``,
    ``high_size <= 2**32``, an even number of keys and every input position in ``[0, n)``.
    """
    cdef Py_ssize_t i
    cdef uint64_t value, bound = <uint64_t>n, size = <uint64_t>high_size
    with nogil:
        for i in range(out.shape[0]):
            value = _encrypt(<uint64_t>(first + stride * i), keys, low_bits, size)
            while value >= bound:
                value = _encrypt(value, keys, low_bits, size)
            out[i] = <int64_t>value
