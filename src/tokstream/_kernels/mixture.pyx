"""The mixture kernel: which window of which source each sample of a weighted mixture is.

:class:`MixtureWindows` holds a mixture's schedule (the tree of :mod:`tokstream.mixture`, and a
table of one period when the period is short) and its sources' window ranges and permutation
domains. It checks them and derives its divisors itself when it is made, so whatever it is
given, every window it writes lies in its sources' ranges; then :meth:`MixtureWindows.fill`
maps a batch's sample indices to window indices with its tables held, not re-acquired per call.

With a period table a batch goes by source: each source's samples in the batch (consecutive
local indices for consecutive samples; for a rank's every step-th sample, read along the cycle
of period rows the rank visits) are permuted eight at a time with one key set, as one corpus's
are, and stored at their places. Without one, each sample walks the tree and the lanes each
load their own source's keys.
"""

from libc.stdint cimport int64_t, uint64_t

import math

import numpy as np

from tokstream._kernels.permute cimport (
    LANES, encrypt, encrypt_lanes, fill_round_keys, one_permutation, permute_group, walk,
)

cdef extern from "portable.h":
    uint64_t tokstream_mulhi64(uint64_t a, uint64_t b) noexcept nogil

cdef extern from *:
    """
    #ifndef TOKSTREAM_DEBUG
    #define TOKSTREAM_DEBUG 0
    #endif
    """
    const bint TOKSTREAM_DEBUG

cdef int64_t INT64_MAX = 0x7FFFFFFFFFFFFFFF
# Ranks of fewer than this many: the rank's cycle of period rows is tabled (see _cycle).
cdef int64_t CYCLE_STEP_LIMIT = 1 << 31


def divisor(d: int) -> tuple[int, int]:
    """``(magic, shift)`` with ``n // d == mulhi64(n, magic) >> shift`` for ``0 <= n < 2**63``.

    ``magic = ceil(2**(63 + l) / d)`` with ``l = ceil(log2(d))``, which is below ``2**64``;
    ``d = 1`` is ``(0, 0)``, which the kernel reads as the identity.
    """
    if d < 1:
        raise ValueError(f"divisor must be positive, got {d}")
    if d == 1:
        return 0, 0
    bits = (d - 1).bit_length()
    return -(-(1 << (63 + bits)) // d), bits - 1


# ---------------------------------------------------------------------------------------------
# The schedule and the two passes over a batch


cdef inline uint64_t _divide(uint64_t n, uint64_t magic, uint64_t shift) noexcept nogil:
    # floor(n / d) for n < 2**63 without a division instruction: magic = ceil(2**(63 + l) / d)
    # with l = ceil(log2(d)) >= 1 and shift = l - 1 (Granlund and Montgomery 1994, theorem 4.2
    # with N = 63); magic 0 stands for d = 1.
    if magic == 0:
        return n
    return tokstream_mulhi64(n, magic) >> shift


cdef inline int64_t _schedule(
    uint64_t *k, int64_t node, const int64_t *nodes, const uint64_t *divisors
) noexcept nogil:
    # Walk sample k down the schedule's tree from ``node`` (rows of 4 in ``nodes`` and in
    # ``divisors``, as MixtureWindows says): return its source, leave its local index in k.
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
    # A leaf is a valid source index: MixtureWindows checked its tree.
    return -1 - node


cdef inline void _samples_before(
    uint64_t k, Py_ssize_t node_count, const int64_t *nodes, const uint64_t *divisors,
    uint64_t *node_samples, int64_t *counts,
) noexcept nogil:
    # counts[s] = how many of the first k samples source s gets (k < 2**63), the tree's count
    # c(k) at every node: the root is the last node and each node's children come before it.
    cdef Py_ssize_t v, side
    cdef uint64_t m, p, q, t, c
    cdef int64_t child
    if node_count == 0:
        counts[0] = <int64_t>k
        return
    node_samples[node_count - 1] = k
    for v in range(node_count - 1, -1, -1):
        k = node_samples[v]
        p = <uint64_t>nodes[4 * v]
        q = <uint64_t>nodes[4 * v + 1]
        m = _divide(k, divisors[4 * v], divisors[4 * v + 1])
        t = 2 * (k - m * q) * p + q
        c = m * p + _divide(t, divisors[4 * v + 2], divisors[4 * v + 3])
        for side in range(2):
            child = nodes[4 * v + 2 + side]
            if child >= 0:
                node_samples[child] = c if side == 0 else k - c
            else:
                counts[-1 - child] = <int64_t>(c if side == 0 else k - c)


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
    # The arrays as MixtureWindows holds them, as raw rows: a loop this small keeps its state in
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


cdef inline void _epoch_keys(
    uint64_t seed, Py_ssize_t source, uint64_t epoch, uint64_t *keys, Py_ssize_t rounds,
    int64_t *key_epoch,
) noexcept nogil:
    # keys = the round keys of the source's epoch, unless they are already (key_epoch[0] says
    # whose they are): once per source-epoch.
    if key_epoch[0] != <int64_t>epoch:
        key_epoch[0] = <int64_t>epoch
        fill_round_keys(seed, <uint64_t>source + 1, epoch, keys, rounds)


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
    # through that source-epoch's implicit permutation, LANES side by side when the keys of
    # every lane are at hand.
    cdef Py_ssize_t i = 0, lane, lanes
    cdef int64_t source
    cdef bint ready
    cdef uint64_t positions[LANES]
    cdef const uint64_t *lane_keys[LANES]
    cdef int lane_low_bits[LANES]
    cdef uint64_t lane_sizes[LANES]
    while i < count:
        lanes = min(LANES, count - i)
        ready = lanes == LANES
        for lane in range(lanes):
            source = samples[3 * (i + lane)]
            ready = ready and key_epochs[source] == samples[3 * (i + lane) + 1]
            positions[lane] = <uint64_t>samples[3 * (i + lane) + 2]
            lane_keys[lane] = keys + source * rounds
            lane_low_bits[lane] = <int>sources[6 * source + 2]
            lane_sizes[lane] = <uint64_t>sources[6 * source + 3]
        if ready:
            encrypt_lanes(positions, lane_keys, rounds, lane_low_bits, lane_sizes)
        for lane in range(lanes):
            source = samples[3 * (i + lane)]
            if not ready:
                # One at a time, in order: a lane may move its source to the next epoch, whose
                # keys replace the ones an earlier lane used (once per source-epoch).
                _epoch_keys(
                    seed, source, <uint64_t>samples[3 * (i + lane) + 1], keys + source * rounds,
                    rounds, &key_epochs[source],
                )
                positions[lane] = encrypt(
                    positions[lane], lane_keys[lane], rounds, lane_low_bits[lane],
                    lane_sizes[lane],
                )
            windows[i + lane] = sources[6 * source] + <int64_t>walk(
                positions[lane], lane_keys[lane], rounds, lane_low_bits[lane], lane_sizes[lane],
                <uint64_t>sources[6 * source + 1],
            )
        i += lanes



cdef inline int _source_windows(
    int64_t *windows,
    Py_ssize_t count,
    int64_t place,
    int64_t k,
    const int64_t *entries,
    Py_ssize_t low,
    Py_ssize_t high,
    Py_ssize_t entry,
    Py_ssize_t s,
    const int64_t *source,
    uint64_t count_divisor,
    bint shuffle,
    uint64_t seed,
    uint64_t *keys,
    Py_ssize_t rounds,
    int64_t *key_epoch,
    int64_t *samples,
) noexcept nogil:
    # The windows of source s's samples in the batch: the first at ``place``, local index k,
    # entry ``entry`` of its rows [low, high) of the cycle (rows of 3: position, local index
    # step, place step). ``source`` is its row of MixtureWindows.sources, keys its round keys
    # (of epoch key_epoch[0]); ``samples`` has room for 2 count. Returns 0, or -1 if a place
    # fell outside the batch (checked in the debug build only: the cycle's arithmetic keeps
    # them inside).
    cdef uint64_t n = <uint64_t>source[1], epoch
    # Below any local index: the first sample computes its epoch.
    cdef int64_t epoch_start = INT64_MAX
    cdef Py_ssize_t i = 0, lane, lanes, taken = 0
    cdef uint64_t values[LANES]
    cdef const uint64_t *lane_keys[LANES]
    cdef int lane_low_bits[LANES]
    cdef uint64_t lane_sizes[LANES]
    # The source's samples first: local index, then place, in order.
    while place < count:
        if TOKSTREAM_DEBUG and place < 0:
            return -1
        samples[2 * taken] = k
        samples[2 * taken + 1] = place
        taken += 1
        k += entries[3 * entry + 1]
        place += entries[3 * entry + 2]
        entry += 1
        if entry == high:
            entry = low
    one_permutation(
        keys, <int>source[2], <uint64_t>source[3], lane_keys, lane_low_bits, lane_sizes
    )
    # Then eight at a time, a group never spanning two epochs of the source.
    while i < taken:
        if <uint64_t>(samples[2 * i] - epoch_start) >= n:
            epoch = _divide(<uint64_t>samples[2 * i], count_divisor, <uint64_t>source[4])
            epoch_start = <int64_t>(epoch * n)
            if shuffle:
                _epoch_keys(seed, s, epoch, keys, rounds, key_epoch)
        # Local indices ascend: the group ends before the first of the next epoch.
        lanes = min(LANES, taken - i)
        while lanes > 1 and <uint64_t>(samples[2 * (i + lanes - 1)] - epoch_start) >= n:
            lanes -= 1
        for lane in range(lanes):
            values[lane] = <uint64_t>(samples[2 * (i + lane)] - epoch_start)
        if shuffle:
            permute_group(values, lanes, lane_keys, rounds, lane_low_bits, lane_sizes, n)
        for lane in range(lanes):
            windows[samples[2 * (i + lane) + 1]] = source[0] + <int64_t>values[lane]
        i += lanes
    return 0


cdef class MixtureWindows:
    """The window index of every sample of a mixture, from its schedule and its sources.

    ``MixtureWindows(root, nodes, weights, sources, num_windows, seed, shuffle, rounds,
    period_limit)``. The schedule is a binary tree: internal node ``v`` is ``nodes[v] = (p, q,
    left, right)`` and sends its local sample ``k`` to ``left`` iff ``c(k + 1) > c(k)``, where
    ``c(k) = floor((2 k p + q) / (2 q))`` (``k p / q`` rounded half up) counts the node's first
    ``k`` samples sent left; the sample is then local sample ``c(k)`` of ``left``, else ``k -
    c(k)`` of ``right``. A child ``< 0`` is the leaf of source ``-1 - child``; ``root`` may be
    one (a single source). ``q`` is the sum of the integer ``weights`` of the node's leaves and
    ``p`` its left child's: every ``W = sum(weights)`` samples each source gets exactly its
    weight, in the same places, so when ``W <= period_limit`` the first ``W`` samples are kept
    in a table and sample ``m W + r`` is local sample ``m w_s + j`` of the source ``s`` of row
    ``r``, ``j`` its local index there: one lookup instead of a walk down the tree.

    Source ``s`` is ``sources[s] = (first window, n_s windows, low_bits, high_size)``: its local
    sample ``j`` is position ``j mod n_s`` of its epoch ``j div n_s``, which is window ``first +
    position`` of ``[0, num_windows)``; shuffled, the position goes through the implicit
    permutation of that epoch (domain ``high_size << low_bits``, ``rounds`` round keys seeded
    by ``seed``, stream ``s + 1``).

    Raises ValueError when the tables are not such a schedule and such sources. :meth:`fill`
    keeps caches (each source's round keys and last epoch): calls must not overlap.
    """

    cdef int64_t root
    cdef const int64_t[:, ::1] nodes
    cdef uint64_t[:, ::1] node_divisors
    cdef int64_t[:, ::1] period
    cdef uint64_t period_magic, period_shift
    # Per source: first window, n_s, low_bits, high_size, shift of n_s, weight.
    cdef int64_t[:, ::1] sources
    cdef uint64_t[::1] count_divisors
    cdef uint64_t seed
    cdef bint shuffle
    cdef uint64_t[:, ::1] keys
    cdef int64_t[::1] key_epochs
    cdef int64_t[:, ::1] source_epochs
    cdef object samples
    # Per source: samples before the batch being filled and before its end.
    cdef int64_t[:, ::1] spans
    # The period table's rows of each source, in order: source s's from row_starts[s] on.
    cdef int64_t[::1] source_rows
    cdef int64_t[::1] row_starts
    cdef uint64_t[::1] node_samples
    # The cycle of period rows a rank of several visits (see _cycle): for which step and
    # class, and its entries grouped by source (position, local-index step, place step).
    cdef int64_t cycle_step, cycle_class, cycle_gcd, cycle_length, cycle_inverse
    cdef int64_t[:, ::1] cycle
    cdef int64_t[::1] cycle_starts

    def __init__(
        self,
        int64_t root,
        nodes,
        weights,
        sources,
        int64_t num_windows,
        uint64_t seed,
        bint shuffle,
        Py_ssize_t rounds,
        Py_ssize_t period_limit,
    ):
        nodes = np.array(nodes, dtype=np.int64, copy=True).reshape(-1, 4)
        weight_list = [int(w) for w in weights]
        rows = [[int(value) for value in row] for row in sources]
        count = len(weight_list)
        if count == 0 or len(rows) != count or any(len(row) != 4 for row in rows):
            raise ValueError("a mixture needs one weight and one (first, n, low_bits, high) row "
                             "per source")
        if nodes.shape[0] != count - 1:
            raise ValueError(f"{count} sources need {count - 1} nodes, got {nodes.shape[0]}")
        if rounds < 0 or rounds % 2:
            raise ValueError(f"rounds must be even and >= 0, got {rounds}")
        if any(not 1 <= w <= 1 << 31 for w in weight_list):
            raise ValueError(f"weights must lie in [1, 2**31], got {weight_list}")
        # Each node's weight is its leaves' (p its left child's): a Huffman tree as
        # tokstream.mixture builds it, whose children come before it.
        def weight_of(child, before):
            if -count <= child < 0:
                return weight_list[-1 - child]
            if 0 <= child < before:
                return int(nodes[child, 1])
            raise ValueError(f"node child {child} is neither a source nor an earlier node")
        for v, (p, q, left, right) in enumerate(nodes.tolist()):
            if not (p == weight_of(left, v) and q == p + weight_of(right, v) < 1 << 31):
                raise ValueError(f"node {v} = {(p, q, left, right)} does not sum its children")
        total = weight_of(root, count - 1)
        if total != sum(weight_list):
            raise ValueError(f"the root's weight {total} is not the weights' sum")
        # One tree: every source a leaf once, every node a child once (the root last).
        if sorted([root, *nodes[:, 2:].ravel().tolist()]) != list(range(-count, count - 1)):
            raise ValueError("the nodes must form one tree with each source as one leaf")
        for s, (first, n, low_bits, high_size) in enumerate(rows):
            if not (
                n >= 1 and 0 <= first and first + n <= num_windows
                and 0 <= low_bits <= 32 and 1 <= high_size <= 1 << 32
                and high_size << low_bits >= n
            ):
                raise ValueError(f"source {s} = {rows[s]} is not a window range of "
                                 f"[0, {num_windows}) with a domain covering it")
        self.root = root
        self.nodes = nodes
        self.node_divisors = np.array(
            [(*divisor(q), *divisor(2 * q)) for q in nodes[:, 1].tolist()], dtype=np.uint64
        ).reshape(-1, 4)
        self.sources = np.array(
            [(*row, divisor(row[1])[1], w) for row, w in zip(rows, weight_list)], dtype=np.int64
        )
        self.count_divisors = np.array([divisor(row[1])[0] for row in rows], dtype=np.uint64)
        self.seed = seed
        self.shuffle = shuffle
        self.keys = np.zeros((count, rounds), dtype=np.uint64)
        self.key_epochs = np.full(count, -1, dtype=np.int64)
        self.source_epochs = np.full((count, 2), -1, dtype=np.int64)
        self.samples = np.empty((0, 3), dtype=np.int64)
        self.spans = np.zeros((2, count), dtype=np.int64)
        self.node_samples = np.zeros(count, dtype=np.uint64)
        self.source_rows = self.row_starts = np.empty(0, dtype=np.int64)
        self.cycle_step = 0
        self.period = np.empty((0, 2), dtype=np.int64)
        self.period_magic = self.period_shift = 0
        if total <= period_limit:
            period = np.empty((total, 2), dtype=np.int64)
            self._walk_tree(period, 0, 1)
            self.period = period
            self.period_magic, self.period_shift = divisor(total)
            self.source_rows = np.argsort(period[:, 0], kind="stable")
            self.row_starts = np.cumsum(weight_list) - np.array(weight_list)

    @property
    def period_length(self) -> int:
        """Samples in the table of one period (0: the schedule walks the tree)."""
        return self.period.shape[0]

    def schedule(self, int64_t first, int64_t step, Py_ssize_t count):
        """``(count, 2)`` int64: ``(source, local index)`` of samples ``first + step * i``, by
        the tree (the definition the period table is read from)."""
        out = np.empty((count, 2), dtype=np.int64)
        self._check_samples(first, step, count)
        self._walk_tree(out, first, step)
        return out

    cdef _check_samples(self, int64_t first, int64_t step, Py_ssize_t count):
        # Every sample index first + step i, i < count, is in [0, 2**63).
        if first < 0 or step < 1 or (count > 1 and step > (INT64_MAX - first) // (count - 1)):
            raise ValueError(
                f"samples {first} + {step} * i for i < {count} must lie in [0, 2**63)"
            )

    cdef _walk_tree(self, int64_t[:, ::1] out, int64_t first, int64_t step):
        cdef Py_ssize_t i
        cdef uint64_t k
        cdef const int64_t *tree = &self.nodes[0, 0] if self.nodes.shape[0] > 0 else NULL
        cdef const uint64_t *divisors = (
            &self.node_divisors[0, 0] if self.nodes.shape[0] > 0 else NULL
        )
        with nogil:
            for i in range(out.shape[0]):
                k = <uint64_t>(first + step * i)
                out[i, 0] = _schedule(&k, self.root, tree, divisors)
                out[i, 1] = <int64_t>k

    def fill(self, int64_t[::1] windows, int64_t first, int64_t step):
        """Write the window index of sample ``first + step * i`` to ``windows[i]``.

        Raises ValueError unless every such sample index lies in ``[0, 2**63)``.
        """
        cdef Py_ssize_t i, count = windows.shape[0]
        self._check_samples(first, step, count)
        if count == 0:
            return
        if self.period.shape[0] > 0 and step == 1:
            self._fill_consecutive(windows, first)
            return
        if self.period.shape[0] > 0 and step < CYCLE_STEP_LIMIT:
            self._fill_by_cycle(windows, first, step)
            return
        if self.samples.shape[0] < count:
            self.samples = np.empty((count, 3), dtype=np.int64)
        # Held here: the buffer stays alive for this call whatever happens to the attribute.
        cdef int64_t[:, ::1] samples = self.samples
        cdef const int64_t *tree = &self.nodes[0, 0] if self.nodes.shape[0] > 0 else NULL
        cdef const uint64_t *divisors = (
            &self.node_divisors[0, 0] if self.nodes.shape[0] > 0 else NULL
        )
        cdef const int64_t *period = &self.period[0, 0] if self.period.shape[0] > 0 else NULL
        cdef uint64_t *keys = &self.keys[0, 0] if self.keys.shape[1] > 0 else NULL
        # Two passes, each small enough for the registers: sources and positions, then the
        # permutations (or, unshuffled, the windows straight away).
        with nogil:
            _source_samples(
                &samples[0, 0], count, <uint64_t>first, <uint64_t>step, self.root, tree,
                divisors, period, <uint64_t>self.period.shape[0], self.period_magic,
                self.period_shift, &self.sources[0, 0], &self.count_divisors[0],
                &self.source_epochs[0, 0],
            )
            if self.shuffle:
                _permute_samples(
                    &windows[0], &samples[0, 0], count, &self.sources[0, 0], self.seed, keys,
                    self.keys.shape[1], &self.key_epochs[0],
                )
            else:
                for i in range(count):
                    windows[i] = self.sources[samples[i, 0], 0] + samples[i, 2]

    cdef _cycle(self, int64_t step, int64_t rank_class):
        # Samples first + step i visit the period's rows (first + step i) mod W, all in one class
        # modulo g = gcd(W, step), along a cycle of L = W / g rows: cycle position v is row
        # (class + step v) mod W, (class + step v) div W periods on. Each source's entries in
        # the cycle, in order: its position v, then how much its local index and the place in
        # the batch grow to its next entry (past the last: around the cycle, step / g periods
        # on). Cached for the last (step, class): a rank keeps both for an epoch at least.
        if self.cycle_step == step and self.cycle_class == rank_class:
            return
        period = np.asarray(self.period)
        size = period.shape[0]
        g = math.gcd(size, step)
        length = size // g
        v = np.arange(length, dtype=np.int64)
        # step < 2**31 and v < 2**16: every product below stays under 2**48.
        offsets = rank_class + (step % size) * v
        rows = offsets % size
        periods = offsets // size + (step // size) * v
        sources = period[rows, 0]
        weights = np.asarray(self.sources)[sources, 5]
        local = periods * weights + period[rows, 1]
        order = np.lexsort((v, sources))
        sources, v, local, weights = sources[order], v[order], local[order], weights[order]
        starts = np.searchsorted(sources, np.arange(self.sources.shape[0] + 1))
        begins, ends = starts[: self.sources.shape[0]], starts[1:]
        # Each entry's next one in its source's group; a group's last goes around to its first.
        nonempty = ends > begins
        last = ends[nonempty] - 1
        following = np.arange(1, length + 1)
        following[last] = begins[nonempty]
        around = np.zeros(length, dtype=np.int64)
        around[last] = 1
        cycle = np.empty((length, 3), dtype=np.int64)
        cycle[:, 0] = v
        cycle[:, 1] = local[following] - local + around * (step // g) * weights
        cycle[:, 2] = v[following] - v + around * length
        self.cycle = cycle
        self.cycle_starts = starts.astype(np.int64)
        self.cycle_length = length
        self.cycle_inverse = pow((step // g) % length, -1, length)
        self.cycle_step, self.cycle_class, self.cycle_gcd = step, rank_class, g

    cdef _fill_by_cycle(self, int64_t[::1] windows, int64_t first, int64_t step):
        # The samples of each source, in order, from its entries in the rank's cycle of period
        # rows: the first at or after the batch's starting position, then on around the cycle.
        # Every eight of one source-epoch are permuted together with one key set in every lane
        # (as one corpus is) and stored at their places in the batch.
        cdef Py_ssize_t count = windows.shape[0], rounds = self.keys.shape[1]
        cdef int64_t size = self.period.shape[0]
        cdef int64_t g = self.cycle_gcd if self.cycle_step == step else math.gcd(size, step)
        self._cycle(step, first % g)
        # The batch's first row, first mod W, is this far along the cycle.
        cdef int64_t start = (
            (first % size - first % g) // g * self.cycle_inverse % self.cycle_length
        )
        cdef int64_t[:, ::1] sources = self.sources
        cdef const int64_t[:, ::1] period = self.period
        cdef const int64_t[:, ::1] cycle = self.cycle
        cdef const int64_t[::1] starts = self.cycle_starts
        cdef uint64_t *keys = &self.keys[0, 0] if rounds > 0 else NULL
        if self.samples.shape[0] < count:
            self.samples = np.empty((count, 3), dtype=np.int64)
        # Held here: the buffer stays alive for this call whatever happens to the attribute.
        cdef int64_t[:, ::1] samples = self.samples
        cdef Py_ssize_t s, entry, low, high, upper, middle
        cdef int64_t place, k, sample
        cdef uint64_t periods
        with nogil:
            for s in range(sources.shape[0]):
                low, high = starts[s], starts[s + 1]
                if low == high:
                    continue
                # The source's first entry at or after the batch's position in the cycle: a
                # binary search among its entries, whose positions ascend.
                entry, upper = low, high
                while entry < upper:
                    middle = (entry + upper) // 2
                    if cycle[middle, 0] < start:
                        entry = middle + 1
                    else:
                        upper = middle
                if entry == high:
                    entry = low
                    place = cycle[entry, 0] + self.cycle_length - start
                else:
                    place = cycle[entry, 0] - start
                if place >= count:
                    continue
                # Its local index, from its sample (below 2**63: a sample of the batch).
                sample = first + step * place
                periods = _divide(<uint64_t>sample, self.period_magic, self.period_shift)
                k = <int64_t>periods * sources[s, 5] + period[
                    sample - <int64_t>periods * size, 1
                ]
                if _source_windows(
                    &windows[0], count, place, k, &cycle[0, 0], low, high, entry, s,
                    &sources[s, 0], self.count_divisors[s], self.shuffle, self.seed,
                    keys + s * rounds, rounds, &self.key_epochs[s], &samples[0, 0],
                ) < 0:
                    with gil:
                        raise AssertionError(f"source {s}'s samples fell outside the batch")

    cdef _fill_consecutive(self, int64_t[::1] windows, int64_t first):
        # Consecutive samples give each source consecutive local indices [before, after): each
        # source-epoch's run is permuted with one set of keys in every lane (as one corpus is),
        # and each window stored at its sample's place in the batch, read from the period
        # table: local index m w_s + j of source s is sample m W + (the row of its j-th place).
        cdef Py_ssize_t i, s, count = windows.shape[0]
        cdef Py_ssize_t rounds = self.keys.shape[1]
        cdef int64_t[:, ::1] spans = self.spans
        cdef int64_t[:, ::1] sources = self.sources
        cdef const int64_t[::1] rows = self.source_rows
        cdef uint64_t *keys = &self.keys[0, 0] if rounds > 0 else NULL
        cdef const int64_t *tree = &self.nodes[0, 0] if self.nodes.shape[0] > 0 else NULL
        cdef const uint64_t *divisors = (
            &self.node_divisors[0, 0] if self.nodes.shape[0] > 0 else NULL
        )
        cdef int64_t period_size = self.period.shape[0]
        cdef uint64_t last = <uint64_t>first + <uint64_t>(count - 1)
        cdef int64_t first_period = <int64_t>_divide(
            <uint64_t>first, self.period_magic, self.period_shift
        )
        cdef int64_t first_row = first - first_period * period_size
        cdef uint64_t local, run, epoch, n
        cdef int64_t k, weight, periods, place, row_first, base
        cdef Py_ssize_t lane, lanes
        cdef uint64_t values[LANES]
        cdef const uint64_t *lane_keys[LANES]
        cdef int lane_low_bits[LANES]
        cdef uint64_t lane_sizes[LANES]
        with nogil:
            _samples_before(
                <uint64_t>first, self.nodes.shape[0], tree, divisors, &self.node_samples[0],
                &spans[0, 0],
            )
            # The last sample counted apart: first + count may be 2**63.
            _samples_before(
                last, self.nodes.shape[0], tree, divisors, &self.node_samples[0], &spans[1, 0]
            )
            s = self.period[last - _divide(last, self.period_magic, self.period_shift)
                            * <uint64_t>period_size, 0]
            spans[1, s] += 1
            for s in range(self.sources.shape[0]):
                k = spans[0, s]
                n = <uint64_t>sources[s, 1]
                weight = sources[s, 5]
                row_first = self.row_starts[s]
                # Local index k = periods * w_s + place is sample periods * W + rows[place], at
                # base + rows[place] in the batch (k >= first_period * w_s).
                periods = k // weight
                place = k - periods * weight
                base = (periods - first_period) * period_size - first_row
                one_permutation(
                    keys + s * rounds, <int>sources[s, 2], <uint64_t>sources[s, 3], lane_keys,
                    lane_low_bits, lane_sizes,
                )
                while k < spans[1, s]:
                    epoch = _divide(<uint64_t>k, self.count_divisors[s], <uint64_t>sources[s, 4])
                    local = <uint64_t>k - epoch * n
                    run = min(<uint64_t>(spans[1, s] - k), n - local)
                    if self.shuffle:
                        _epoch_keys(
                            self.seed, s, epoch, keys + s * rounds, rounds, &self.key_epochs[s]
                        )
                    i = 0
                    while i < <Py_ssize_t>run:
                        lanes = min(LANES, <Py_ssize_t>run - i)
                        for lane in range(lanes):
                            values[lane] = local + <uint64_t>(i + lane)
                        if self.shuffle:
                            permute_group(
                                values, lanes, lane_keys, rounds, lane_low_bits, lane_sizes, n
                            )
                        for lane in range(lanes):
                            windows[base + rows[row_first + place]] = (
                                sources[s, 0] + <int64_t>values[lane]
                            )
                            place += 1
                            if place == weight:
                                place = 0
                                base += period_size
                        i += LANES
                    k += <int64_t>run
