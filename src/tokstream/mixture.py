"""Weighted mixtures of corpora: exact shares, exact resume, no index.

:func:`mix` makes a :class:`Mixture` of named sources with weights, which every stream entry
point takes as ``token_ids``. The stream then draws global sample ``k = epoch * N + position``
(``N`` samples per epoch: the sources' windows together, or ``samples=``) from source ``s(k)``,
as its local sample ``j`` (the number of earlier samples of ``s``), which is position ``j mod
n_s`` of that source's epoch ``j div n_s``: each source-epoch is a fresh implicit permutation of
the source's ``n_s`` windows, keyed by seed, source and source epoch. Small sources repeat,
large ones are partly seen.

The schedule ``k -> (s, j)`` is a binary tree over the sources, built like a Huffman code (the
two lightest groups merged first). Node ``v`` with weight ``q`` and left weight ``p`` sends its
local sample ``k`` left iff ``round((k + 1) p / q) > round(k p / q)`` (halves up): a Beatty
sequence, so after ``k`` samples the left side has had ``round(k p / q)``, within 1/2 of its
share. Errors add up along a source's path scaled by the source's fraction of each node, and a
Huffman tree at least doubles its weight every two levels up, so in every prefix of ``k``
samples each source's count is within 2 of ``w_s * k``, computed per sample in O(depth) integer
operations with no division, never from an index as long as the run. The global sequence does
not depend on the world size: rank ``r`` takes positions ``r, r + W, ...`` as for one corpus.

Weights are read exactly: an int as itself, a float as the decimal it prints as (``0.7`` is
7/10). Reduced to integers over their sum, they are the schedule's exact shares when that sum
is at most ``2**30``; otherwise each is rounded to a multiple of ``2**-30`` of the total (never
to zero). Every ``sum`` samples each source then gets exactly its integer weight.
"""

from __future__ import annotations

import heapq
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from tokstream._arrays import read_only
from tokstream._options import StreamOptions
from tokstream._order import FEISTEL_ROUNDS, WindowOrder, implicit_domain
from tokstream._schedule import MixtureWindows, Stage
from tokstream._space import WindowSpace
from tokstream._state import Cursor, schedule_fingerprint
from tokstream._validate import INT64_MAX
from tokstream.corpus import Corpus
from tokstream.shards.joined import JoinedShards

#: The integer weights of a schedule sum to at most this (plus one per source): the kernel's
#: products stay below ``2**63``.
WEIGHT_TOTAL = 1 << 30

#: Sources of at most this many shards together, all of them arrays in hand, are joined as a
#: tuple of those arrays; beyond it (or with a source whose shards are read on demand) through
#: a :class:`~tokstream.shards.joined.JoinedShards` source, with no Python work per shard.
LISTED_SHARDS = 4096

#: The most stages a schedule may have: a state dict records each (its start and a digest of
#: its weights) and stays under 16 KB up to this many.
MAX_STAGES = 256

#: Schedules whose period (the integer weights' sum) is at most this are read from a table of
#: one period (16 bytes a sample, 1 MiB at most), one lookup per sample instead of a walk down
#: the tree.
PERIOD_TABLE_LIMIT = 1 << 16

__all__ = ["Mixture", "mix"]


class Mixture:
    """Named token sources and their weights, to be streamed as one (see :func:`mix`).

    ``sources`` maps each name (in the order given) to its :class:`~tokstream.Corpus`.
    ``stages`` lists each stage of the schedule as ``(first global sample, {name: share})``
    (shares summing to 1; one stage unless :func:`mix` was given a schedule), ``weights`` the
    first stage's shares; ``integer_stages`` and ``integer_weights`` (read-only: the schedule is
    built from them) the exact integers the schedule uses. ``corpus`` holds every source's
    shards in that order, documents kept: the stream reads windows out of it.
    """

    def __init__(
        self, sources: dict[str, Corpus], stages: Sequence[tuple[int, Sequence[int]]]
    ) -> None:
        self.sources = dict(sources)
        self.names = tuple(sources)
        self._integer_stages = tuple(
            (int(start), tuple(int(w) for w in weights)) for start, weights in stages
        )
        self.stages = tuple(
            (start, {name: w / sum(weights) for name, w in zip(self.names, weights, strict=True)})
            for start, weights in self._integer_stages
        )
        self.weights = dict(self.stages[0][1])
        corpora = list(self.sources.values())
        if sum(len(c.lengths) for c in corpora) > LISTED_SHARDS or any(c.source for c in corpora):
            joined = JoinedShards(corpora, [_label(name) for name in self.names])
            self.corpus = Corpus._from_source(joined, "sources")
            return
        arrays, shard_names, documents = [], [], []
        for name, corpus in self.sources.items():
            for j, shard in enumerate(corpus.shards):
                arrays.append(shard)
                shard_names.append(_label(name, j if len(corpus.shards) > 1 else None))
                documents.append(corpus.shard_documents(j))
        self.corpus = Corpus._from_arrays(arrays, shard_names, "sources", documents)

    @property
    def integer_weights(self) -> tuple[int, ...]:
        """The first stage's integer weights, one per source: each gets exactly its weight of
        every ``sum(integer_weights)`` samples of the stage."""
        return self._integer_stages[0][1]

    @property
    def integer_stages(self) -> tuple[tuple[int, tuple[int, ...]], ...]:
        """Each stage's first global sample and integer weights (0: no sample of that source)."""
        return self._integer_stages

    def num_windows(self, block: int, stride: int = 1) -> int:
        """Windows of all sources together (one epoch of samples, unless ``samples=``)."""
        return self.corpus.num_windows(block, stride)

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}={w:.4g}" for n, w in self.weights.items())
        later = f"; {len(self.stages) - 1} later stages" if len(self.stages) > 1 else ""
        return (
            f"Mixture({shares}{later}; tokens={self.corpus.num_tokens}, dtype={self.corpus.dtype})"
        )


def mix(sources: Mapping[str, Any], weights: Mapping[str, Any] | Sequence[Any]) -> Mixture:
    """A weighted mixture of token sources, for ``token_ids`` of any stream entry point.

    Parameters
    ----------
    sources
        A dict name -> anything :func:`tokstream.stream_token_source` takes as ``token_ids``
        (an array, a :class:`~tokstream.Corpus`, an :func:`~tokstream.open_tokens` result,
        with its documents). The dict's order numbers the sources (the ``"source"`` extra).
    weights
        A dict name -> a finite number ``>= 0``, for every source, normalised to shares; or a
        schedule of stages, a list of ``(first global sample, dict)`` pairs with starts
        ascending from 0: each stage's dict gives its weights from its start to the next
        stage's, a source it leaves out (or gives 0) has no samples there. At most
        :data:`MAX_STAGES` stages.

    Raises
    ------
    TypeError
        ``sources`` is not a dict, ``weights`` neither a dict nor a list of ``(int, dict)``
        pairs, a name is not a str, a source is not token ids (or is itself a mixture), a weight
        is not a number.
    ValueError
        No sources; a weight's name that is no source; a plain dict without a weight for some
        source; a negative or infinite weight, or a stage whose weights are all 0; stages not
        starting at 0 and ascending; a source without tokens; sources of different token
        dtypes. Every message names the source or the stage (``weights[i]``).

    Examples
    --------
    >>> import numpy as np
    >>> from tokstream import mix
    >>> mixture = mix({"a": np.arange(100), "b": np.arange(50)}, weights={"a": 3, "b": 1})
    >>> mixture.weights
    {'a': 0.75, 'b': 0.25}
    >>> annealed = mix(
    ...     {"a": np.arange(100), "b": np.arange(50)},
    ...     weights=[(0, {"a": 1}), (1_000, {"a": 1, "b": 1})],
    ... )
    >>> annealed.stages
    ((0, {'a': 1.0, 'b': 0.0}), (1000, {'a': 0.5, 'b': 0.5}))
    """
    if not isinstance(sources, Mapping):
        raise TypeError(f"sources must be a dict of name -> ..., got {type(sources).__name__}")
    if isinstance(weights, (str, bytes)) or not isinstance(weights, (Mapping, Sequence)):
        raise TypeError(
            "weights must be a dict of name -> weight or a list of (first sample, dict) "
            f"stages, got {type(weights).__name__}"
        )
    if not sources:
        raise ValueError("sources must name at least one token source")
    corpora: dict[str, Corpus] = {}
    for name, tokens in sources.items():
        if not isinstance(name, str):
            raise TypeError(f"source names must be str, got {name!r} ({type(name).__name__})")
        if isinstance(tokens, Mixture):
            raise TypeError(
                f"{_label(name)} is a mixture; give its sources to one mix() with their weights"
            )
        corpora[name] = Corpus.from_tokens(tokens, _label(name))
        if corpora[name].num_tokens == 0:
            raise ValueError(f"{_label(name)} holds no tokens")
    if isinstance(weights, Mapping):
        missing = [name for name in corpora if name not in weights]
        stages = [(0, _stage_weights(weights, list(corpora), "weights"))]
        if missing:
            raise ValueError(f"weights has no weight for source {missing[0]!r}")
    else:
        stages = _schedule(weights, list(corpora))
    return Mixture(corpora, stages)


def _schedule(stages: Sequence[Any], names: list[str]) -> list[tuple[int, tuple[int, ...]]]:
    """Each stage's start and integer weights, every rule of a schedule checked."""
    if not stages:
        raise ValueError("weights must hold at least one (first sample, dict) stage")
    if len(stages) > MAX_STAGES:
        raise ValueError(f"weights holds {len(stages)} stages, more than {MAX_STAGES}")
    checked: list[tuple[int, tuple[int, ...]]] = []
    for i, stage in enumerate(stages):
        where = f"weights[{i}]"
        if not (isinstance(stage, (tuple, list)) and len(stage) == 2):
            raise TypeError(f"{where} must be a (first sample, dict) pair, got {stage!r}")
        start, stage_weights = stage
        if isinstance(start, (bool, np.bool_)) or not isinstance(start, numbers.Integral):
            raise TypeError(f"{where}[0] must be an int (a global sample), got {start!r}")
        start = int(start)
        if i == 0 and start != 0:
            raise ValueError(
                f"{where}[0] must be 0: the first stage starts at sample 0, got {start}"
            )
        if i > 0 and start <= checked[-1][0]:
            raise ValueError(
                f"{where}[0] = {start} must be after the previous stage's start {checked[-1][0]}"
            )
        if start > INT64_MAX:
            raise ValueError(f"{where}[0] must be below 2**63, got {start}")
        if not isinstance(stage_weights, Mapping):
            raise TypeError(
                f"{where}[1] must be a dict of name -> weight, got {type(stage_weights).__name__}"
            )
        checked.append((start, _stage_weights(stage_weights, names, where)))
    return checked


def _stage_weights(weights: Mapping[str, Any], names: list[str], where: str) -> tuple[int, ...]:
    """One stage's integer weights, a name left out weighing 0; some weight must be positive."""
    for name in weights:
        if name not in names:
            raise ValueError(f"{where}[{name!r}] names no source; the sources are {names}")
    exact = [exact_weight(weights.get(name, 0), f"{where}[{name!r}]") for name in names]
    if not any(exact):
        raise ValueError(f"{where} must give some source a positive weight, got {dict(weights)}")
    return integer_weights(exact)


def exact_weight(value: Any, name: str, positive: bool = False) -> Fraction:
    """A finite weight ``>= 0`` (``> 0`` if ``positive``) as an exact fraction: an int as itself,
    a float as it prints."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if isinstance(value, numbers.Rational):
        weight = Fraction(int(value.numerator), int(value.denominator))
    else:
        as_float = float(value)
        if not math.isfinite(as_float):
            raise ValueError(f"{name} must be finite, got {value!r}")
        weight = Fraction(repr(as_float))
    if positive and weight <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    if weight < 0:
        raise ValueError(f"{name} must be at least 0, got {value!r}")
    return weight


def integer_weights(weights: Sequence[Fraction]) -> tuple[int, ...]:
    """The smallest integers in the ratio of ``weights`` (some positive), rounded when they sum
    past 2**30 (a positive weight never to zero)."""
    scale = math.lcm(*(w.denominator for w in weights))
    integers = [int(w * scale) for w in weights]
    total = sum(integers)
    if total > WEIGHT_TOTAL:
        # Rounded half up to a multiple of 1/WEIGHT_TOTAL of the total, and never to zero.
        integers = [
            max(1, (2 * w * WEIGHT_TOTAL + total) // (2 * total)) if w else 0 for w in integers
        ]
    common = math.gcd(*integers)
    return tuple(w // common for w in integers)


def schedule_tree(weights: Sequence[int]) -> tuple[int, np.ndarray]:
    """``(root, nodes)``: a stage's binary tree over the sources of positive integer ``weights``.

    Built as a Huffman code: the two lightest groups (the earlier on a tie) become the left
    and right child of a new node, until one group is left. ``nodes[v] = (p, q, left, right)``
    with ``q`` the node's weight and ``p`` its left child's; a child ``< 0`` is the leaf of
    source ``-1 - child`` (sources of weight 0 are no leaf). With one such source the root is its
    leaf and there are no nodes.
    """
    heap = [(weight, order, -1 - order) for order, weight in enumerate(weights) if weight]
    heapq.heapify(heap)
    nodes: list[tuple[int, int, int, int]] = []
    while len(heap) > 1:
        left_weight, _, left = heapq.heappop(heap)
        right_weight, _, right = heapq.heappop(heap)
        nodes.append((left_weight, left_weight + right_weight, left, right))
        heapq.heappush(
            heap, (left_weight + right_weight, len(weights) + len(nodes), len(nodes) - 1)
        )
    return heap[0][2], np.array(nodes, dtype=np.int64).reshape(-1, 4)


class MixtureOrder(WindowOrder):
    """The window indices of every batch of a stream over a :class:`Mixture`.

    A :class:`~tokstream._order.WindowOrder` over the ``N`` samples of each epoch (ranks,
    epoch tail and cursors as for one corpus), whose position ``p`` of epoch ``e`` is global
    sample ``e * N + p``, mapped to a window of the combined corpus by the compiled schedule.
    Pure in the cursor: nothing about earlier batches is kept beyond the kernel's caches (each
    source's round keys and last epoch).
    """

    def __init__(self, mixture: Mixture, gather: WindowSpace, options: StreamOptions) -> None:
        # A source's first window is the first of the first segment starting in the source.
        segment_starts = gather.token_starts(gather.offsets[:-1])
        source_tokens = np.cumsum([0] + [c.num_tokens for c in mixture.sources.values()])
        first_windows = gather.offsets[np.searchsorted(segment_starts, source_tokens[:-1])]
        offsets = np.append(first_windows, gather.num_windows)
        counts = np.diff(offsets)
        for name, count in zip(mixture.names, counts, strict=True):
            if count == 0:
                inside = " inside one document" if options.windows == "within" else ""
                raise ValueError(
                    f"{_label(name)} holds no window of block + 1 = {options.block + 1} "
                    f"tokens{inside}, so it cannot give its share of the samples"
                )
        samples = int(counts.sum()) if options.samples is None else options.samples
        if options.epochs * samples > INT64_MAX:
            raise ValueError(
                f"epochs * samples per epoch = {options.epochs} * {samples} must stay below 2**63"
            )
        super().__init__(samples, options)
        # First window of each source in the combined corpus, then the window count.
        self._source_offsets = read_only(offsets)
        self._mixture = mixture
        self._kernel = mixture_windows(mixture, first_windows, counts, gather.num_windows, options)

    def fill_extras(self, windows_index: np.ndarray, buffers: dict[str, np.ndarray]) -> None:
        """The ``"source"`` extra: each row's source, the last one whose first window is at or
        before the row's window."""
        if "source" in buffers:
            found = np.searchsorted(self._source_offsets, windows_index, side="right")
            np.subtract(found, 1, out=buffers["source"])

    def batch_windows(self, cursor: Cursor, count: int) -> np.ndarray:
        """Window indices of this rank's batch at ``cursor``: samples ``k + r + i W``."""
        windows = np.empty(count, dtype=np.int64)
        first = cursor.epoch * self.num_windows + cursor.position + self.options.rank
        self._kernel.fill(windows, first, self.options.world_size)
        return windows

    def fingerprint(self) -> dict[str, Any]:
        """The sources' names and shards, the samples per epoch and the schedule's stages (a
        state loads into a schedule that agrees with its own up to the state's position)."""
        mixture = self._mixture
        return {
            "mixture_sources": json.dumps(list(mixture.names)),
            "mixture_shards": json.dumps([len(c.shards) for c in mixture.sources.values()]),
            **schedule_fingerprint(mixture.integer_stages),
            "samples": self.num_windows,
        }


def window_order(
    source: Corpus | Mixture, space: WindowSpace, options: StreamOptions
) -> WindowOrder:
    """The order of a stream's windows: a mixture's schedule, else one corpus's order."""
    if isinstance(source, Mixture):
        return MixtureOrder(source, space, options)
    return WindowOrder(space.num_windows, options)


def mixture_windows(
    mixture: Mixture,
    first_windows: np.ndarray,
    counts: np.ndarray,
    num_windows: int,
    options: StreamOptions,
) -> MixtureWindows:
    """The compiled schedule of ``mixture``'s samples over its sources' windows (source ``s``
    holds windows ``first_windows[s] ..`` ``+ counts[s]`` of ``num_windows``), from the weights
    alone: nothing a caller can reassign reaches the kernel, which checks its tables itself."""
    return MixtureWindows(
        [
            Stage(start, *schedule_tree(weights), weights)
            for start, weights in mixture.integer_stages
        ],
        [
            (first, count, *implicit_domain(count))
            for first, count in zip(first_windows.tolist(), counts.tolist(), strict=True)
        ],
        num_windows,
        options.seed,
        options.shuffle,
        FEISTEL_ROUNDS,
        PERIOD_TABLE_LIMIT,
    )


def _label(name: str, shard: int | None = None) -> str:
    return f"sources[{name!r}]" + ("" if shard is None else f"[{shard}]")
