"""Checks of runs that change: a staged mixture resumed into new shapes and new schedules, seeks,
and splits. Each compares every rank's rows with the model's
(:func:`fuzz.model.model_mixture_batches`; :func:`fuzz.model.model_batches` over the runs of
:func:`fuzz.split_model.model_split`)."""

from __future__ import annotations

import itertools
import json
import random
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from fuzz.checks import (
    MAX_BATCHES,
    assert_batch_equal,
    assert_batches_equal,
    assert_no_prefetch_thread,
)
from fuzz.model import (
    ShardList,
    mixture_epoch,
    model_batches,
    model_call,
    model_mixture,
    model_mixture_batches,
    windows_in,
)
from fuzz.schedule import mixture_stages
from fuzz.split_model import model_split
from tokstream import Corpus, mix, split, stream_token_source


def as_schedule(weights: Any) -> list[tuple[int, dict[str, Any]]]:
    """``mix(weights=...)`` as a list of ``(start, dict)`` stages."""
    return [(0, dict(weights))] if isinstance(weights, Mapping) else list(weights)


def random_stage(names: list[str], chooser: random.Random) -> dict[str, int]:
    stage = {name: chooser.randint(0, 5) for name in names if chooser.random() < 0.8}
    if not any(stage.values()):
        stage[chooser.choice(names)] = chooser.randint(1, 5)
    return stage


def changed_schedule(schedule, sample: int, names: list[str], chooser: random.Random) -> list:
    """``schedule``'s stages that start before global sample ``sample`` (the saved position),
    then zero to three random ones from there on: a schedule a state taken at ``sample`` loads
    into."""
    kept = [(start, weights) for start, weights in schedule if start < sample]
    first = sample if kept else 0
    starts = sorted({first + chooser.randint(0, 100) for _ in range(chooser.randint(0, 3))})
    if not kept:
        starts = sorted({0, *starts})
    return kept + [(start, random_stage(names, chooser)) for start in starts]


def differing_schedule(schedule, sample: int, names, chooser: random.Random) -> list | None:
    """A schedule that differs from ``schedule`` before ``sample``: a stage inserted inside
    ``(0, sample)`` (None when there is no room)."""
    taken = {start for start, _ in schedule}
    room = [start for start in range(1, min(sample, 400)) if start not in taken]
    if not room:
        return None
    inserted = (chooser.choice(room), random_stage(names, chooser))
    return sorted([*schedule, inserted], key=lambda stage: stage[0])


def check_mixture_reshaped_resume(sources, weights, kwargs, shapes, chooser, seek_step) -> str:
    """A mixture run whose ``(world_size, batch_size)`` changes at each resume (``shapes`` as
    for :func:`fuzz.checks.check_reshaped_resume`) and whose schedule changes after the saved
    position each time: every rank of a shape streams its steps, then rank 0's state is loaded
    into every rank of the next shape over the changed schedule (and refused by a schedule that
    differs before the position). The union of the ranks' rows, step by step, is the model's
    global sequence under the last schedule (it agrees with every earlier one where that one was
    streamed). Then every rank of the last shape seeks to ``seek_step`` and streams the model's
    steps from there."""
    kwargs = {**kwargs, "prefetch": 0, "reuse_buffers": 0}  # rows compared one by one
    arrays, _, controls = model_mixture(sources, weights, kwargs)
    counts = [windows_in(len(t), controls["block"], controls["stride"]) for t in arrays]
    samples = mixture_epoch(counts, controls)
    names = list(sources)
    schedule, state, got = as_schedule(weights), None, []
    refusals = 0
    for world, batch_size, steps in shapes:
        if state is not None:
            sample = state["epoch"] * samples + state["position"]
            refusals += _refused(
                sources, differing_schedule(schedule, sample, names, chooser), kwargs, state
            )
            schedule = changed_schedule(schedule, sample, names, chooser)
        streams = _ranks(sources, schedule, kwargs, world, batch_size, state)
        for _ in range(10**9) if steps is None else range(steps):
            step = _global_step(streams)
            if step is None:
                break
            got.append(step)
        state = json.loads(json.dumps(streams[0].state_dict()))
        for stream in streams:
            stream.close()
    stages = mixture_stages(schedule, names)
    expected = list(model_mixture_batches(arrays, stages, controls, shapes=shapes, ranks="all"))
    assert len(got) == len(expected), f"{len(got)} global steps, the model has {len(expected)}"
    for index, (batch, want) in enumerate(zip(got, expected, strict=True)):
        assert_batch_equal(batch, want, f"global step {index} of a reshaped staged mixture")
    _check_seek(sources, schedule, kwargs, shapes[-1][:2], seek_step, arrays, stages, controls)
    assert_no_prefetch_thread()
    return f"staged mixture: reshaped x{len(shapes) - 1}, refused {refusals}, seek"


def _ranks(sources, schedule, kwargs, world, batch_size, state) -> list:
    streams = []
    for rank in range(world):
        call = {**kwargs, "world_size": world, "batch_size": batch_size, "rank": rank}
        stream = stream_token_source(mix(sources, schedule), **call)
        if state is not None:
            stream.load_state_dict(state)
        streams.append(stream)
    lengths = {stream.__length_hint__() for stream in streams}
    assert len(lengths) == 1, f"ranks have different batches left: {lengths}"
    return streams


def _global_step(streams):
    """The ranks' next batches as one, rows in order-position order; None when all ended."""
    batches = [next(stream, None) for stream in streams]
    if batches[0] is None:
        assert all(batch is None for batch in batches), "ranks ended apart"
        return None
    world = len(batches)

    def rows_of(part):
        arrays = [batch[part] for batch in batches]
        assert len({len(a) for a in arrays}) == 1, "ranks' rows differ"
        return np.stack([arrays[r][k] for k in range(len(arrays[0])) for r in range(world)])

    if isinstance(batches[0], dict):
        return {key: rows_of(key) for key in batches[0]}
    return tuple(rows_of(part) for part in (0, 1))


def _refused(sources, schedule, kwargs, state) -> int:
    """A schedule differing before the state's position refuses it, naming a stage."""
    if schedule is None:
        return 0
    stream = stream_token_source(mix(sources, schedule), **kwargs)
    try:
        stream.load_state_dict(state)
    except ValueError as exc:
        assert "stage" in str(exc), f"{exc!r} does not name the stage"
        return 1
    finally:
        stream.close()
    raise AssertionError(f"a schedule differing before the saved position loaded: {schedule}")


def _check_seek(sources, schedule, kwargs, shape, step, arrays, stages, controls) -> None:
    """Every rank of ``shape`` seeks to ``step``: the union of their next steps is the
    model's from the cursor of that step."""
    world, batch_size = shape
    streams = _ranks(sources, schedule, kwargs, world, batch_size, None)
    per_epoch, epochs = streams[0].batches_per_epoch, controls["epochs"]
    epoch, batch = divmod(min(step, epochs * per_epoch), per_epoch) if per_epoch else (0, 0)
    for stream in streams:
        stream.seek(step)
    got = [_global_step(streams) for _ in range(3)]
    got = [step for step in got if step is not None]
    c = {**controls, "world_size": world, "batch_size": batch_size}
    model = model_mixture_batches(
        arrays, stages, c, cursor=(epoch, batch * world * batch_size, None), ranks="all"
    )
    expected = list(itertools.islice(model, 3))
    assert len(got) == len(expected), f"seek({step}): {len(got)} steps, model {len(expected)}"
    for index, (batch_got, want) in enumerate(zip(got, expected, strict=True)):
        assert_batch_equal(batch_got, want, f"step {step} + {index} after seek")
    for stream in streams:
        stream.close()


def check_split(shards, documents, fractions, seed, range_tokens, kwargs, through_source) -> str:
    """``split`` gives each name the model's runs (tokens and documents), and every rank of a
    stream over each split together stream the model's windows of those runs."""
    offsets = [None if d is None else np.array(d, dtype=np.int64) for d in documents]
    corpus = Corpus._from_arrays(shards, [f"s{j}" for j in range(len(shards))], "c", offsets)
    split_module = sys.modules["tokstream.split"]
    listed = split_module.LISTED_RUNS
    split_module.LISTED_RUNS = 0 if through_source else listed
    try:
        parts = split(corpus, fractions, seed=seed, range_tokens=range_tokens)
    finally:
        split_module.LISTED_RUNS = listed
    expected = model_split(shards, documents, fractions, seed, range_tokens)
    assert list(parts) == list(fractions)
    for name, runs in expected.items():
        part = parts[name]
        if not runs:
            assert part.num_tokens == 0, f"split {name!r} should be empty"
            continue
        got = [(shard.tolist(), part.shard_documents(j)) for j, shard in enumerate(part.shards)]
        assert [g[0] for g in got] == [r[0].tolist() for r in runs], f"split {name!r} runs"
        if corpus.has_documents:
            assert [g[1].tolist() for g in got] == [r[1] for r in runs], f"{name!r} documents"
        model_shards, controls = model_call(ShardList([r[0] for r in runs]), kwargs)
        if corpus.has_documents:
            controls["recorded"] = [set(bounds[1:-1]) for _, bounds in runs]
        for rank in range(kwargs["world_size"]):
            stream = stream_token_source(part, **kwargs, rank=rank)
            assert_batches_equal(
                itertools.islice(stream, MAX_BATCHES),
                itertools.islice(
                    model_batches(model_shards, {**controls, "rank": rank}), MAX_BATCHES
                ),
                f"stream over split {name!r}, rank {rank}",
            )
    return "split " + ("through a source" if through_source else "as views")
