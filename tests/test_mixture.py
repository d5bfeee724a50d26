"""Weighted mixtures: the schedule against a pure-Python oracle, exact shares in every prefix,
source-epochs that are permutations, exact resume and rank sharding, memory, and bad input.
"""

from __future__ import annotations

import json
import pickle
import random
import tracemalloc
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokstream.mixture
from fuzz import schedule as schedule_model
from tokstream import Corpus, TokenStream, mix, open_tokens, stream_token_source
from tokstream._kernels.order import permuted_positions
from tokstream._permutation import implicit_domain, implicit_round_keys
from tokstream._schedule import MixtureWindows, Stage, divisor
from tokstream._state import Cursor
from tokstream.mixture import WEIGHT_TOTAL

SOURCE_STEP = 10**9  # token t of source s is s * SOURCE_STEP + t: a window names its source


def tagged_sources(sizes: list[int], dtype: str = "int64") -> dict[str, np.ndarray]:
    return {f"s{s}": (s * SOURCE_STEP + np.arange(n)).astype(dtype) for s, n in enumerate(sizes)}


def weights_of(names, values) -> dict:
    return dict(zip(names, values, strict=True))


# ------------------------------------------------------------------ the oracle of the schedule

# The schedule by its definition, in fractions (one oracle, shared with the fuzz harness).
oracle_tree, oracle_sample = schedule_model.mixture_tree, schedule_model.mixture_sample


def schedule_of(weights: dict, count: int, first: int = 0, step: int = 1, block: int = 1):
    """(source, local index) of samples first + i * step, from an unshuffled stream whose
    sources hold more windows than any local index reached, so a window is its local index."""
    size = (first + step * count) + block + 2
    sources = tagged_sources([size] * len(weights))
    mixture = mix(dict(zip(weights, sources.values(), strict=True)), weights)
    stream = stream_token_source(mixture, block=block, batch_size=count, shuffle=False)
    n = stream.num_windows
    tokens = stream._order.batch_windows(Cursor(first // n, first % n, None), count)
    starts = np.concatenate([[0], np.cumsum([size - block for _ in weights])])
    source = np.searchsorted(starts, tokens, side="right") - 1
    return source, tokens - starts[source]


@pytest.mark.parametrize(
    "weights",
    [[1, 1], [7, 2, 1], [1, 1, 1], [3, 5, 7, 11, 13], [1, 100], [1, 2, 4, 8, 16, 32], [9, 9, 2]],
)
def test_the_schedule_is_the_oracle_for_the_first_samples(weights):
    names = [f"s{i}" for i in range(len(weights))]
    source, local = schedule_of(weights_of(names, weights), 3000)
    tree = oracle_tree(weights)
    expected = [oracle_sample(tree, k) for k in range(3000)]
    assert list(zip(source.tolist(), local.tolist(), strict=True)) == expected


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.integers(1, 2**20), min_size=1, max_size=7),
    first=st.integers(0, 2**62),
    world_size=st.integers(1, 64),
)
def test_the_schedule_is_the_oracle_anywhere_in_a_long_run(weights, first, world_size):
    names = [f"s{i}" for i in range(len(weights))]
    # 49 windows per source: a window is the local index modulo 49 (unshuffled).
    sources = tagged_sources([50] * len(weights))
    mixture = mix(dict(zip(names, sources.values(), strict=True)), weights_of(names, weights))
    stream = stream_token_source(
        mixture, 1, 8, shuffle=False, world_size=world_size, epochs=2**62 // (49 * len(weights))
    )
    n = stream.num_windows
    windows = stream._order.batch_windows(Cursor(first // n, first % n, None), 8)
    tree = oracle_tree(list(mixture.integer_weights))
    for i, window in enumerate(windows.tolist()):
        source, local = oracle_sample(tree, first + i * world_size)
        assert window == source * 49 + local % 49


@settings(max_examples=200, deadline=None)
@given(d=st.integers(1, 2**32), n=st.integers(0, 2**63 - 1))
def test_the_division_free_quotient_is_exact_below_2_63(d, n):
    magic, shift = divisor(d)
    quotient = n if magic == 0 else ((n * magic) >> 64) >> shift
    assert magic < 2**64 and quotient == n // d


# ------------------------------------------------------------------ shares of every prefix


def prefix_errors(weights: dict, count: int) -> np.ndarray:
    """max over prefixes k <= count of |count_s(k) - w_s k|, per source (exact weights)."""
    source, _ = schedule_of(weights, count)
    mixture_weights = mix({n: np.arange(3) for n in weights}, weights).integer_weights
    total = sum(mixture_weights)
    k = np.arange(1, count + 1)
    errors = []
    for s, w in enumerate(mixture_weights):
        counts = np.cumsum(source == s)
        # |count * total - w * k| / total, in exact integers.
        errors.append(np.abs(counts * total - w * k).max() / total)
    return np.array(errors)


@pytest.mark.parametrize(
    "values",
    [
        [1, 1, 1],
        [0.7, 0.2, 0.1],
        [1, 2, 4, 8, 16, 32, 64, 128],  # a deep, skewed tree
        [1] * 17,
        [1000, 1, 1, 1],
        [0.5, 0.25, 0.125, 0.0625, 0.0625],
        [3, 3, 3, 3, 3, 3, 1],
    ],
)
def test_every_prefix_gives_each_source_its_share_within_2(values):
    names = [f"s{i}" for i in range(len(values))]
    errors = prefix_errors(weights_of(names, values), 400_000)
    assert errors.max() < 2, errors


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 10**6), min_size=2, max_size=12))
def test_every_prefix_is_within_2_for_any_integer_weights(values):
    names = [f"s{i}" for i in range(len(values))]
    assert prefix_errors(weights_of(names, values), 30_000).max() < 2


def test_every_period_of_the_integer_weights_gives_each_source_exactly_its_weight():
    weights = {"web": 5, "code": 3, "math": 2}
    source, _ = schedule_of(weights, 10 * 50)
    for period in source.reshape(50, 10):
        assert np.bincount(period, minlength=3).tolist() == [5, 3, 2]


def test_weights_are_read_exactly_and_rounded_only_past_2_30():
    assert mix({"a": [1, 2], "b": [3, 4]}, {"a": 0.7, "b": 0.3}).integer_weights == (7, 3)
    assert mix({"a": [1, 2], "b": [3, 4]}, {"a": 6, "b": 4}).integer_weights == (3, 2)
    third = mix({"a": [1, 2], "b": [3, 4]}, {"a": 1 / 3, "b": 2 / 3})
    assert sum(third.integer_weights) <= WEIGHT_TOTAL + 2
    assert abs(third.weights["a"] - 1 / 3) < 2**-29
    tiny = mix({"a": [1, 2], "b": [3, 4]}, {"a": 1e-12, "b": 1})
    assert tiny.integer_weights[0] == 1  # rounded, but never to zero
    assert mix({"a": [1, 2], "b": [3, 4]}, {"a": Fraction(1, 3), "b": 1}).integer_weights == (1, 3)


# ------------------------------------------------------------------ the sources' orders


@pytest.mark.parametrize("shuffle", [True, False])
def test_each_source_epoch_is_a_permutation_of_that_sources_windows(shuffle):
    sizes = [38, 102, 7]  # 37, 101 and 6 windows of block 1
    mixture = mix(tagged_sources(sizes), {"s0": 2, "s1": 5, "s2": 1})
    stream = stream_token_source(mixture, 1, 64, epochs=6, shuffle=shuffle, seed=11)
    windows = np.concatenate([x[:, 0] for x, _ in stream])
    previous_orders = {}
    for s, size in enumerate(sizes):
        picked = windows[windows // SOURCE_STEP == s] % SOURCE_STEP
        n = size - 1
        epochs = picked[: picked.shape[0] // n * n].reshape(-1, n)
        assert epochs.shape[0] >= 2
        for order in epochs:
            assert sorted(order.tolist()) == list(range(n))
        if shuffle:
            assert len({tuple(order) for order in epochs.tolist()}) == epochs.shape[0]
            previous_orders[s] = epochs[0]
        else:
            assert (epochs == np.arange(n)).all()
    if shuffle:  # each source has its own permutation, not another's cut down
        assert previous_orders[0].tolist() != previous_orders[1][:37].tolist()


def test_samples_permuted_side_by_side_equal_samples_permuted_one_at_a_time(monkeypatch):
    # Tiny sources change epochs (and keys) inside most groups of the kernel's lanes. Batches of
    # consecutive samples are permuted a source-epoch at a time; the tree's path (no period
    # table) permutes them in the schedule's order.
    mixture = mix(tagged_sources([9, 30, 4]), {"s0": 3, "s1": 5, "s2": 2})
    stream = stream_token_source(mixture, 1, 40, epochs=30, seed=5)
    together = np.concatenate([x[:, 0] for x, _ in stream])
    monkeypatch.setattr(tokstream.mixture, "PERIOD_TABLE_LIMIT", 0)
    for batch_size in (1, 40):
        alone = stream_token_source(mixture, 1, batch_size, epochs=30, seed=5)
        assert together.tolist() == np.concatenate([x[:, 0] for x, _ in alone]).tolist()


@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize("weights", [[3, 5, 2], [1], [7, 1, 1, 40], [2**16, 1]])
def test_the_period_table_gives_the_windows_of_the_tree(monkeypatch, weights, world_size):
    # Schedules of small period are read from a table of one period; larger ones walk the
    # tree. Both give the same samples, in any order of batches (the kernel's cache of each
    # source's last epoch is only a shortcut).
    names = [f"s{i}" for i in range(len(weights))]
    mixture = mix(tagged_sources([9, 30, 4, 70][: len(weights)]), weights_of(names, weights))

    def windows(limit: int) -> list[list[int]]:
        monkeypatch.setattr(tokstream.mixture, "PERIOD_TABLE_LIMIT", limit)
        stream = stream_token_source(mixture, 1, 13, epochs=40, seed=3, world_size=world_size)
        order, cursors = stream._order, [stream._cursor]
        for _ in range(30):
            cursors.append(order.after(cursors[-1]))
        visits = cursors + cursors[::-1] + cursors[::7]
        return [order.batch_windows(c, order.rows_at(c)).tolist() for c in visits]

    by_table = windows(2**17)
    assert by_table == windows(0)
    assert mixture_period(mixture, 2**17) == sum(mixture.integer_weights)
    assert mixture_period(mixture, 0) == 0


def mixture_period(mixture, limit: int) -> int:
    """The rows of the period table a stream over ``mixture`` uses under ``limit``."""
    previous = tokstream.mixture.PERIOD_TABLE_LIMIT
    tokstream.mixture.PERIOD_TABLE_LIMIT = limit
    try:
        return stream_token_source(mixture, 1, 4)._order._kernel.period_length
    finally:
        tokstream.mixture.PERIOD_TABLE_LIMIT = previous


def test_the_schedule_comes_from_weights_a_caller_cannot_reassign():
    mixture = mix(tagged_sources([9, 30]), {"s0": 1, "s1": 3})
    with pytest.raises(AttributeError):
        mixture.integer_weights = (1, -5)  # type: ignore[misc]
    assert not hasattr(mixture, "nodes") and not hasattr(mixture, "root")


# Two sources of weights 1 and 3: root node 0 = (p, q, left, right) = (1, 4, leaf 0, leaf 1).
GOOD_TABLES = {
    "root": 0,
    "nodes": [[1, 4, -1, -2]],
    "weights": [1, 3],
    "sources": [[0, 5, 3, 1], [5, 10, 4, 1]],
    "num_windows": 15,
}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"nodes": [[1, 5, -1, -2]]}, "does not sum its children"),
        ({"nodes": [[1, 4, -1, 0]]}, "neither a source .*nor an earlier node"),
        ({"nodes": [[1, 4, -1, -3]]}, "neither a source .*nor an earlier node"),
        ({"root": 1}, "neither a source .*nor an earlier node"),
        ({"root": -1}, "is not the weights' sum"),
        ({"nodes": []}, "2 sources of positive weight need 1 nodes"),
        (  # sums right, but source 0 is two leaves and source 2 none
            {
                "root": 1,
                "nodes": [[1, 2, -1, -2], [2, 3, 0, -1]],
                "weights": [1, 1, 1],
                "sources": [[0, 5, 3, 1], [5, 5, 3, 1], [10, 5, 3, 1]],
            },
            "one tree with each source as one leaf",
        ),
        ({"weights": [0, 4], "nodes": [[0, 4, -1, -2]]}, "1 sources of positive weight need 0"),
        ({"weights": [0, 0], "nodes": []}, "weights must lie in .* not all 0"),
        ({"weights": [-1, 4]}, "weights must lie in"),
        ({"sources": [[0, 5, 3, 1]]}, "1 sources need 1 weights"),
        ({"start": 1}, "the first stage must start at sample 0"),
        ({"later": [(5, 0, [[1, 4, -1, -2]], [1, 3]), (5, -1, [], [1, 0])]}, "stage 2 must start"),
        ({"later": [(5, -1, [], [0, 1])]}, "stage 1: node child -1 is neither a source of pos"),
        ({"sources": [[0, 5, 3, 1], [5, 11, 4, 1]]}, "source 1 .* is not a window range"),
        ({"sources": [[0, 5, 3, 1], [5, 10, 3, 1]]}, "source 1 .* domain covering it"),
        ({"sources": [[-1, 5, 3, 1], [5, 10, 4, 1]]}, "source 0"),
        ({"sources": [[0, 0, 3, 1], [5, 10, 4, 1]]}, "source 0"),
        ({"sources": [[0, 5, 33, 1], [5, 10, 4, 1]]}, "source 0"),
    ],
)
def test_the_mixture_kernel_refuses_tables_that_are_not_a_schedule(change, match):
    # The kernel checks what it is given once, so that its release build, which reads the tables
    # without bounds checks, can only write windows inside its sources' ranges.
    with pytest.raises(ValueError, match=match):
        kernel_of(**{**GOOD_TABLES, **change}, seed=0, shuffle=True, rounds=6, period_limit=2**16)


def kernel_of(root, nodes, weights, sources, num_windows, start=0, later=(), **options):
    """A mixture kernel of one stage ``(root, nodes, weights)`` from ``start`` (and ``later``
    stages)."""
    stages = [Stage(start, root, nodes, weights), *(Stage(*stage) for stage in later)]
    return MixtureWindows(stages, sources, num_windows, **options)


@pytest.mark.parametrize(("first", "step", "count"), [(-1, 1, 4), (0, 0, 4), (2**62, 2**61, 3)])
def test_the_mixture_kernel_refuses_sample_indices_past_2_63(first, step, count):
    kernel = kernel_of(**GOOD_TABLES, seed=0, shuffle=True, rounds=6, period_limit=2**16)
    with pytest.raises(ValueError, match="must lie in"):
        kernel.fill(np.empty(count, np.int64), first, step)
    kernel.fill(np.empty(2, np.int64), 2**62, 2**62 - 1)  # the last sample is 2**63 - 1


def test_the_mixture_kernel_table_is_its_tree():
    kernel = kernel_of(**GOOD_TABLES, seed=0, shuffle=False, rounds=6, period_limit=4)
    assert kernel.period_length == 4
    windows = np.empty(40, np.int64)
    kernel.fill(windows, 7, 3)
    walked = kernel.schedule(7, 3, 40)
    starts = np.array([0, 5])
    expected = starts[walked[:, 0]] + walked[:, 1] % np.array([5, 10])[walked[:, 0]]
    assert windows.tolist() == expected.tolist()


def kernels_by_tree_and_by_table(weights, sizes, shuffle: bool, seed: int):
    """Two mixture kernels of the same sources, windows ``0 ..`` laid out one source after the
    other: one walking the tree per sample, one with a period table."""
    root, nodes = tokstream.mixture.schedule_tree(weights)
    firsts = np.cumsum([0, *sizes])[:-1].tolist()
    sources = [(f, n, *implicit_domain(n)) for f, n in zip(firsts, sizes, strict=True)]
    return tuple(
        MixtureWindows(
            [Stage(0, root, nodes, weights)], sources, sum(sizes), seed, shuffle, 6, limit
        )
        for limit in (0, 2**16)
    )


@pytest.mark.parametrize("weights", [[3, 5, 2], [1, 1], [7, 1, 1, 40], [4, 6]])
@pytest.mark.parametrize("step", [2, 3, 5, 10, 20, 64, 2**30 + 3, 2**31])
def test_a_rank_of_several_reads_the_same_windows_from_its_cycle_of_rows(weights, step):
    # A rank takes every step-th sample: from a period table it follows the cycle of rows it
    # visits (one class modulo gcd(period, step); a step that the period divides stays on one
    # row, one coprime to it visits them all), each source's samples permuted together. The
    # tree's path gives the same windows, whatever the first sample and the batch length;
    # steps of 2**31 and more take the per-sample path.
    sizes = [9, 30, 4, 70][: len(weights)]
    for shuffle in (True, False):
        tree, table = kernels_by_tree_and_by_table(weights, sizes, shuffle, seed=11)
        for first in (0, 1, 7, 123, 2**40 + 5):
            for count in (1, 9, 130):
                if first + step * (count - 1) >= 2**63:
                    continue
                by_tree, by_table = np.empty(count, np.int64), np.empty(count, np.int64)
                tree.fill(by_tree, first, step)
                table.fill(by_table, first, step)
                assert by_table.tolist() == by_tree.tolist(), (first, count, shuffle)


@settings(max_examples=150, deadline=None)
@given(
    weights=st.lists(st.integers(1, 50), min_size=1, max_size=6),
    sizes=st.lists(st.integers(1, 40), min_size=6, max_size=6),
    first=st.integers(0, 2**40),
    step=st.one_of(st.just(1), st.integers(1, 64)),
    count=st.integers(0, 300),
    shuffle=st.booleans(),
)
def test_the_mixture_kernel_with_or_without_its_table_writes_the_same_windows(
    weights, sizes, first, step, count, shuffle
):
    sizes = sizes[: len(weights)]
    made = kernels_by_tree_and_by_table(weights, sizes, shuffle, seed=7)
    assert [k.period_length for k in made] == [0, sum(weights)]
    by_tree, by_table = np.empty(count, np.int64), np.empty(count, np.int64)
    made[0].fill(by_tree, first, step)
    made[1].fill(by_table, first, step)
    assert by_tree.tolist() == by_table.tolist()
    if not shuffle:
        walked = made[0].schedule(first, step, count)
        firsts = np.cumsum([0, *sizes])[:-1]
        expected = [firsts[s] + j % sizes[s] for s, j in walked.tolist()]
        assert by_tree.tolist() == expected


def test_a_shuffled_source_order_is_its_keyed_implicit_permutation():
    sizes = [60, 90]
    mixture = mix(tagged_sources(sizes), {"s0": 1, "s1": 1})
    stream = stream_token_source(mixture, 3, 10, epochs=3, seed=4)
    windows = np.concatenate([x[:, 0] for x, _ in stream])
    for s, size in enumerate(sizes):
        n = size - 3
        low_bits, high_size = implicit_domain(n)
        picked = windows[windows // SOURCE_STEP == s] % SOURCE_STEP
        for epoch in range(picked.shape[0] // n):
            keys = implicit_round_keys(4, epoch, stream=s + 1)
            expected = np.empty(n, dtype=np.int64)
            permuted_positions(expected, 0, 1, n, low_bits, high_size, keys)
            assert picked[epoch * n : (epoch + 1) * n].tolist() == expected.tolist()


def test_one_unshuffled_source_is_the_corpus_in_order():
    ids = np.arange(500, 560)
    alone = stream_token_source(mix({"only": ids}, {"only": 2.5}), 4, 7, shuffle=False)
    plain = stream_token_source(ids, 4, 7, shuffle=False)
    for (x, y), (px, py) in zip(alone, plain, strict=True):
        assert np.array_equal(x, px) and np.array_equal(y, py)


def test_samples_sets_the_epoch_length_and_sources_repeat_or_are_partly_seen():
    mixture = mix(tagged_sources([11, 1001]), {"s0": 1, "s1": 1})
    stream = stream_token_source(mixture, 1, 8, samples=100, epochs=3, extras=("source",))
    assert stream.num_windows == 100 and len(stream) == 3 * 13
    sources = np.concatenate([batch["source"] for batch in stream])
    assert sources.shape[0] == 300 and np.bincount(sources).tolist() == [150, 150]
    # The small source (10 windows) repeats 15 times; the large one shows 150 of its 1000.


def test_the_source_extra_names_each_rows_source_and_documents_reach_the_extras():
    web = Corpus.from_documents([np.arange(1, 9), np.arange(20, 26)])
    code = Corpus.from_documents([np.arange(100, 104), np.arange(200, 210)])
    mixture = mix({"web": web, "code": code}, {"web": 1, "code": 1})
    extras = ("source", "position_ids", "loss_mask")
    stream = stream_token_source(mixture, 4, 6, extras=extras, epochs=2)
    batches = list(stream)
    assert len(batches) == len(stream) == 8  # 10 + 10 windows an epoch, 6 a batch
    document_starts = {1, 20, 100, 200}
    for batch in batches:
        assert batch["source"].dtype == np.int64 and batch["source"].ndim == 1
        first = batch["input_ids"][:, 0]
        assert ((first >= 100) == (batch["source"] == 1)).all()  # a window never spans sources
        for tokens, positions in zip(batch["input_ids"], batch["position_ids"], strict=True):
            expected = [0]
            for token in tokens[1:].tolist():
                expected.append(0 if token in document_starts else expected[-1] + 1)
            assert positions.tolist() == expected


# ------------------------------------------------------------------ resume and ranks


def mixture_stream(**overrides):
    args = dict(block=3, batch_size=5, epochs=4, seed=9, extras=("source",))
    args.update(overrides)
    sources = tagged_sources([40, 23, 131])
    mixture = mix(sources, {"s0": 0.5, "s1": 0.3, "s2": 0.2})
    return stream_token_source(mixture, **args)


def as_lists(batches) -> list:
    return [(b["input_ids"].tolist(), b["labels"].tolist(), b["source"].tolist()) for b in batches]


@pytest.mark.parametrize("seed", range(4))
def test_a_state_taken_at_a_random_point_resumes_to_the_uninterrupted_run(seed):
    chooser = random.Random(seed)
    options = dict(shuffle=chooser.random() < 0.8, world_size=chooser.choice([1, 2, 3]))
    options["rank"] = chooser.randrange(options["world_size"])
    whole = as_lists(mixture_stream(**options))
    cut = chooser.randrange(len(whole) + 1)
    stream = mixture_stream(**options)
    head = as_lists(next(stream) for _ in range(cut))
    state = json.loads(json.dumps(stream.state_dict()))
    resumed = mixture_stream(**options)
    resumed.load_state_dict(state)
    assert head + as_lists(resumed) == whole
    assert len(json.dumps(state)) < 1000  # no per-source order in the state


def global_steps(streams) -> list[np.ndarray]:
    """Each global step's windows, rank r's rows at positions r, r + W, ..."""
    steps = []
    for batches in zip(*streams, strict=True):
        world = len(batches)
        rows = sum(b["input_ids"].shape[0] for b in batches)
        step = np.empty((rows, batches[0]["input_ids"].shape[1]), dtype=np.int64)
        for r, b in enumerate(batches):
            step[r::world] = b["input_ids"]
        steps.append(step)
    return steps


def test_two_ranks_together_stream_exactly_what_one_rank_streams():
    # samples=200 (a multiple of every world size here): no epoch tail is cut.
    one = global_steps([mixture_stream(batch_size=10, samples=200)])
    two = global_steps(
        [mixture_stream(batch_size=5, samples=200, rank=r, world_size=2) for r in range(2)]
    )
    assert len(one) == len(two) == 80
    assert all(np.array_equal(a, b) for a, b in zip(one, two, strict=True))


@pytest.mark.parametrize("steps", [0, 3, 16, 17, 25, 50])
def test_four_ranks_resume_on_two_with_the_batch_doubled_exactly(steps):
    # 200 samples an epoch, a multiple of both worlds: the global steps of 4 ranks of 3 and of
    # 2 ranks of 6 are the same, so the two-rank run resumed after any step continues it.
    def world(size: int) -> list:
        return [
            mixture_stream(batch_size=12 // size, rank=r, world_size=size, samples=200)
            for r in range(size)
        ]

    expected = global_steps(world(2))
    assert all(np.array_equal(a, b) for a, b in zip(global_steps(world(4)), expected, strict=True))
    four = world(4)
    for stream in four:
        for _ in range(steps):
            next(stream)
    states = [json.loads(json.dumps(stream.state_dict())) for stream in four]
    assert all(state["config"] == states[0]["config"] for state in states)
    two = world(2)
    for stream in two:
        stream.load_state_dict(states[0])
    resumed = global_steps(two)
    assert len(resumed) == len(expected) - steps
    assert all(np.array_equal(a, b) for a, b in zip(resumed, expected[steps:], strict=True))


def test_a_state_of_another_mixture_or_of_a_plain_corpus_is_refused():
    stream = mixture_stream()
    next(stream)  # the weights decide the samples consumed so far
    state = stream.state_dict()
    other = mix(tagged_sources([40, 23, 131]), {"s0": 0.4, "s1": 0.4, "s2": 0.2})
    with pytest.raises(ValueError, match="mixture_weights"):
        stream_token_source(other, 3, 5, seed=9).load_state_dict(state)
    renamed = mix(
        dict(zip("abc", tagged_sources([40, 23, 131]).values(), strict=True)),
        {"a": 0.5, "b": 0.3, "c": 0.2},
    )
    with pytest.raises(ValueError, match="mixture_sources"):
        stream_token_source(renamed, 3, 5, seed=9).load_state_dict(state)
    plain = stream_token_source(stream.corpus, 3, 5, seed=9, permutation="implicit")
    with pytest.raises(ValueError, match="mixture_shards|which this stream lacks"):
        plain.load_state_dict(state)
    with pytest.raises(ValueError, match="missing 'mixture_sources'"):
        stream.load_state_dict(plain.state_dict())


def test_a_stream_over_a_mixture_checks_the_epoch_tail_as_for_one_corpus():
    # 185 samples an epoch on 2 ranks: 184 are streamed, the last position is the tail.
    mixture_ranks = [mixture_stream(world_size=2, rank=r, epochs=1) for r in range(2)]
    assert [stream.num_windows for stream in mixture_ranks] == [185, 185]
    assert [sum(b["source"].shape[0] for b in stream) for stream in mixture_ranks] == [92, 92]


# ------------------------------------------------------------------ memory


def sparse_tokens(path, windows: int, block: int) -> np.memmap:
    """A uint16 memory map of ``windows + block`` zero tokens, sparse on disk."""
    with open(path, "wb") as f:
        f.truncate((windows + block) * 2)
    return np.memmap(path, dtype=np.uint16, mode="r")


def test_a_mixture_of_two_5e8_window_memory_maps_starts_in_a_few_mib(tmp_path):
    block, batch_size = 64, 32
    big = {name: sparse_tokens(tmp_path / name, 5 * 10**8, block) for name in ("web", "code")}

    def first_batch():
        mixture = mix(big, {"web": 0.6, "code": 0.4})
        stream = stream_token_source(mixture, block, batch_size, extras=("source",))
        return stream, next(stream)

    tracemalloc.start()
    try:
        (stream, batch), peak = first_batch(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stream.num_windows == 10**9 and batch["input_ids"].shape == (batch_size, block)
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB traced"
    stream.close()


def test_a_mixture_of_token_files_reads_them_in_place(tmp_path):
    from tokstream import write_tokens

    write_tokens(tmp_path / "a.bin", np.arange(1000, dtype=np.uint16))
    write_tokens(tmp_path / "b.bin", np.arange(2000, 2500, dtype=np.uint16))
    mixture = mix(
        {"a": open_tokens(tmp_path / "a.bin"), "b": open_tokens(tmp_path / "b.bin")},
        {"a": 1, "b": 1},
    )
    assert mixture.corpus.dtype == np.uint16
    windows = np.concatenate([x[:, 0] for x, _ in stream_token_source(mixture, 8, 100)])
    assert ((windows < 1000) | (windows >= 2000)).all()


# ------------------------------------------------------------------ bad input

ARRAY = np.arange(20)


@pytest.mark.parametrize(
    ("sources", "weights", "error", "match"),
    [
        ([ARRAY], {"a": 1}, TypeError, "sources must be a dict"),
        ({"a": ARRAY}, 1, TypeError, "weights must be a dict"),
        ({}, {}, ValueError, "at least one"),
        ({1: ARRAY}, {1: 1}, TypeError, "names must be str"),
        ({"a": ARRAY}, {"a": 1, "b": 1}, ValueError, r"weights\['b'\] names no source"),
        ({"a": ARRAY, "b": ARRAY}, {"a": 1}, ValueError, "no weight for source 'b'"),
        ({"a": ARRAY}, {"a": 0}, ValueError, "weights must give some source a positive weight"),
        ({"a": ARRAY}, {"a": -1.5}, ValueError, r"weights\['a'\] must be at least 0"),
        ({"a": ARRAY}, {"a": float("nan")}, ValueError, r"weights\['a'\] must be finite"),
        ({"a": ARRAY}, {"a": float("inf")}, ValueError, r"weights\['a'\] must be finite"),
        ({"a": ARRAY}, {"a": True}, TypeError, r"weights\['a'\] must be a number"),
        ({"a": ARRAY}, {"a": "1"}, TypeError, r"weights\['a'\] must be a number"),
        ({"a": ARRAY}, {"a": None}, TypeError, r"weights\['a'\] must be a number"),
        ({"a": np.arange(0)}, {"a": 1}, ValueError, r"sources\['a'\] holds no tokens"),
        ({"a": [1.5, 2]}, {"a": 1}, ValueError, r"sources\['a'\]\[0\] must be an exact integer"),
        ({"a": "text"}, {"a": 1}, TypeError, r"sources\['a'\]"),
        (
            {"web": ARRAY.astype(np.uint16), "code": ARRAY.astype(np.int32)},
            {"web": 1, "code": 1},
            ValueError,
            r"sources\['web'\] is uint16, sources\['code'\] is int32",
        ),
    ],
)
def test_bad_mixtures_are_refused_naming_the_source(sources, weights, error, match):
    with pytest.raises(error, match=match):
        mix(sources, weights)


def test_a_mixture_cannot_be_a_source():
    inner = mix({"a": ARRAY}, {"a": 1})
    with pytest.raises(TypeError, match=r"sources\['inner'\] is a mixture"):
        mix({"inner": inner, "b": ARRAY}, {"inner": 1, "b": 1})


@pytest.mark.parametrize(
    ("token_ids", "options", "error", "match"),
    [
        (ARRAY, {"extras": ("source",)}, ValueError, "extras 'source' needs a tokstream.mix"),
        (ARRAY, {"samples": 10}, ValueError, "samples needs a tokstream.mix"),
        ("mixture", {"samples": 0}, ValueError, "samples must be positive"),
        ("mixture", {"samples": 2.5}, ValueError, "samples must be an exact integer"),
        ("mixture", {"samples": "10"}, TypeError, "samples must be an int"),
        ("mixture", {"permutation": "materialized"}, ValueError, "not available for a mixture"),
        ("mixture", {"extras": ("sources",)}, ValueError, "extras"),
        ("mixture", {"epochs": 2**62}, ValueError, "below 2\\*\\*63"),
    ],
)
def test_stream_options_a_source_cannot_give_are_refused(token_ids, options, error, match):
    if isinstance(token_ids, str):
        token_ids = mix({"a": ARRAY, "b": ARRAY}, {"a": 1, "b": 2})
    with pytest.raises(error, match=match):
        stream_token_source(token_ids, 4, 2, **options)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"block": 30}, r"sources\['short'\] holds no window of block \+ 1 = 31 tokens"),
        ({"block": 5, "windows": "within"}, r"sources\['short'\] .* inside one document"),
    ],
)
def test_a_source_without_windows_for_the_block_is_refused_by_name(options, match):
    short = Corpus.from_documents([np.arange(4), np.arange(5)])
    mixture = mix({"long": np.arange(100), "short": short}, {"long": 1, "short": 1})
    with pytest.raises(ValueError, match=match):
        TokenStream(mixture, batch_size=3, **options)


@pytest.mark.parametrize("windows", ["cross", "within"])
@pytest.mark.parametrize("world_size", [1, 3])
def test_sources_of_many_shards_are_joined_through_a_source_with_the_same_batches(
    monkeypatch, windows, world_size
):
    # Past LISTED_SHARDS shards (here: any), the mixture's corpus reads its sources' shards
    # through a JoinedShards source: the same windows, documents and extras as the arrays.
    web = Corpus._from_arrays(
        [np.arange(40) + 1000 * j for j in range(5)],
        [f"w{j}" for j in range(5)],
        "web",
        [np.array([0, 7, 7, 30, 40]), None, np.array([0, 40]), None, np.array([0, 1, 39, 40])],
    )
    code = np.arange(10_000, 10_300)
    options = dict(
        block=5,
        batch_size=7,
        epochs=2,
        seed=4,
        windows=windows,
        world_size=world_size,
        extras=("source", "position_ids", "loss_mask", "origin"),
    )

    def batches(listed: int) -> list:
        monkeypatch.setattr(tokstream.mixture, "LISTED_SHARDS", listed)
        mixture = mix({"web": web, "code": code}, [(0, {"web": 1}), (30, {"web": 2, "code": 1})])
        corpus = mixture.corpus
        assert (corpus.source is None) == (listed > 0)
        documents = [corpus.shard_documents(j) for j in range(len(corpus.shards))]
        ranks = [stream_token_source(mixture, **options, rank=r) for r in range(world_size)]
        shards = [
            (s.tolist(), None if d is None else d.tolist())
            for s, d in zip(corpus.shards, documents, strict=True)
        ]
        return [shards, corpus.document_boundaries.tolist()] + [every_extra(s) for s in ranks]

    joined = batches(0)
    assert joined == batches(4096)
    monkeypatch.setattr(tokstream.mixture, "LISTED_SHARDS", 0)
    mixture = mix({"web": web, "code": code}, [(0, {"web": 1}), (30, {"web": 2, "code": 1})])
    restored = pickle.loads(pickle.dumps(mixture))
    assert every_extra(stream_token_source(restored, **options, rank=0)) == joined[2]


def every_extra(batches) -> list:
    return [{key: value.tolist() for key, value in batch.items()} for batch in batches]
