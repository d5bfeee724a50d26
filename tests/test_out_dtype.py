"""out_dtype="int32": the same batches as int64, written in 32 bits by the kernels themselves."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokstream import Corpus, TokenStream, mix, stream_token_source
from tokstream._windows import DEBUG_BUILD

#: The batch entries written in out_dtype; every other entry keeps its own dtype.
OUT_ENTRIES = ("input_ids", "labels", "position_ids")
EVERY_EXTRA = ("position_ids", "loss_mask", "cu_seqlens", "document_ids", "origin")


def assert_same_values(wide, narrow) -> None:
    """``narrow`` (out_dtype="int32") holds ``wide``'s (int64) values, in int32 where the
    option says, in the same dtype elsewhere."""
    if isinstance(wide, tuple):
        assert isinstance(narrow, tuple) and len(wide) == len(narrow) == 2
        for a, b in zip(wide, narrow, strict=True):
            assert a.dtype == np.int64 and b.dtype == np.int32 and b.flags.c_contiguous
            np.testing.assert_array_equal(a, b)
        return
    assert wide.keys() == narrow.keys()
    for name, value in wide.items():
        if not isinstance(value, np.ndarray):
            assert narrow[name] == value, name
            continue
        expected = np.int32 if name in OUT_ENTRIES else value.dtype
        assert narrow[name].dtype == expected, name
        assert narrow[name].shape == value.shape, name
        np.testing.assert_array_equal(narrow[name], value, err_msg=name)


@st.composite
def streams(draw):
    """A corpus (one or more shards, recorded documents or not) and a stream's keywords over it,
    across every window policy, a mixture of two such corpora among them."""
    dtype = draw(
        st.sampled_from(["uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"])
    )
    high = min(int(np.iinfo(dtype).max), 2**31 - 1)
    low = max(int(np.iinfo(dtype).min), -(2**31))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    block = draw(st.integers(1, 40))

    def corpus() -> Corpus:
        lengths = draw(st.lists(st.integers(0, 300), min_size=1, max_size=6))
        lengths[0] += 1  # no empty corpus (refused before any option is looked at)
        documents = draw(st.booleans())
        # Values at both ends of int32 too, where the corpus dtype reaches them.
        values = [rng.integers(low, high, n, endpoint=True).astype(dtype) for n in lengths]
        for array in values:
            array[rng.random(array.shape[0]) < 0.05] = high
            array[rng.random(array.shape[0]) < 0.05] = 3  # the eos
        if documents:
            return Corpus.from_documents(values)
        return Corpus([v for v in values if v.shape[0]] or [np.zeros(block + 2, dtype)])

    windows = draw(st.sampled_from(["cross", "within", "packed", "mixture"]))
    options = {
        "batch_size": draw(st.integers(1, 9)),
        "shuffle": draw(st.booleans()),
        "seed": draw(st.integers(0, 7)),
        "epochs": draw(st.integers(1, 2)),
        "drop_last": draw(st.booleans()),
        "extras": tuple(draw(st.lists(st.sampled_from(EVERY_EXTRA), unique=True))),
        "eos": draw(st.sampled_from([None, 3])),
    }
    world_size = draw(st.integers(1, 3))
    options.update(world_size=world_size, rank=draw(st.integers(0, world_size - 1)))
    if windows == "packed":
        options.update(windows="packed", pad=draw(st.sampled_from([0, high])))
        return corpus(), block, options
    options["targets"] = draw(st.sampled_from(["next", "shifted"]))
    options["stride"] = draw(st.integers(1, 4))
    if windows == "mixture":
        source = mix({"a": corpus(), "b": corpus()}, {"a": 2, "b": 1})
        if draw(st.booleans()):
            options["extras"] += ("source",)
        return source, block, options
    return corpus(), block, {**options, "windows": windows}


def _stream(source, block, options, **more):
    try:
        return stream_token_source(source, block, **options, **more)
    except ValueError as error:
        # Settings with no window at all (a mixture's source too short): refused alike.
        with pytest.raises(ValueError) as narrow:
            stream_token_source(source, block, **options, **more, out_dtype="int32")
        assert str(narrow.value) == str(error)
        return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=streams())
def test_int32_batches_hold_the_int64_batches_values_on_every_policy(run):
    source, block, options = run
    wide = _stream(source, block, options)
    if wide is None:
        return
    narrow = stream_token_source(source, block, **options, out_dtype="int32")
    assert len(narrow) == len(wide)
    count = 0
    for a, b in zip(wide, narrow, strict=True):
        assert_same_values(a, b)
        count += 1
    assert count == len(wide)


@pytest.mark.parametrize("windows", ["cross", "within", "packed"])
@pytest.mark.parametrize(("reuse_buffers", "prefetch"), [(0, 0), (2, 0), (0, 2), (3, 2)])
def test_int32_with_reused_buffers_and_prefetch_matches_int64(windows, reuse_buffers, prefetch):
    ids = np.random.default_rng(1).integers(0, 50_000, 5_000).astype(np.uint16)
    ids[::97] = 7
    options = {"windows": windows, "eos": 7, "extras": EVERY_EXTRA, "epochs": 2}
    wide = list(stream_token_source(Corpus([ids[:3000], ids[3000:]]), 32, 16, **options))
    narrow = stream_token_source(
        Corpus([ids[:3000], ids[3000:]]),
        32,
        16,
        **options,
        out_dtype="int32",
        reuse_buffers=reuse_buffers,
        prefetch=prefetch,
    )
    # Each batch compared as it arrives (reused buffers are overwritten later).
    for a, b in zip(wide, narrow, strict=True):
        assert_same_values(a, b)


@pytest.mark.parametrize("spelling", ["int32", np.dtype("int32"), "i4", "=i4"])
def test_out_dtype_takes_a_name_or_a_dtype_and_keeps_the_name(spelling):
    stream = stream_token_source(np.arange(40), 4, 3, out_dtype=spelling)
    assert stream.out_dtype == "int32" and next(stream)[0].dtype == np.int32
    assert stream_token_source(np.arange(40), 4, 3).out_dtype == "int64"


BAD = [
    ({"out_dtype": None}, TypeError, "out_dtype must be 'int64' or 'int32'"),
    ({"out_dtype": 32}, TypeError, "out_dtype must be 'int64' or 'int32'"),
    ({"out_dtype": np.int32}, TypeError, r"a str or np.dtype"),
    ({"out_dtype": ["int32"]}, TypeError, "out_dtype"),
    ({"out_dtype": "float32"}, ValueError, "out_dtype must be 'int64' or 'int32', got 'float32'"),
    ({"out_dtype": np.dtype("float32")}, ValueError, "out_dtype"),
    ({"out_dtype": "int16"}, ValueError, "out_dtype"),
    ({"out_dtype": "uint32"}, ValueError, "out_dtype"),
    ({"out_dtype": "Int32"}, ValueError, "out_dtype"),
    ({"out_dtype": ">i4" if np.little_endian else "<i4"}, ValueError, "out_dtype"),
    ({"out_dtype": "not a dtype"}, ValueError, "out_dtype"),
    ({"out_dtype": "int32", "windows": "packed", "pad": 2**31}, ValueError, r"pad=2147483648"),
    ({"out_dtype": "int32", "windows": "packed", "pad": -(2**31) - 1}, ValueError, "pad="),
]


@pytest.mark.parametrize(("overrides", "error", "message"), BAD)
def test_bad_out_dtype_arguments_name_the_argument(overrides, error, message):
    ids = np.arange(100, dtype=np.int64)
    with pytest.raises(error, match=message):
        stream_token_source(ids, 4, 3, **overrides)
    with pytest.raises(error, match=message):
        TokenStream(Corpus([ids]), 4, 3, **overrides)


def test_a_block_whose_position_ids_do_not_fit_int32_is_refused():
    ids = np.zeros(4, np.int64)
    with pytest.raises(ValueError, match=r"out_dtype='int32' holds position ids below 2\*\*31"):
        stream_token_source(ids, 2**31 + 1, 1, out_dtype="int32")


def _batch_with(dtype, value, windows, shards):
    """A corpus of ``dtype`` whose one token ``value`` lies in the first batch of a stream."""
    ids = np.arange(2_000, dtype=np.int64) % 100 + 10
    ids[37] = 3
    ids = ids.astype(dtype)
    ids[20] = value
    corpus = Corpus([ids[:1000], ids[1000:]] if shards == 2 else [ids])
    extras = EVERY_EXTRA if windows != "cross" else ()
    options = {"windows": windows, "eos": 3, "extras": extras}
    if windows == "packed":
        options["pad"] = 0
    return corpus, {**options, "shuffle": False}


@pytest.mark.parametrize("windows", ["cross", "within", "packed"])
@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize(
    ("dtype", "value"),
    [("uint32", 2**31), ("uint32", 2**32 - 1), ("int64", 2**31), ("int64", -(2**31) - 1),
     ("int64", 2**40), ("uint64", 2**31), ("uint64", 2**63 - 1)],
)  # fmt: skip
def test_a_token_outside_int32_refuses_the_batch_and_leaves_the_stream(
    windows, shards, dtype, value
):
    corpus, options = _batch_with(dtype, value, windows, shards)
    stream = stream_token_source(corpus, 16, 8, **options, out_dtype="int32")
    before = stream.state_dict()
    for _ in range(2):
        with pytest.raises(ValueError, match=rf"does not fit out_dtype='int32' .*{dtype} tokens"):
            next(stream)
    assert stream.state_dict() == before
    # The int64 stream reads the token as it is.
    batch = next(stream_token_source(corpus, 16, 8, **options))
    wide = batch["input_ids"] if isinstance(batch, dict) else batch[0]
    assert value in wide


@pytest.mark.parametrize("windows", ["cross", "within", "packed"])
@pytest.mark.parametrize(
    ("dtype", "value"),
    [("uint32", 2**31 - 1), ("int64", 2**31 - 1), ("int64", -(2**31)), ("uint64", 2**31 - 1)],
)
def test_tokens_at_the_ends_of_int32_pass(windows, dtype, value):
    corpus, options = _batch_with(dtype, value, windows, 2)
    narrow = stream_token_source(corpus, 16, 8, **options, out_dtype="int32")
    for a, b in zip(stream_token_source(corpus, 16, 8, **options), narrow, strict=True):
        assert_same_values(a, b)


@pytest.mark.parametrize("prefetch", [1, 3])
def test_a_refused_batch_is_refused_again_when_made_by_the_prefetch_thread(prefetch):
    # Token 39 is in the third batch only (see below); the two before it are delivered.
    ids = np.arange(200, dtype=np.int64)
    ids[39] = 2**31
    stream = stream_token_source(ids, 16, 8, shuffle=False, prefetch=prefetch, out_dtype="int32")
    wide = stream_token_source(ids, 16, 8, shuffle=False)
    for _ in range(2):
        assert_same_values(next(wide), next(stream))
    delivered = stream.state_dict()
    for _ in range(3):
        with pytest.raises(ValueError, match="does not fit out_dtype"):
            next(stream)
    assert stream.state_dict() == delivered
    stream.close()


def test_a_refused_batch_leaves_the_last_reused_batch_intact():
    # Sequential batches of 8 windows of 16 tokens: batch k reads tokens 8k .. 8k + 23, so
    # token 39 is in the third batch only.
    ids = np.arange(200, dtype=np.int64)
    ids[39] = 2**31
    stream = stream_token_source(ids, 16, 8, shuffle=False, reuse_buffers=2, out_dtype="int32")
    next(stream)
    held = next(stream)
    copy = (held[0].copy(), held[1].copy())
    for _ in range(3):
        with pytest.raises(ValueError, match="does not fit out_dtype"):
            next(stream)
    np.testing.assert_array_equal(held[0], copy[0])
    np.testing.assert_array_equal(held[1], copy[1])


def test_a_state_loads_across_out_dtypes_and_continues_with_the_same_values():
    ids = np.random.default_rng(3).integers(0, 60_000, 4_000).astype(np.uint16)
    options = {"windows": "within", "eos": 5, "extras": EVERY_EXTRA, "epochs": 2}
    wide = stream_token_source(Corpus([ids]), 16, 8, **options)
    for _ in range(5):
        next(wide)
    state = wide.state_dict()
    assert "out_dtype" not in state["config"]
    narrow = stream_token_source(Corpus([ids]), 16, 8, **options, out_dtype="int32")
    narrow.load_state_dict(state)
    for a, b in zip(wide, narrow, strict=True):
        assert_same_values(a, b)
    # And back: an int32 stream's state loads into an int64 one.
    back = stream_token_source(Corpus([ids]), 16, 8, **options)
    back.load_state_dict(narrow.state_dict())
    assert back.state_dict() == narrow.state_dict()


@pytest.mark.skipif(not DEBUG_BUILD, reason="release builds run without bounds checks")
def test_debug_build_streams_int32_on_every_policy():
    # The bounds-checked build walks every index the int32 specialisations use.
    ids = np.random.default_rng(4).integers(0, 2**31, 3_000).astype(np.int64)
    ids[::50] = 9
    for windows in ("cross", "within", "packed"):
        options = {"windows": windows, "eos": 9, "extras": EVERY_EXTRA}
        corpus = Corpus([ids[:1000], ids[1000:]])
        wide = stream_token_source(corpus, 24, 5, **options)
        narrow = stream_token_source(corpus, 24, 5, **options, out_dtype="int32")
        for a, b in zip(wide, narrow, strict=True):
            assert_same_values(a, b)


def test_the_torch_adapter_yields_int32_tensors_holding_the_int64_values():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from tokstream.torch import TokenDataset

    ids = np.random.default_rng(5).integers(0, 50_000, 3_000).astype(np.uint16)
    options = {"eos": 7, "extras": ("position_ids", "loss_mask", "cu_seqlens"), "seed": 2}
    wide = DataLoader(TokenDataset(ids, 16, 8, **options), batch_size=None)
    narrow = DataLoader(TokenDataset(ids, 16, 8, **options, out_dtype="int32"), batch_size=None)
    for a, b in zip(wide, narrow, strict=True):
        for name in OUT_ENTRIES:
            assert a[name].dtype == torch.int64 and b[name].dtype == torch.int32
            assert torch.equal(a[name], b[name].long())
        assert torch.equal(a["cu_seqlens"], b["cu_seqlens"])
    windows, labels = next(iter(TokenDataset(ids, 16, 8, out_dtype="int32")))
    assert windows.dtype == labels.dtype == torch.int32
