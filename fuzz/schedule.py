"""The fuzz model's mixture schedule, by its definition in fractions: stages, trees, samples.

Shares no code with tokstream: weights are read with :class:`fractions.Fraction`, each stage's
tree is walked with exact rational rounding, and a source's samples in the stages before are
counted from whole periods plus the samples of the last partial period, one by one.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any


def mixture_weights(weights: list[Any]) -> list[int]:
    """The smallest integers in the ratio of the weights, each read exactly (a float as the
    decimal it prints as); the harness keeps their sum far below 2**30, where they are rounded."""
    exact = [Fraction(repr(float(w))) if isinstance(w, float) else Fraction(w) for w in weights]
    scale = math.lcm(*(w.denominator for w in exact))
    integers = [int(w * scale) for w in exact]
    common = math.gcd(*integers)
    return [w // common for w in integers]


def mixture_stages(weights: Any, names: list[str]) -> list[tuple[int, list[int]]]:
    """``[(start, integer weights)]`` of ``mix(weights=...)``: a dict is one stage from 0; a list
    of ``(start, dict)`` pairs gives a name it leaves out weight 0. The harness draws valid
    schedules only."""
    if isinstance(weights, Mapping):
        return [(0, mixture_weights([weights[n] for n in names]))]
    return [(start, mixture_weights([w.get(n, 0) for n in names])) for start, w in weights]


def mixture_tree(weights: list[int]):
    """The Huffman tree of the schedule over the sources of positive weight: the two lightest
    (earlier first on ties) merged; a leaf names its source's index in ``weights``."""
    forest = [(w, order, ("leaf", s)) for order, (s, w) in enumerate(enumerate(weights)) if w]
    made = len(weights)
    while len(forest) > 1:
        forest.sort(key=lambda item: (item[0], item[1]))
        (wa, _, a), (wb, _, b) = forest[0], forest[1]
        made += 1
        forest = forest[2:] + [(wa + wb, made, ("node", Fraction(wa, wa + wb), a, b))]
    return forest[0][2]


def mixture_sample(tree, k: int) -> tuple[int, int]:
    """``(source, local index)`` of sample ``k`` of one stage: round half up at every node."""
    while tree[0] == "node":
        _, share, left, right = tree
        sent_left = math.floor(k * share + Fraction(1, 2))
        if math.floor((k + 1) * share + Fraction(1, 2)) > sent_left:
            tree, k = left, sent_left
        else:
            tree, k = right, k - sent_left
    return tree[1], k


class StagedSchedule:
    """Global sample ``k`` of a schedule of stages -> ``(source, its local index)``: the stage
    holding ``k``, its sample ``k - start`` there, plus the source's samples of the stages
    before."""

    def __init__(self, stages: list[tuple[int, list[int]]]) -> None:
        self.starts = [start for start, _ in stages]
        self.trees = [mixture_tree(weights) for _, weights in stages]
        count = len(stages[0][1])
        self.offsets = [[0] * count]
        for i in range(1, len(stages)):
            length = self.starts[i] - self.starts[i - 1]
            weights = stages[i - 1][1]
            # Every sum(weights) samples give each source exactly its weight; the rest one by one.
            periods, rest = divmod(length, sum(weights))
            counts = [periods * w for w in weights]
            for t in range(rest):
                counts[mixture_sample(self.trees[i - 1], t)[0]] += 1
            self.offsets.append([o + c for o, c in zip(self.offsets[-1], counts, strict=True)])

    def sample(self, k: int) -> tuple[int, int]:
        stage = bisect.bisect_right(self.starts, k) - 1
        source, local = mixture_sample(self.trees[stage], k - self.starts[stage])
        return source, self.offsets[stage][source] + local


def recorded_stages(config: dict[str, Any]) -> list[tuple[int, Any]] | None:
    """A state's schedule as its fingerprint records it: ``(0, first stage's weights as
    JSON)`` and ``(start, digest)`` per later stage from ``"start:digest"`` items; None when
    the fingerprint cannot hold one (a field missing or not a str, an item not of that form)."""
    weights, later = config.get("mixture_weights"), config.get("mixture_stages", "")
    if not isinstance(weights, str) or not isinstance(later, str):
        return None
    stages: list[tuple[int, Any]] = [(0, weights)]
    for item in later.split(",") if later else []:
        start, colon, digest = item.partition(":")
        if not (colon and start and set(start) <= set("0123456789") and len(digest) == 16):
            return None
        stages.append((int(start), digest))
    return stages


def schedule_edit_verdict(original: Any, edited: Any, must_reject: bool, samples: int) -> bool:
    """Whether loading ``edited`` (a mixture state whose fingerprint's schedule was edited) must
    be refused: the stages both record before the saved global sample must be the same; any
    other edit keeps its verdict ``must_reject``."""
    if not (isinstance(edited, dict) and isinstance(edited.get("config"), dict)):
        return must_reject
    keys = ("mixture_weights", "mixture_stages")
    if {k: v for k, v in edited.items() if k != "config"} != {
        k: v for k, v in original.items() if k != "config"
    }:
        return must_reject
    config, before = edited["config"], original["config"]
    if {k: v for k, v in config.items() if k not in keys} != {
        k: v for k, v in before.items() if k not in keys
    }:
        return must_reject
    saved = recorded_stages(config) if "mixture_weights" in config else None
    if saved is None:
        return True
    sample = original["epoch"] * samples + original["position"]
    own = recorded_stages(before)
    assert own is not None
    return [s for s in saved if s[0] < sample] != [s for s in own if s[0] < sample]
