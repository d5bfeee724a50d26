"""A short run of the fuzz harness (``fuzz/fuzz_stream.py``), and the bugs it found, pinned.

The harness checks every generated call against its own model of the spec: the model's batches,
or the TypeError/ValueError it predicts, naming the argument. ``fuzz/fuzz_stream.py --seconds N``
runs the same properties for as long as wanted.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from tokstream import _validate, stream_token_source


def _load_harness():
    path = Path(__file__).resolve().parents[1] / "fuzz" / "fuzz_stream.py"
    spec = importlib.util.spec_from_file_location("fuzz_stream", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


harness = _load_harness()
QUICK = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


@QUICK
@given(tokens=harness.token_inputs(), kwargs=harness.call_kwargs())
def test_any_call_yields_the_models_batches_or_the_predicted_clear_error(tokens, kwargs):
    harness.guarded(harness.check_call, tokens, kwargs)


@QUICK
@given(call=harness.resumable_calls(), edit=harness.state_edits())
def test_a_hand_edited_state_is_refused_cleanly_or_resumes_where_it_claims(call, edit):
    tokens, kwargs, steps = call
    harness.guarded(harness.check_state_edit, tokens, kwargs, steps, edit)


def test_the_model_agrees_with_the_reference_and_the_fast_path_on_a_known_call():
    # The harness' own oracle, checked once against a hand-computed batch.
    shards, controls = harness.model_call(np.arange(10, 16), {"block": 3, "batch_size": 2,
                                                              "shuffle": False})
    windows, next_tokens = next(harness.model_batches(shards, controls))
    assert windows.tolist() == [[10, 11, 12], [11, 12, 13]] and next_tokens.tolist() == [13, 14]


def test_the_implicit_permutation_model_matches_the_kernel_on_every_small_size():
    for n in range(1, 300):
        stream = stream_token_source(np.arange(n + 1), 1, n, shuffle=True, seed=n,
                                     permutation="implicit")
        windows, _ = next(stream)
        order = harness.implicit_order(n, n, 0)
        assert windows[:, 0].tolist() == [order(p) for p in range(n)]


# ---------------------------------------------------------------------------------------------
# Found by the harness


@pytest.mark.parametrize(
    "token_ids",
    [
        pytest.param(np.array([1, 2, 3], dtype="m8[s]"), id="timedelta_array"),
        pytest.param([np.timedelta64(1, "s"), np.timedelta64(2, "s")], id="timedelta_list"),
    ],
)
def test_timedeltas_are_not_token_ids(token_ids):
    # NumPy files timedelta64 under np.integer; a duration is not a token id.
    with pytest.raises(TypeError, match="token_ids"):
        stream_token_source(token_ids, 1, 1)


def test_a_timedelta_is_not_a_block_size():
    with pytest.raises(TypeError, match="block"):
        stream_token_source(np.arange(10), np.timedelta64(2, "s"), 1)


def test_a_list_of_float16_scalars_converts_without_an_overflow_warning():
    # Comparing np.float16(7) with 2.0**63 casts 2**63 to float16 and warned (an error here).
    assert _validate.token_array([np.float16(7.0), np.float16(-3.0)]).tolist() == [7, -3]


def test_a_longdouble_int64_max_in_a_list_is_kept_exact():
    # float(np.longdouble(2**63 - 1)) rounds up to 2**63, which is out of range.
    assert _validate.token_array([np.longdouble(2**63 - 1), 0]).tolist() == [2**63 - 1, 0]


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(" " * 4992, id="all_whitespace"),
        pytest.param("00 1" * 1248, id="whitespace_inside"),
    ],
)
def test_an_rng_key_with_whitespace_is_a_value_error_not_an_index_error(key):
    # bytes.fromhex skips whitespace: 4992 characters decoded to fewer than 624 words.
    stream = stream_token_source(np.arange(100), 4, 8, seed=1)
    state = json.loads(json.dumps(stream.state_dict()))
    state["rng_state"]["key"] = key
    with pytest.raises(ValueError, match=r"state\['rng_state'\]\['key'\]"):
        stream.load_state_dict(state)
    assert next(stream)[0].tolist() == next(stream_token_source(np.arange(100), 4, 8, seed=1))[
        0].tolist()


def test_an_array_in_a_hand_edited_state_is_a_clear_error():
    stream = stream_token_source(np.arange(100), 4, 8, seed=1)
    state = stream.state_dict()
    state["rng_state"]["bit_generator"] = np.array(["MT19937", "MT19937"])
    with pytest.raises(ValueError, match="bit_generator"):
        stream.load_state_dict(state)
