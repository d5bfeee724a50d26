"""The compiled kernels: copy context windows out of a token array, and walk a keyed permutation.

Nothing here validates or allocates. The Python side (``tokstream._validate``,
``tokstream.corpus`` and ``tokstream.stream``) hands in C-contiguous int64 output buffers of the
right shapes and start positions it has proven to be in range; the release build then runs with
bounds checks off, the debug build (``TOKSTREAM_DEBUG=1`` at build time) with them on.
"""

cimport cython
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from tokstream._inline cimport copy_window, prefetch_window, segment_of
from tokstream._types cimport token_t

cdef extern from *:
    """
    #ifndef TOKSTREAM_DEBUG
    #define TOKSTREAM_DEBUG 0
    #endif
    """
    const bint TOKSTREAM_DEBUG

cdef extern from "_portable.h":
    uint64_t tokstream_mulhi64(uint64_t a, uint64_t b) noexcept nogil


#: True when this module was compiled with bounds checks on (``TOKSTREAM_DEBUG=1``).
DEBUG_BUILD = bool(TOKSTREAM_DEBUG)

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
    int64_t stride=1,
    int64_t offset=0,
):
    """gather_windows(const token_t[::1] tokens, const int64_t[:] starts, int64_t[:, ::1] windows, int64_t[::1] next_tokens=None, int64_t[:, ::1] targets=None, const int64_t[:] rows=None, Py_ssize_t prefetch=0, int64_t stride=1, int64_t offset=0)

    Copy window ``i`` (``block`` tokens from ``s = offset + stride * starts[i]``) into row
    ``rows[i]``: ``stride`` and ``offset`` map window indices of one segment to their first
    tokens here, so that no batch builds that array (both default to tokens already).

    ``block`` is ``windows.shape[1]``. With ``next_tokens`` the token after each window goes to
    ``next_tokens[row]``; with ``targets`` the window shifted by one token goes to
    ``targets[row]``; exactly one of the two is given. ``rows`` defaults to ``0, 1, 2, ...``.
    With ``prefetch=d > 0`` every cache line of window ``i + d`` is prefetched before window
    ``i`` is copied (:func:`tokstream._gather.prefetch_distance` chooses ``d``); 0 skips the
    software prefetch, for consecutive windows, which the hardware prefetcher already streams.

    The caller guarantees ``0 <= s`` and ``s + block < len(tokens)`` for every window, that
    every row index is below ``windows.shape[0]``, and that the target buffer has the matching
    shape.
    """
    cdef Py_ssize_t count = starts.shape[0]
    cdef Py_ssize_t block = windows.shape[1]
    cdef bint shifted = targets is not None
    cdef bint indirect = rows is not None
    cdef Py_ssize_t i, row
    cdef int64_t start, checked = 0
    with nogil:
        for i in range(count):
            if prefetch > 0 and prefetch < count - i:
                # starts[i + prefetch] maps to a validated window start, so every address from
                # its first token to its last lies inside ``tokens``.
                prefetch_window(&tokens[offset + stride * starts[i + prefetch]], block)
            # Validated on the Python side: start + block < len(tokens), row < windows.shape[0].
            start = offset + stride * starts[i]
            row = rows[i] if indirect else i
            if TOKSTREAM_DEBUG:
                checked += tokens[start + block]
            copy_window(
                &tokens[start],
                block,
                &windows[row, 0],
                &targets[row, 0] if shifted else NULL,
                NULL if shifted else &next_tokens[row],
            )


# Cython embeds the signature of a fused function's dispatcher; the docstring states it instead.
@cython.embedsignature(False)
def gather_segments(
    const token_t[::1] anchor,
    const int64_t[:] windows_index,
    const int64_t[::1] offsets,
    const uint64_t[::1] segment_addresses,
    const int64_t[::1] segment_lengths,
    const int64_t[::1] bucket_segments,
    int shift,
    int64_t stride,
    int64_t[::1] sources,
    int64_t[:, ::1] windows,
    int64_t[::1] next_tokens=None,
    int64_t[:, ::1] targets=None,
    Py_ssize_t prefetch=0,
):
    """gather_segments(const token_t[::1] anchor, const int64_t[:] windows_index, const int64_t[::1] offsets, const uint64_t[::1] segment_addresses, const int64_t[::1] segment_lengths, const int64_t[::1] bucket_segments, int shift, int64_t stride, int64_t[::1] sources, int64_t[:, ::1] windows, int64_t[::1] next_tokens=None, int64_t[:, ::1] targets=None, Py_ssize_t prefetch=0)

    :func:`gather_windows` for windows given by their index in a space of segments (shards,
    documents, a mixture's sources), row ``i`` from window ``windows_index[i]``, in one call.

    Window ``w`` of segment ``j`` (``offsets[j] <= w < offsets[j + 1]``) starts ``(w -
    offsets[j]) * stride`` tokens after the segment's first token, which is at address
    ``segment_addresses[j]`` (a segment lies inside one array; ``anchor`` is any of them, for
    the dtype). ``bucket_segments[b]`` is the segment of window ``b << shift`` (its last entry
    the last segment), so a window's segment is searched among the few of its bucket. First
    every window's address goes to ``sources`` (scratch, at least ``len(windows_index)``): the
    lookups are independent, so their cache misses overlap; then the copy loop prefetches
    ``prefetch`` windows ahead.

    The caller guarantees ``0 <= w < offsets[-1]`` for every window, ``len(segment_addresses)
    == len(segment_lengths) == len(offsets) - 1 >= 1``, ``len(bucket_segments) ==
    (offsets[-1] - 1 >> shift) + 2`` with entries valid segments, and that every address
    points at a live array of ``token_t`` holding the segment's ``segment_lengths[j]`` tokens,
    of which each window's ``block + 1`` are; the debug build checks the last.
    """
    cdef Py_ssize_t count = windows_index.shape[0]
    cdef Py_ssize_t block = windows.shape[1]
    cdef bint shifted = targets is not None
    cdef Py_ssize_t i, low
    cdef int64_t window, start
    with nogil:
        for i in range(count):
            window = windows_index[i]
            low = segment_of(window, &offsets[0], &bucket_segments[0], shift)
            start = (window - offsets[low]) * stride
            if TOKSTREAM_DEBUG and not (
                offsets[low] <= window < offsets[low + 1]
                and start + block < segment_lengths[low]
            ):
                with gil:
                    raise IndexError(f"window {window} does not lie inside its segment")
            sources[i] = <int64_t>(segment_addresses[low] + <uint64_t>start * sizeof(token_t))
        for i in range(count):
            if prefetch > 0 and prefetch < count - i:
                prefetch_window(<const token_t *><size_t>sources[i + prefetch], block)
            # Every window's block + 1 tokens lie in its segment (checked above in debug builds).
            copy_window(
                <const token_t *><size_t>sources[i],
                block,
                &windows[i, 0],
                &targets[i, 0] if shifted else NULL,
                NULL if shifted else &next_tokens[i],
            )

# ---------------------------------------------------------------------------------------------
# Keyed permutation of [0, n): an alternating Feistel network on a mixed-radix domain

cdef enum:
    # Positions encrypted side by side (see _encrypt_lanes).
    _LANES = 8

cdef inline uint64_t _mix64(uint64_t z) noexcept nogil:
    # The splitmix64 finaliser: a cheap bijective avalanche on 64 bits.
    z = (z ^ (z >> 30)) * <uint64_t>0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * <uint64_t>0x94D049BB133111EB
    return z ^ (z >> 31)


cdef inline uint64_t _encrypt(
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
            low = (low + _mix64(high ^ keys[r])) & low_mask
        else:
            # mulhi(hash, size) maps a 64-bit hash evenly onto [0, size) without a division.
            high = high + tokstream_mulhi64(_mix64(low ^ keys[r]), high_size)
            if high >= high_size:
                high -= high_size
    return (high << low_bits) | low


cdef inline void _encrypt_lanes(
    uint64_t *x,
    const uint64_t **keys,
    Py_ssize_t rounds,
    const int *low_bits,
    const uint64_t *high_size,
) noexcept nogil:
    # _encrypt of x[lane] with keys[lane] on the domain (low_bits[lane], high_size[lane]), for
    # the _LANES lanes side by side: independent chains of multiplies that the CPU overlaps,
    # where one chain at a time leaves it waiting on each multiply's latency (1.7x faster).
    cdef uint64_t low[_LANES]
    cdef uint64_t high[_LANES]
    cdef uint64_t low_mask[_LANES]
    cdef Py_ssize_t r, lane
    for lane in range(_LANES):
        low_mask[lane] = (<uint64_t>1 << low_bits[lane]) - 1
        low[lane] = x[lane] & low_mask[lane]
        high[lane] = x[lane] >> low_bits[lane]
    for r in range(rounds):
        if r % 2 == 0:
            for lane in range(_LANES):
                low[lane] = (low[lane] + _mix64(high[lane] ^ keys[lane][r])) & low_mask[lane]
        else:
            for lane in range(_LANES):
                high[lane] += tokstream_mulhi64(_mix64(low[lane] ^ keys[lane][r]), high_size[lane])
                high[lane] = high[lane] - high_size[lane] if high[lane] >= high_size[lane] else high[lane]
    for lane in range(_LANES):
        x[lane] = (high[lane] << low_bits[lane]) | low[lane]


cdef inline uint64_t _walk(
    uint64_t value, const uint64_t *keys, Py_ssize_t rounds, int low_bits, uint64_t high_size,
    uint64_t bound,
) noexcept nogil:
    # Cycle walking: an encrypted value >= bound is encrypted again until it lands below.
    while value >= bound:
        value = _encrypt(value, keys, rounds, low_bits, high_size)
    return value


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
    cdef Py_ssize_t i, lane, count = out.shape[0], rounds = keys.shape[0]
    cdef uint64_t value, bound = <uint64_t>n, size = <uint64_t>high_size
    cdef const uint64_t *key = &keys[0] if rounds > 0 else NULL
    cdef uint64_t values[_LANES]
    cdef const uint64_t *lane_keys[_LANES]
    cdef int lane_low_bits[_LANES]
    cdef uint64_t lane_sizes[_LANES]
    with nogil:
        for lane in range(_LANES):
            lane_keys[lane], lane_low_bits[lane], lane_sizes[lane] = key, low_bits, size
        i = 0
        while i < count:
            if i + _LANES <= count:
                for lane in range(_LANES):
                    values[lane] = <uint64_t>(first + stride * (i + lane))
                _encrypt_lanes(values, lane_keys, rounds, lane_low_bits, lane_sizes)
            else:
                # The last few: one at a time.
                for lane in range(count - i):
                    values[lane] = _encrypt(
                        <uint64_t>(first + stride * (i + lane)), key, rounds, low_bits, size
                    )
            for lane in range(min(_LANES, count - i)):
                out[i + lane] = <int64_t>_walk(values[lane], key, rounds, low_bits, size, bound)
            i += _LANES


cdef inline void _round_keys(
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
        keys[r] = _mix64(state)


def round_keys(uint64_t[::1] keys, uint64_t seed, uint64_t epoch, uint64_t stream=0):
    """Fill ``keys`` with the round keys of the implicit permutation of ``epoch``.

    ``stream`` tells apart permutations that share a seed and an epoch: 0 for a single corpus,
    ``s + 1`` for source ``s`` of a mixture.
    """
    cdef Py_ssize_t rounds = keys.shape[0]
    if rounds > 0:
        _round_keys(seed, stream, epoch, &keys[0], rounds)


# ---------------------------------------------------------------------------------------------
# Weighted mixture: the source of each sample, and which of that source's windows it is


cdef inline uint64_t _divide(uint64_t n, uint64_t magic, uint64_t shift) noexcept nogil:
    # floor(n / d) for n < 2**63 without a division instruction: magic = ceil(2**(63 + l) / d)
    # with l = ceil(log2(d)) >= 1 and shift = l - 1 (Granlund and Montgomery 1994, theorem 4.2
    # with N = 63); magic 0 stands for d = 1.
    if magic == 0:
        return n
    return tokstream_mulhi64(n, magic) >> shift


cdef _check_source(int64_t source, Py_ssize_t sources):
    # Debug builds: a source index the mixture kernel may read rows at.
    if not 0 <= source < sources:
        raise IndexError(f"the mixture's tables name source {source} of {sources}")


cdef inline int64_t _schedule(
    uint64_t *k, int64_t node, const int64_t *nodes, const uint64_t *divisors
) noexcept nogil:
    # Walk sample k down the schedule's tree from ``node`` (rows of 4 in ``nodes`` and in
    # ``divisors``, as mixture_schedule says): return its source, leave its local index in k.
    cdef uint64_t m, p, q, t, c
    while node >= 0:
        # Every product stays below 2**63: r p < q**2 < 2**62 and m q <= k.
        p = <uint64_t>nodes[4 * node]
        q = <uint64_t>nodes[4 * node + 1]
        m = _divide(k[0], divisors[4 * node], divisors[4 * node + 1])
        t = 2 * (k[0] - m * q) * p + q
        c = _divide(t, divisors[4 * node + 2], divisors[4 * node + 3])
        # t - 2 q c is the remainder of 2 k p + q modulo 2 q: c(k + 1) = c(k) + 1 iff adding
        # 2 p carries past it.
        if t - 2 * q * c + 2 * p >= 2 * q:
            k[0] = m * p + c
            node = nodes[4 * node + 2]
        else:
            k[0] = k[0] - m * p - c
            node = nodes[4 * node + 3]
    # A leaf is a valid source index, by the caller's tree.
    return -1 - node


def mixture_schedule(
    int64_t[:, ::1] out,
    int64_t first,
    int64_t step,
    int64_t root,
    const int64_t[:, ::1] nodes,
    const uint64_t[:, ::1] node_divisors,
):
    """Write ``(source, local index)`` of mixture sample ``first + step * i`` to ``out[i]``.

    The schedule is a binary tree: internal node ``v`` is ``nodes[v] = (p, q, left, right)``
    and sends its local sample ``k`` to ``left`` iff ``c(k + 1) > c(k)``, where ``c(k) =
    floor((2 k p + q) / (2 q))`` (``k p / q`` rounded half up) counts the node's first ``k``
    samples sent left; the sample is then local sample ``c(k)`` of ``left``, else ``k - c(k)``
    of ``right``. A child ``< 0`` is the leaf of source ``-1 - child``; ``root`` may be one (a
    single source). ``node_divisors[v]`` is ``(magic, shift)`` of ``q`` then of ``2 q``.

    The caller guarantees every sample index below ``2**63``, for every node ``0 <= p < q <
    2**31`` and children that are nodes or leaves, and ``out`` of shape ``(count, 2)``.
    """
    cdef Py_ssize_t i, count = out.shape[0]
    cdef uint64_t k
    cdef const int64_t *tree = &nodes[0, 0] if nodes.shape[0] > 0 else NULL
    cdef const uint64_t *divisors = &node_divisors[0, 0] if nodes.shape[0] > 0 else NULL
    with nogil:
        for i in range(count):
            k = <uint64_t>(first + step * i)
            out[i, 0] = _schedule(&k, root, tree, divisors)
            out[i, 1] = <int64_t>k


cdef inline void _source_samples(
    int64_t *out,
    Py_ssize_t count,
    uint64_t first,
    uint64_t step,
    int64_t root,
    const int64_t *nodes,
    const uint64_t *node_divisors,
    const int64_t *period,
    uint64_t period_size,
    uint64_t period_magic,
    uint64_t period_shift,
    const int64_t *sources,
    const uint64_t *count_divisors,
    int64_t *source_epochs,
) noexcept nogil:
    # out[3 i : 3 i + 3] = (source, its epoch, position in that epoch) of sample first + step i.
    # The arrays as mixture_windows says, as raw rows: a loop this small keeps its state in
    # registers.
    cdef Py_ssize_t i
    cdef int64_t source
    cdef uint64_t k, m = 0, r = 0, step_m = 0, step_r = 0, size, epoch, local
    if period_size > 0:
        # Sample first + step i is sample r of period m, both advanced by step each time.
        m = _divide(first, period_magic, period_shift)
        r = first - m * period_size
        step_m = _divide(step, period_magic, period_shift)
        step_r = step - step_m * period_size
    for i in range(count):
        if period_size > 0:
            source = period[2 * r]
            # m w_s <= the sample index: the product stays below 2**63.
            k = m * <uint64_t>sources[6 * source + 5] + <uint64_t>period[2 * r + 1]
            m += step_m
            r += step_r
            if r >= period_size:
                r -= period_size
                m += 1
        else:
            k = first + step * <uint64_t>i
            source = _schedule(&k, root, nodes, node_divisors)
        size = <uint64_t>sources[6 * source + 1]
        # Local sample k of the source: its epoch is most often the last one met.
        local = k - <uint64_t>source_epochs[2 * source + 1]
        if source_epochs[2 * source] >= 0 and local < size:
            epoch = <uint64_t>source_epochs[2 * source]
        else:
            epoch = _divide(k, count_divisors[source], <uint64_t>sources[6 * source + 4])
            local = k - epoch * size
            source_epochs[2 * source] = <int64_t>epoch
            source_epochs[2 * source + 1] = <int64_t>(epoch * size)
        out[3 * i] = source
        out[3 * i + 1] = <int64_t>epoch
        out[3 * i + 2] = <int64_t>local


cdef inline void _permute_samples(
    int64_t *windows,
    const int64_t *samples,
    Py_ssize_t count,
    const int64_t *sources,
    uint64_t seed,
    uint64_t *keys,
    Py_ssize_t rounds,
    int64_t *key_epochs,
) noexcept nogil:
    # windows[i] = the window of (source, epoch, position) samples[3 i : 3 i + 3], its position
    # through that source-epoch's implicit permutation, _LANES side by side when the keys of
    # every lane are at hand.
    cdef Py_ssize_t i = 0, lane, lanes
    cdef int64_t source
    cdef bint ready
    cdef uint64_t positions[_LANES]
    cdef const uint64_t *lane_keys[_LANES]
    cdef int lane_low_bits[_LANES]
    cdef uint64_t lane_sizes[_LANES]
    while i < count:
        lanes = min(_LANES, count - i)
        ready = lanes == _LANES
        for lane in range(lanes):
            source = samples[3 * (i + lane)]
            ready = ready and key_epochs[source] == samples[3 * (i + lane) + 1]
            positions[lane] = <uint64_t>samples[3 * (i + lane) + 2]
            lane_keys[lane] = keys + source * rounds
            lane_low_bits[lane] = <int>sources[6 * source + 2]
            lane_sizes[lane] = <uint64_t>sources[6 * source + 3]
        if ready:
            _encrypt_lanes(positions, lane_keys, rounds, lane_low_bits, lane_sizes)
        for lane in range(lanes):
            source = samples[3 * (i + lane)]
            if not ready:
                # One at a time, in order: a lane may move its source to the next epoch, whose
                # keys replace the ones an earlier lane used (once per source-epoch).
                if key_epochs[source] != samples[3 * (i + lane) + 1]:
                    key_epochs[source] = samples[3 * (i + lane) + 1]
                    _round_keys(
                        seed, <uint64_t>source + 1, <uint64_t>key_epochs[source],
                        keys + source * rounds, rounds,
                    )
                positions[lane] = _encrypt(
                    positions[lane], lane_keys[lane], rounds, lane_low_bits[lane],
                    lane_sizes[lane],
                )
            windows[i + lane] = sources[6 * source] + <int64_t>_walk(
                positions[lane], lane_keys[lane], rounds, lane_low_bits[lane], lane_sizes[lane],
                <uint64_t>sources[6 * source + 1],
            )
        i += lanes


def mixture_windows(
    int64_t[::1] windows,
    int64_t first,
    int64_t step,
    int64_t root,
    const int64_t[:, ::1] nodes,
    const uint64_t[:, ::1] node_divisors,
    const int64_t[:, ::1] period,
    uint64_t period_magic,
    uint64_t period_shift,
    const int64_t[:, ::1] sources,
    const uint64_t[::1] count_divisors,
    uint64_t seed,
    bint shuffle,
    uint64_t[:, ::1] keys,
    int64_t[::1] key_epochs,
    int64_t[:, ::1] source_epochs,
    int64_t[:, ::1] samples,
):
    """Write the global window index of mixture sample ``first + step * i`` to ``windows[i]``.

    The sample's source and local index come from the schedule of :func:`mixture_schedule`
    (``root``, ``nodes``, ``node_divisors``), or from one period of it: with ``W =
    len(period) > 0``, ``period[r]`` is ``(source, local index)`` of sample ``r < W`` (every
    source ``s`` gets exactly its integer weight ``w_s`` of each ``W`` samples, in the same
    places), so sample ``m W + r`` is local sample ``m w_s + period[r, 1]`` of ``period[r,
    0]``; ``(period_magic, period_shift)`` divides by ``W`` (see :func:`_divide`).

    Source ``s`` is ``sources[s] = (first window, n_s windows, low_bits, high_size, count
    shift, w_s)`` with ``count_divisors[s]`` the magic of ``n_s``: its local sample ``j`` is
    position ``j mod n_s`` of its epoch ``j div n_s``; shuffled, the position goes through the
    implicit permutation of that epoch keyed by ``(seed, stream s + 1)``. ``keys[s]`` caches the
    round keys of epoch ``key_epochs[s]`` (-1: none yet), ``source_epochs[s]`` the last epoch
    of ``s`` met and its first local sample (epoch -1: none yet), which spares a division by
    ``n_s`` for the next sample of the same epoch, and ``samples`` (``(len(windows), 3)``) each
sample's source, epoch and position before its permutation: scratch the caller owns.

    The caller guarantees what :func:`mixture_schedule` requires; a period that is that
    schedule's first ``W`` samples, with sources in range; ``n_s >= 1`` and each source's
    domain as :func:`permuted_positions` requires; ``keys`` of shape ``(sources, even
    rounds)``, ``key_epochs`` of ``(sources,)``, ``source_epochs`` of ``(sources, 2)`` and
    ``samples`` of at least ``(len(windows), 3)``.
    """
    cdef Py_ssize_t i, count = windows.shape[0]
    cdef int64_t child
    cdef const int64_t *tree = &nodes[0, 0] if nodes.shape[0] > 0 else NULL
    cdef const uint64_t *divisors = &node_divisors[0, 0] if nodes.shape[0] > 0 else NULL
    cdef const int64_t *period_rows = &period[0, 0] if period.shape[0] > 0 else NULL
    if count == 0:
        return
    if TOKSTREAM_DEBUG:
        # The passes read the tables through raw pointers: check every source they can name.
        for i in range(period.shape[0]):
            _check_source(period[i, 0], sources.shape[0])
        for i in range(nodes.shape[0]):
            for child in (nodes[i, 2], nodes[i, 3]):
                if not 0 <= child < nodes.shape[0]:
                    _check_source(-1 - child, sources.shape[0])
    # Two passes, each small enough for the registers: sources and positions, then the
    # permutations (or, unshuffled, the windows straight away).
    with nogil:
        _source_samples(
            &samples[0, 0], count, <uint64_t>first, <uint64_t>step, root, tree, divisors,
            period_rows, <uint64_t>period.shape[0], period_magic, period_shift, &sources[0, 0],
            &count_divisors[0], &source_epochs[0, 0],
        )
    if TOKSTREAM_DEBUG:
        for i in range(count):
            if not 0 <= samples[i, 2] < sources[samples[i, 0], 1]:
                raise IndexError(f"sample {i} names no window of its source: {samples[i]}")
    with nogil:
        if shuffle:
            _permute_samples(
                &windows[0], &samples[0, 0], count, &sources[0, 0], seed, &keys[0, 0],
                keys.shape[1], &key_epochs[0],
            )
        else:
            for i in range(count):
                windows[i] = sources[samples[i, 0], 0] + samples[i, 2]
