"""Addressable steps: ``seek(step)`` and the ``"origin"`` extra.

``stream.seek(step)`` makes the next batch the stream's ``step``-th from the run's start, found
without making the batches before it; ``extras=("origin",)`` gives each row's ``(shard, first
token in the shard)``, from which the row can be read back out of ``corpus.shards``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokstream import Corpus, mix, stream_token_source

QUICK = settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))


def same_batches(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        if isinstance(b, dict):
            assert a.keys() == b.keys()
            for key in b:
                np.testing.assert_array_equal(a[key], b[key])
        else:
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y)


def shards_of(lengths: list[int]) -> Corpus:
    """Shards whose tokens say where they are: shard j holds 1000 * j + offset."""
    return Corpus([(1000 * j + np.arange(n)).astype(np.int64) for j, n in enumerate(lengths)])


stream_options = st.fixed_dictionaries(
    {
        "block": st.integers(1, 6),
        "batch_size": st.integers(1, 5),
        "epochs": st.integers(1, 3),
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**32 - 1),
        "permutation": st.sampled_from(["materialized", "implicit"]),
        "drop_last": st.booleans(),
        "stride": st.sampled_from([1, 1, 2]),
        "prefetch": st.sampled_from([0, 0, 2]),
    }
)


@QUICK
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    options=stream_options,
    world=st.integers(1, 3),
    data=st.data(),
)
def test_seek_gives_the_batches_from_that_step_on(lengths, options, world, data):
    corpus = shards_of(lengths)
    rank = data.draw(st.integers(0, world - 1))
    make = lambda: stream_token_source(corpus, rank=rank, world_size=world, **options)  # noqa: E731
    whole = list(make())
    step = data.draw(st.integers(0, len(whole) + 2))
    stream = make()
    stream.seek(step)
    same_batches(list(stream), whole[step:])
    # From the middle of a run, forwards or back, and with the batches of the run alike.
    stream = make()
    consumed = data.draw(st.integers(0, len(whole)))
    for _ in range(consumed):
        next(stream)
    again = data.draw(st.integers(0, len(whole)))
    stream.seek(again)
    assert stream.__length_hint__() == len(whole) - again
    same_batches(list(stream), whole[again:])


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"windows": "within", "eos": 0}, id="within"),
        pytest.param({"windows": "packed", "pad": -1, "extras": ("origin",)}, id="packed"),
        pytest.param({"extras": ("position_ids", "origin"), "eos": 3}, id="extras"),
        pytest.param({"reuse_buffers": 2, "prefetch": 1}, id="ring"),
    ],
)
def test_seek_works_for_every_window_policy(options):
    tokens = np.arange(300) % 17
    corpus = Corpus.from_documents([tokens[i : i + 23] for i in range(0, 300, 23)])
    make = lambda: stream_token_source(corpus, 8, 4, epochs=2, seed=1, **options)  # noqa: E731
    whole = [dict(b) if isinstance(b, dict) else tuple(x.copy() for x in b) for b in make()]
    for step in (0, 1, 7, len(whole) - 1, len(whole), len(whole) + 5):
        stream = make()
        stream.seek(step)
        got = [dict(b) if isinstance(b, dict) else tuple(x.copy() for x in b) for b in stream]
        same_batches(got, whole[step:])


def test_seek_in_a_mixture():
    mixture = mix({"a": np.arange(100), "b": 1000 + np.arange(40)}, {"a": 1, "b": 1})
    make = lambda: stream_token_source(mixture, 4, 5, epochs=2, extras=("source",))  # noqa: E731
    whole = list(make())
    stream = make()
    stream.seek(11)
    same_batches(list(stream), whole[11:])


def test_a_skip_after_a_spike_is_a_seek_past_the_skipped_steps():
    stream = stream_token_source(np.arange(1000), 16, 8, seed=0)
    whole = list(stream_token_source(np.arange(1000), 16, 8, seed=0))
    for step, _ in enumerate(stream):
        if step == 20:  # a loss spike at step 20: skip the 5 batches after it
            stream.seek(step + 1 + 5)
            break
    np.testing.assert_array_equal(next(stream)[0], whole[26][0])


def test_seek_reopens_a_closed_stream_and_its_state_is_the_steps():
    stream = stream_token_source(np.arange(200), 4, 3, epochs=2, seed=2)
    stream.close()
    stream.seek(70)
    state = stream.state_dict()
    assert (state["epoch"], state["position"]) == (1, (70 - len(stream) // 2) * 3)
    fresh = stream_token_source(np.arange(200), 4, 3, epochs=2, seed=2)
    whole = list(fresh)
    same_batches([next(stream)], [whole[70]])


@pytest.mark.parametrize(
    ("step", "error", "match"),
    [
        (-1, ValueError, "step must be nonnegative, got -1"),
        (1.5, ValueError, "step must be an exact integer"),
        ("3", TypeError, "step must be an int"),
        (True, TypeError, "step must be an int"),
        (None, TypeError, "step must be an int"),
    ],
)
def test_a_bad_step_is_refused_naming_it_and_leaves_the_stream_be(step, error, match):
    stream = stream_token_source(np.arange(100), 4, 3, seed=1)
    first = next(stream)
    with pytest.raises(error, match=match):
        stream.seek(step)
    whole = list(stream_token_source(np.arange(100), 4, 3, seed=1))
    same_batches([first, *stream], whole)


# ------------------------------------------------------------------------------- origin


def assert_rows_come_from_their_origin(batch: dict[str, Any], shards, block: int) -> None:
    origin = batch["origin"]
    assert origin.dtype == np.int64 and origin.shape == (batch["input_ids"].shape[0], 2)
    for row, (shard, start) in zip(batch["input_ids"], origin.tolist(), strict=True):
        np.testing.assert_array_equal(row, shards[shard][start : start + block])


@QUICK
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    options=stream_options,
    windows=st.sampled_from(["cross", "within"]),
)
def test_each_row_is_read_back_from_its_origin(lengths, options, windows):
    corpus = shards_of(lengths)
    options = {**options, "extras": ("origin",), "windows": windows}
    if windows == "within":
        options["eos"] = 1005  # token 5 of shard 1 ends a document
    for batch in stream_token_source(corpus, **options):
        assert_rows_come_from_their_origin(batch, corpus.shards, options["block"])


def test_a_mixtures_origin_counts_the_sources_shards_in_order():
    mixture = mix(
        {"a": Corpus([np.arange(30), 100 + np.arange(20)]), "b": 1000 + np.arange(25)},
        {"a": 1, "b": 1},
    )
    shards = mixture.corpus.shards
    for batch in stream_token_source(mixture, 4, 6, extras=("origin", "source")):
        assert_rows_come_from_their_origin(batch, shards, 4)
        assert ((batch["origin"][:, 0] == 2) == (batch["source"] == 1)).all()


def test_a_packed_rows_origin_is_its_first_piece():
    tokens = np.arange(400, dtype=np.int64)
    corpus = Corpus.from_documents([tokens[i : i + 13] for i in range(0, 400, 13)])
    stream = stream_token_source(corpus, 16, 4, windows="packed", pad=-1, extras=("origin",))
    for batch in stream:
        for row, (shard, start) in zip(batch["input_ids"], batch["origin"].tolist(), strict=True):
            assert shard == 0 and row[0] == tokens[start]
