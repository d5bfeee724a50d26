"""A mixture's shares over the samples actually streamed, when epoch tails are cut.

The schedule keeps each source within 2 of ``w_s * k`` in every prefix of the global sample
sequence. The samples streamed are that sequence less each epoch's tail (``N - S`` samples, the
same positions for any shape): over streamed samples the bound is ``2 + 4 c`` after ``c`` cut
tails, and exactly the schedule's 2 when no tail is cut (docs/mixtures.md).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tokstream import mix, stream_token_source

BLOCK = 2


def streamed_sources(mixture, world: int, batch: int, epochs: int, **options) -> list[np.ndarray]:
    """Each global step's sources (all ranks together), from the ranks' ``"source"`` extra."""
    ranks = [
        stream_token_source(
            mixture,
            BLOCK,
            batch,
            rank=r,
            world_size=world,
            epochs=epochs,
            seed=1,
            extras=("source",),
            **options,
        )  # fmt: skip
        for r in range(world)
    ]
    return [np.concatenate([b["source"] for b in batches]) for batches in zip(*ranks, strict=True)]


def worst_error(steps: list[np.ndarray], weights: list[Fraction]) -> list[Fraction]:
    """For each step, the largest ``|count_s - w_s * T|`` over the sources after it."""
    counts = np.zeros(len(weights), np.int64)
    total, worst = 0, []
    for sources in steps:
        counts += np.bincount(sources, minlength=len(weights))
        total += len(sources)
        worst.append(max(abs(int(c) - w * total) for c, w in zip(counts, weights, strict=True)))
    return worst


def shares(mixture) -> list[Fraction]:
    total = sum(mixture.integer_weights)
    return [Fraction(w, total) for w in mixture.integer_weights]


def mixture_of(weights: dict[str, int]):
    return mix({name: 1000 * i + np.arange(50) for i, name in enumerate(weights)}, weights)


@pytest.mark.parametrize(
    ("weights", "samples", "world", "batch", "drop_last"),
    [
        ({"a": 2, "b": 1}, 30, 4, 3, False),  # N a multiple of the period: the same cut
        ({"a": 2, "b": 1}, 30, 4, 2, True),
        ({"a": 5, "b": 3, "c": 2}, 41, 3, 4, False),
        ({"a": 1, "b": 1, "c": 1, "d": 7}, 50, 7, 2, True),
    ],
)
def test_streamed_shares_stay_within_two_plus_four_per_cut_tail(
    weights, samples, world, batch, drop_last
):
    mixture = mixture_of(weights)
    epochs = 12
    steps = streamed_sources(mixture, world, batch, epochs, samples=samples, drop_last=drop_last)
    per_epoch = len(steps) // epochs
    streamed = sum(len(s) for s in steps[:per_epoch])
    assert streamed < samples  # a tail is cut every epoch
    for step, error in enumerate(worst_error(steps, shares(mixture))):
        cut_tails = step // per_epoch  # the tails cut before this step's epoch
        assert error <= 2 + 4 * cut_tails


def test_the_error_grows_past_two_when_the_same_positions_are_cut_every_epoch():
    # 30 samples of a 2:1 schedule (period 3), 4 ranks: positions 28 and 29 are cut every
    # epoch, and they are the same sources every epoch.
    mixture = mixture_of({"a": 2, "b": 1})
    steps = streamed_sources(mixture, 4, 7, 30, samples=30)
    assert worst_error(steps, shares(mixture))[-1] > 2


@pytest.mark.parametrize(
    ("weights", "samples", "world", "batch", "drop_last"),
    [
        ({"a": 2, "b": 1}, 30, 3, 4, False),  # 30 % 3 == 0: nothing cut
        ({"a": 2, "b": 1}, 36, 3, 4, True),  # 36 % 12 == 0
        ({"a": 5, "b": 3, "c": 2}, 40, 4, 3, False),
        ({"a": 1, "b": 1, "c": 1, "d": 7}, 42, 7, 2, True),
    ],
)
def test_without_cut_tails_every_streamed_prefix_is_within_two(
    weights, samples, world, batch, drop_last
):
    mixture = mixture_of(weights)
    steps = streamed_sources(mixture, world, batch, 12, samples=samples, drop_last=drop_last)
    assert sum(len(s) for s in steps) == 12 * samples
    assert max(worst_error(steps, shares(mixture))) <= 2
