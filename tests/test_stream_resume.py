"""The resumable cursor: ``state_dict()``, ``load_state_dict()`` and ``len()``.

The contract: a state is a small JSON-serialisable dict; a fresh stream built with the same
arguments that loads it yields exactly the batches the uninterrupted stream yields after the
point where it was taken. A state from another configuration, or a malformed one, is a
TypeError/ValueError naming what is wrong, and leaves the stream as it was.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import assert_same_batches
from tokstream import Corpus, stream_token_source

STATE_BYTES_LIMIT = 16 * 1024


def build(**overrides: Any):
    """A small shuffled stream; ``overrides`` change any argument of ``stream_token_source``."""
    args: dict[str, Any] = {
        "token_ids": np.arange(103, dtype=np.uint16),
        "block": 3,
        "batch_size": 4,
        "epochs": 3,
        "seed": 7,
    }
    args.update(overrides)
    return stream_token_source(**args)


def take(stream, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [next(stream) for _ in range(steps)]


def through_json(state: dict) -> dict:
    text = json.dumps(state)
    assert len(text) < STATE_BYTES_LIMIT
    return json.loads(text)


# ------------------------------------------------------------------ resuming exactly


stream_configs = st.fixed_dictionaries(
    {
        "token_ids": st.integers(0, 70).map(lambda n: np.arange(n, dtype=np.int32)),
        "block": st.integers(1, 6),
        "batch_size": st.integers(1, 5),
        "epochs": st.integers(0, 3),
        "shuffle": st.booleans(),
        "seed": st.integers(0, 2**32 - 1),
        "targets": st.sampled_from(["next", "shifted"]),
        "world_size": st.integers(1, 4),
        "drop_last": st.booleans(),
        "permutation": st.sampled_from(["materialized", "implicit"]),
    }
)


@settings(max_examples=120, deadline=None)
@given(config=stream_configs, cut=st.floats(0, 1))
def test_every_rank_resumes_exactly_where_the_state_was_taken(config, cut):
    world_size = config["world_size"]
    ranks = [stream_token_source(**config, rank=r) for r in range(world_size)]
    steps = round(cut * len(ranks[0]))
    for stream in ranks:
        take(stream, steps)
    states = [stream.state_dict() for stream in ranks]
    # The cursor is global: every rank holds the same state, apart from naming its rank.
    assert all({**s, "rank": 0} == {**states[0], "rank": 0} for s in states)
    saved = through_json(states[0])
    for rank, stream in enumerate(ranks):
        rest = list(stream)
        resumed = stream_token_source(**config, rank=rank)
        resumed.load_state_dict(saved)
        assert resumed.__length_hint__() == len(rest)
        assert_same_batches(list(resumed), rest)


@pytest.mark.parametrize("permutation", ["materialized", "implicit"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_a_state_taken_after_any_batch_resumes_to_the_next_one(shuffle, permutation):
    # 100 windows in batches of 4 per epoch: states mid-epoch, at both epoch boundaries and
    # after the last batch are all among these.
    stream = build(shuffle=shuffle, permutation=permutation)
    assert len(stream) == 3 * 25
    for step in range(len(stream) + 1):
        saved = through_json(stream.state_dict())
        resumed = build(shuffle=shuffle, permutation=permutation)
        resumed.load_state_dict(saved)
        if step == len(stream):
            assert list(resumed) == [] and list(stream) == []
        else:
            assert_same_batches(take(resumed, 1), take(stream, 1))


def test_a_state_at_an_epoch_boundary_starts_the_next_epoch_with_its_own_order():
    stream = build()
    take(stream, 25)
    saved = stream.state_dict()
    assert (saved["epoch"], saved["position"]) == (1, 0)
    resumed = build()
    resumed.load_state_dict(saved)
    second_epoch = take(resumed, 25)
    assert_same_batches(second_epoch, take(stream, 25))
    first_epoch = take(build(), 25)
    starts = [w[:, 0] for w, _ in second_epoch], [w[:, 0] for w, _ in first_epoch]
    assert not all(np.array_equal(a, b) for a, b in zip(*starts, strict=True))


def test_a_state_after_the_last_batch_resumes_to_an_exhausted_stream():
    stream = build(epochs=2)
    list(stream)
    resumed = build(epochs=2)
    resumed.load_state_dict(through_json(stream.state_dict()))
    assert len(resumed) == 50 and resumed.__length_hint__() == 0
    assert list(resumed) == []


def test_a_finished_run_extends_with_more_epochs_exactly_as_a_longer_run():
    short = build(epochs=2)
    list(short)
    longer = build(epochs=3)
    longer.load_state_dict(through_json(short.state_dict()))
    uninterrupted = build(epochs=3)
    take(uninterrupted, 50)
    assert_same_batches(list(longer), list(uninterrupted))


def test_a_state_taken_before_the_first_batch_is_the_start():
    resumed = build()
    resumed.load_state_dict(through_json(build().state_dict()))
    assert_same_batches(list(resumed), list(build()))


def test_a_closed_stream_reports_the_cursor_where_it_stopped():
    stream = build()
    take(stream, 7)
    twin = build()
    take(twin, 7)
    stream.close()
    assert list(stream) == []
    resumed = build()
    resumed.load_state_dict(through_json(stream.state_dict()))
    assert_same_batches(list(resumed), list(twin))


def test_loading_an_earlier_state_rewinds_a_running_stream():
    stream = build()
    take(stream, 30)
    saved = stream.state_dict()
    after_save = take(stream, 40)
    stream.load_state_dict(saved)
    assert_same_batches(take(stream, 40), after_save)


def test_a_multi_shard_corpus_resumes_exactly():
    corpus = Corpus([np.arange(40), np.arange(100, 107), np.arange(200, 260)])
    stream = build(token_ids=corpus, targets="shifted")
    take(stream, 11)
    resumed = build(token_ids=corpus, targets="shifted")
    resumed.load_state_dict(through_json(stream.state_dict()))
    assert_same_batches(list(resumed), list(stream))


def test_the_state_is_small_and_holds_no_corpus_data():
    big = np.zeros(2_000_000, dtype=np.uint16)
    for permutation in ("materialized", "implicit"):
        stream = build(token_ids=big, block=64, batch_size=32, permutation=permutation)
        next(stream)
        assert len(json.dumps(stream.state_dict())) < STATE_BYTES_LIMIT


# ------------------------------------------------------------------ len()


@settings(max_examples=80, deadline=None)
@given(config=stream_configs)
def test_len_is_the_number_of_batches_every_rank_yields(config):
    for rank in range(config["world_size"]):
        stream = stream_token_source(**config, rank=rank)
        expected = len(stream)
        for done in range(expected + 1):
            assert stream.__length_hint__() == expected - done
            if done < expected:
                next(stream)
        assert list(stream) == []


def test_len_counts_each_epoch_of_the_spec():
    # 103 tokens, block 3: 100 windows; batches of 8: 12 full and one of 4 per epoch.
    assert len(build(batch_size=8)) == 3 * 13
    assert len(build(batch_size=8, drop_last=True)) == 3 * 12
    assert len(build(batch_size=8, epochs=0)) == 0
    assert len(build(token_ids=np.arange(3), batch_size=8)) == 0


# ------------------------------------------------------------------ states that do not fit


def assert_rejected_and_unchanged(stream_args: dict, state: Any, error: type, match: str):
    """Loading ``state`` raises ``error`` and the stream goes on as if it had never seen it."""
    stream, twin = build(**stream_args), build(**stream_args)
    take(stream, 3)
    take(twin, 3)
    with pytest.raises(error, match=match):
        stream.load_state_dict(state)
    assert_same_batches(list(stream), list(twin))


@pytest.mark.parametrize(
    ("other", "match"),
    [
        (
            {"token_ids": np.arange(104, dtype=np.uint16)},
            "num_tokens=103, but this stream has num_tokens=104",
        ),
        (
            {"token_ids": Corpus([np.arange(50), np.arange(53)])},
            "num_shards=1, but this stream has num_shards=2",
        ),
        ({"block": 4}, "block=3, but this stream has block=4"),
        ({"seed": 8}, "seed=7, but this stream has seed=8"),
        ({"shuffle": False}, "shuffle=True, but this stream has shuffle=False"),
        ({"drop_last": True}, "drop_last=False, but this stream has drop_last=True"),
        (
            {"permutation": "implicit"},
            "permutation='materialized', but this stream has permutation='implicit'",
        ),
    ],
)
def test_a_state_from_another_configuration_names_the_mismatch(other, match):
    saved = through_json(build().state_dict())
    stream = build(**other)
    with pytest.raises(ValueError, match=match):
        stream.load_state_dict(saved)


def test_a_state_from_a_corpus_with_other_shard_lengths_is_a_mismatch():
    saved = build(token_ids=Corpus([np.arange(50), np.arange(53)])).state_dict()
    stream = build(token_ids=Corpus([np.arange(53), np.arange(50)]))
    with pytest.raises(ValueError, match="shard_lengths_sha256"):
        stream.load_state_dict(saved)


def test_other_epochs_and_targets_are_not_a_mismatch():
    saved = build(epochs=3, targets="next").state_dict()
    build(epochs=5, targets="shifted").load_state_dict(saved)


def edited(state: dict, path: tuple, value: Any) -> dict:
    """A deep copy of ``state`` with the entry at ``path`` set to ``value`` (or removed)."""
    result = copy.deepcopy(state)
    holder = result
    for key in path[:-1]:
        holder = holder[key]
    if value is REMOVED:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    return result


REMOVED = object()

HAND_EDITS = [
    (("version",), REMOVED, ValueError, r"missing \['version'\]"),
    (("config",), REMOVED, ValueError, r"missing \['config'\]"),
    (("epoch",), REMOVED, ValueError, r"missing \['epoch'\]"),
    (("position",), REMOVED, ValueError, r"missing \['position'\]"),
    (("rng_state",), REMOVED, ValueError, r"missing \['rng_state'\]"),
    (("version",), 2, ValueError, r"state\['version'\] = 2"),
    (("version",), "1", TypeError, r"state\['version'\] must be an int, got '1'"),
    (("version",), True, TypeError, r"state\['version'\] must be an int, got True"),
    (("config",), [], TypeError, r"state\['config'\] must be a dict, got list"),
    (("config", "block"), REMOVED, ValueError, r"state\['config'\] is missing 'block'"),
    (("config", "block"), "3", TypeError, r"state\['config'\]\['block'\] must be an int"),
    (("config", "shuffle"), 1, TypeError, r"state\['config'\]\['shuffle'\] must be a bool"),
    (("epoch",), -1, ValueError, r"state\['epoch'\] must be nonnegative, got -1"),
    (("epoch",), 1.0, TypeError, r"state\['epoch'\] must be an int, got 1.0"),
    (("epoch",), "1", TypeError, r"state\['epoch'\] must be an int, got '1'"),
    (("epoch",), None, TypeError, r"state\['epoch'\] must be an int, got None"),
    (("position",), True, TypeError, r"state\['position'\] must be an int, got True"),
    (("position",), -4, ValueError, r"state\['position'\] must be nonnegative, got -4"),
    (("position",), 104, ValueError, r"state\['position'\] = 104 is past the end of an epoch"),
    (("rng_state",), None, TypeError, r"state\['rng_state'\] must be a dict, got NoneType"),
    (("rng_state", "key"), REMOVED, ValueError, r"state\['rng_state'\] is missing 'key'"),
    (("rng_state", "pos"), REMOVED, ValueError, r"state\['rng_state'\] is missing 'pos'"),
    (("rng_state", "bit_generator"), "PCG64", ValueError, r"must be 'MT19937', got 'PCG64'"),
    (("rng_state", "key"), 5, TypeError, r"state\['rng_state'\]\['key'\] must be a str"),
    (("rng_state", "key"), "ab" * 10, ValueError, r"\['key'\] must be 624 words as 4992 hex"),
    (("rng_state", "key"), "zz" * 2496, ValueError, r"\['key'\] is not a hex string"),
    (("rng_state", "key"), "00" * 2496, ValueError, r"\['key'\] is all zeros"),
    (("rng_state", "pos"), 625, ValueError, r"\['pos'\] must be at most 624, got 625"),
    (("rng_state", "pos"), "3", TypeError, r"state\['rng_state'\]\['pos'\] must be an int"),
    (("rng_state", "has_gauss"), 2, ValueError, r"\['has_gauss'\] must be 0 or 1, got 2"),
    (("rng_state", "cached_gaussian"), "0", TypeError, r"\['cached_gaussian'\] must be a float"),
    # Beyond Python's 4300-digit printing limit: the message names the field all the same.
    (("position",), 10**5000, ValueError, r"state\['position'\] must be at most 2\*\*63 - 1"),
    (("position",), -(10**5000), ValueError, r"state\['position'\] must be nonnegative, got a"),
    (("epoch",), -(10**5000), ValueError, r"state\['epoch'\] must be nonnegative, got a neg"),
    (("config", "num_tokens"), 10**5000, ValueError, r"saved with num_tokens=an int of 16610"),
]


def _edit_id(path, value) -> str:
    huge = isinstance(value, int) and abs(value) > 2**64  # too long to print
    shown = f"{'-' if value < 0 else ''}{abs(value).bit_length()}-bit int" if huge else value
    return f"{'.'.join(path)}={shown!r:.12}"


@pytest.mark.parametrize(
    ("path", "value", "error", "match"),
    HAND_EDITS,
    ids=[_edit_id(path, value) for path, value, _, _ in HAND_EDITS],
)
def test_a_hand_edited_state_is_rejected_and_the_stream_is_unchanged(path, value, error, match):
    saved = through_json(build().state_dict())
    assert_rejected_and_unchanged({}, edited(saved, path, value), error, match)


@pytest.mark.parametrize(
    ("state", "error"),
    [(None, TypeError), ([], TypeError), ("{}", TypeError), ({}, ValueError)],
)
def test_something_that_is_not_a_state_is_rejected(state, error):
    assert_rejected_and_unchanged({}, state, error, "state")


@pytest.mark.parametrize("stream_args", [{"shuffle": False}, {"permutation": "implicit"}])
def test_an_rng_state_for_a_stream_without_a_random_order_is_rejected(stream_args):
    saved = through_json(build(**stream_args).state_dict())
    assert saved["rng_state"] is None
    with_rng = edited(saved, ("rng_state",), build().state_dict()["rng_state"])
    assert_rejected_and_unchanged(stream_args, with_rng, ValueError, r"rng_state.*must be None")
