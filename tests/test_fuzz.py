"""A short run of the fuzz harness (``fuzz/``), and the bugs it found, pinned.

The harness checks every generated call against its own model (``fuzz/model.py``): the model's
batches, or the TypeError/ValueError it predicts, naming the argument. ``python -m fuzz.run
--seconds N`` runs the same properties for as long as wanted.
"""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings

from fuzz import checks, model, packing_runs, runs, strategies
from fuzz.run import guarded
from tokstream import _validate, open_tokens, stream_token_source

QUICK = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


@QUICK
@given(tokens=strategies.token_inputs(), kwargs=strategies.call_kwargs())
def test_any_call_yields_the_models_batches_or_the_predicted_clear_error(tokens, kwargs):
    guarded(checks.check_call, tokens, kwargs)


@QUICK
@given(call=strategies.resumable_calls(documents=True), edit=strategies.state_edits())
def test_a_hand_edited_state_is_refused_cleanly_or_resumes_where_it_claims(call, edit):
    tokens, kwargs, steps = call
    guarded(checks.check_state_edit, tokens, kwargs, steps, edit)


@QUICK
@given(run=strategies.reshaped_runs())
def test_a_run_resumed_into_other_world_and_batch_sizes_streams_the_models_global_sequence(run):
    guarded(checks.check_reshaped_resume, *run)


@QUICK
@given(call=strategies.resumable_calls(), event=strategies.lifecycle_events)
def test_a_stream_rewound_edited_pickled_or_forked_mid_run_keeps_yielding_the_models_batches(
    tmp_path_factory, call, event
):
    tokens, kwargs, steps = call
    guarded(checks.check_lifecycle, tokens, kwargs, steps, event, tmp_path_factory.mktemp("l"))


@QUICK
@given(call=strategies.document_calls())
def test_documents_and_their_extras_are_the_models_for_any_call(call):
    guarded(checks.check_call, *call)


@QUICK
@given(call=strategies.mixture_calls())
def test_any_mixture_yields_the_models_batches_or_the_predicted_clear_error(call):
    guarded(checks.check_mixture, *call)


@QUICK
@given(call=strategies.resumable_mixture_calls(), edit=strategies.state_edits())
def test_a_hand_edited_mixture_state_is_refused_cleanly_or_resumes_where_it_claims(call, edit):
    guarded(checks.check_mixture_state_edit, *call, edit)


@QUICK
@given(run=strategies.reshaped_mixture_runs())
def test_a_staged_mixture_resumed_into_new_shapes_and_schedules_and_seeked_is_the_model(run):
    guarded(runs.check_mixture_reshaped_resume, *run)


@QUICK
@given(run=packing_runs.packed_runs())
# Resumed at position 1 into 3 ranks, the epoch of 15 rows leaves 2 after step 2: the stream's
# state then starts the next epoch (the model once waited for position 15 and called it a bug).
@example(
    run=(
        [[4, 30], [74]],
        (1, 1),
        {"block": 8, "shuffle": False, "seed": 0, "epochs": 1},
        [(1, 1, 1), (3, 2, 2), (1, 1, 0)],
        (1, 1, 0, 0),
    )
)
# Loaded into 3 ranks at position 1 of 3 rows and saved before a step, the state is still
# position 1 (it was once the next epoch's start, and the 1-rank run resumed from it lost rows).
@example(
    run=(
        [[2, 9]],
        (1, 1),
        {"block": 4, "shuffle": False, "seed": 0, "epochs": 2},
        [(1, 1, 1), (3, 1, 0), (1, 1, 0)],
        (1, 1, 0, 0),
    )
)
def test_packed_streams_resumed_into_new_shapes_and_seeked_stream_the_global_rows(run):
    guarded(packing_runs.check_packed_run, *run)


@QUICK
@given(call=strategies.split_calls())
def test_any_split_holds_the_models_runs_and_its_ranks_stream_the_models_windows(call):
    guarded(runs.check_split, *call)


@QUICK
@given(token_file=strategies.token_files())
def test_any_token_file_opens_to_exactly_its_tokens_or_a_clear_error(tmp_path_factory, token_file):
    guarded(checks.check_token_file, tmp_path_factory.mktemp("file"), token_file)


@QUICK
@given(token_file=strategies.token_files())
def test_the_command_line_reads_any_token_file_exactly_or_fails_with_one_clear_line(
    tmp_path_factory, token_file
):
    guarded(checks.check_cli_file, tmp_path_factory.mktemp("cli"), token_file)


def test_the_model_agrees_with_the_reference_and_the_fast_path_on_a_known_call():
    # The harness' own oracle, checked once against a hand-computed batch.
    shards, controls = model.model_call(
        np.arange(10, 16), {"block": 3, "batch_size": 2, "shuffle": False}
    )
    windows, next_tokens = next(model.model_batches(shards, controls))
    assert windows.tolist() == [[10, 11, 12], [11, 12, 13]] and next_tokens.tolist() == [13, 14]


def test_the_implicit_permutation_model_matches_the_kernel_on_every_small_size():
    for n in range(1, 300):
        stream = stream_token_source(
            np.arange(n + 1), 1, n, shuffle=True, seed=n, permutation="implicit"
        )
        windows, _ = next(stream)
        order = model.implicit_order(n, n, 0)
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


def test_the_model_calls_a_cu_seqlens_batch_past_int32_an_extras_error_the_reference_lacks():
    # Found by the fuzz harness: named "cu_seqlens", the model's verdict was not recognised as
    # one about a tokstream option, so the reference (which has no extras) was expected to fail.
    kwargs = {"block": 1, "batch_size": 2**62, "extras": ("cu_seqlens",)}
    assert checks.check_call(np.array([], dtype=np.int8), kwargs) == "ValueError:extras"


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
    assert (
        next(stream)[0].tolist()
        == next(stream_token_source(np.arange(100), 4, 8, seed=1))[0].tolist()
    )


def test_an_array_in_a_hand_edited_state_is_a_clear_error():
    stream = stream_token_source(np.arange(100), 4, 8, seed=1)
    state = stream.state_dict()
    state["rng_state"]["bit_generator"] = np.array(["MT19937", "MT19937"])
    with pytest.raises(ValueError, match="bit_generator"):
        stream.load_state_dict(state)


def _npy_with_header(text: str, payload: bytes = b"") -> bytes:
    text = text + " " * (63 - (len(text) + 10) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode() + payload


def test_a_timedelta_npy_file_is_a_value_error_naming_the_file(tmp_path):
    path = tmp_path / "durations.npy"
    np.save(path, np.arange(10, dtype="m8[s]"))
    with pytest.raises(ValueError, match="must hold integers") as raised:
        open_tokens(path)
    assert str(path) in str(raised.value)


@pytest.mark.parametrize(
    ("name", "content", "kwargs"),
    [
        pytest.param(
            "big.npy",
            lambda: _npy_with_header(
                "{'descr': '>u2', 'fortran_order': False, 'shape': (4,), }",
                np.arange(4, dtype=">u2").tobytes(),
            ),
            {},
            id="byteswapped_npy",
        ),
        pytest.param("empty.bin", lambda: b"", {"dtype": ">u2"}, id="empty_byteswapped_raw"),
    ],
)
def test_a_file_copied_into_memory_is_read_only_like_a_mapped_one(tmp_path, name, content, kwargs):
    path = tmp_path / name
    path.write_bytes(content())
    shard = open_tokens(path, **kwargs).shards[0]
    assert not shard.flags.writeable


@pytest.mark.parametrize("shape", ["(4611686018427387904,)", "(2**62,)", "(-1,)", "(5,)", "(3,)"])
def test_an_npy_header_lying_about_its_length_is_refused_before_mapping(tmp_path, shape):
    path = tmp_path / "lying.npy"
    path.write_bytes(
        _npy_with_header(
            f"{{'descr': '<u2', 'fortran_order': False, 'shape': {shape}, }}",
            np.arange(4, dtype="<u2").tobytes(),
        )
    )
    with pytest.raises(ValueError) as raised:
        open_tokens(path)
    assert str(path) in str(raised.value)


@pytest.mark.parametrize("count", [2**31 - 1, 11, -1, -(2**31)])
def test_an_llmc_header_lying_about_its_token_count_is_refused(tmp_path, count):
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240520, 1, count)
    path = tmp_path / "lying.bin"
    path.write_bytes(header.tobytes() + np.arange(10, dtype="<u2").tobytes())
    with pytest.raises(ValueError, match="lying.bin"):
        open_tokens(path)


def test_a_huge_reuse_buffers_ring_is_not_allocated_up_front():
    # The ring was allocated whole when the stream was made: reuse_buffers=2**40 never finished
    # (the harness' watchdog caught it after the machine ran out of memory).
    ids = np.arange(40)
    stream = stream_token_source(ids, 4, 8, shuffle=False, reuse_buffers=2**40)
    assert [w.tolist() for w, _ in stream] == [
        w.tolist() for w, _ in stream_token_source(ids, 4, 8, shuffle=False)
    ]


def test_a_stream_without_windows_allocates_no_ring_buffer():
    # A block longer than the corpus leaves no batch; the ring still held one (1, block) row.
    tracemalloc.start()
    try:
        stream = stream_token_source(np.arange(5), 2**24, 1, reuse_buffers=4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert list(stream) == [] and peak < 2**20


def test_the_command_line_keeps_an_explicit_byte_order(tmp_path):
    # --dtype '>u2' came back from argparse as the name "uint16": a big-endian raw file was
    # read as little-endian, every token silently byte-swapped.
    path = tmp_path / "big.bin"
    path.write_bytes(np.array([1, 2, 300], dtype=">u2").tobytes())
    code, out, err = checks.run_cli(["inspect", "--json", "--quiet", str(path), "--dtype", ">u2"])
    assert code == 0, err
    (summary,) = json.loads(out)
    assert (summary["min_id"], summary["max_id"]) == (1, 300)
    converted = tmp_path / "out.npy"
    code, _, err = checks.run_cli(
        ["convert", "--quiet", str(path), str(converted), "--in-dtype", ">u2"]
    )
    assert code == 0, err
    assert open_tokens(converted).shards[0].tolist() == [1, 2, 300]
