"""The implicit order of one corpus: a keyed permutation of [0, n), walked in place.

An alternating Feistel network on a mixed-radix domain (``permute.pxd``), its round keys drawn
from the seed and the epoch. Nothing here validates or allocates: ``tokstream.plan.order`` hands in
the domain, the keys and an output buffer it has sized.
"""

from libc.stdint cimport int64_t, uint64_t

from tokstream._kernels.permute cimport LANES, fill_round_keys, one_permutation, permute_group


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
    cdef Py_ssize_t i = 0, lane, lanes, count = out.shape[0], rounds = keys.shape[0]
    cdef uint64_t values[LANES]
    cdef const uint64_t *lane_keys[LANES]
    cdef int lane_low_bits[LANES]
    cdef uint64_t lane_sizes[LANES]
    with nogil:
        one_permutation(
            &keys[0] if rounds > 0 else NULL, low_bits, <uint64_t>high_size, lane_keys,
            lane_low_bits, lane_sizes,
        )
        while i < count:
            lanes = min(LANES, count - i)
            for lane in range(lanes):
                values[lane] = <uint64_t>(first + stride * (i + lane))
            permute_group(
                values, lanes, lane_keys, rounds, lane_low_bits, lane_sizes, <uint64_t>n
            )
            for lane in range(lanes):
                out[i + lane] = <int64_t>values[lane]
            i += LANES


def round_keys(uint64_t[::1] keys, uint64_t seed, uint64_t epoch, uint64_t stream=0):
    """Fill ``keys`` with the round keys of the implicit permutation of ``epoch``.

    ``stream`` tells apart permutations that share a seed and an epoch: 0 for a single corpus,
    ``s + 1`` for source ``s`` of a mixture.
    """
    cdef Py_ssize_t rounds = keys.shape[0]
    if rounds > 0:
        fill_round_keys(seed, stream, epoch, &keys[0], rounds)
