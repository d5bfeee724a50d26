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

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tokstream._kernels.mixture import MixtureTables, schedule_samples
from tokstream.corpus import frozen

_I8, _U8 = np.int64, np.uint64
#: The kernel's records (``mixture.pxd``), field for field.
NODE = np.dtype(
    [("p", _I8), ("q", _I8), ("left", _I8), ("right", _I8), ("q_magic", _U8), ("q_shift", _U8)]
    + [("twice_q_magic", _U8), ("twice_q_shift", _U8)]
)
SOURCE = np.dtype(
    [("first", _I8), ("windows", _I8), ("low_bits", _I8), ("high_size", _I8), ("weight", _I8)]
    + [("windows_magic", _U8), ("windows_shift", _U8)]
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


class MixtureWindows:
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

    def __init__(
        self,
        root: int,
        nodes: npt.ArrayLike,
        weights: Sequence[int],
        sources: Sequence[Sequence[int]],
        num_windows: int,
        seed: int,
        shuffle: bool,
        rounds: int,
        period_limit: int,
    ) -> None:
        node_rows = np.array(nodes, dtype=np.int64, copy=True).reshape(-1, 4).tolist()
        weight_list = [int(w) for w in weights]
        rows = [[int(value) for value in row] for row in sources]
        count = len(weight_list)
        if count == 0 or len(rows) != count or any(len(row) != 4 for row in rows):
            raise ValueError(
                "a mixture needs one weight and one (first, n, low_bits, high) row per source"
            )
        if len(node_rows) != count - 1:
            raise ValueError(f"{count} sources need {count - 1} nodes, got {len(node_rows)}")
        if rounds < 0 or rounds % 2:
            raise ValueError(f"rounds must be even and >= 0, got {rounds}")
        if any(not 1 <= w <= 1 << 31 for w in weight_list):
            raise ValueError(f"weights must lie in [1, 2**31], got {weight_list}")

        # Each node's weight is its leaves' (p its left child's): a Huffman tree as
        # tokstream.mixture builds it, whose children come before it.
        def weight_of(child: int, before: int) -> int:
            if -count <= child < 0:
                return weight_list[-1 - child]
            if 0 <= child < before:
                return node_rows[child][1]
            raise ValueError(f"node child {child} is neither a source nor an earlier node")

        for v, (p, q, left, right) in enumerate(node_rows):
            if not (p == weight_of(left, v) and q == p + weight_of(right, v) < 1 << 31):
                raise ValueError(f"node {v} = {(p, q, left, right)} does not sum its children")
        total = weight_of(int(root), count - 1)
        if total != sum(weight_list):
            raise ValueError(f"the root's weight {total} is not the weights' sum")
        # One tree: every source a leaf once, every node a child once (the root last).
        children = [child for row in node_rows for child in row[2:]]
        if sorted([int(root), *children]) != list(range(-count, count - 1)):
            raise ValueError("the nodes must form one tree with each source as one leaf")
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
        self._root = int(root)
        self._nodes = frozen(
            np.array([(*row, *divisor(row[1]), *divisor(2 * row[1])) for row in node_rows], NODE)
        )
        self._sources = frozen(
            np.array(
                [(*row, w, *divisor(row[1])) for row, w in zip(rows, weight_list, strict=True)],
                SOURCE,
            )
        )
        self._keys = np.zeros((count, rounds), dtype=np.uint64)
        self._caches = np.full(count, -1, dtype=np.int64).repeat(4).view(SOURCE_CACHE)
        self._samples = np.empty(0, SAMPLE)
        self._places = np.empty(0, np.int64)
        period, period_divisor = frozen(np.empty(0, ROW)), (0, 0)
        if total <= period_limit:
            period = frozen(self.schedule(0, 1, total).view(ROW)[:, 0])
            period_divisor = divisor(total)
        self._period = period
        self._tables = MixtureTables(
            self._nodes,
            self._root,
            period,
            *period_divisor,
            self._sources,
            int(seed),
            bool(shuffle),
            self._keys,
            self._caches,
        )

    @property
    def period_length(self) -> int:
        """Samples in the table of one period (0: the schedule walks the tree)."""
        return int(self._period.shape[0])

    def schedule(self, first: int, step: int, count: int) -> np.ndarray:
        """``(count, 2)`` int64: ``(source, local index)`` of samples ``first + step * i``, by
        the tree (the definition the period table is read from)."""
        _check_samples(first, step, count)
        out = np.empty((count, 2), dtype=np.int64)
        schedule_samples(self._nodes, self._root, first, step, out)
        return out

    def fill(self, windows_index: np.ndarray, first: int, step: int) -> None:
        """Write the window index of sample ``first + step * i`` to ``windows_index[i]``.

        Raises ValueError unless every such sample index lies in ``[0, 2**63)``.
        """
        count = windows_index.shape[0]
        _check_samples(first, step, count)
        if self._samples.shape[0] < count:
            self._samples, self._places = np.empty(count, SAMPLE), np.empty(count, np.int64)
        self._tables.fill(windows_index, first, step, self._samples, self._places)


def _check_samples(first: int, step: int, count: int) -> None:
    """Every sample index ``first + step * i``, ``i < count``, is in ``[0, 2**63)``."""
    if first < 0 or step < 1 or (count > 1 and first + step * (count - 1) > INT64_MAX):
        raise ValueError(f"samples {first} + {step} * i for i < {count} must lie in [0, 2**63)")
