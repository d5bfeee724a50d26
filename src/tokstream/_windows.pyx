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
    #if defined(__GNUC__) || defined(__clang__)
    #define TOKSTREAM_PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 0)
    #else
    #define TOKSTREAM_PREFETCH(p) ((void)(p))
    #endif
    """
    const bint TOKSTREAM_DEBUG
    void TOKSTREAM_PREFETCH(const void *p) noexcept nogil

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
    # How many windows ahead the gather loop asks the CPU to start loading.
    _PREFETCH_DISTANCE = 16

#: How many windows ahead the gather loop asks the CPU to start loading.
PREFETCH_DISTANCE = _PREFETCH_DISTANCE


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
):
    """gather_windows(const token_t[::1] tokens, const int64_t[:] starts, int64_t[:, ::1] windows, int64_t[::1] next_tokens=None, int64_t[:, ::1] targets=None, const int64_t[:] rows=None)

    Copy window ``i`` (``tokens[starts[i] : starts[i] + block]``) into row ``rows[i]``.

    ``block`` is ``windows.shape[1]``. With ``next_tokens`` the token after each window goes to
    ``next_tokens[row]``; with ``targets`` the window shifted by one token goes to
    ``targets[row]``; exactly one of the two is given. ``rows`` defaults to ``0, 1, 2, ...``.

    The caller guarantees ``0 <= starts[i]`` and ``starts[i] + block < len(tokens)``, that every
    row index is below ``windows.shape[0]``, and that the target buffer has the matching shape.
    """
    cdef Py_ssize_t count = starts.shape[0]
    cdef Py_ssize_t block = windows.shape[1]
    cdef bint shifted = targets is not None
    cdef bint indirect = rows is not None
    cdef Py_ssize_t i, j, row, start, ahead
    with nogil:
        for i in range(count):
            if i + _PREFETCH_DISTANCE < count:
                # starts[i + _PREFETCH_DISTANCE] is a validated window start, so the address
                # lies inside ``tokens``.
                ahead = starts[i + _PREFETCH_DISTANCE]
                TOKSTREAM_PREFETCH(&tokens[ahead])
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
# Keyed permutation of [0, n): a balanced Feistel network with cycle walking


cdef inline uint64_t _mix64(uint64_t z) noexcept nogil:
    # The splitmix64 finaliser: a cheap bijective avalanche on 64 bits.
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EB
    return z ^ (z >> 31)


cdef inline uint64_t _feistel(
    uint64_t x, const uint64_t[::1] keys, int half_bits, uint64_t half_mask
) noexcept nogil:
    cdef uint64_t left = x >> half_bits
    cdef uint64_t right = x & half_mask
    cdef uint64_t swap
    cdef Py_ssize_t r
    for r in range(keys.shape[0]):
        swap = right
        right = left ^ (_mix64(right ^ keys[r]) & half_mask)
        left = swap
    return (left << half_bits) | right


def permuted_positions(
    int64_t[::1] out,
    int64_t first,
    int64_t stride,
    int64_t n,
    int half_bits,
    const uint64_t[::1] keys,
):
    """Write ``pi(first + stride * i)`` to ``out[i]``, with ``pi`` a keyed bijection of [0, n).

    ``pi`` is a Feistel network over ``2 * half_bits`` bits (a power of four ``>= n``) restricted
    to ``[0, n)`` by cycle walking: an output ``>= n`` is encrypted again until it lands inside.
    Because the network is a bijection, the walk always returns inside the cycle of its input, so
    the restriction is itself a bijection. The caller guarantees ``1 <= n <= 4 ** half_bits``,
    ``half_bits <= 31`` and every input position below ``n``.
    """
    cdef Py_ssize_t i
    cdef uint64_t half_mask = (<uint64_t>1 << half_bits) - 1
    cdef uint64_t value, bound = <uint64_t>n
    with nogil:
        for i in range(out.shape[0]):
            value = _feistel(<uint64_t>(first + stride * i), keys, half_bits, half_mask)
            while value >= bound:
                value = _feistel(value, keys, half_bits, half_mask)
            out[i] = <int64_t>value
