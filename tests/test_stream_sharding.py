"""Sharding across ranks, its tail, ``drop_last``, and elastic resume.

The contract (the module docstring of ``tokstream.stream``): each epoch's order is cut to its
first ``(n // W) * W`` positions, rank ``r`` takes positions ``r, r + W, ...`` of it, and global
step ``k`` consumes positions ``[k * W * B, (k + 1) * W * B)``. The corpus here is
``np.arange``, so a window's first token is its start and the order can be read off the
batches.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokstream
from tokstream import reference, stream_token_source


def ranks(num_windows: int, block: int, batch_size: int, world_size: int, **controls: Any):
    tokens = np.arange(num_windows + block, dtype=np.int64)
    return [
        stream_token_source(tokens, block, batch_size, rank=rank, world_size=world_size, **controls)
        for rank in range(world_size)
    ]


def epoch_orders(num_windows: int, epochs: int, shuffle: bool, seed: int, permutation: str):
    """Each epoch's window order, as one process streams it."""
    (single,) = ranks(
        num_windows, 2, 7, 1, epochs=epochs, shuffle=shuffle, seed=seed, permutation=permutation
    )
    starts = np.concatenate([windows[:, 0] for windows, _ in single] or [np.empty(0, int)])
    return starts.reshape(epochs, num_windows)


def global_steps(streams) -> list[np.ndarray]:
    """Run the ranks in lockstep; each global step's window starts in order-position order."""
    steps = []
    for batches in zip(*streams, strict=True):
        sizes = {windows.shape[0] for windows, _ in batches}
        assert len(sizes) == 1, f"ranks yielded batches of different sizes {sizes}"
        # Row i of rank r holds position base + r + W * i: interleaving rows restores the order.
        steps.append(np.stack([windows[:, 0] for windows, _ in batches], axis=1).reshape(-1))
    for stream in streams:
        assert list(stream) == [], "a rank yielded more batches than the others"
    return steps


shard_configs = st.fixed_dictionaries(
    {
        "num_windows": st.integers(0, 60),
        "block": st.integers(1, 4),
        "batch_size": st.integers(1, 6),
        "world_size": st.integers(1, 5),
        "epochs": st.integers(1, 3),
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**32 - 1),
        "drop_last": st.booleans(),
        "permutation": st.sampled_from(["materialized", "implicit"]),
    }
)


@settings(max_examples=150, deadline=None)
@given(config=shard_configs)
def test_ranks_split_each_epoch_order_disjointly_less_the_documented_tail(config):
    n, world, batch = config["num_windows"], config["world_size"], config["batch_size"]
    streams = ranks(
        n,
        config["block"],
        batch,
        world,
        epochs=config["epochs"],
        shuffle=config["shuffle"],
        seed=config["seed"],
        drop_last=config["drop_last"],
        permutation=config["permutation"],
    )
    lengths = {len(stream) for stream in streams}
    assert len(lengths) == 1
    steps = global_steps(streams)
    assert len(steps) == lengths.pop()

    orders = epoch_orders(
        n, config["epochs"], config["shuffle"], config["seed"], config["permutation"]
    )
    used = (n // world) * world  # the tail: the last n % world positions of each order
    if config["drop_last"]:
        used = (n // (world * batch)) * world * batch
    expected = np.concatenate([order[:used] for order in orders])
    streamed = np.concatenate(steps) if steps else np.empty(0, int)
    np.testing.assert_array_equal(streamed, expected)
    for order in orders:
        assert len(set(order[:used])) == used  # so the ranks' shares are disjoint


def test_the_single_process_order_is_the_reference_order():
    orders = epoch_orders(50, 3, True, 9, "materialized")
    stream = reference.stream_token_source(np.arange(52), 2, 50, epochs=3, seed=9)
    np.testing.assert_array_equal(orders, np.stack([windows[:, 0] for windows, _ in stream]))


def test_every_rank_yields_equal_batches_and_the_tail_is_skipped():
    # 23 windows, 3 ranks, batches of 4: the first 21 positions in global steps of 12 and 9,
    # so every rank yields one batch of 4 and one of 3; the last 2 positions are the tail.
    streams = ranks(23, 5, 4, 3, shuffle=False)
    batches = [[windows[:, 0].tolist() for windows, _ in stream] for stream in streams]
    assert batches == [
        [[0, 3, 6, 9], [12, 15, 18]],
        [[1, 4, 7, 10], [13, 16, 19]],
        [[2, 5, 8, 11], [14, 17, 20]],
    ]


def test_drop_last_drops_the_final_partial_global_batch():
    streams = ranks(23, 5, 4, 3, shuffle=False, drop_last=True)
    assert [len(stream) for stream in streams] == [1, 1, 1]
    assert [next(stream)[0][:, 0].tolist() for stream in streams] == [
        [0, 3, 6, 9],
        [1, 4, 7, 10],
        [2, 5, 8, 11],
    ]


def test_a_corpus_with_fewer_windows_than_ranks_yields_nothing_on_every_rank():
    assert [len(stream) for stream in ranks(2, 3, 4, 3)] == [0, 0, 0]
    assert global_steps(ranks(2, 3, 4, 3)) == []


@pytest.mark.parametrize(
    ("rank", "world_size", "error", "match"),
    [
        (2, 2, ValueError, "rank must be below world_size=2, got 2"),
        (-1, 2, ValueError, "rank must be nonnegative, got -1"),
        (0, 0, ValueError, "world_size must be positive, got 0"),
        (0.5, 2, ValueError, "rank must be an exact integer, got 0.5"),
        ("0", 2, TypeError, "rank must be an int, got '0'"),
        (0, True, TypeError, "world_size must be an int, got bool True"),
    ],
)
def test_bad_rank_or_world_size_is_rejected(rank, world_size, error, match):
    with pytest.raises(error, match=match):
        stream_token_source(np.arange(20), 3, 2, rank=rank, world_size=world_size)


@pytest.mark.parametrize("drop_last", ["yes", 1, None])
def test_drop_last_must_be_a_bool(drop_last):
    with pytest.raises(TypeError, match=f"drop_last must be a bool, got {drop_last!r}"):
        stream_token_source(np.arange(20), 3, 2, drop_last=drop_last)


# ------------------------------------------------------------------ elastic resume


def resume(streams, steps: int, world_size: int, batch_size: int, **controls):
    """Run ``streams`` for ``steps`` global steps, then continue on ``world_size`` new ranks.

    Returns the new ranks and the state they loaded (taken from rank 0 of the old world).
    """
    for stream in streams:
        for _ in range(steps):
            next(stream)
    saved = json.loads(json.dumps(streams[0].state_dict()))
    resumed = ranks(streams[0].num_windows, 3, batch_size, world_size, **controls)
    for stream in resumed:
        stream.load_state_dict(saved)
    return resumed, saved


ELASTIC = {"epochs": 3, "seed": 4}


@pytest.mark.parametrize("permutation", ["materialized", "implicit"])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("steps", [0, 3, 6, 7, 13])
def test_four_ranks_resume_on_two_with_the_batch_doubled_exactly(steps, shuffle, permutation):
    # 103 windows in global batches of 16: 6 full steps and a partial one of 7 positions per
    # epoch. drop_last makes every global step a full one, so the sequence is the same for
    # any world size of the same global batch and the resume continues it exactly.
    controls = dict(ELASTIC, shuffle=shuffle, permutation=permutation, drop_last=True)
    uninterrupted = global_steps(ranks(103, 3, 4, 4, **controls))
    assert len(uninterrupted) == 3 * 6
    resumed, _ = resume(ranks(103, 3, 4, 4, **controls), steps, 2, 8, **controls)
    resumed = global_steps(resumed)
    assert len(resumed) == len(uninterrupted) - steps
    for got, want in zip(resumed, uninterrupted[steps:], strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("old", "new"), [((4, 4), (2, 8)), ((2, 8), (4, 4)), ((1, 16), (8, 2))])
@pytest.mark.parametrize("steps", [0, 4, 6, 7, 8, 13, 20])
def test_an_elastic_resume_keeps_full_global_batches_and_cuts_the_tail_for_the_new_world(
    old, new, steps
):
    # Without drop_last the final partial global batch of an epoch holds the positions up to
    # (n // W) * W, which depends on W: 103 windows keep 100 positions with 4 ranks, 102 with
    # 2, 103 with 1. An elastic resume therefore continues exactly as if the new world had run
    # from the start: every full global batch is the old one, the partial one is the new
    # world's.
    controls = dict(ELASTIC, shuffle=True)
    old_world = ranks(103, 3, old[1], old[0], **controls)
    steps = min(steps, len(old_world[0]))
    resumed, saved = resume(old_world, steps, *new, **controls)
    resumed = global_steps(resumed)
    new_from_start = global_steps(ranks(103, 3, new[1], new[0], **controls))
    old_from_start = global_steps(ranks(103, 3, old[1], old[0], **controls))

    # The new world stands where the old one stopped, counted in its own steps; a cursor past
    # the new world's shorter epoch starts the next epoch.
    new_steps_per_epoch = len(new_from_start) // ELASTIC["epochs"]
    skip = saved["epoch"] * new_steps_per_epoch + saved["position"] // 16
    assert len(resumed) == len(new_from_start) - skip
    for got, want in zip(resumed, new_from_start[skip:], strict=True):
        np.testing.assert_array_equal(got, want)
    full = [step for step in old_from_start if step.size == 16]
    np.testing.assert_array_equal(
        np.concatenate(full), np.concatenate([s for s in new_from_start if s.size == 16])
    )


def test_rank_zeros_state_resumes_every_rank_though_its_rank_field_differs():
    tokens = np.arange(5000, dtype=np.int64)
    streams = [
        tokstream.stream_token_source(tokens, 8, 4, seed=1, rank=r, world_size=3) for r in range(3)
    ]
    for stream in streams:
        for _ in range(5):
            next(stream)
    states = [stream.state_dict() for stream in streams]
    assert [state["rank"] for state in states] == [0, 1, 2]
    assert all({**state, "rank": 0} == states[0] for state in states)
    for rank, stream in enumerate(streams):
        resumed = tokstream.stream_token_source(tokens, 8, 4, seed=1, rank=rank, world_size=3)
        resumed.load_state_dict(states[0])
        for _ in range(6):
            expected, got = next(stream), next(resumed)
            assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
