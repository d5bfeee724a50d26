"""Mixture stages: the staged schedule against a pure-Python oracle, shares of every prefix of
each stage, sources' epochs running on across stages, batches and resumes across stage
boundaries, loading a state into a changed schedule, the state's size, and bad schedules.
"""

from __future__ import annotations

import itertools
import json
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz.model import model_mixture_batches
from fuzz.schedule import StagedSchedule
from tokstream import mix, stream_token_source
from tokstream.mixture import MAX_STAGES

SOURCE_STEP = 10**6  # token t of source s is s * SOURCE_STEP + t: a window names its source
NAMES = ("web", "code", "math")


def tagged(sizes) -> dict[str, np.ndarray]:
    return {NAMES[s]: s * SOURCE_STEP + np.arange(n, dtype=np.int64) for s, n in enumerate(sizes)}


def stage_dicts(stages) -> list:
    """``mix(weights=...)`` of ``[(start, integer weights)]``, a 0 left out of the dict."""
    return [(start, {NAMES[s]: w for s, w in enumerate(ws) if w}) for start, ws in stages]


def schedules(max_sources: int = 3):
    """Random stage schedules: weight-0 stages, late sources, boundaries anywhere."""

    @st.composite
    def draw_schedule(draw):
        count = draw(st.integers(1, max_sources))
        starts = sorted(set(draw(st.lists(st.integers(1, 400), max_size=4))))
        stages = []
        for start in [0, *starts]:
            weights = draw(st.lists(st.integers(0, 9), min_size=count, max_size=count))
            if not any(weights):
                weights[draw(st.integers(0, count - 1))] = draw(st.integers(1, 9))
            stages.append((start, weights))
        return stages

    return draw_schedule()


# ------------------------------------------------------------------ the schedule


@settings(max_examples=60, deadline=None)
@given(stages=schedules(), first=st.integers(0, 600), step=st.integers(1, 7))
def test_the_staged_schedule_is_the_oracle_across_stage_boundaries(stages, first, step):
    mixture = mix(tagged([50] * len(stages[0][1])), stage_dicts(stages))
    stream = stream_token_source(mixture, 1, 4)
    oracle = StagedSchedule([(start, list(ws)) for start, ws in mixture.integer_stages])
    got = stream._order._kernel.schedule(first, step, 40)
    expected = [oracle.sample(first + step * i) for i in range(40)]
    assert [tuple(row) for row in got.tolist()] == expected


@settings(max_examples=40, deadline=None)
@given(stages=schedules(), world_size=st.integers(1, 4), batch_size=st.integers(1, 9))
def test_every_rank_reads_the_models_windows_in_batches_that_cross_stage_boundaries(
    stages, world_size, batch_size
):
    # Sources of 7, 30 and 11 windows: several epochs of each per mixture epoch, shuffled.
    sizes = [8, 31, 12][: len(stages[0][1])]
    mixture = mix(tagged(sizes), stage_dicts(stages))
    controls = dict(block=1, batch_size=batch_size, epochs=3, seed=5, world_size=world_size)
    stages_model = [(start, list(ws)) for start, ws in mixture.integer_stages]
    c = {"stride": 1, "shuffle": True, "targets": "next", "drop_last": False, "samples": None}
    for rank in range(world_size):
        stream = stream_token_source(mixture, **controls, rank=rank, extras=("source",))
        model = model_mixture_batches(
            list(tagged(sizes).values()),
            stages_model,
            {**c, **controls, "rank": rank, "extras": ("source",)},
        )
        got, want = list(stream), list(model)
        assert len(got) == len(want)
        for batch, expected in zip(got, want, strict=True):
            for key in ("input_ids", "labels", "source"):
                assert batch[key].tolist() == expected[key].tolist()


@pytest.mark.parametrize(
    "stages",
    [
        [(0, [7, 3, 0]), (10_000, [3, 3, 4])],
        [(0, [1, 0, 0]), (777, [0, 5, 1]), (20_001, [1, 1, 1])],
        [(0, [2, 9, 1]), (3, [0, 0, 1]), (50, [1000, 1, 7])],
    ],
)
def test_every_prefix_from_a_stages_start_gives_each_source_its_share_within_2(stages):
    mixture = mix(tagged([5, 5, 5]), stage_dicts(stages))
    kernel = stream_token_source(mixture, 1, 4)._order._kernel
    ends = [start for start, _ in stages[1:]] + [stages[-1][0] + 60_000]
    for (start, weights), end in zip(mixture.integer_stages, ends, strict=True):
        sources = kernel.schedule(start, 1, end - start)[:, 0]
        k = np.arange(1, end - start + 1)
        total = sum(weights)
        for s, w in enumerate(weights):
            counts = np.cumsum(sources == s)
            assert np.abs(counts * total - w * k).max() < 2 * total


def test_a_source_continues_its_epochs_across_stages_and_never_repeats_a_window_within_one():
    # "math" (13 windows) has no samples in stage 0, appears in stage 1 at its epoch 0; every
    # source's windows come as whole permutations, one source-epoch after the other.
    sizes = [20, 9, 14]
    stages = [(0, [7, 3, 0]), (41, [3, 3, 4]), (90, [0, 1, 0]), (131, [1, 1, 1])]
    mixture = mix(tagged(sizes), stage_dicts(stages))
    stream = stream_token_source(mixture, 1, 7, epochs=4, seed=3, extras=("source",))
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for batch in stream:
        for source, window in zip(batch["source"], batch["input_ids"][:, 0], strict=True):
            seen[int(source)].append(int(window) - int(source) * SOURCE_STEP)
    assert seen[2]  # math was seen
    for source, windows in seen.items():
        n = sizes[source] - 1
        epochs = [windows[i : i + n] for i in range(0, len(windows), n)]
        for epoch in epochs[:-1]:
            assert sorted(epoch) == list(range(n)), (source, epoch)
        assert len(set(epochs[-1])) == len(epochs[-1])


def test_the_source_extra_and_a_stage_boundary_inside_a_batch():
    mixture = mix(tagged([100, 100, 100]), [(0, {"web": 1}), (5, {"math": 1})])
    batch = next(stream_token_source(mixture, 2, 8, shuffle=False, extras=("source",)))
    assert batch["source"].tolist() == [0, 0, 0, 0, 0, 2, 2, 2]
    assert batch["input_ids"][:, 0].tolist() == [
        0,
        1,
        2,
        3,
        4,
        2 * SOURCE_STEP,
        2 * SOURCE_STEP + 1,
        2 * SOURCE_STEP + 2,
    ]


# ------------------------------------------------------------------ resume and seek


def staged_stream(stages, **options):
    args = dict(block=2, batch_size=5, epochs=3, seed=7, extras=("source",))
    return stream_token_source(
        mix(tagged([30, 17, 45]), stage_dicts(stages)), **{**args, **options}
    )


STAGES = [(0, [7, 3, 0]), (23, [3, 3, 4]), (61, [0, 0, 1]), (150, [2, 1, 1])]


def as_lists(batches) -> list:
    return [{k: v.tolist() for k, v in batch.items()} for batch in batches]


@pytest.mark.parametrize("world_size", [1, 3])
def test_a_state_taken_after_any_batch_resumes_exactly_across_stage_boundaries(world_size):
    run = [staged_stream(STAGES, world_size=world_size, rank=r) for r in range(world_size)]
    expected = [as_lists(stream) for stream in run]
    for steps in range(len(expected[0]) + 1):
        source = staged_stream(STAGES, world_size=world_size, rank=0)
        for _ in itertools.islice(source, steps):
            pass
        state = json.loads(json.dumps(source.state_dict()))
        for rank in range(world_size):
            resumed = staged_stream(STAGES, world_size=world_size, rank=rank)
            resumed.load_state_dict(state)
            assert as_lists(resumed) == expected[rank][steps:]


def test_seek_lands_on_the_batch_streaming_reaches_in_any_stage():
    expected = as_lists(staged_stream(STAGES))
    stream = staged_stream(STAGES)
    for step in [17, 0, 5, len(expected) - 1, 9, 30]:
        stream.seek(step)
        assert as_lists(itertools.islice(stream, 3)) == expected[step : step + 3]


def test_a_state_loads_into_a_schedule_that_agrees_up_to_its_position():
    source = staged_stream(STAGES)
    for _ in range(10):  # 50 samples: stages 0 and 1 are behind or current
        next(source)
    state = source.state_dict()
    changed_future = [*STAGES[:2], (61, [1, 1, 1]), (300, [0, 1, 0])]
    added = [*STAGES[:2], (55, [0, 1, 0])]
    for stages in (changed_future, added, STAGES[:2]):
        target = staged_stream(stages)
        target.load_state_dict(state)
        assert as_lists(target) == as_lists(_resumed(stages, 10))


def _resumed(stages, steps):
    stream = staged_stream(stages)
    for _ in range(steps):
        next(stream)
    return stream


@pytest.mark.parametrize(
    ("stages", "match"),
    [
        ([(0, [7, 3, 0]), (23, [3, 3, 5])], r"stage 1 \(from sample 23\) has other weights"),
        ([(0, [7, 3, 0]), (24, [3, 3, 4])], "stage 1 starts at sample 23 in the state's .* 24"),
        ([(0, [7, 3, 0])], "stage 1 of the state's schedule .* is not in this mixture's"),
        ([(0, [7, 3, 0]), (20, [1, 1, 1]), (23, [3, 3, 4])], "stage 1 starts at sample 23"),
        ([(0, [7, 3, 1]), (23, [3, 3, 4])], r"mixture_weights=\[7, 3, 0\] \(stage 0\)"),
        ([(0, [7, 3, 0]), (23, [3, 3, 4]), (49, [1, 1, 1])], "stage 2 of this mixture's"),
    ],
)
def test_a_state_is_refused_by_a_schedule_that_differs_before_its_position(stages, match):
    source = staged_stream(STAGES)
    for _ in range(10):  # position 50
        next(source)
    target = staged_stream(stages)
    before = as_lists(itertools.islice(staged_stream(stages), 2))
    with pytest.raises(ValueError, match=match):
        target.load_state_dict(source.state_dict())
    assert as_lists(itertools.islice(target, 2)) == before  # nothing changed


def test_a_one_stage_state_loads_into_a_schedule_that_adds_a_later_stage():
    one = staged_stream([(0, [7, 3, 0])])
    for _ in range(4):
        next(one)
    target = staged_stream([(0, [7, 3, 0]), (1_000, [1, 1, 1])])
    target.load_state_dict(one.state_dict())
    assert as_lists(itertools.islice(target, 3)) == as_lists(itertools.islice(one, 3))


def test_the_state_stays_under_16_kb_with_the_most_stages():
    names = {f"source_with_a_long_name_{i}": np.arange(40) for i in range(8)}
    stages = [
        (1000 * i, {name: 1 + (i + j) % 5 for j, name in enumerate(names)})
        for i in range(MAX_STAGES)
    ]
    stream = stream_token_source(mix(names, stages), 4, 8)
    next(stream)
    assert len(json.dumps(stream.state_dict())) < 16 * 1024


def test_the_schedule_of_the_most_stages_costs_kilobytes_not_megabytes():
    stages = [
        (100_000 * i, {"web": 1 + i % 7, "code": 3, "math": i % 2}) for i in range(MAX_STAGES)
    ]
    mixture = mix(tagged([50, 50, 50]), stages)
    tracemalloc.start()
    stream = stream_token_source(mixture, 4, 8, epochs=10**6)
    stream.seek(10**6)  # sample 8 * 10**6: stage 80
    next(stream)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 * 2**20, peak


# ------------------------------------------------------------------ bad schedules

A = np.arange(20)


@pytest.mark.parametrize(
    ("weights", "error", "match"),
    [
        ([], ValueError, "at least one"),
        ([(1, {"a": 1})], ValueError, r"weights\[0\]\[0\] must be 0"),
        ([(0, {"a": 1}), (0, {"b": 1})], ValueError, r"weights\[1\]\[0\] = 0 must be after"),
        ([(0, {"a": 1}), (9, {"b": 1}), (5, {"a": 1})], ValueError, r"weights\[2\]\[0\] = 5"),
        ([(0, {"a": 1}), (9, {"a": 0, "b": 0})], ValueError, r"weights\[1\] must give some"),
        ([(0, {"a": 1}), (9, {})], ValueError, r"weights\[1\] must give some"),
        ([(0, {"a": 1, "c": 1})], ValueError, r"weights\[0\]\['c'\] names no source"),
        ([(0, {"a": -1, "b": 2})], ValueError, r"weights\[0\]\['a'\] must be at least 0"),
        ([(0, {"a": float("nan")})], ValueError, r"weights\[0\]\['a'\] must be finite"),
        ([(0, {"a": "1"})], TypeError, r"weights\[0\]\['a'\] must be a number"),
        ([(0.0, {"a": 1})], TypeError, r"weights\[0\]\[0\] must be an int"),
        ([(True, {"a": 1})], TypeError, r"weights\[0\]\[0\] must be an int"),
        ([(0, {"a": 1}), (2**63, {"b": 1})], ValueError, r"weights\[1\]\[0\] must be below"),
        ([(0, [1, 2])], TypeError, r"weights\[0\]\[1\] must be a dict"),
        ([(0, {"a": 1}, 5)], TypeError, r"weights\[0\] must be a \(first sample, dict\) pair"),
        ([{"a": 1}], TypeError, r"weights\[0\] must be a \(first sample, dict\) pair"),
        ("ab", TypeError, "weights must be a dict"),
        ([(i, {"a": 1}) for i in range(MAX_STAGES + 1)], ValueError, f"more than {MAX_STAGES}"),
    ],
)
def test_bad_schedules_are_refused_naming_the_stage(weights, error, match):
    with pytest.raises(error, match=match):
        mix({"a": A, "b": A}, weights)
