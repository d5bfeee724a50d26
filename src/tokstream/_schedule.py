"""A mixture's schedule as the tables its kernel reads: checked, frozen, then only looped over.

:class:`MixtureWindows` holds a mixture's schedule (the tree of :mod:`tokstream.mixture`, and a
table of one period when the period is short) and its sources' window ranges and permutation
domains, as records with named fields (``tokstream/_kernels/mixture.pxd``). It checks them and
derives the divisors itself when it is made, and freezes every table (a copy over immutable
bytes, which no caller can make writeable again), so whatever it is given, every window the
kernel writes lies in its sources' ranges; :meth:`MixtureWindows.fill` then maps a batch's
sample indices to window indices in one kernel call.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from tokstream._frozen import frozen
from tokstream._kernels.mixture import MixtureTables, schedule_samples

_I8, _U8 = np.int64, np.uint64
#: The kernel's records (``mixture.pxd``), field for field.
NODE = np.dtype(
    [("p", _I8), ("q", _I8), ("left", _I8), ("right", _I8), ("q_magic", _U8), ("q_shift", _U8)]
    + [("twice_q_magic", _U8), ("twice_q_shift", _U8)]
)
SOURCE = np.dtype(
    [("first", _I8), ("windows", _I8), ("low_bits", _I8), ("high_size", _I8), ("weight", _I8)]
    + [("windows_magic", _U8), ("windows_shift", _U8), ("offset", _I8)]
)
ROW = np.dtype([("source", _I8), ("local", _I8)])
SAMPLE = np.dtype([("source", _I8), ("epoch", _I8), ("position", _I8)])
SOURCE_CACHE = np.dtype([("epoch", _I8), ("epoch_start", _I8), ("key_epoch", _I8), ("taken", _I8)])

INT64_MAX = (1 << 63) - 1


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


class Stage(NamedTuple):
    """One stage of a schedule: from global sample ``start`` on, the tree ``(root, nodes)`` over
    the sources of positive ``weights`` (one integer per source, 0: none of the stage's
    samples)."""

    start: int
    root: int
    nodes: Any
    weights: Sequence[int]


class MixtureWindows:
    """The window index of every sample of a mixture, from its schedule and its sources.

    ``MixtureWindows(stages, sources, num_windows, seed, shuffle, rounds, period_limit)``.
    ``stages`` are :class:`Stage` records in order of their ``start``, the first at sample 0;
    stage ``i`` holds the samples from its start to the next stage's. Its schedule is a binary
    tree over the sources of positive weight: internal node ``v`` is ``nodes[v] = (p, q, left,
    right)`` and sends its local sample ``k`` to ``left`` iff ``c(k + 1) > c(k)``, where ``c(k)
    = floor((2 k p + q) / (2 q))`` (``k p / q`` rounded half up) counts the node's first ``k``
    samples sent left; the sample is then local sample ``c(k)`` of ``left``, else ``k - c(k)``
    of ``right``. A child ``< 0`` is the leaf of source ``-1 - child``; ``root`` may be one (a
    single source). ``q`` is the sum of the integer ``weights`` of the node's leaves and ``p``
    its left child's: every ``W = sum(weights)`` samples of a stage each source gets exactly its
    weight, in the same places, so when ``W`` fits in what is left of ``period_limit`` rows
    (shared by all stages, the earlier first) the first ``W`` are kept in a table and stage
    sample ``m W + r`` is local sample ``m w_s + j`` of the source ``s`` of row ``r``, ``j`` its
    local index there: one lookup instead of a walk down the tree.

    A source's local samples run on across stages: its ``j``-th sample of stage ``i`` is its
    local sample ``o_i(s) + j``, ``o_i(s)`` its samples in the stages before (counted down each
    stage's tree). Source ``s`` is ``sources[s] = (first window, n_s windows, low_bits,
    high_size)``: its local sample ``j`` is position ``j mod n_s`` of its epoch ``j div n_s``,
    which is window ``first + position`` of ``[0, num_windows)``; shuffled, the position goes
    through the implicit permutation of that epoch (domain ``high_size << low_bits``, ``rounds``
    round keys seeded by ``seed``, stream ``s + 1``). So no window of a source repeats before
    its epoch ends, whatever the stages.

    Raises ValueError when the tables are not such a schedule and such sources. :meth:`fill`
    keeps caches (each source's round keys and last epoch): calls must not overlap.
    """

    def __init__(
        self,
        stages: Sequence[Stage],
        sources: Sequence[Sequence[int]],
        num_windows: int,
        seed: int,
        shuffle: bool,
        rounds: int,
        period_limit: int,
    ) -> None:
        rows = [[int(value) for value in row] for row in sources]
        count = len(rows)
        if count == 0 or any(len(row) != 4 for row in rows):
            raise ValueError("a mixture needs one (first, n, low_bits, high) row per source")
        if rounds < 0 or rounds % 2:
            raise ValueError(f"rounds must be even and >= 0, got {rounds}")
        if not stages or int(stages[0].start) != 0:
            raise ValueError("the first stage must start at sample 0")
        for s, (first, n, low_bits, high_size) in enumerate(rows):
            if not (
                n >= 1
                and 0 <= first
                and first + n <= num_windows
                and 0 <= low_bits <= 32
                and 1 <= high_size <= 1 << 32
                and high_size << low_bits >= n
            ):
                raise ValueError(
                    f"source {s} = {rows[s]} is not a window range of "
                    f"[0, {num_windows}) with a domain covering it"
                )
        self._keys = np.zeros((count, rounds), dtype=np.uint64)
        self._caches = np.full(count, -1, dtype=np.int64).repeat(4).view(SOURCE_CACHE)
        self._samples = np.empty(0, SAMPLE)
        self._places = np.empty(0, np.int64)
        self._starts: list[int] = []
        self._stages: list[tuple[MixtureTables, int, np.ndarray, np.ndarray, np.ndarray]] = []
        offsets = [0] * count
        # Rows of period tables still allowed: all stages' tables together stay within the limit.
        self._table_rows = period_limit
        for i, stage in enumerate(stages):
            start = int(stage.start)
            if i and not self._starts[-1] < start <= INT64_MAX:
                raise ValueError(f"stage {i} must start after stage {i - 1}, below 2**63")
            if i:
                # The previous stage's samples of each source, counted down its tree.
                length = start - self._starts[-1]
                _, previous_root, previous_nodes, _, _ = self._stages[-1]
                counts = prefix_counts(previous_root, previous_nodes, count, length)
                offsets = [o + c for o, c in zip(offsets, counts, strict=True)]
            self._starts.append(start)
            self._stages.append(self._stage_tables(i, stage, rows, offsets, seed, shuffle))

    def _stage_tables(
        self,
        i: int,
        stage: Stage,
        rows: list[list[int]],
        offsets: list[int],
        seed: int,
        shuffle: bool,
    ) -> tuple[MixtureTables, int, np.ndarray, np.ndarray, np.ndarray]:
        """Stage ``i``'s kernel tables, checked: ``(tables, root, nodes, period, offsets)``."""
        count = len(rows)
        weight_list = [int(w) for w in stage.weights]
        node_rows = np.array(stage.nodes, dtype=np.int64, copy=True).reshape(-1, 4).tolist()
        where = f"stage {i}: "
        if len(weight_list) != count:
            raise ValueError(f"{where}{count} sources need {count} weights, got {weight_list}")
        if any(not 0 <= w <= 1 << 31 for w in weight_list) or not any(weight_list):
            raise ValueError(f"{where}weights must lie in [0, 2**31], not all 0, got {weight_list}")
        leaves = [s for s, w in enumerate(weight_list) if w]
        if len(node_rows) != len(leaves) - 1:
            raise ValueError(
                f"{where}{len(leaves)} sources of positive weight need {len(leaves) - 1} nodes, "
                f"got {len(node_rows)}"
            )

        # Each node's weight is its leaves' (p its left child's): a Huffman tree as
        # tokstream.mixture builds it, whose children come before it.
        def weight_of(child: int, before: int) -> int:
            if -count <= child < 0 and weight_list[-1 - child]:
                return weight_list[-1 - child]
            if 0 <= child < before:
                return node_rows[child][1]
            raise ValueError(
                f"{where}node child {child} is neither a source of positive weight nor an "
                "earlier node"
            )

        for v, (p, q, left, right) in enumerate(node_rows):
            if not (p == weight_of(left, v) and q == p + weight_of(right, v) < 1 << 31):
                raise ValueError(
                    f"{where}node {v} = {(p, q, left, right)} does not sum its children"
                )
        root = int(stage.root)
        total = weight_of(root, len(node_rows))
        if total != sum(weight_list):
            raise ValueError(f"{where}the root's weight {total} is not the weights' sum")
        # One tree: every source of positive weight a leaf once, every node a child once (the
        # root last).
        children = [child for row in node_rows for child in row[2:]]
        expected = [-1 - s for s in leaves] + list(range(len(node_rows)))
        if sorted([root, *children]) != sorted(expected):
            raise ValueError(f"{where}the nodes must form one tree with each source as one leaf")
        nodes = frozen(
            np.array([(*row, *divisor(row[1]), *divisor(2 * row[1])) for row in node_rows], NODE)
        )
        sources = frozen(
            np.array(
                [
                    (*row, w, *divisor(row[1]), offset)
                    for row, w, offset in zip(rows, weight_list, offsets, strict=True)
                ],
                SOURCE,
            )
        )
        period, period_divisor = frozen(np.empty(0, ROW)), (0, 0)
        if total <= self._table_rows:
            self._table_rows -= total
            walked = np.empty((total, 2), dtype=np.int64)
            schedule_samples(nodes, root, 0, 1, walked)
            period = frozen(walked.view(ROW)[:, 0])
            period_divisor = divisor(total)
        tables = MixtureTables(
            nodes,
            root,
            period,
            *period_divisor,
            sources,
            int(seed),
            bool(shuffle),
            self._keys,
            self._caches,
        )
        return tables, root, nodes, period, frozen(np.array(offsets, dtype=np.int64))

    @property
    def period_length(self) -> int:
        """Samples in the table of one period of the first stage (0: it walks the tree)."""
        return int(self._stages[0][3].shape[0])

    def schedule(self, first: int, step: int, count: int) -> np.ndarray:
        """``(count, 2)`` int64: ``(source, its local index)`` of samples ``first + step * i``,
        by each stage's tree (the definition the period tables are read from)."""
        _check_samples(first, step, count)
        out = np.empty((count, 2), dtype=np.int64)
        for stage, begin, end, stage_first in self._pieces(first, step, count):
            _, root, nodes, _, offsets = self._stages[stage]
            schedule_samples(nodes, root, stage_first, step, out[begin:end])
            out[begin:end, 1] += offsets[out[begin:end, 0]]
        return out

    def fill(self, windows_index: np.ndarray, first: int, step: int) -> None:
        """Write the window index of sample ``first + step * i`` to ``windows_index[i]``.

        Raises ValueError unless every such sample index lies in ``[0, 2**63)``.
        """
        count = windows_index.shape[0]
        _check_samples(first, step, count)
        if self._samples.shape[0] < count:
            self._samples, self._places = np.empty(count, SAMPLE), np.empty(count, np.int64)
        for stage, begin, end, stage_first in self._pieces(first, step, count):
            self._stages[stage][0].fill(
                windows_index[begin:end], stage_first, step, self._samples, self._places
            )

    def _pieces(self, first: int, step: int, count: int) -> Iterator[tuple[int, int, int, int]]:
        """``(stage, begin, end, first)``: samples ``first + step * i`` for ``begin <= i <
        end`` lie in ``stage``, the first of them its sample ``first`` counted from its start."""
        starts = self._starts
        if len(starts) == 1:
            yield 0, 0, count, first
            return
        stage = bisect.bisect_right(starts, first) - 1
        begin = 0
        while begin < count:
            following = starts[stage + 1] if stage + 1 < len(starts) else None
            # The first i whose sample reaches the next stage: ceil((next - first) / step).
            end = count if following is None else min(count, -(-(following - first) // step))
            if end > begin:
                yield stage, begin, end, first + step * begin - starts[stage]
            begin = max(begin, end)
            stage += 1


def prefix_counts(root: int, nodes: Any, count: int, length: int) -> list[int]:
    """Each of ``count`` sources' samples among the first ``length`` of a stage's tree: a node
    with ``n`` of them sends ``c(n) = floor((2 n p + q) / (2 q))`` left, the rest right."""
    counts = [0] * count
    pending = [(int(root), length)]
    while pending:
        node, n = pending.pop()
        if node < 0:
            counts[-1 - node] += n
            continue
        p, q, left, right = (int(nodes[field][node]) for field in ("p", "q", "left", "right"))
        sent_left = (2 * n * p + q) // (2 * q)
        pending += [(left, sent_left), (right, n - sent_left)]
    return counts


def _check_samples(first: int, step: int, count: int) -> None:
    """Every sample index ``first + step * i``, ``i < count``, is in ``[0, 2**63)``."""
    if first < 0 or step < 1 or (count > 1 and first + step * (count - 1) > INT64_MAX):
        raise ValueError(f"samples {first} + {step} * i for i < {count} must lie in [0, 2**63)")
