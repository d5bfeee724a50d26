"""The benchmark baselines yield what they claim, so that timing them compares like with like."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import tokstream
from tokstream import bench
from tokstream._validate import KERNEL_DTYPES
from tokstream.bench import _loop, baselines, harness

NUMPY_LOADERS = ["reference", "best_numpy", "fast", "fast_reuse", "fast_one_buffer", "c_loop"]


def _corpus(length: int, dtype: str, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 50257, length).astype(dtype)


def _numpy(value):
    return value.numpy() if hasattr(value, "numpy") else value


def _loaders() -> list[str]:
    names = list(NUMPY_LOADERS)
    if baselines.torch_available():
        names.append("nanogpt")
    return names


@pytest.mark.parametrize("path", _loaders())
@pytest.mark.parametrize("dtype", ["int64", "uint16", "int32"])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("length", "block", "batch_size"), [(200, 8, 16), (57, 5, 7), (9, 8, 4)])
def test_loaders_yield_the_fast_paths_batches(path, dtype, shuffle, length, block, batch_size):
    ids = _corpus(length, dtype)
    expected = list(
        tokstream.stream_token_source(ids, block, batch_size, epochs=2, shuffle=shuffle, seed=7)
    )
    got = baselines.PATHS[path](ids, block, batch_size, epochs=2, shuffle=shuffle, seed=7)
    count = 0
    # Compared as they come: fast_reuse overwrites a batch two batches later, fast_one_buffer one.
    for (windows, next_tokens), (want_windows, want_next) in zip(got, expected, strict=True):
        windows, next_tokens = _numpy(windows), _numpy(next_tokens)
        assert windows.dtype == np.int64 and next_tokens.dtype == np.int64
        np.testing.assert_array_equal(windows, want_windows)
        np.testing.assert_array_equal(next_tokens, want_next)
        count += 1
    assert count == len(expected) > 0


@pytest.mark.parametrize("distance", [*baselines.C_LOOP_DISTANCES, 1000])
@pytest.mark.parametrize("dtype", ["int64", "uint16"])
def test_c_loop_yields_the_same_batches_at_every_prefetch_distance(distance, dtype):
    ids = _corpus(300, dtype)
    expected = list(tokstream.stream_token_source(ids, 9, 16, seed=2))
    got = baselines.c_loop(ids, 9, 16, seed=2, distance=distance)
    for (windows, next_tokens), (want_windows, want_next) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(windows, want_windows)
        np.testing.assert_array_equal(next_tokens, want_next)


def test_c_loop_calibrates_to_one_of_its_distances_and_reuses_one_buffer():
    ids = _corpus(5000, "int64")
    assert baselines.best_c_loop_distance(ids, 16, 64) in baselines.C_LOOP_DISTANCES
    batches = baselines.c_loop(ids, 16, 64)
    addresses = {w.__array_interface__["data"][0] for w, _ in itertools.islice(batches, 4)}
    assert len(addresses) == 1


@pytest.mark.parametrize("out", ["int32", "int64"])
@pytest.mark.parametrize("dtype", sorted(dtype.name for dtype in KERNEL_DTYPES))
@pytest.mark.parametrize("distance", [0, 3, 1000])
def test_c_rows_floor_writes_windows_shifted_labels_and_the_extras_bytes(out, dtype, distance):
    ids = _corpus(400, dtype)
    starts = np.random.default_rng(1).integers(0, 400 - 17, 40).astype(np.int64)
    rows = np.lib.stride_tricks.sliding_window_view(ids, 17)[starts]
    inputs, labels, positions = (np.full((40, 16), -1, out) for _ in range(3))
    mask, pieces = np.zeros((40, 16), np.uint8), np.full((40, 16), -1, np.int32)
    _loop.copy_rows(ids, starts, inputs, labels, positions, mask, pieces, distance)
    np.testing.assert_array_equal(inputs, rows[:, :-1].astype(out))
    np.testing.assert_array_equal(labels, rows[:, 1:].astype(out))
    np.testing.assert_array_equal(positions, np.broadcast_to(np.arange(16), (40, 16)))
    assert mask.all() and not pieces.any()
    # Without extras only the tokens are written.
    positions.fill(-1)
    _loop.copy_rows(ids, starts[::-1].copy(), inputs, labels, None, None, None, distance)
    np.testing.assert_array_equal(inputs, rows[::-1, :-1].astype(out))
    np.testing.assert_array_equal(labels, rows[::-1, 1:].astype(out))
    assert (positions == -1).all()


def _rows(count: int = 4, block: int = 8, extras: bool = True) -> dict:
    buffers = {
        "inputs": np.zeros((count, block), np.int32),
        "labels": np.zeros((count, block), np.int32),
    }
    buffers["positions"] = np.zeros((count, block), np.int32) if extras else None
    buffers["mask"] = np.zeros((count, block), np.uint8) if extras else None
    buffers["pieces"] = np.zeros((count, block), np.int32) if extras else None
    return buffers


@pytest.mark.parametrize(
    ("starts", "change", "message"),
    [
        ([0, 1, 92, 3], {}, "inside tokens"),  # its label 92 + 8 would be token 100 of 100
        ([0, -1, 2, 3], {}, "inside tokens"),
        ([0, 1, 2], {}, "must be"),  # 3 starts, buffers of 4 rows
        ([0, 1, 2, 3], {"labels": np.zeros((4, 7), np.int32)}, "must be"),
        ([0, 1, 2, 3], {"mask": np.zeros((4, 9), np.uint8)}, "must be"),
        ([0, 1, 2, 3], {"mask": None}, "together"),
        ([0, 1, 2, 3], {"positions": None}, "together"),
    ],
)
def test_c_rows_floor_refuses_windows_outside_the_tokens_and_mismatched_buffers(
    starts, change, message
):
    tokens = np.arange(100, dtype=np.int64)
    buffers = {**_rows(), **change}
    before = {name: None if b is None else b.copy() for name, b in buffers.items()}
    with pytest.raises(ValueError, match=message):
        _loop.copy_rows(tokens, np.asarray(starts, np.int64), *buffers.values(), 0)
    for name, buffer in buffers.items():
        if buffer is not None:
            np.testing.assert_array_equal(buffer, before[name])
    # The last window that fits is copied.
    _loop.copy_rows(tokens, np.array([91, 0, 0, 0]), *_rows(extras=False).values(), 0)


EXTRAS = ("position_ids", "loss_mask", "cu_seqlens", "document_ids")


def _document_rows(documents: _loop.Documents, starts, out: str, distance: int = 0) -> dict:
    """The batch copy_document_rows writes for window numbers starts, by the stream's names."""
    count, block = len(starts), documents.block
    rows = {
        "input_ids": np.full((count, block), -1, out),
        "labels": np.full((count, block), -1, out),
        "position_ids": np.full((count, block), -1, out),
        "loss_mask": np.full((count, block), 7, np.uint8),
        "document_ids": np.full((count, block), -1, np.int32),
    }
    cu_seqlens = np.full(count * block + 1, -1, np.int32)
    written, longest = _loop.copy_document_rows(
        documents, np.asarray(starts, np.int64), *rows.values(), cu_seqlens, distance
    )
    rows["loss_mask"] = rows["loss_mask"].view(bool)
    return {**rows, "cu_seqlens": cu_seqlens[:written], "max_seqlen": longest}


@pytest.mark.parametrize("windows", ["cross", "within"])
@pytest.mark.parametrize("out", ["int32", "int64"])
@pytest.mark.parametrize("dtype", ["uint16", "int64", "int8"])
def test_c_document_floor_writes_the_document_streams_batch(windows, out, dtype):
    # The stream, unshuffled with stride 1, yields windows 0, 1, 2, ... of its space: the floor
    # given those numbers writes the same batch, over layouts with empty documents, documents
    # shorter and longer than a window, one document, documents exactly block + 1 long.
    rng = np.random.default_rng(5)
    layouts = [[40], [9] * 6, [0, 0, 12, 0, 3, 30, 0]]
    layouts += [list(rng.integers(0, 30, rng.integers(1, 30))) for _ in range(20)]
    for lengths in layouts:
        ids = _corpus(sum(lengths), dtype, seed=len(lengths)) % 100
        for block in (1, 3, 8):
            documents = _loop.Documents(ids, lengths, block, windows == "within")
            if documents.windows == 0:
                continue
            corpus = tokstream.Corpus.from_documents(np.split(ids, np.cumsum(lengths)[:-1]))
            batch_size = min(documents.windows, 6)
            stream = tokstream.stream_token_source(
                corpus,
                block,
                batch_size,
                shuffle=False,
                targets="shifted",
                extras=EXTRAS,
                windows=windows,
                out_dtype=out,
            )
            expected = next(stream)
            got = _document_rows(documents, range(batch_size), out, distance=2)
            assert got.keys() == expected.keys()
            for name, value in expected.items():
                np.testing.assert_array_equal(got[name], value, err_msg=f"{lengths} {name}")


def test_c_document_floor_restarts_the_extras_at_every_document_start():
    # Documents [0 1 2] [] [3 4 5 6 7 8]; window 1 of block 4 across them: 1 2 | 3 4.
    documents = _loop.Documents(np.arange(9, dtype=np.uint16), [3, 0, 6], 4, within=False)
    got = _document_rows(documents, [1, 4], "int64")
    assert got["input_ids"].tolist() == [[1, 2, 3, 4], [4, 5, 6, 7]]
    assert got["position_ids"].tolist() == [[0, 1, 0, 1], [0, 1, 2, 3]]
    assert got["document_ids"].tolist() == [[0, 0, 1, 1], [0, 0, 0, 0]]
    assert got["loss_mask"].tolist() == [[True, False, True, True], [True] * 4]
    assert got["cu_seqlens"].tolist() == [0, 2, 4, 8] and got["max_seqlen"] == 4
    # Within documents: only document 2 holds windows of 5 tokens, numbered 0 and 1.
    documents = _loop.Documents(np.arange(9, dtype=np.uint16), [3, 0, 6], 4, within=True)
    assert documents.windows == 2
    got = _document_rows(documents, [1, 0], "int32")
    assert got["input_ids"].tolist() == [[4, 5, 6, 7], [3, 4, 5, 6]]
    assert got["cu_seqlens"].tolist() == [0, 4, 8] and not got["document_ids"].any()


@pytest.mark.parametrize(
    ("tokens", "lengths", "block", "error", "message"),
    [
        (np.arange(10), [4, 6], 0, ValueError, "block"),
        (np.arange(10), [4, 5], 3, ValueError, "add up"),
        (np.arange(10), [12, -2], 3, ValueError, ">= 0"),
        (np.arange(10), [], 3, ValueError, "non-empty"),
        (np.arange(10), [[4, 6]], 3, ValueError, "non-empty"),
        (np.arange(10), [4.0, 6.0], 3, ValueError, "integers"),
        (np.arange(10).reshape(2, 5), [10], 3, ValueError, "one-dimensional"),
        (np.arange(10.0), [10], 3, TypeError, "integers"),
    ],
)
def test_c_document_floor_refuses_bad_documents(tokens, lengths, block, error, message):
    with pytest.raises(error, match=message):
        _loop.Documents(tokens, lengths, block, within=False)


@pytest.mark.parametrize(
    ("starts", "within", "change", "message"),
    [
        ([0, 1, 6, 2], False, {}, "not below"),  # 6 windows of 4 tokens in 10 (5 tokens each)
        ([0, -1, 2, 3], False, {}, "not below"),
        ([0, 1, 2, 3], True, {}, "not below"),  # within: windows 0 and 1 only
        ([0, 1, 2], False, {}, "must be"),
        ([0, 1, 2, 3], False, {"labels": np.zeros((4, 3), np.int32)}, "must be"),
        ([0, 1, 2, 3], False, {"cu_seqlens": np.zeros(16, np.int32)}, "cu_seqlens"),
    ],
)
def test_c_document_floor_refuses_windows_outside_and_writes_nothing(
    starts, within, change, message
):
    documents = _loop.Documents(np.arange(10, dtype=np.int64), [4, 6], 4, within=within)
    buffers = {
        **_rows(count=4, block=4),
        "cu_seqlens": np.zeros(17, np.int32),
        **change,
    }
    before = {name: b.copy() for name, b in buffers.items()}
    with pytest.raises(ValueError, match=message):
        _loop.copy_document_rows(documents, np.asarray(starts, np.int64), *buffers.values(), 0)
    for name, buffer in buffers.items():
        np.testing.assert_array_equal(buffer, before[name])
    # Its attributes are read-only: nothing can widen the windows the loop trusts.
    with pytest.raises(AttributeError):
        documents.windows = 10**9  # type: ignore[misc]


def test_c_loop_rejects_a_negative_distance():
    with pytest.raises(ValueError, match="distance"):
        baselines.c_loop(np.arange(100), 4, 8, distance=-1)


def test_fast_reuse_cycles_through_two_buffers():
    batches = baselines.fast_reuse(np.arange(100), 4, 8)
    addresses = [w.__array_interface__["data"][0] for w, _ in itertools.islice(batches, 6)]
    assert len(set(addresses)) == 2 and addresses[0] == addresses[2] != addresses[1]


def test_fast_one_buffer_refills_one_buffer():
    batches = baselines.fast_one_buffer(np.arange(100), 4, 8)
    addresses = [w.__array_interface__["data"][0] for w, _ in itertools.islice(batches, 4)]
    assert len(set(addresses)) == 1


@pytest.mark.parametrize("path", list(baselines.PATHS))
def test_every_path_yields_nothing_when_no_window_fits(path):
    if path == "nanogpt" and not baselines.torch_available():
        pytest.skip("PyTorch is not installed")
    assert list(baselines.PATHS[path](np.arange(8), 8, 4)) == []
    assert list(baselines.PATHS[path](np.arange(20), 8, 4, epochs=0)) == []


@pytest.mark.parametrize("path", list(baselines.PATHS))
@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    [
        ({"block": 0}, ValueError, "block"),
        ({"batch_size": 2.5}, ValueError, "batch_size"),
        ({"shuffle": "no"}, TypeError, "shuffle"),
        ({"epochs": -1}, ValueError, "epochs"),
    ],
)
def test_every_path_validates_like_the_stream_when_called(path, kwargs, error, argument):
    if path == "nanogpt" and not baselines.torch_available():
        pytest.skip("PyTorch is not installed")
    arguments = {"block": 4, "batch_size": 3, **kwargs}
    block, batch_size = arguments.pop("block"), arguments.pop("batch_size")
    with pytest.raises(error, match=argument):
        baselines.PATHS[path](np.arange(50), block, batch_size, **arguments)


@pytest.mark.parametrize("dtype", ["int64", "uint16"])
def test_gather_limit_holds_the_first_token_of_each_window(dtype):
    ids = _corpus(300, dtype)
    fast = tokstream.stream_token_source(ids, 6, 32, epochs=2, seed=3)
    gather = baselines.gather_limit(ids, 6, 32, epochs=2, seed=3)
    count = 0
    for (windows, _), (first_tokens,) in zip(fast, gather, strict=True):
        assert first_tokens.dtype == ids.dtype
        np.testing.assert_array_equal(first_tokens, windows[:, 0])
        count += 1
    assert count == 2 * -(-(300 - 6) // 32)


@pytest.mark.parametrize("dtype", ["int64", "uint16"])
@pytest.mark.parametrize(("length", "block", "batch_size"), [(1000, 8, 16), (30, 4, 20)])
def test_copy_limit_copies_consecutive_tokens_into_one_reused_buffer(
    dtype, length, block, batch_size
):
    ids = np.arange(length, dtype=np.int64).astype(dtype)  # a token's value is its position
    sizes = [len(w) for w, _ in tokstream.stream_token_source(ids, block, batch_size, epochs=2)]
    buffers = []
    for (buffer,), size in zip(
        baselines.copy_limit(ids, block, batch_size, epochs=2), sizes, strict=True
    ):
        assert buffer.shape == (size, block) and buffer.dtype == np.int64
        flat = buffer.ravel()
        # Consecutive tokens of the corpus, read around its end when the batch is longer.
        np.testing.assert_array_equal(flat, (flat[0] + np.arange(flat.size)) % length)
        buffers.append(buffer)
    assert len({b.__array_interface__["data"][0] for b in buffers}) == 1


def test_copy_limit_offsets_are_random_and_seeded():
    ids = np.arange(100_000)
    first = [int(b[0, 0]) for (b,) in itertools.islice(baselines.copy_limit(ids, 8, 16), 20)]
    again = [int(b[0, 0]) for (b,) in itertools.islice(baselines.copy_limit(ids, 8, 16), 20)]
    other = [
        int(b[0, 0]) for (b,) in itertools.islice(baselines.copy_limit(ids, 8, 16, seed=1), 20)
    ]
    assert first == again != other
    assert len(set(first)) > 15


def test_paths_draw_their_order_lazily(monkeypatch):
    """The permutation must happen at the first batch, so a benchmark can leave it untimed."""
    calls = []

    class CountingRandomState(np.random.RandomState):
        def permutation(self, x):
            calls.append(x)
            return super().permutation(x)

    monkeypatch.setattr(np.random, "RandomState", CountingRandomState)
    for name, path in baselines.PATHS.items():
        if name == "nanogpt" and not baselines.torch_available():
            continue
        calls.clear()
        batches = path(np.arange(100), 4, 8, shuffle=True)
        assert calls == [], name
        next(batches)
        if name != "copy_limit":
            assert calls == [96], name


def test_epochs_for_holds_enough_batches():
    assert bench.epochs_for(108, 8, 10, 10) == 1
    assert bench.epochs_for(108, 8, 10, 11) == 2
    assert bench.epochs_for(10_000, 8, 10, 1) == 1
    with pytest.raises(ValueError, match="block=8"):
        bench.epochs_for(8, 8, 10, 1)


def test_consume_counts_windows_and_stops_early():
    batches = iter([(np.zeros((3, 2)),), (np.zeros((5, 2)),), (np.zeros((1, 2)),)])
    assert bench.consume(batches, 2) == 8
    assert bench.consume(batches, 10) == 1
    assert bench.consume(batches, 10) == 0


def _first_batches(block: int = 4, batch_size: int = 8) -> dict:
    ids = _corpus(100, "uint16")
    return {
        path: next(baselines.PATHS[path](ids, block, batch_size, seed=1))
        for path in baselines.PATHS
        if path != "nanogpt" or baselines.torch_available()
    }


def test_check_identical_accepts_every_paths_first_batch():
    first = _first_batches()
    harness.check_identical(first, 4)
    harness.check_identical(first, 4, against="reference")


def test_check_identical_takes_tokstreams_paths_in_out_dtype_and_the_others_in_int64():
    ids = np.arange(60, dtype=np.uint16)
    first = {
        path: next(baselines.PATHS[path](ids, 4, 8, seed=1, **extra))
        for path, extra in [
            ("reference", {}),
            ("best_numpy", {}),
            ("fast", {"out_dtype": "int32"}),
            ("fast_reuse", {"out_dtype": "int32"}),
        ]
    }
    assert first["fast"][0].dtype == np.int32
    harness.check_identical(first, 4, out_dtype="int32")
    with pytest.raises(ValueError, match="'fast' yielded a different first batch"):
        harness.check_identical(first, 4, against="reference")


@pytest.mark.parametrize(
    ("path", "spoil"),
    [
        ("best_numpy", lambda batch: (batch[0] + 1, batch[1])),
        ("reference", lambda batch: (batch[0], batch[1][::-1].copy())),
        ("fast", lambda batch: (batch[0].astype(np.int32), batch[1])),
        ("gather_limit", lambda batch: (batch[0][::-1].copy(),)),
        ("copy_limit", lambda batch: (batch[0][:-1],)),
    ],
)
def test_check_identical_refuses_a_path_that_does_a_different_job(path, spoil):
    first = _first_batches()
    first[path] = spoil(first[path])
    against = "reference" if path == "fast" else "fast"
    with pytest.raises(ValueError, match=f"path {path!r} yielded a different first batch"):
        harness.check_identical(first, 4, against=against)


def test_ratios_name_measured_paths_and_labels_cover_every_path():
    assert set(baselines.PATH_LABELS) == set(baselines.PATHS)
    for top, bottom, _label in baselines.RATIOS:
        assert {top, bottom} <= set(baselines.PATHS)
    assert baselines.ratio("fast", "reference", 30.0, 10.0, block=8) == 3.0
    assert baselines.ratio("fast", "gather_limit", 800.0, 50.0, block=8) == 2.0


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(
    ("num_windows", "batch_size"), [(10, 3), (10, 10), (4, 9), (0, 2), (-3, 2)]
)
def test_batch_starts_cut_each_epochs_order_into_consecutive_batches(
    shuffle, num_windows, batch_size
):
    from tokstream.reference import batch_starts

    got = list(batch_starts(num_windows, batch_size, 3, shuffle, np.random.RandomState(5)))
    rng = np.random.RandomState(5)
    expected = []
    for _ in range(3 if num_windows > 0 else 0):
        order = rng.permutation(num_windows) if shuffle else np.arange(num_windows)
        expected += [order[k : k + batch_size] for k in range(0, num_windows, batch_size)]
    assert [s.tolist() for s in got] == [s.tolist() for s in expected]


@pytest.mark.parametrize("path", list(baselines.PATHS))
def test_a_batch_size_beyond_the_corpus_allocates_only_the_windows_there_are(path):
    if path == "nanogpt" and not baselines.torch_available():
        pytest.skip("PyTorch is not installed")
    ids = _corpus(100, "uint16")
    (huge,) = baselines.PATHS[path](ids, 4, 10**12, seed=3)
    (fitting,) = baselines.PATHS[path](ids, 4, 96, seed=3)
    assert len(huge[0]) == 96
    if path != "copy_limit":  # its offsets depend on the batch size asked for
        for got, expected in zip(huge, fitting, strict=True):
            np.testing.assert_array_equal(_numpy(got), _numpy(expected))
