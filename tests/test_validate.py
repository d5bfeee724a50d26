"""The bad-input matrix: every rule of the spec and every hole tokstream fixes.

Each row is raised by both the fast path and the reference path, when the function is called
(before any batch), with the same exception type and a message naming the argument.
"""

from __future__ import annotations

import numpy as np
import pytest

from tokstream import _validate, reference, stream_token_source

GOOD = np.arange(64, dtype=np.int64)
BOTH_PATHS = [
    pytest.param(stream_token_source, id="fast"),
    pytest.param(reference.stream_token_source, id="reference"),
]


def _kwargs(**overrides):
    kwargs = {"token_ids": GOOD, "block": 4, "batch_size": 8}
    kwargs.update(overrides)
    return kwargs


class RaisingArray:
    """An array-like whose conversion fails, as a tensor that requires grad does."""

    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("cannot convert")


# (test id, overrides, exception type, text the message must contain)
TOKEN_ID_CASES = [
    ("2d", {"token_ids": np.zeros((3, 4), np.int64)}, ValueError, "token_ids"),
    ("0d", {"token_ids": np.int64(5)}, ValueError, "token_ids"),
    ("nan", {"token_ids": np.array([1.0, np.nan])}, ValueError, "token_ids"),
    ("inf", {"token_ids": np.array([1.0, -np.inf])}, ValueError, "token_ids"),
    ("fractional", {"token_ids": np.array([1.0, 2.5])}, ValueError, "token_ids"),
    ("subnormal", {"token_ids": np.array([5e-324])}, ValueError, "token_ids"),
    ("float_two_pow_63", {"token_ids": np.array([2.0**63])}, ValueError, "token_ids"),
    ("float32_two_pow_63", {"token_ids": np.array([2.0**63], "f4")}, ValueError, "token_ids"),
    ("float_below_int64", {"token_ids": np.array([-(2.0**63) * (1 + 2**-52)])}, ValueError, "ids"),
    ("float_1e19", {"token_ids": np.array([1e19])}, ValueError, "token_ids"),
    ("uint64_two_pow_63", {"token_ids": np.array([2**63], np.uint64)}, ValueError, "token_ids"),
    ("uint64_max", {"token_ids": np.array([0, 2**64 - 1], np.uint64)}, ValueError, "token_ids"),
    ("bool_array", {"token_ids": np.array([True, False])}, TypeError, "token_ids"),
    ("complex", {"token_ids": np.array([1 + 0j])}, TypeError, "token_ids"),
    ("object_ints", {"token_ids": np.array([1, 2], dtype=object)}, TypeError, "token_ids"),
    ("strings", {"token_ids": np.array(["1", "2"])}, TypeError, "token_ids"),
    ("empty_strings", {"token_ids": np.array([], dtype="U1")}, TypeError, "token_ids"),
    ("empty_object", {"token_ids": np.array([], dtype=object)}, TypeError, "token_ids"),
    ("datetime", {"token_ids": np.array(["2020-01-01"], "datetime64[D]")}, TypeError, "token_ids"),
    ("masked", {"token_ids": np.ma.masked_array([1, 2, 3], [0, 1, 0])}, TypeError, "token_ids"),
    ("list_with_bool", {"token_ids": [1, True, 3]}, TypeError, "token_ids[1]"),
    ("list_of_bools", {"token_ids": [True, False]}, TypeError, "token_ids[0]"),
    ("list_negative_and_two_pow_63", {"token_ids": [-1, 2**63]}, ValueError, "token_ids[1]"),
    ("list_two_pow_64", {"token_ids": [2**64]}, ValueError, "token_ids[0]"),
    ("list_with_none", {"token_ids": [1, None]}, TypeError, "token_ids[1]"),
    ("list_with_string", {"token_ids": [1, "2"]}, TypeError, "token_ids[1]"),
    ("list_nan", {"token_ids": [1, float("nan")]}, ValueError, "token_ids[1]"),
    ("list_fraction", {"token_ids": [1, 0.5]}, ValueError, "token_ids[1]"),
    ("list_float_two_pow_63", {"token_ids": [0.0, 2.0**63]}, ValueError, "token_ids[1]"),
    ("ragged", {"token_ids": [[1, 2], [3]]}, ValueError, "token_ids"),
    ("nested", {"token_ids": [[1, 2], [3, 4]]}, ValueError, "token_ids"),
    ("none", {"token_ids": None}, TypeError, "token_ids"),
    ("generator", {"token_ids": (i for i in range(10))}, TypeError, "list(it)"),
    ("str", {"token_ids": "0123456789"}, TypeError, "got str"),
    ("bytes", {"token_ids": b"0123456789"}, TypeError, "got bytes"),
    ("set", {"token_ids": {1, 2, 3}}, TypeError, "got set"),
    ("array_that_raises", {"token_ids": RaisingArray()}, TypeError, "token_ids (RaisingArray)"),
    ("list_ten_pow_5000", {"token_ids": [1, 10**5000]}, ValueError, "token_ids[1] = an int of"),
    ("list_minus_ten_pow_5000", {"token_ids": [-(10**5000)]}, ValueError, "token_ids[0]"),
]


def _int_control_cases(name: str, zero_ok: bool):
    low = ValueError
    cases = [
        (f"{name}_negative", {name: -1}, low, name),
        (f"{name}_fractional", {name: 3.5}, ValueError, name),
        (f"{name}_nan", {name: float("nan")}, ValueError, name),
        (f"{name}_inf", {name: float("inf")}, ValueError, name),
        (f"{name}_bool", {name: True}, TypeError, name),
        (f"{name}_numpy_bool", {name: np.True_}, TypeError, name),
        (f"{name}_string", {name: "3"}, TypeError, name),
        (f"{name}_none", {name: None}, TypeError, name),
        (f"{name}_complex", {name: 3 + 0j}, TypeError, name),
    ]
    if not zero_ok:
        cases.append((f"{name}_zero", {name: 0}, ValueError, name))
    return cases


CONTROL_CASES = [
    *_int_control_cases("block", zero_ok=False),
    *_int_control_cases("batch_size", zero_ok=False),
    *_int_control_cases("epochs", zero_ok=True),
    *_int_control_cases("seed", zero_ok=True),
    ("seed_two_pow_32", {"seed": 2**32}, ValueError, "seed"),
    ("seed_huge", {"seed": 2**70}, ValueError, "seed"),
    ("seed_ten_pow_5000", {"seed": 10**5000}, ValueError, "seed must be at most"),
    ("block_minus_ten_pow_5000", {"block": -(10**5000)}, ValueError, "block must be positive"),
    ("epochs_minus_ten_pow_5000", {"epochs": -(10**5000)}, ValueError, "epochs must be"),
    ("shuffle_string", {"shuffle": "false"}, TypeError, "shuffle"),
    ("shuffle_int", {"shuffle": 1}, TypeError, "shuffle"),
    ("shuffle_none", {"shuffle": None}, TypeError, "shuffle"),
]

SPEC_CASES = TOKEN_ID_CASES + CONTROL_CASES


@pytest.mark.parametrize("path", BOTH_PATHS)
@pytest.mark.parametrize(
    ("overrides", "error", "named"),
    [pytest.param(o, e, n, id=i) for i, o, e, n in SPEC_CASES],
)
def test_bad_input_raises_at_call_time_naming_the_argument(path, overrides, error, named):
    with pytest.raises(error) as caught:
        path(**_kwargs(**overrides))
    assert named in str(caught.value)


@pytest.mark.parametrize(
    ("overrides", "error", "named"),
    [
        pytest.param({"targets": "both"}, ValueError, "targets", id="targets_unknown"),
        pytest.param({"targets": 1}, TypeError, "targets", id="targets_int"),
        pytest.param({"permutation": "feistel"}, ValueError, "permutation", id="perm_unknown"),
        pytest.param({"permutation": 1}, TypeError, "permutation", id="perm_int"),
        pytest.param({"stride": 0}, ValueError, "stride", id="stride_zero"),
        pytest.param({"stride": 1.5}, ValueError, "stride", id="stride_fraction"),
        pytest.param({"stride": "2"}, TypeError, "stride", id="stride_str"),
        pytest.param({"eos": "50256"}, TypeError, "eos", id="eos_str"),
        pytest.param({"eos": 1.5}, ValueError, "eos", id="eos_fraction"),
        pytest.param(
            {"token_ids": np.arange(20, dtype=np.uint16), "eos": 2**16},
            ValueError,
            "eos",
            id="eos_outside_dtype",
        ),
        pytest.param(
            {"token_ids": np.arange(20, dtype=np.uint16), "eos": -1},
            ValueError,
            "eos",
            id="eos_negative_unsigned",
        ),
        pytest.param(
            {"token_ids": np.arange(20.0), "eos": 2**63},
            ValueError,
            "eos",
            id="eos_outside_int64_of_a_converted_float_corpus",
        ),
        pytest.param(
            # Found by the fuzz harness: past int64 it reached the kernel as an OverflowError.
            {"token_ids": np.arange(20, dtype=np.uint64), "eos": 2**63, "extras": ("loss_mask",)},
            ValueError,
            "([0, 9223372036854775807]), got 9223372036854775808",
            id="eos_of_uint64_past_int64_is_no_token_id",
        ),
        pytest.param(
            {"token_ids": np.arange(20, dtype=np.int8), "eos": 128, "windows": "within"},
            ValueError,
            "eos",
            id="eos_outside_dtype_within",
        ),
        pytest.param({"eos": True}, TypeError, "eos", id="eos_bool"),
        pytest.param({"stride": -3}, ValueError, "stride", id="stride_negative"),
        pytest.param({"extras": ["position_ids", 3]}, TypeError, "extras", id="extras_not_str"),
        pytest.param({"windows": "x"}, ValueError, "windows", id="windows_unknown"),
        pytest.param({"windows": None}, TypeError, "windows", id="windows_none"),
        pytest.param({"extras": ("attention",)}, ValueError, "extras", id="extras_unknown"),
        pytest.param({"extras": "position_ids"}, TypeError, "extras", id="extras_str"),
        pytest.param({"extras": ("loss_mask",) * 2}, ValueError, "extras", id="extras_twice"),
        pytest.param({"extras": ("source",)}, ValueError, "extras", id="extras_not_a_mixture"),
        pytest.param(
            # int32 offsets: a batch of 2**31 positions or more has some it cannot name.
            {"block": 2**16, "batch_size": 2**15, "extras": ("cu_seqlens",)},
            ValueError,
            "extras 'cu_seqlens' are int32 offsets",
            id="cu_seqlens_past_int32",
        ),
        pytest.param({"world_size": 0}, ValueError, "world_size", id="world_zero"),
        pytest.param({"world_size": 2.5}, ValueError, "world_size", id="world_fraction"),
        pytest.param({"rank": -1}, ValueError, "rank", id="rank_negative"),
        pytest.param({"rank": 2, "world_size": 2}, ValueError, "rank", id="rank_too_big"),
        pytest.param({"rank": 10**5000}, ValueError, "rank must be below", id="rank_huge"),
        pytest.param({"rank": True}, TypeError, "rank", id="rank_bool"),
        pytest.param({"drop_last": "yes"}, TypeError, "drop_last", id="drop_last_string"),
    ],
)
def test_bad_tokstream_options_raise_at_call_time(overrides, error, named):
    with pytest.raises(error) as caught:
        stream_token_source(**_kwargs(**overrides))
    assert named in str(caught.value)


@pytest.mark.parametrize("path", BOTH_PATHS)
@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"block": 4.0, "batch_size": np.int32(8)}, id="exact_float_and_numpy_int"),
        pytest.param({"epochs": 0}, id="zero_epochs"),
        pytest.param({"seed": 2**32 - 1}, id="largest_seed"),
        pytest.param({"seed": np.float64(7.0)}, id="float_seed"),
        pytest.param({"shuffle": np.False_}, id="numpy_bool_shuffle"),
        pytest.param({"block": 2**70}, id="block_beyond_int64_yields_nothing"),
    ],
)
def test_valid_edge_controls_are_accepted(path, overrides):
    list(path(**_kwargs(**overrides)))


@pytest.mark.parametrize(
    ("token_ids", "expected"),
    [
        pytest.param([0.0, 2**53 + 1], [0, 2**53 + 1], id="list_big_int_beside_float"),
        pytest.param(np.array([-0.0, 3.0]), [0, 3], id="negative_zero"),
        pytest.param(np.array([-(2.0**63), 2.0**62]), [-(2**63), 2**62], id="float_int64_ends"),
        pytest.param(np.array([2**63 - 1], np.uint64), [2**63 - 1], id="uint64_int64_max"),
        pytest.param([-(2**63), 2**63 - 1], [-(2**63), 2**63 - 1], id="list_int64_ends"),
        pytest.param([np.int16(3), 4], [3, 4], id="list_numpy_scalars"),
        pytest.param((5, 6), [5, 6], id="tuple"),
        pytest.param([], [], id="empty_list"),
    ],
)
def test_token_ids_convert_losslessly(token_ids, expected):
    assert _validate.token_array(token_ids).tolist() == expected


@pytest.mark.parametrize("token_ids", [[np.int8(0)], (np.uint16(3), np.uint16(4)), [1, 2]])
def test_a_sequence_becomes_int64_whatever_numpy_infers(token_ids):
    # Found by the fuzz harness: [np.int8(0)] stayed int8, so eos=255 was refused for it.
    assert _validate.token_array(token_ids).dtype == np.int64
    assert len(stream_token_source(token_ids, 1, 1, eos=255)) == max(len(token_ids) - 1, 0)


def test_spec_order_of_checks_is_kept():
    # token_ids is checked first, then block, batch_size, epochs, shuffle, seed.
    for path in (stream_token_source, reference.stream_token_source):
        with pytest.raises(ValueError, match="token_ids"):
            path(np.zeros((2, 2)), 0, 0, epochs=-1, shuffle="x", seed=-1)
        with pytest.raises(ValueError, match="block"):
            path(GOOD, 0, 0, epochs=-1, shuffle="x", seed=-1)
        with pytest.raises(ValueError, match="batch_size"):
            path(GOOD, 1, 0, epochs=-1, shuffle="x", seed=-1)
        with pytest.raises(ValueError, match="epochs"):
            path(GOOD, 1, 1, epochs=-1, shuffle="x", seed=-1)
        with pytest.raises(TypeError, match="shuffle"):
            path(GOOD, 1, 1, epochs=1, shuffle="x", seed=-1)


def test_float_corpus_is_converted_in_bounded_chunks(monkeypatch):
    monkeypatch.setattr(_validate, "SCAN_CHUNK", 7)
    ids = np.arange(50, dtype=np.float64)
    assert _validate.token_array(ids).tolist() == list(range(50))
    bad = ids.copy()
    bad[45] = 0.5
    with pytest.raises(ValueError, match="fractional"):
        _validate.token_array(bad)
