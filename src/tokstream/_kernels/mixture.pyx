"""The mixture kernel: which window of which source each sample of a weighted mixture is.

The tables come from :class:`tokstream._schedule.MixtureWindows`, which checks and freezes them
(records with named fields, declared in ``mixture.pxd``); nothing here validates or allocates. A batch is
two passes: each sample's source, that source's epoch and the position in it (from the period
table, or walking the schedule's tree); then, source by source, every position through its
source-epoch's implicit permutation, eight side by side with one key set.
"""

from libc.stdint cimport int64_t, uint64_t

from tokstream._kernels.permute cimport LANES, fill_round_keys, one_permutation, permute_group

cdef extern from "portable.h":
    uint64_t tokstream_mulhi64(uint64_t a, uint64_t b) noexcept nogil


cdef inline uint64_t _divide(uint64_t n, uint64_t magic, uint64_t shift) noexcept nogil:
    # floor(n / d) for n < 2**63 without a division instruction: magic = ceil(2**(63 + l) / d)
    # with l = ceil(log2(d)) >= 1 and shift = l - 1 (Granlund and Montgomery 1994, theorem 4.2
    # with N = 63); magic 0 stands for d = 1 (tokstream._schedule.divisor).
    if magic == 0:
        return n
    return tokstream_mulhi64(n, magic) >> shift


cdef inline int64_t _walk_tree(uint64_t *k, int64_t node, const Node *nodes) noexcept nogil:
    # Walk sample k down the schedule's tree from ``node``: return its source, leave its local
    # index in k. Children are a checked tree's (tokstream._schedule), so every node index is
    # one of its nodes and the leaf a source.
    cdef uint64_t m, p, q, t, c
    while node >= 0:
        # Every product stays below 2**63: r p < q**2 < 2**62 and m q <= k.
        p = <uint64_t>nodes[node].p
        q = <uint64_t>nodes[node].q
        m = _divide(k[0], nodes[node].q_magic, nodes[node].q_shift)
        t = 2 * (k[0] - m * q) * p + q
        c = _divide(t, nodes[node].twice_q_magic, nodes[node].twice_q_shift)
        # t - 2 q c is the remainder of 2 k p + q modulo 2 q: c(k + 1) = c(k) + 1 iff adding
        # 2 p carries past it.
        if t - 2 * q * c + 2 * p >= 2 * q:
            k[0] = m * p + c
            node = nodes[node].left
        else:
            k[0] = k[0] - m * p - c
            node = nodes[node].right
    return -1 - node


def schedule_samples(
    const Node[::1] nodes, int64_t root, uint64_t first, uint64_t step, int64_t[:, ::1] out
):
    """Write ``(source, local index)`` of sample ``first + step * i`` to ``out[i]``, walking the
    schedule's tree from ``root`` (the definition the period table is read from).

    The caller guarantees a checked tree (``tokstream._schedule``), ``out`` of shape
    ``(count, 2)`` and every sample index below ``2**63``.
    """
    cdef Py_ssize_t i
    cdef uint64_t k
    cdef const Node *tree = &nodes[0] if nodes.shape[0] > 0 else NULL
    with nogil:
        for i in range(out.shape[0]):
            k = first + step * <uint64_t>i
            out[i, 0] = _walk_tree(&k, root, tree)
            out[i, 1] = <int64_t>k


cdef inline void _samples(
    Sample *samples, Py_ssize_t count, uint64_t first, uint64_t step, int64_t root,
    const Node *nodes, const Row *period, uint64_t period_size, uint64_t period_magic,
    uint64_t period_shift, const Source *sources, SourceCache *caches,
) noexcept nogil:
    # samples[i] = (source, its epoch, position in that epoch) of sample first + step i.
    cdef Py_ssize_t i
    cdef int64_t s
    cdef uint64_t k, m = 0, r = 0, step_m = 0, step_r = 0, size, epoch, local
    if period_size > 0:
        # Sample first + step i is row r of period m, both advanced by step each time.
        m = _divide(first, period_magic, period_shift)
        r = first - m * period_size
        step_m = _divide(step, period_magic, period_shift)
        step_r = step - step_m * period_size
    for i in range(count):
        if period_size > 0:
            # r < period_size: the remainder of the exact division above, kept below it.
            s = period[r].source
            # m w_s <= the sample index: the product stays below 2**63.
            k = m * <uint64_t>sources[s].weight + <uint64_t>period[r].local
            m += step_m
            r += step_r
            if r >= period_size:
                r -= period_size
                m += 1
        else:
            k = first + step * <uint64_t>i
            s = _walk_tree(&k, root, nodes)
        # s < len(sources) == len(caches): a source of the checked period table or tree. Its
        # samples of earlier stages come first: offset + k is at most the global sample index.
        k += <uint64_t>sources[s].offset
        size = <uint64_t>sources[s].windows
        # Most often in the epoch the source's last sample was in; whatever the cache holds,
        # local < size keeps the position inside the source.
        local = k - <uint64_t>caches[s].epoch_start
        if caches[s].epoch >= 0 and local < size:
            epoch = <uint64_t>caches[s].epoch
        else:
            epoch = _divide(k, sources[s].windows_magic, sources[s].windows_shift)
            local = k - epoch * size
            caches[s].epoch = <int64_t>epoch
            caches[s].epoch_start = <int64_t>(epoch * size)
        samples[i].source = s
        samples[i].epoch = <int64_t>epoch
        samples[i].position = <int64_t>local


cdef inline void _permute(
    int64_t *windows_index, const Sample *samples, Py_ssize_t count, int64_t *places,
    const Source *sources, Py_ssize_t source_count, uint64_t seed, uint64_t *keys,
    Py_ssize_t rounds, SourceCache *caches,
) noexcept nogil:
    # windows_index[i] = the window of samples[i], its position through its source-epoch's
    # implicit permutation. The samples are taken source by source (``places``: scratch, the
    # batch's places grouped by source, each group in order), so a source's epochs come in
    # order and LANES of one source-epoch share one key set, as one corpus's do.
    cdef Py_ssize_t i, j, end, lane, lanes
    cdef int64_t s, epoch
    cdef uint64_t values[LANES]
    cdef const uint64_t *lane_keys[LANES]
    cdef int lane_low_bits[LANES]
    cdef uint64_t lane_sizes[LANES]
    # Each source's first slot in places: counted, then summed.
    for s in range(source_count):
        caches[s].taken = 0
    for i in range(count):
        # Every sample's source is one of the sources (_samples).
        caches[samples[i].source].taken += 1
    j = 0
    for s in range(source_count):
        j, caches[s].taken = j + caches[s].taken, j
    for i in range(count):
        # taken counts up to the next source's first slot: j < count.
        s = samples[i].source
        places[caches[s].taken] = i
        caches[s].taken += 1
    j = 0
    for s in range(source_count):
        # caches[s].taken is now the end of source s's slots.
        end = caches[s].taken
        one_permutation(
            keys + s * rounds, <int>sources[s].low_bits, <uint64_t>sources[s].high_size,
            lane_keys, lane_low_bits, lane_sizes,
        )
        while j < end:
            epoch = samples[places[j]].epoch
            if caches[s].key_epoch != epoch:
                caches[s].key_epoch = epoch
                fill_round_keys(seed, <uint64_t>s + 1, <uint64_t>epoch, keys + s * rounds, rounds)
            # LANES of one epoch at most (the places of a source ascend, so do its epochs).
            lanes = 0
            while lanes < LANES and j + lanes < end and samples[places[j + lanes]].epoch == epoch:
                values[lanes] = <uint64_t>samples[places[j + lanes]].position
                lanes += 1
            permute_group(
                values, lanes, lane_keys, rounds, lane_low_bits, lane_sizes,
                <uint64_t>sources[s].windows,
            )
            for lane in range(lanes):
                # places hold the batch's places i < count, each once (the counting sort).
                windows_index[places[j + lane]] = sources[s].first + <int64_t>values[lane]
            j += lanes


cdef class MixtureTables:
    """A mixture's tables as the kernel reads them, held as typed views (taken once, not per
    batch): ``MixtureTables(nodes, root, period, period_magic, period_shift, sources, seed,
    shuffle, keys, caches)``; :meth:`fill` maps a batch's samples to windows.

    With a period table (``period`` not empty: one period of the schedule, ``period_magic``
    and ``period_shift`` the divisor of its length) sample ``m W + r`` is local sample ``m w_s
    + j`` of the source ``s`` of row ``r``, ``j`` its local index there; without one each
    sample walks the tree (``nodes``, ``root``). The tables are one stage's: its samples are
    counted from the stage's start, and source ``s``'s ``j``-th of them is its local sample
    ``sources[s].offset + j``. Source ``s``'s local sample ``j`` is position
    ``j mod n_s`` of its epoch ``j div n_s``, window ``first + position``; shuffled, the
    position goes through the implicit permutation of that source-epoch (``keys[s]`` its round
    keys, seeded by ``seed``, stream ``s + 1``). ``caches[s]`` remembers the source's last
    epoch and whose keys ``keys[s]`` holds: a shortcut only (any content gives the same
    windows).

    The caller (``tokstream._schedule``) guarantees tables it checked and froze,
    ``len(caches) == len(keys) == len(sources)``, and offsets that count samples before the
    stage, so that an offset plus a stage's sample index stays below the global sample index.
    """

    cdef const Node[::1] nodes
    cdef int64_t root
    cdef const Row[::1] period
    cdef uint64_t period_magic, period_shift
    cdef const Source[::1] sources
    cdef uint64_t seed
    cdef bint shuffle
    cdef uint64_t[:, ::1] keys
    cdef SourceCache[::1] caches

    def __init__(
        self,
        const Node[::1] nodes,
        int64_t root,
        const Row[::1] period,
        uint64_t period_magic,
        uint64_t period_shift,
        const Source[::1] sources,
        uint64_t seed,
        bint shuffle,
        uint64_t[:, ::1] keys,
        SourceCache[::1] caches,
    ):
        self.nodes, self.root, self.period = nodes, root, period
        self.period_magic, self.period_shift = period_magic, period_shift
        self.sources, self.seed, self.shuffle = sources, seed, shuffle
        self.keys, self.caches = keys, caches

    def fill(
        self,
        int64_t[::1] windows_index,
        uint64_t first,
        uint64_t step,
        Sample[::1] samples,
        int64_t[::1] places,
    ):
        """Write the window index of sample ``first + step * i`` to ``windows_index[i]``.

        ``samples`` and ``places`` are scratch of at least ``len(windows_index)`` entries; the
        caller guarantees them and every sample index below ``2**63``.
        """
        cdef Py_ssize_t i, count = windows_index.shape[0], rounds = self.keys.shape[1]
        if count == 0:
            return
        cdef const Node *tree = &self.nodes[0] if self.nodes.shape[0] > 0 else NULL
        cdef const Row *rows = &self.period[0] if self.period.shape[0] > 0 else NULL
        cdef uint64_t *keys = &self.keys[0, 0] if rounds > 0 else NULL
        cdef const Source *sources = &self.sources[0]
        with nogil:
            _samples(
                &samples[0], count, first, step, self.root, tree, rows,
                <uint64_t>self.period.shape[0], self.period_magic, self.period_shift, sources,
                &self.caches[0],
            )
            if self.shuffle:
                _permute(
                    &windows_index[0], &samples[0], count, &places[0], sources,
                    self.sources.shape[0], self.seed, keys, rounds, &self.caches[0],
                )
            else:
                for i in range(count):
                    # A source of the tables, a position below its window count (_samples).
                    windows_index[i] = sources[samples[i].source].first + samples[i].position
