# The keyed permutation of [0, n) the implicit orders use (one corpus in order.pyx, each
# source-epoch of a mixture in mixture.pyx): an alternating Feistel network on a mixed-radix
# domain, restricted to [0, n) by cycle walking. One definition, inlined where it is used.
from libc.stdint cimport uint64_t

cdef extern from "portable.h":
    uint64_t tokstream_mulhi64(uint64_t a, uint64_t b) noexcept nogil


cdef enum:
    # Positions encrypted side by side (see encrypt_lanes).
    LANES = 8

cdef inline uint64_t mix64(uint64_t z) noexcept nogil:
    # The splitmix64 finaliser: a cheap bijective avalanche on 64 bits.
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EB
    return z ^ (z >> 31)


cdef inline uint64_t encrypt(
    uint64_t x, const uint64_t *keys, Py_ssize_t rounds, int low_bits, uint64_t high_size
) noexcept nogil:
    # x = high * 2**low_bits + low, with low < 2**low_bits and high < high_size. Round r adds
    # a keyed hash of one half to the other half, modulo that half's size: (low, high) ->
    # ((low + F(high)) mod 2**low_bits, high), then (low, (high + F(low)) mod high_size). Each
    # round is invertible whatever F is, so the whole is a bijection of [0, high_size << low_bits).
    cdef uint64_t low_mask = (<uint64_t>1 << low_bits) - 1
    cdef uint64_t low = x & low_mask
    cdef uint64_t high = x >> low_bits
    cdef Py_ssize_t r
    for r in range(rounds):
        if r % 2 == 0:
            low = (low + mix64(high ^ keys[r])) & low_mask
        else:
            # mulhi(hash, size) maps a 64-bit hash evenly onto [0, size) without a division.
            high = high + tokstream_mulhi64(mix64(low ^ keys[r]), high_size)
            if high >= high_size:
                high -= high_size
    return (high << low_bits) | low


cdef inline void encrypt_lanes(
    uint64_t *x,
    const uint64_t **keys,
    Py_ssize_t rounds,
    const int *low_bits,
    const uint64_t *high_size,
) noexcept nogil:
    # _encrypt of x[lane] with keys[lane] on the domain (low_bits[lane], high_size[lane]), for
    # the LANES lanes side by side: independent chains of multiplies that the CPU overlaps,
    # where one chain at a time leaves it waiting on each multiply's latency (1.7x faster).
    cdef uint64_t low[LANES]
    cdef uint64_t high[LANES]
    cdef uint64_t low_mask[LANES]
    cdef Py_ssize_t r, lane
    for lane in range(LANES):
        low_mask[lane] = (<uint64_t>1 << low_bits[lane]) - 1
        low[lane] = x[lane] & low_mask[lane]
        high[lane] = x[lane] >> low_bits[lane]
    for r in range(rounds):
        if r % 2 == 0:
            for lane in range(LANES):
                low[lane] = (low[lane] + mix64(high[lane] ^ keys[lane][r])) & low_mask[lane]
        else:
            for lane in range(LANES):
                high[lane] += tokstream_mulhi64(mix64(low[lane] ^ keys[lane][r]), high_size[lane])
                high[lane] = high[lane] - high_size[lane] if high[lane] >= high_size[lane] else high[lane]
    for lane in range(LANES):
        x[lane] = (high[lane] << low_bits[lane]) | low[lane]


cdef inline uint64_t walk(
    uint64_t value, const uint64_t *keys, Py_ssize_t rounds, int low_bits, uint64_t high_size,
    uint64_t bound,
) noexcept nogil:
    # Cycle walking: an encrypted value >= bound is encrypted again until it lands below.
    while value >= bound:
        value = encrypt(value, keys, rounds, low_bits, high_size)
    return value



cdef inline void one_permutation(
    const uint64_t *keys,
    int low_bits,
    uint64_t high_size,
    const uint64_t **lane_keys,
    int *lane_low_bits,
    uint64_t *lane_sizes,
) noexcept nogil:
    # Every one of the LANES lanes given the same keys and domain, as permute_group reads them.
    cdef Py_ssize_t lane
    for lane in range(LANES):
        lane_keys[lane] = keys
        lane_low_bits[lane] = low_bits
        lane_sizes[lane] = high_size


cdef inline void permute_group(
    uint64_t *values,
    Py_ssize_t lanes,
    const uint64_t **keys,
    Py_ssize_t rounds,
    const int *low_bits,
    const uint64_t *high_size,
    uint64_t bound,
) noexcept nogil:
    # values[:lanes] through one permutation of [0, bound), whose keys and domain every one of
    # the LANES entries of keys, low_bits and high_size holds: a full group side by side, fewer
    # one at a time, then cycle walking. The caller guarantees every value below bound.
    cdef Py_ssize_t lane
    if lanes == LANES:
        encrypt_lanes(values, keys, rounds, low_bits, high_size)
    else:
        for lane in range(lanes):
            values[lane] = encrypt(values[lane], keys[0], rounds, low_bits[0], high_size[0])
    for lane in range(lanes):
        values[lane] = walk(values[lane], keys[0], rounds, low_bits[0], high_size[0], bound)


cdef inline void fill_round_keys(
    uint64_t seed, uint64_t stream, uint64_t epoch, uint64_t *keys, Py_ssize_t rounds
) noexcept nogil:
    # splitmix64 from a state that mixes seed, stream and epoch; stream 0 is a single corpus.
    cdef uint64_t state = (
        seed * <uint64_t>0x9E3779B97F4A7C15
        + epoch * <uint64_t>0xD1B54A32D192ED03
        + stream * <uint64_t>0x8CB92BA72F3D8DD7
    )
    cdef Py_ssize_t r
    for r in range(rounds):
        state += <uint64_t>0x9E3779B97F4A7C15
        keys[r] = mix64(state)

