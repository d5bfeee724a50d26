"""Documents in a corpus and the streams over them: strides, window policies, batch extras.

Corpus.from_documents and the readers record boundaries; every stream over them is checked
against the pure-NumPy oracle of tests/oracle_documents.py.
"""

from __future__ import annotations

import tracemalloc
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import assert_same_batches as tuple_batches_identical
from tests.conftest import stress
from tests.oracle_documents import (
    Shard,
    assert_same_batches,
    copied,
    expected_batches,
    materialized_orders,
)
from tokstream import Corpus, mix, open_tokens, reference, stream_token_source
from tokstream._kernels.documents import document_pieces, gather_documents
from tokstream._space import WindowSpace, document_buckets
from tokstream._windows import DEBUG_BUILD


def test_from_documents_joins_the_documents_and_records_their_boundaries():
    docs = [np.array([1, 2, 3], np.uint16), np.array([], np.uint16), np.array([4, 5], np.uint16)]
    corpus = Corpus.from_documents(docs)
    assert len(corpus.shards) == 1 and corpus.dtype == np.uint16
    assert corpus.shards[0].tolist() == [1, 2, 3, 4, 5]
    assert corpus.document_lengths.tolist() == [3, 0, 2]
    assert corpus.document_boundaries.tolist() == [0, 3, 3, 5]
    assert corpus.has_documents


def test_from_documents_accepts_lists_and_validates_each_document_by_name():
    corpus = Corpus.from_documents([[1, 2], [3]])
    assert corpus.shards[0].tolist() == [1, 2, 3]
    assert corpus.document_lengths.tolist() == [2, 1]
    with pytest.raises(ValueError, match=r"documents\[1\]"):
        Corpus.from_documents([[1, 2], [3.5]])
    with pytest.raises(TypeError, match=r"documents\[0\]"):
        Corpus.from_documents([[True, 2], [3]])


@pytest.mark.parametrize(
    ("documents", "error", "match"),
    [
        (np.arange(5), TypeError, "documents must be a sequence"),
        ("abc", TypeError, "documents must be a sequence"),
        ([], ValueError, "at least one document"),
        ([np.arange(3, dtype=np.uint16), np.arange(3, dtype=np.int32)], ValueError, "mix token"),
    ],
)
def test_from_documents_rejects_bad_input(documents, error, match):
    with pytest.raises(error, match=match):
        Corpus.from_documents(documents)


def test_from_documents_over_a_million_documents_needs_no_loop_per_token():
    docs = np.split(np.arange(3_000_000, dtype=np.uint16), np.arange(3, 3_000_000, 3))
    corpus = Corpus.from_documents(docs)
    assert corpus.document_lengths.shape == (1_000_000,)
    assert int(corpus.document_lengths.sum()) == 3_000_000


def test_shards_without_recorded_documents_are_one_document_each():
    corpus = Corpus([np.arange(5), np.arange(3)])
    assert not corpus.has_documents
    assert corpus.document_lengths.tolist() == [5, 3]


def test_readers_record_documents_per_shard_and_they_are_checked():
    arrays = [np.arange(5), np.arange(4)]
    corpus = Corpus._from_arrays(arrays, ["a", "b"], "files", [np.array([0, 2, 5]), None])
    assert corpus.document_boundaries.tolist() == [0, 2, 5, 9]
    assert corpus.document_lengths.tolist() == [2, 3, 4]
    for offsets, match in [
        (np.array([1, 5]), "rise from 0"),
        (np.array([0, 4]), "rise from 0"),
        (np.array([0, 3, 2, 5]), "decrease"),
        (np.array([0, 7, 5]), "decrease"),
        (np.array([0, 2**63 + 1, 5], dtype=np.uint64), "decrease"),  # wraps negative as int64
        (np.array([[0, 5]]), "integer array"),
        (np.array([0.0, 5.0]), "integer array"),
        (np.array([5]), "rise from 0"),  # [0] alone is an empty shard of no documents
        (np.array([], dtype=np.int64), "at least 1 offset"),
    ]:
        with pytest.raises(ValueError, match=match):
            Corpus._from_arrays(arrays, ["a", "b"], "files", [offsets, None])


# ---------------------------------------------------------------------------------------------
# Streams over documents against the pure-NumPy oracle (tests/oracle_documents.py)

ALL_EXTRAS = ("position_ids", "loss_mask", "cu_seqlens", "document_ids")
VOCAB = 6  # few ids, so that a drawn eos occurs often, also first and last


@st.composite
def layouts(draw):
    """Shards of small token ids, each with or without recorded documents (some empty)."""
    dtype = draw(st.sampled_from(["uint8", "uint16", "int32", "int64"]))
    shards = []
    for _ in range(draw(st.integers(1, 3))):
        lengths = draw(
            st.lists(st.one_of(st.integers(0, 12), st.integers(40, 90)), min_size=1, max_size=6)
        )
        tokens = np.array(
            draw(st.lists(st.integers(0, VOCAB - 1), min_size=sum(lengths), max_size=sum(lengths))),
            dtype=dtype,
        )
        recorded = draw(st.booleans())
        boundaries = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        shards.append(Shard(tokens, boundaries if recorded else None))
    return shards


def corpus_of(shards) -> Corpus:
    if len(shards) == 1 and shards[0].boundaries is not None:
        b = shards[0].boundaries
        return Corpus.from_documents([shards[0].tokens[s:e] for s, e in pairwise(b)])
    return Corpus._from_arrays(
        [s.tokens for s in shards],
        [f"shard{i}" for i in range(len(shards))],
        "shards",
        [s.boundaries for s in shards],
    )


@st.composite
def settings_of_a_run(draw):
    return {
        "block": draw(st.integers(1, 9)),
        "batch_size": draw(st.integers(1, 5)),
        "stride": draw(st.sampled_from([1, 2, 3, 5, 8, 13])),
        "eos": draw(st.sampled_from([None, 0, VOCAB - 1])),
        "windows": draw(st.sampled_from(["cross", "within"])),
        "targets": draw(st.sampled_from(["next", "shifted"])),
        "extras": tuple(draw(st.permutations(ALL_EXTRAS))[: draw(st.integers(0, 4))]),
        "drop_last": draw(st.booleans()),
        "epochs": draw(st.integers(1, 2)),
    }


def stream_order(seed: int, permutation: str):
    """``epoch_order`` for the oracle: the stream's order of ``n`` windows in ``epoch``."""
    cache: dict[int, np.ndarray] = {}

    def order(epoch: int, n: int) -> np.ndarray:
        if n not in cache:
            epochs = epoch + 2
            if permutation == "materialized":
                cache[n] = np.stack(materialized_orders(seed, epochs, n))
            else:
                plain = stream_token_source(
                    np.arange(n + 1),
                    1,
                    max(n, 1),
                    epochs=epochs,
                    seed=seed,
                    permutation="implicit",
                )
                cache[n] = np.stack([windows[:, 0] for windows, _ in plain]).reshape(epochs, n)
        return cache[n][epoch]

    return order


def oracle_run(shards, run, order=None, **sharding):
    keep = ("block", "batch_size", "stride", "eos", "windows", "targets", "extras")
    keep += ("drop_last", "epochs")
    return expected_batches(shards, epoch_order=order, **{k: run[k] for k in keep}, **sharding)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shards=layouts(), run=settings_of_a_run(), world_size=st.integers(1, 3))
def test_every_rank_streams_the_oracles_batches_in_index_order(shards, run, world_size):
    corpus = corpus_of(shards)
    for rank in range(world_size):
        stream = stream_token_source(corpus, **run, shuffle=False, rank=rank, world_size=world_size)
        expected = oracle_run(shards, run, rank=rank, world_size=world_size)
        assert len(stream) == len(expected)
        assert_same_batches(list(stream), expected)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shards=layouts(),
    run=settings_of_a_run(),
    seed=st.integers(0, 2**32 - 1),
    permutation=st.sampled_from(["materialized", "implicit"]),
)
def test_shuffled_streams_give_the_oracles_batches_in_the_epoch_order(
    shards, run, seed, permutation
):
    stream = stream_token_source(
        corpus_of(shards), **run, shuffle=True, seed=seed, permutation=permutation
    )
    expected = oracle_run(shards, run, stream_order(seed, permutation))
    assert len(stream) == len(expected)
    assert_same_batches(list(stream), expected)


def interleaved(batches: list, world_size: int):
    """The rows of one global step (one batch per rank) in order position order."""
    if isinstance(batches[0], tuple):
        batches = [{"input_ids": b[0], "labels": b[1]} for b in batches]
    return {
        name: np.stack([b[name] for b in batches], axis=1).reshape(-1, *batches[0][name].shape[1:])
        for name in ("input_ids", "labels", "position_ids", "loss_mask")
        if name in batches[0]
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shards=layouts(),
    run=settings_of_a_run(),
    world_size=st.integers(2, 3),
    shuffle=st.booleans(),
)
def test_the_ranks_together_stream_the_single_rank_sequence(shards, run, world_size, shuffle):
    run = {**run, "epochs": 1}
    corpus = corpus_of(shards)
    ranks = [
        list(stream_token_source(corpus, **run, shuffle=shuffle, rank=r, world_size=world_size))
        for r in range(world_size)
    ]
    single = list(
        stream_token_source(
            corpus, **{**run, "batch_size": run["batch_size"] * world_size}, shuffle=shuffle
        )
    )
    assert len(single) >= len(ranks[0])
    for step, batches in enumerate(zip(*ranks, strict=True)):
        together = interleaved(list(batches), world_size)
        alone = interleaved([single[step]], 1)
        for name, rows in together.items():
            assert np.array_equal(rows, alone[name][: rows.shape[0]]), (step, name)


# Quadratic in the batches (a resume from every state): a bounded number under the debug build.
@settings(max_examples=stress(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shards=layouts(),
    run=settings_of_a_run(),
    shuffle=st.booleans(),
    prefetch=st.integers(0, 2),
    reuse=st.booleans(),
)
def test_resuming_after_every_batch_continues_identically(shards, run, shuffle, prefetch, reuse):
    corpus = corpus_of(shards)
    options = {**run, "shuffle": shuffle, "prefetch": prefetch}
    if reuse:
        options["reuse_buffers"] = prefetch + 2
    stream = stream_token_source(corpus, **options)
    states, batches = [stream.state_dict()], []
    for batch in stream:
        batches.append(copied(batch))
        states.append(stream.state_dict())
    order = stream_order(0, stream.options.permutation) if shuffle else None
    assert_same_batches(batches, oracle_run(shards, run, order))
    for k, state in enumerate(states):
        resumed = stream_token_source(corpus, **options)
        resumed.load_state_dict(state)
        assert_same_batches([copied(b) for b in resumed], batches[k:])
        resumed.close()


def within_stream(source, **options):
    return stream_token_source(source, 2, 2, windows="within", shuffle=False, **options)


@pytest.mark.parametrize(
    ("saved_by", "loaded_by"),
    [
        # The same shard lengths and window count (3 + 7), the windows elsewhere.
        pytest.param(
            lambda: within_stream(Corpus.from_documents([np.arange(5), np.arange(9)])),
            lambda: within_stream(Corpus.from_documents([np.arange(9), np.arange(5)])),
            id="recorded",
        ),
        pytest.param(
            lambda: within_stream(np.array([1, 2, 3, 4, 0, 5, 6, 7, 8, 9, 1, 2, 3, 0]), eos=0),
            lambda: within_stream(np.array([1, 2, 3, 4, 5, 6, 7, 8, 0, 9, 1, 2, 3, 0]), eos=0),
            id="eos",
        ),
        pytest.param(
            lambda: within_stream(
                mix({"a": Corpus.from_documents([np.arange(5), np.arange(9)])}, {"a": 1})
            ),
            lambda: within_stream(
                mix({"a": Corpus.from_documents([np.arange(9), np.arange(5)])}, {"a": 1})
            ),
            id="mixture",
        ),
    ],
)
def test_a_state_from_other_documents_is_refused_within_them(saved_by, loaded_by):
    saved = saved_by()
    next(saved)
    state = saved.state_dict()
    with pytest.raises(ValueError, match="window_segments_sha256"):
        loaded_by().load_state_dict(state)
    again = saved_by()
    again.load_state_dict(state)
    assert_same_batches([copied(b) for b in again], [copied(b) for b in saved])


def test_a_state_from_other_documents_resumes_cross_windows():
    # Across documents the documents decide the extras (data), not which windows come when.
    saved = stream_token_source(Corpus.from_documents([np.arange(5), np.arange(9)]), 2, 2)
    next(saved)
    other = stream_token_source(Corpus.from_documents([np.arange(9), np.arange(5)]), 2, 2)
    other.load_state_dict(saved.state_dict())
    assert "window_segments_sha256" not in saved.state_dict()["config"]


@pytest.mark.parametrize("windows", ["cross", "within"])
@pytest.mark.parametrize("targets", ["next", "shifted"])
@pytest.mark.parametrize(
    "tokens",
    [
        pytest.param([9, 1, 2, 9, 3, 4, 5, 9], id="nanogpt_eos_last"),
        pytest.param([9, 1, 2, 3, 9, 4, 5, 6, 7, 9, 9, 8], id="llmc_eos_first"),
        pytest.param(list(range(1, 9)) * 8, id="one_huge_document"),
        pytest.param([9] * 12, id="only_eos"),
    ],
)
@pytest.mark.parametrize("stride", [1, 3])
def test_eos_placements_give_the_oracles_batches(tokens, windows, targets, stride):
    shards = [Shard(np.array(tokens, np.uint16))]
    run = {"stride": stride, "eos": 9, "windows": windows, "targets": targets}
    stream = stream_token_source(shards[0].tokens, 2, 3, shuffle=False, extras=ALL_EXTRAS, **run)
    assert_same_batches(list(stream), expected_batches(shards, 2, 3, extras=ALL_EXTRAS, **run))


@pytest.mark.parametrize("targets", ["next", "shifted"])
@pytest.mark.parametrize("seed", range(24))
def test_eos_in_long_windows_gives_the_oracles_batches(seed, targets):
    # Windows wider than the kernel's sixteen-token eos scan, eos anywhere in them (inside a
    # run of sixteen, at its edges, several in one), with and without recorded documents.
    rng = np.random.default_rng(seed)
    dtype = ["uint8", "uint16", "int16", "int32", "int64", "uint64"][seed % 6]
    tokens = rng.integers(0, 9, 600).astype(dtype)
    tokens[rng.random(600) < [0.0, 0.004, 0.03, 0.2][seed % 4]] = 9
    cuts = np.sort(rng.integers(0, 600, int(rng.integers(0, 12))))
    boundaries = np.concatenate([[0], cuts, [600]]).astype(np.int64) if seed % 3 else None
    shards = [Shard(tokens, boundaries)]
    block = [16, 17, 31, 64, 100][seed % 5]
    run = {"eos": 9, "targets": targets, "windows": ["cross", "within"][seed % 2]}
    stream = stream_token_source(
        corpus_of(shards), block, 7, shuffle=False, extras=ALL_EXTRAS, **run
    )
    assert_same_batches(list(stream), expected_batches(shards, block, 7, extras=ALL_EXTRAS, **run))


@pytest.mark.parametrize("cut", [None, 4095, 4096, 4097, 4500])
def test_position_ids_of_pieces_longer_than_the_kernels_ramp_count_on(cut):
    # The kernel copies a piece's positions from a ramp of 4096; longer pieces go on from there.
    tokens = np.arange(9000, dtype=np.uint16)
    boundaries = None if cut is None else np.array([0, cut, 9000], np.int64)
    shards = [Shard(tokens, boundaries)]
    run = {"stride": 997, "extras": ALL_EXTRAS}
    stream = stream_token_source(corpus_of(shards), 5000, 2, shuffle=False, **run)
    assert_same_batches(list(stream), expected_batches(shards, 5000, 2, **run))


@pytest.mark.parametrize("targets", ["next", "shifted"])
def test_an_eos_past_32_bits_is_told_from_ids_that_share_half_of_it(targets):
    # The kernel's eos scan compares 32-bit halves: ids equal to eos in one half only must not
    # end a document, and eos itself must.
    eos = 2**33 + 7
    rng = np.random.default_rng(3)
    tokens = rng.choice(np.array([7, 2**34 + 7, 2**33, eos, 5]), 500, p=[0.3, 0.3, 0.3, 0.02, 0.08])
    shards = [Shard(tokens.astype(np.int64))]
    run = {"eos": eos, "targets": targets}
    stream = stream_token_source(shards[0].tokens, 40, 9, shuffle=False, extras=ALL_EXTRAS, **run)
    expected = expected_batches(shards, 40, 9, extras=ALL_EXTRAS, **run)
    assert any((batch["position_ids"][:, 1:] == 0).any() for batch in expected)
    assert_same_batches(list(stream), expected)


def test_eos_and_recorded_documents_together_break_at_both():
    documents = [np.array([1, 2, 9, 3, 4], np.int32), np.array([5, 6, 7, 8], np.int32)]
    corpus = Corpus.from_documents(documents)
    assert corpus.boundaries_with_eos(9).tolist() == [0, 3, 5, 9]
    batch = next(stream_token_source(corpus, 8, 1, shuffle=False, eos=9, extras=("position_ids",)))
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    within = stream_token_source(corpus, 2, 8, shuffle=False, eos=9, windows="within")
    assert next(within)[0].tolist() == [[1, 2], [5, 6], [6, 7]]  # [3, 4] holds no window


@pytest.mark.parametrize("seed", range(12))
def test_eos_boundaries_are_the_union_of_both_kinds_each_once(seed):
    # eos tokens ending recorded documents and shards, first tokens, runs of eos, empty shards.
    rng = np.random.default_rng(seed)
    shards, offsets = [], []
    for _ in range(int(rng.integers(1, 5))):
        tokens = rng.integers(0, 4, int(rng.integers(0, 40))).astype(np.int16)
        cuts = rng.integers(0, tokens.shape[0] + 1, int(rng.integers(0, 6)))
        shards.append(tokens)
        offsets.append(np.unique(np.concatenate([[0], cuts, [tokens.shape[0]]])))
    corpus = Corpus._from_arrays(shards, [f"s{i}" for i in range(len(shards))], "s", offsets)
    starts = np.cumsum([0] + [shard.shape[0] for shard in shards])
    expected = np.unique(
        np.concatenate(
            [
                np.concatenate([o, np.flatnonzero(t == 3) + 1]) + b
                for t, o, b in zip(shards, offsets, starts[:-1], strict=True)
            ]
        )
    )
    assert corpus.boundaries_with_eos(3).tolist() == expected.tolist()


def test_streams_over_several_token_files_give_the_oracles_batches(tmp_path):
    rng = np.random.default_rng(5)
    shards = [Shard(rng.integers(0, 4, n).astype(np.uint16)) for n in (50, 7, 33)]
    paths = []
    for i, shard in enumerate(shards):
        paths.append(tmp_path / f"shard_{i}.bin")
        shard.tokens.tofile(paths[-1])
    corpus = open_tokens([str(p) for p in paths])
    for run in [
        {"stride": 4, "windows": "cross"},
        {"stride": 2, "eos": 3, "windows": "within"},
        {"stride": 5, "eos": 0, "windows": "cross"},
    ]:
        stream = stream_token_source(
            corpus, 5, 4, shuffle=False, targets="shifted", extras=ALL_EXTRAS, **run
        )
        expected = expected_batches(shards, 5, 4, targets="shifted", extras=ALL_EXTRAS, **run)
        assert len(stream) == len(expected)
        assert_same_batches(list(stream), expected)


def test_without_documents_the_extras_are_the_trivial_ones():
    ids = np.arange(40, dtype=np.int64)
    batch = next(stream_token_source(ids, 4, 3, shuffle=False, extras=ALL_EXTRAS))
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3]] * 3
    assert batch["loss_mask"].tolist() == [True] * 3
    assert batch["cu_seqlens"].tolist() == [0, 4, 8, 12] and batch["max_seqlen"] == 4


def test_explicit_empty_extras_stay_byte_identical_to_the_reference():
    ids = np.random.default_rng(2).integers(0, 50257, 3000).astype(np.uint16)
    for shuffle in (True, False):
        fast = stream_token_source(ids, 16, 64, epochs=2, shuffle=shuffle, seed=7, extras=())
        ref = reference.stream_token_source(ids, 16, 64, epochs=2, shuffle=shuffle, seed=7)
        tuple_batches_identical(fast, ref)


def test_stride_block_gives_non_overlapping_samples_sharing_one_token():
    ids = np.arange(1, 22, dtype=np.uint16)  # 21 tokens: samples of 5 tokens, 5 of them
    windows, labels = next(stream_token_source(ids, 4, 10, shuffle=False, stride=4))
    assert windows[:, 0].tolist() == [1, 5, 9, 13, 17]
    assert labels.tolist() == [5, 9, 13, 17, 21]


@pytest.mark.parametrize("stride", [30, 31, 2**63 - 1, 2**63, 2**70])
def test_a_stride_past_every_shard_gives_each_its_first_window(stride):
    # Found by the fuzz harness: a stride beyond int64 raised OverflowError.
    corpus = Corpus([np.arange(30), np.arange(100, 110), np.arange(200, 203)])
    stream = stream_token_source(corpus, 2, 8, shuffle=False, stride=stride)
    assert len(stream) == 1 and corpus.num_windows(2, stride) == 3
    windows, next_tokens = next(stream)
    assert windows.tolist() == [[0, 1], [100, 101], [200, 201]]
    assert next_tokens.tolist() == [2, 102, 202]
    assert next(iter(stream_token_source(corpus, 2, 8, stride=stride, seed=3)))[0].shape == (3, 2)


def test_the_torch_dataset_gives_the_oracles_batches_as_tensors():
    # Not importorskip("tokstream.torch"): without PyTorch it raises a plain ImportError naming
    # the extra, which importorskip turns into a warning (an error here), not a skip.
    pytest.importorskip("torch")
    import tokstream.torch as torch_dataset

    shards = [Shard(np.array([0, 1, 2, 9, 3, 4, 9, 5, 6, 7, 8, 9, 1], np.uint16))]
    run = {"stride": 2, "eos": 9, "windows": "within", "targets": "shifted", "extras": ALL_EXTRAS}
    dataset = torch_dataset.TokenDataset(shards[0].tokens, 2, 2, shuffle=False, **run)
    got = [
        {k: v if k == "max_seqlen" else v.numpy() for k, v in batch.items()} for batch in dataset
    ]
    assert_same_batches(got, expected_batches(shards, 2, 2, **run))


# ---------------------------------------------------------------------------------------------
# Memory: strided and within-document index spaces cost O(documents), never O(windows)

MB = 1 << 20


def traced_peak_beyond_batches(stream, batches: int) -> tuple[int, int]:
    """Peak traced bytes over ``batches`` batches, and the bytes of two batches."""
    tracemalloc.start()
    try:
        held = None
        for _, batch in zip(range(batches), stream, strict=False):
            held = batch
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    arrays = held.values() if isinstance(held, dict) else held
    return peak, 2 * sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))


@pytest.fixture(scope="module")
def sparse_tokens(tmp_path_factory) -> np.memmap:
    """10**8 uint16 tokens in a sparse file: zeros, with an eos (7) every 100,000 tokens."""
    path = tmp_path_factory.mktemp("sparse") / "tokens.bin"
    with open(path, "wb") as file:
        file.truncate(2 * 10**8)
    tokens = np.memmap(path, np.uint16, "r+")
    tokens[99_999::100_000] = 7
    tokens.flush()
    return np.memmap(path, np.uint16, "r")


@pytest.mark.slow
@pytest.mark.parametrize(
    "run",
    [
        pytest.param({"stride": 7}, id="strided_cross"),
        pytest.param({"stride": 3, "windows": "within", "documents": 10**4}, id="within_recorded"),
        pytest.param({"windows": "within", "eos": 7}, id="within_eos"),
        pytest.param({"stride": 5, "eos": 7, "extras": ALL_EXTRAS}, id="strided_eos_extras"),
    ],
)
def test_implicit_order_over_1e8_tokens_allocates_nothing_per_window(sparse_tokens, run):
    run = dict(run)
    documents = run.pop("documents", None)
    if documents:
        boundaries = np.linspace(0, sparse_tokens.shape[0], documents + 1).astype(np.int64)
        corpus = Corpus._from_arrays([sparse_tokens], ["tokens"], "tokens", [boundaries])
    else:
        corpus = Corpus.from_tokens(sparse_tokens)

    tracemalloc.start()
    try:
        stream = stream_token_source(corpus, 1024, 64, seed=1, targets="shifted", **run)
        _, made_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stream.options.permutation == "implicit"
    assert stream.num_windows > 10**7  # an int64 per window would be 80 MB or more
    peak, batches = traced_peak_beyond_batches(stream, 20)
    print(f"{run}: made in {made_peak / MB:.2f} MiB, 20 batches {(peak - batches) / MB:.2f} MiB")
    assert made_peak < 4 * MB, f"making the stream peaked at {made_peak / MB:.1f} MiB"
    assert peak - batches < 4 * MB, f"peak {peak / MB:.1f} MiB beyond two batches"


def test_an_empty_document_does_not_hide_the_next_documents_start():
    # Starts 3, 3 (an empty document) and 4: the kernel must see the start at 4 too.
    documents = [np.arange(1, 4), np.arange(0), np.arange(7, 8), np.arange(8, 12)]
    corpus = Corpus.from_documents(documents)
    batch = next(stream_token_source(corpus, 4, 2, shuffle=False, stride=2, extras=ALL_EXTRAS))
    assert batch["input_ids"].tolist() == [[1, 2, 3, 7], [3, 7, 8, 9]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0], [0, 0, 0, 1]]
    assert batch["cu_seqlens"].tolist() == [0, 3, 4, 5, 6, 8]
    assert batch["loss_mask"].tolist() == [False, True]


def test_document_pieces_counts_every_piece_and_never_writes_past_its_buffer():
    # Pieces of 2, 2, 1, 3 and 4 tokens (the last row one piece, found without a search).
    positions = np.array([[0, 1, 0, 1], [0, 0, 1, 2], [0, 1, 2, 3]], np.int64)
    assert document_pieces(positions, np.empty(0, np.int32)) == (5, 4)
    guarded = np.full(6, -1, np.int32)
    assert document_pieces(positions, guarded[:3]) == (5, 4)
    assert guarded.tolist() == [0, 2, 4, -1, -1, -1]
    starts = np.empty(5, np.int32)
    assert document_pieces(positions, starts) == (5, 4) and starts.tolist() == [0, 2, 4, 5, 8]
    # Values a caller scribbled over a reused buffer: wrong pieces, never a bad access.
    scribbled = np.random.default_rng(0).integers(-(2**40), 2**40, (9, 33))
    assert document_pieces(scribbled, np.empty(3, np.int32))[0] >= 9


@pytest.mark.parametrize("seed", range(20))
def test_document_pieces_match_the_zeros_of_the_position_ids(seed):
    # Valid position ids (a ramp restarting at random columns): the pieces start at every 0.
    rng = np.random.default_rng(seed)
    rows, block = int(rng.integers(1, 9)), int(rng.integers(1, 40))
    restarts = rng.random((rows, block)) < rng.choice([0.0, 0.05, 0.5, 1.0])
    restarts[:, 0] = True
    columns = np.broadcast_to(np.arange(block), (rows, block))
    last_restart = np.maximum.accumulate(np.where(restarts, columns, 0), axis=1)
    positions = np.ascontiguousarray(columns - last_restart)
    flat_starts = np.flatnonzero(positions.ravel() == 0)
    lengths = np.diff(np.append(flat_starts, positions.size))
    for capacity in (0, len(flat_starts) // 2, len(flat_starts)):
        starts = np.full(capacity + 1, -1, np.int32)
        found = document_pieces(positions, starts[:capacity])
        assert found == (len(flat_starts), int(lengths.max()))
        assert starts[:capacity].tolist() == flat_starts[:capacity].tolist()
        assert starts[capacity] == -1


@pytest.mark.parametrize("length", [1, 2, 7, 100, 4097])
@pytest.mark.parametrize("num_starts", [0, 1, 3, 50, 1000])
def test_document_buckets_bound_the_first_start_after_every_token(length, num_starts):
    rng = np.random.default_rng(length * 1009 + num_starts)
    starts = np.sort(rng.integers(1, length + 1, num_starts)).astype(np.int64)
    shift, buckets = document_buckets(starts, length)
    assert buckets.shape[0] == ((length - 1) >> shift) + 2
    assert buckets.shape[0] <= 2 * num_starts + 3  # O(documents)
    for token in range(length):
        first_after = np.searchsorted(starts, token, side="right")
        assert buckets[token >> shift] <= first_after <= buckets[(token >> shift) + 1]


@pytest.mark.parametrize("seed", range(6))
def test_window_starts_over_many_documents_match_a_searchsorted_oracle(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 60, rng.integers(1, 3000))
    corpus = Corpus.from_documents([np.zeros(n, np.uint8) for n in lengths])
    block, stride = int(rng.integers(1, 20)), int(rng.integers(1, 5))
    gather = WindowSpace(
        corpus, block, stride=stride, document_boundaries=corpus.document_boundaries
    )
    room = lengths - block - 1
    counts = np.where(room >= 0, room // stride + 1, 0)
    if gather.num_windows == 0:
        assert counts.sum() == 0
        return
    offsets = np.concatenate([[0], np.cumsum(counts)])
    windows = rng.integers(0, gather.num_windows, 5000)
    document = np.searchsorted(offsets, windows, side="right") - 1
    expected = corpus.document_boundaries[document] + (windows - offsets[document]) * stride
    np.testing.assert_array_equal(gather.token_starts(windows), expected)


@pytest.mark.skipif(not DEBUG_BUILD, reason="release builds run without bounds checks")
def test_debug_build_catches_a_document_buffer_short_of_the_batch():
    # Where the windows lie is checked by the lookup (test_kernel.py); the document kernel's
    # own indices are its buffers' rows.
    tokens = np.arange(10, dtype=np.int64)
    starts, shift, buckets = np.zeros(0, np.int64), *document_buckets(np.zeros(0, np.int64), 10)
    windows, targets = np.empty((1, 4), np.int64), np.empty((1, 4), np.int64)
    positions, continues = np.empty((0, 4), np.int64), np.empty((1, 4), np.uint8)
    with pytest.raises(IndexError):
        gather_documents(
            tokens,
            np.array([tokens.ctypes.data], np.uint64),
            np.array([0], np.int64),
            windows,
            None,
            targets,
            0,
            starts,
            buckets,
            shift,
            0,
            False,
            positions,  # no row for the batch's one window
            continues,
            None,
            np.empty((1, 3), np.int64),
        )
