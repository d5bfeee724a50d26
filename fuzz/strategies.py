"""The fuzz harness' strategies: token inputs, call arguments, state edits and token files.

Most of what they draw is valid, so that most calls get as far as streaming; the rest is every
kind of wrong value, type, dtype, layout and file damage.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fuzz.model import (
    DOCUMENT_EXTRAS,
    INT64_MIN,
    LLMC_MAGIC,
    MEGATRON_DTYPES,
    MEGATRON_MAGIC,
    NPY_MAGIC,
    DocumentList,
    Rejected,
    ShardList,
    TokenFile,
    model_int,
    model_mixture,
)

INT_DTYPES = [f"{o}{k}{s}" for o in "<>" for k in "iu" for s in (1, 2, 4, 8)]
FLOAT_DTYPES = [f"{o}f{s}" for o in "<>" for s in (2, 4, 8)] + [np.longdouble]
OTHER_DTYPES = ["?", "c8", "c16", "O", "U3", "S3", "M8[D]", "m8[s]", "V4", [("a", "<i4")]]
SPECIAL_FLOATS = [
    0.0,
    -0.0,
    0.5,
    -1.5,
    1.0,
    2.0**24 + 1,
    2.0**53,
    2.0**53 + 2,
    2.0**62,
    2.0**63,
    -(2.0**63),
    2.0**64,
    1e19,
    1e300,
    5e-324,
    math.nan,
    math.inf,
    -math.inf,
    65504.0,
]


@st.composite
def float_arrays(draw, length: int) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    exact = st.integers(-(2**11), 2**11).map(float)  # exact in every float dtype
    # Half the arrays are valid (exact small integers); one bad element spoils the rest.
    elements = (
        exact
        if draw(st.booleans())
        else st.one_of(
            exact,
            st.integers(INT64_MIN, 2**64).map(float),
            st.sampled_from(SPECIAL_FLOATS),
            st.floats(allow_nan=True, allow_infinity=True),
        )
    )
    values = draw(st.lists(elements, min_size=length, max_size=length))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        array = np.array(values, dtype=dtype)
    if dtype == np.longdouble and draw(st.booleans()):
        # Odd integers above 2**53 are exact in longdouble, not in float64.
        array[: length // 2] += np.longdouble(1)
    return array


@st.composite
def arrays_1d(draw, max_length: int = 300) -> np.ndarray:
    length = draw(st.integers(0, max_length))
    kind = draw(st.sampled_from(["int", "int", "int", "float", "float", "other"]))
    if kind == "int":
        dtype = np.dtype(draw(st.sampled_from(INT_DTYPES)))
        if draw(st.integers(0, 2)):
            # Small values keep windows distinct enough for a wrong window to show.
            info = np.iinfo(dtype)
            low = max(int(info.min), -1000)
            elements = st.integers(low, min(int(info.max), low + 3000))
        else:
            elements = hnp.from_dtype(dtype)
        return draw(hnp.arrays(dtype, length, elements=elements))
    if kind == "float":
        return draw(float_arrays(length))
    dtype = draw(st.sampled_from(OTHER_DTYPES))
    return np.zeros(length, dtype=dtype)


@st.composite
def token_inputs(draw):
    """Arrays of every dtype and layout, Python sequences, odd shapes and multi-shard corpora."""
    shape = draw(st.sampled_from(["1d"] * 8 + ["0d", "2d", "empty2d", "sequence", "shards"]))
    if shape == "0d":
        return np.array(draw(st.integers(0, 5)), dtype=draw(st.sampled_from(INT_DTYPES + ["f8"])))
    if shape == "2d":
        array = draw(arrays_1d(60))
        return array[: len(array) // 2 * 2].reshape(-1, 2)
    if shape == "empty2d":
        return np.zeros((0, draw(st.integers(0, 3))), dtype=draw(st.sampled_from(INT_DTYPES)))
    if shape == "sequence":
        values = st.one_of(
            st.integers(-1000, 1000),
            st.integers(INT64_MIN - 10, 2**64 + 10),
            st.sampled_from(SPECIAL_FLOATS),
            st.booleans(),
            st.none(),
            st.text(max_size=2),
            st.sampled_from(
                [
                    np.int8(3),
                    np.uint64(2**64 - 1),
                    np.float16(7),
                    np.float32(0.5),
                    np.longdouble(3),
                    np.timedelta64(2, "s"),
                    np.True_,
                    1j,
                ]
            ),
        )
        # Mostly clean sequences, so that valid ones get streamed too.
        clean = st.lists(st.integers(-1000, 1000), max_size=200)
        items = draw(st.one_of(clean, clean, st.lists(values, max_size=40)))
        return tuple(items) if draw(st.booleans()) else items
    if shape == "shards":
        dtype = np.dtype(draw(st.sampled_from(INT_DTYPES)))
        count = draw(st.integers(0, 4))
        shards = [
            np.arange(draw(st.integers(0, 80)), dtype=np.int64).astype(dtype) * 3 + i
            for i in range(count)
        ]
        if count and draw(st.integers(0, 5)) == 0:
            shards[-1] = shards[-1].astype(draw(st.sampled_from(INT_DTYPES + ["f8"])))
        return ShardList(shards)
    array = draw(arrays_1d())
    layout = draw(
        st.sampled_from(
            ["contiguous"] * 4 + ["strided", "reversed", "readonly", "byteswapped", "list"]
        )
    )
    if layout == "strided":
        doubled = np.empty(2 * len(array), dtype=array.dtype)
        doubled[::2] = array
        return doubled[::2]
    if layout == "reversed":
        return array[::-1]
    if layout == "readonly":
        array.flags.writeable = False
    elif layout == "byteswapped" and array.dtype.kind in "iuf":
        return array.astype(array.dtype.newbyteorder("S"))
    elif layout == "list" and array.dtype.kind in "iuf":
        return list(array)
    return array


GARBAGE = st.one_of(
    st.integers(-3, 0),
    st.integers(2**62, 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.sampled_from(
        [
            np.int32(3),
            np.uint8(2),
            np.float32(2.0),
            np.float64(2.5),
            np.longdouble(3),
            np.timedelta64(2, "s"),
            np.True_,
            3 + 0j,
            "4",
            b"4",
            [4],
            np.array(4),
            np.array([4]),
            2**32,
            -(2**63),
        ]
    ),
)


def control(valid):
    """Mostly valid, so that most calls get as far as streaming."""
    return st.sampled_from([True] * 7 + [False]).flatmap(lambda ok: valid if ok else GARBAGE)


@st.composite
def call_kwargs(draw) -> dict[str, Any]:
    kwargs = {
        "block": draw(control(st.integers(1, 40))),
        "batch_size": draw(control(st.integers(1, 50))),
    }
    optional = {
        "epochs": control(st.integers(0, 3)),
        "shuffle": control(st.booleans()),
        "seed": control(st.integers(0, 2**32 - 1)),
        "targets": control(st.sampled_from(["next", "shifted"])),
        "world_size": control(st.integers(1, 4)),
        "rank": control(st.integers(0, 3)),
        "drop_last": control(st.booleans()),
        "permutation": control(st.sampled_from(["materialized", "implicit"])),
        "prefetch": control(st.integers(0, 3)),
        "reuse_buffers": control(st.integers(0, 6)),
        "stride": control(st.sampled_from([1, 2, 3, 7, 40])),
        "eos": control(st.sampled_from([0, 1, 3, 7, 255, 256, 2**15, -1, 2**63])),
        "windows": control(st.sampled_from(["cross", "within"])),
        "extras": control(
            st.sampled_from(
                [
                    (),
                    ("position_ids",),
                    ("loss_mask",),
                    ("cu_seqlens",),
                    ("position_ids", "loss_mask", "cu_seqlens"),
                    ["cu_seqlens", "loss_mask"],
                    ("loss_mask", "loss_mask"),
                    ("source",),
                    ("positions",),
                    (3,),
                ]
            )
        ),
        "out_dtype": control(
            st.sampled_from(
                ["int32", "int32", "int64", np.dtype("int32"), np.dtype(">i4"), "float32", "i2"]
                + [np.int32, "int33"]
            )
        ),
        "instance_filter": control(
            st.sampled_from(
                [True, False, None, {"max_count": 3}, {"max_period": 2, "max_count": 4}]
                + [{"min_period": 2, "max_period": 3, "max_count": 5}, {"max_period": 0}]
                + [{"min_period": 4, "max_period": 3}, {"periods": 2}, [1, 13, 32]]
            )
        ),
    }
    for name, strategy in optional.items():
        if draw(st.booleans()):
            kwargs[name] = draw(strategy)
    if "world_size" in kwargs and "rank" in kwargs and draw(st.booleans()):
        # Keep most multi-rank calls valid.
        try:
            kwargs["rank"] = model_int(kwargs["rank"], "rank") % max(
                model_int(kwargs["world_size"], "world_size"), 1
            )
        except Rejected:
            pass
    return kwargs


# ---------------------------------------------------------------------------------------------
# Resumable state, edited by hand

STATE_GARBAGE = st.one_of(
    GARBAGE,
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def leaf_paths(state: dict[str, Any]) -> list[tuple[str, ...]]:
    paths = []
    for key, value in state.items():
        if isinstance(value, dict):
            paths.extend((key, *sub) for sub in leaf_paths(value))
        paths.append((key,))
    return paths


@st.composite
def state_edits(draw):
    """A function editing a state dict, returning it and whether it must be refused."""
    action = draw(
        st.sampled_from(["nothing", "replace", "replace", "delete", "nudge", "key", "whole"])
    )
    choose = draw(st.randoms(use_true_random=False))
    garbage = draw(STATE_GARBAGE)
    nudge = draw(st.sampled_from([1, -1, 2, 7, 2**31, 2**32, 2**63, -(2**63)]))
    key_edit = draw(st.sampled_from(["flip", "truncate", "space", "nonhex", "zeros", "upper"]))

    def edit(state):
        if action == "nothing":
            return state, False
        if action == "whole":
            return garbage, True
        path = choose.choice(leaf_paths(state))
        parent = state
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        before = parent[last]
        if action == "key" and state.get("rng_state"):
            path, parent, last = ("rng_state", "key"), state["rng_state"], "key"
            before, text = parent[last], parent[last]
            position = choose.randrange(len(text))
            parent[last] = {
                "flip": text[:position]
                + ("0" if text[position] != "0" else "1")
                + text[position + 1 :],
                "truncate": text[:position],
                "space": text[:position] + " " + text[position + 1 :],
                "nonhex": text[:position] + "g" + text[position + 1 :],
                "zeros": "0" * len(text),
                "upper": text.upper(),
            }[key_edit]
        elif action == "delete":
            del parent[last]
            return state, path[0] in ("version", "config", "epoch", "position", "rng_state")
        elif action == "nudge" and isinstance(before, int) and not isinstance(before, bool):
            parent[last] = before + nudge
        else:
            parent[last] = garbage
        changed = type(parent[last]) is not type(before) or parent[last] != before
        return state, changed and path[0] in ("version", "config")

    return edit


@st.composite
def resumable_calls(draw, documents: bool = False):
    """Valid calls on a small corpus, for the state edits; with ``documents``, half of them
    over the tokens cut into recorded documents (``Corpus.from_documents``, empty ones too)."""
    length = draw(st.integers(1, 200))
    tokens = np.arange(length, dtype=draw(st.sampled_from(["u2", "i4", "i8"]))) * 7 % 1009
    if documents and draw(st.booleans()):
        cuts = sorted(draw(st.lists(st.integers(0, length), max_size=8)))
        tokens = DocumentList(np.split(tokens, cuts))
    world_size = draw(st.integers(1, 3))
    kwargs = {
        "block": draw(st.integers(1, 12)),
        "batch_size": draw(st.integers(1, 20)),
        "epochs": draw(st.integers(1, 3)),
        "shuffle": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "world_size": world_size,
        "rank": draw(st.integers(0, world_size - 1)),
        "drop_last": draw(st.booleans()),
        "permutation": draw(st.sampled_from(["materialized", "implicit"])),
        "prefetch": draw(st.sampled_from([0, 0, 1, 3])),
        "reuse_buffers": draw(st.sampled_from([0, 0, 5])),
        "stride": draw(st.sampled_from([1, 1, 2, 5])),
        "eos": draw(st.sampled_from([None, None, 0, 7, 14])),
        "windows": draw(st.sampled_from(["cross", "cross", "within"])),
        "extras": tuple(draw(st.lists(st.sampled_from(DOCUMENT_EXTRAS), unique=True, max_size=3))),
    }
    return tokens, kwargs, draw(st.integers(0, 25))


@st.composite
def reshaped_runs(draw):
    """A valid call (:func:`resumable_calls`) and the shapes of a run that changes its
    ``(world_size, batch_size)`` at each of one to three resumes: ``[(world_size, batch_size,
    global steps), ...]``, the last one streaming to the end."""
    tokens, kwargs, _ = draw(resumable_calls(documents=True))
    shapes = [
        (draw(st.integers(1, 4)), draw(st.integers(1, 12)), draw(st.integers(0, 6)))
        for _ in range(draw(st.integers(2, 4)))
    ]
    shapes[-1] = (*shapes[-1][:2], None)
    return tokens, kwargs, shapes


@st.composite
def document_calls(draw):
    """Valid calls over tokens of a few values, one of them the eos, so that documents start
    inside most windows (by the eos rule or recorded, ``Corpus.from_documents``, empty ones
    included): every window policy, stride, target and extra; int64 or int32 batches, with
    now and then a token at or beyond an end of int32 (in the dtypes that hold one)."""
    dtype = draw(st.sampled_from(["u1", "u2", "i2", "i8", "u4", "u8"]))
    edges = {
        "i8": [2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**40],
        "u4": [2**31 - 1, 2**31, 2**32 - 1],
        "u8": [2**31 - 1, 2**31, 2**63 - 1],
    }.get(dtype, [])
    ids = st.integers(0, 4)
    if edges and draw(st.booleans()):
        ids = st.one_of(*[ids] * 30, st.sampled_from(edges))
    if draw(st.booleans()):
        documents = draw(st.lists(st.lists(ids, max_size=40), min_size=1, max_size=8))
        corpus = DocumentList([np.array(d, dtype=dtype) for d in documents])
    else:
        shards = [np.array(draw(st.lists(ids, max_size=160)), dtype=dtype)]
        if draw(st.booleans()):
            shards.append(np.array(draw(st.lists(ids, max_size=60)), dtype))
        corpus = ShardList(shards)
    world_size = draw(st.integers(1, 3))
    kwargs = {
        # Blocks past 16 reach the kernel's vectorised eos searches (sixteen tokens a step).
        "block": draw(st.one_of(st.integers(1, 8), st.integers(15, 40))),
        "batch_size": draw(st.integers(1, 9)),
        "epochs": draw(st.integers(1, 2)),
        "shuffle": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "targets": draw(st.sampled_from(["next", "shifted"])),
        "world_size": world_size,
        "rank": draw(st.integers(0, world_size - 1)),
        "stride": draw(st.sampled_from([1, 1, 2, 3])),
        "eos": draw(st.sampled_from([None, 0, 0, 3])),
        "windows": draw(st.sampled_from(["cross", "within"])),
        "extras": tuple(draw(st.lists(st.sampled_from(DOCUMENT_EXTRAS), unique=True, min_size=1))),
        "prefetch": draw(st.sampled_from([0, 0, 1])),
        "reuse_buffers": draw(st.sampled_from([0, 0, 2])),
        "out_dtype": draw(st.sampled_from(["int64", "int32"])),
    }
    return corpus, kwargs


@st.composite
def mixture_calls(draw):
    """A mixture of one to three small sources (tokens ``1000 s + i``: a window names its
    source) with valid weights, and valid stream options, some of which it cannot take."""
    dtype = draw(st.sampled_from(["u2", "i4", "i8"]))
    sources = {
        f"s{s}": (1000 * s + np.arange(draw(st.integers(0, 60)))).astype(dtype)
        for s in range(draw(st.integers(1, 3)))
    }
    weights = draw(mixture_weights(list(sources)))
    world_size = draw(st.integers(1, 3))
    kwargs = {
        "block": draw(st.integers(1, 10)),
        "batch_size": draw(st.integers(1, 12)),
        "epochs": draw(st.integers(0, 3)),
        "shuffle": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "targets": draw(st.sampled_from(["next", "shifted"])),
        "world_size": world_size,
        "rank": draw(st.integers(0, world_size - 1)),
        "drop_last": draw(st.booleans()),
        "stride": draw(st.sampled_from([1, 1, 2, 3])),
        "prefetch": draw(st.sampled_from([0, 0, 2])),
        "reuse_buffers": draw(st.sampled_from([0, 0, 3])),
    }
    permutation = draw(st.sampled_from([None, None, "implicit", "materialized"]))
    if permutation is not None:
        kwargs["permutation"] = permutation
    samples = draw(st.sampled_from([None, None, 1, 7, 40]))
    if samples is not None:
        kwargs["samples"] = samples
    if draw(st.booleans()):
        kwargs["extras"] = ("source",)
    return sources, weights, kwargs


def stage_weights(names: list[str]):
    """One stage's weights: a number ``>= 0`` per name (some left out: weight 0), some
    positive."""

    @st.composite
    def draw_stage(draw):
        weight = st.one_of(st.integers(0, 6), st.sampled_from([0.5, 0.3, 1.25, 2.0, 0]))
        stage = {name: draw(weight) for name in names if draw(st.integers(0, 3))}
        if not any(stage.values()):
            stage[draw(st.sampled_from(names))] = draw(st.integers(1, 6))
        return stage

    return draw_stage()


@st.composite
def mixture_weights(draw, names: list[str]):
    """``mix(weights=...)``: a dict with a weight for every name (as before stages), or a
    schedule of one to four stages starting at 0 with boundaries up to sample 150, where a
    source may have weight 0 in a stage or first appear in a later one."""
    if draw(st.booleans()):
        stage = draw(stage_weights(names))
        return {name: stage.get(name, 0) for name in names}
    starts = sorted(set(draw(st.lists(st.integers(1, 150), max_size=3))))
    return [(start, draw(stage_weights(names))) for start in [0, *starts]]


@st.composite
def reshaped_mixture_runs(draw):
    """A valid mixture call, the shapes of a run resumed into a new ``(world_size,
    batch_size)`` one to three times (as :func:`reshaped_runs`), a random generator choosing
    the schedule each resume loads into (:func:`fuzz.runs.changed_schedule`), and a step to
    seek to."""
    sources, weights, kwargs = draw(mixture_calls().filter(_valid_mixture))
    shapes = [
        (draw(st.integers(1, 4)), draw(st.integers(1, 12)), draw(st.integers(0, 6)))
        for _ in range(draw(st.integers(2, 4)))
    ]
    shapes[-1] = (*shapes[-1][:2], None)
    chooser = draw(st.randoms(use_true_random=False))
    return sources, weights, kwargs, shapes, chooser, draw(st.integers(0, 40))


def _valid_mixture(call) -> bool:
    try:
        model_mixture(*call)
    except Rejected:
        return False
    return True


@st.composite
def resumable_mixture_calls(draw):
    """Valid mixture calls with the number of batches to take before a state is saved."""
    return (*draw(mixture_calls().filter(_valid_mixture)), draw(st.integers(0, 25)))


#: What happens to a stream in the middle (see ``fuzz.checks.check_lifecycle``).
lifecycle_events = st.sampled_from(["rewind", "edit", "pickle", "fork", "seek"])


# ---------------------------------------------------------------------------------------------
# Token files: corrupt, truncated and lying

NPY_DESCRS = [
    "'<u2'",
    "'>u2'",
    "'|u1'",
    "'<i8'",
    "'>i4'",
    "'<u8'",
    "'<f8'",
    "'|b1'",
    "'<m8[s]'",
    "'O'",
    "'<U2'",
    "[('a', '<i4')]",
    "'<u9'",
    "'garbage'",
    "5",
    "None",
]


@st.composite
def token_files(draw) -> TokenFile:
    kind = draw(st.sampled_from(["npy", "llmc", "bin", "llmc7", "megatron", "arrow", "other"]))
    if kind == "arrow" and not _has_pyarrow():
        kind = "bin"
    count = draw(st.integers(0, 300))
    kwargs: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:
        kwargs["format"] = draw(
            st.sampled_from(["npy", "llmc", "bin", "megatron", "arrow", "zip", None, 3])
        )
    if draw(st.integers(0, 2)) == 0:
        kwargs["dtype"] = draw(
            st.sampled_from(
                ["u1", "u2", "<u2", ">u2", "i4", "u8", "f8", "?", "garbage", None, 7, np.int64]
            )
        )
    pristine = draw(st.integers(0, 2)) == 0  # a well-formed file, else a damaged one
    if kind == "npy":
        dtype = np.dtype(draw(st.sampled_from(["<u2", ">u2", "|u1", "<i4", ">i8", "<u8"])))
        values = draw(hnp.arrays(dtype, count))
        descr, shape = repr(dtype.str), f"({count},)"
        payload = values.tobytes()
        if not pristine:
            descr = draw(st.sampled_from([descr] * 3 + NPY_DESCRS))
            shape = draw(
                st.sampled_from(
                    [
                        shape,
                        shape,
                        f"({count + 1},)",
                        f"({count - 1},)",
                        f"({-count - 1},)",
                        "(2**62,)",
                        f"({2**62},)",
                        f"({count}, 1)",
                        "()",
                        "(1, 2, 3)",
                        "[3]",
                        "'x'",
                        f"({count}.0,)",
                        "((((((((",
                        "{}",
                    ]
                )
            )
        text = f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}"
        text = text + " " * (63 - (len(text) + 10) % 64) + "\n"
        header = NPY_MAGIC + bytes([1, 0]) + len(text).to_bytes(2, "little") + text.encode()
        data, name = header + payload, "tokens.npy"
    elif kind == "llmc":
        values = draw(hnp.arrays(np.dtype("<u2"), count))
        header = np.zeros(256, dtype="<i4")
        header[:3] = (LLMC_MAGIC, 1, count)
        if not pristine:
            header[0] = draw(st.sampled_from([LLMC_MAGIC] * 4 + [20240801, 20240522, 0, -1]))
            header[1] = draw(st.sampled_from([1, 1, 1, 0, 2, -1]))
            header[2] = draw(
                st.sampled_from(
                    [
                        count,
                        count,
                        count + 1,
                        count - 1,
                        -1,
                        -(2**31),
                        2**31 - 1,
                        2**30,
                    ]
                )
            )
        data, name = header.tobytes() + values.tobytes(), "shard.bin"
    elif kind == "llmc7":
        values = draw(hnp.arrays(np.dtype("<u4"), count))
        header = np.zeros(256, dtype="<i4")
        header[:3] = (20240801, draw(st.sampled_from([7, 7, 7, 1])), count)
        data, name = header.tobytes() + values.tobytes(), "llama3_shard.bin"
    elif kind == "megatron":
        data, name, beside = draw(megatron_files(pristine))
    elif kind == "arrow":
        data, name = draw(arrow_files(pristine)), "data-00000-of-00001.arrow"
    elif kind == "other":
        data = draw(st.sampled_from(OTHER_KINDS)) + draw(st.binary(max_size=64))
        name = "tokens.bin"
    else:
        data = draw(st.binary(max_size=600))
        name = draw(st.sampled_from(["tokens.bin", "tokens.npy", "tokens"]))
    if not pristine:
        edit = draw(st.sampled_from(["none", "truncate", "append", "overwrite"]))
        cut = draw(st.integers(0, max(len(data), 1)))
        if edit == "truncate":
            data = data[:cut]
        elif edit == "append":
            data = data + draw(st.binary(min_size=1, max_size=9))
        elif edit == "overwrite" and data:
            patch = draw(st.binary(min_size=1, max_size=4))
            cut = min(cut, len(data) - 1)
            data = data[:cut] + patch + data[cut + len(patch) :]
    return TokenFile(name, data, kwargs, beside if kind == "megatron" else None)


#: First bytes of files of other kinds (zip, gzip, zstd, Parquet, Feather v1, JSON, JSON Lines).
OTHER_KINDS = [
    b"PK\x05\x06" + bytes(18),
    b"\x1f\x8b\x08\x00",
    b"\x28\xb5\x2f\xfd",
    b"PAR1",
    b"FEA1",
    b'{"text": "a"}\n',
    b"[1, 2, 3]",
    b"\xff\xff\xff\xff\x08\x00\x00\x00",
    b"ARROW1\x00\x00",
    b"MMIDIDX\x00\x00",
]


def _has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


@st.composite
def megatron_files(draw, pristine: bool) -> tuple[bytes, str, dict[str, bytes]]:
    """``data.bin`` and ``data.idx`` laid out as Megatron-LM writes them, the index maybe lying."""
    code = draw(st.sampled_from(sorted(MEGATRON_DTYPES)))
    dtype = np.dtype(MEGATRON_DTYPES[code])
    lengths = draw(st.lists(st.integers(0, 20), max_size=8))
    tokens = draw(hnp.arrays(dtype, sum(lengths)))
    documents = sorted(draw(st.lists(st.integers(0, len(lengths)), max_size=4)))
    starts = [0, *documents, len(lengths)]
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * dtype.itemsize
    fields = {
        "version": 1,
        "code": code,
        "sequences": len(lengths),
        "documents": len(starts),
        "lengths": lengths,
        "pointers": pointers.tolist(),
        "starts": starts,
    }
    if not pristine:
        name = draw(st.sampled_from(sorted(fields)))
        value = fields[name]
        if isinstance(value, list):
            if value:
                at = draw(st.integers(0, len(value) - 1))
                value = [*value[:at], draw(st.integers(-5, 2**40)), *value[at + 1 :]]
        else:
            value = draw(st.sampled_from([0, 1, 2, 6, 7, 9, 255, value + 1, max(value - 1, 0)]))
        fields[name] = value
    index = (
        MEGATRON_MAGIC
        + fields["version"].to_bytes(8, "little")
        + bytes([fields["code"] % 256])
        + fields["sequences"].to_bytes(8, "little")
        + fields["documents"].to_bytes(8, "little")
        + np.asarray(fields["lengths"], dtype=np.int64).astype("<i4").tobytes()
        + np.asarray(fields["pointers"], dtype="<i8").tobytes()
        + np.asarray(fields["starts"], dtype="<i8").tobytes()
    )
    return tokens.tobytes(), "data.bin", {"data.idx": index}


@st.composite
def arrow_files(draw, pristine: bool) -> bytes:
    """One record batch of an ``input_ids`` list column, as an IPC stream or file."""
    import pyarrow as pa

    value_type = draw(st.sampled_from([pa.int32(), pa.uint16(), pa.int64(), pa.float32()]))
    documents = draw(st.lists(st.lists(st.integers(0, 30000), max_size=6), max_size=6))
    column = pa.array(documents, pa.list_(value_type))
    name = "input_ids" if pristine or draw(st.booleans()) else "tokens"
    table = pa.table({name: column})
    sink = pa.BufferOutputStream()
    new = pa.ipc.new_file if draw(st.booleans()) else pa.ipc.new_stream
    with new(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@st.composite
def split_calls(draw):
    """A corpus of one to three shards (documents recorded, empty ones too, or none), split
    fractions, seed and range_tokens, stream options for the splits, and whether the splits'
    runs are read through a shard source (``tokstream.split.SplitShards``)."""
    shards = [
        (1000 * j + np.arange(draw(st.integers(0, 50)))).astype("i4")
        for j in range(draw(st.integers(1, 3)))
    ]
    documents: list[Any] = [None] * len(shards)
    if draw(st.booleans()):
        documents = [
            [0, *sorted(draw(st.lists(st.integers(0, len(s)), max_size=6))), len(s)] for s in shards
        ]
    names = draw(
        st.lists(st.sampled_from(["train", "valid", "test", "x"]), min_size=1, unique=True)
    )
    fractions = {
        name: draw(st.one_of(st.sampled_from([0.99, 0.01, 0.5, 1, 3]), st.floats(0.01, 5.0)))
        for name in names
    }
    world_size = draw(st.integers(1, 3))
    kwargs = {
        "block": draw(st.integers(1, 6)),
        "batch_size": draw(st.integers(1, 8)),
        "shuffle": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "world_size": world_size,
        "windows": draw(st.sampled_from(["cross", "within"])),
        "stride": draw(st.sampled_from([1, 1, 2])),
    }
    if draw(st.booleans()):
        kwargs["extras"] = ("position_ids",)
    return (
        shards,
        documents,
        fractions,
        draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(1, 12)),
        kwargs,
        draw(st.booleans()),
    )
