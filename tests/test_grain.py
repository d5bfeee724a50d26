"""tokstream.grain: Grain's own datasets, transformations, prefetch and checkpoints are the
counterparts; :func:`tokstream.stream_token_source` is the oracle of every batch and sample."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

grain = pytest.importorskip("grain")

from tokstream import Corpus, mix, stream_token_source  # noqa: E402
from tokstream.grain import TokenIterDataset, TokenMapDataset  # noqa: E402

RNG = np.random.default_rng(0)
TOKENS = RNG.integers(0, 50_000, 6_000).astype(np.uint16)
DOCUMENTS = Corpus.from_documents(
    [RNG.integers(1, 50_000, n).astype(np.uint16) for n in RNG.integers(3, 90, 150)]
)


def _mixture():
    return mix({"a": TOKENS[:4_000], "b": DOCUMENTS}, {"a": 0.7, "b": 0.3})


# Every kind of batch a stream yields: (windows, next), shifted targets, int32, documents with
# extras, packed rows, a mixture, stages, strided windows.
KINDS = {
    "array": (lambda: TOKENS, dict(seed=3)),
    "shifted-int32": (lambda: TOKENS, dict(targets="shifted", out_dtype="int32", shuffle=False)),
    "within-extras": (
        lambda: DOCUMENTS,
        dict(windows="within", extras=("position_ids", "loss_mask", "cu_seqlens", "origin")),
    ),
    "packed": (lambda: DOCUMENTS, dict(windows="packed", pad=0, extras=("document_ids",))),
    "mixture": (_mixture, dict(extras=("source",), samples=900)),
    "stages": (
        lambda: mix(
            {"a": TOKENS[:3_000], "b": TOKENS[3_000:]},
            [(0, {"a": 1.0, "b": 0.0}), (200, {"a": 0.2, "b": 0.8})],
        ),
        dict(extras=("source",), samples=700),
    ),
    "strided-eos": (lambda: TOKENS, dict(stride=16, eos=int(TOKENS[7]), drop_last=True)),
}


def assert_same_batch(got, expected) -> None:
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys()
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
            if isinstance(expected[name], np.ndarray):
                assert got[name].dtype == expected[name].dtype, name
    else:
        assert len(got) == len(expected) == 2
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype


def assert_same_batches(got, expected) -> None:
    got, expected = list(got), list(expected)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert_same_batch(a, b)


# ---- TokenIterDataset: the stream's batches, Grain's state


@pytest.mark.parametrize("kind", list(KINDS))
def test_iterating_yields_exactly_the_batches_of_stream_token_source(kind):
    source, options = KINDS[kind]
    dataset = TokenIterDataset(source(), 32, 8, epochs=2, **options)
    assert isinstance(dataset, grain.IterDataset)
    iterator = iter(dataset)
    assert isinstance(iterator, grain.DatasetIterator)
    assert_same_batches(iterator, stream_token_source(source(), 32, 8, epochs=2, **options))


@settings(max_examples=25, deadline=None)
@given(
    block=st.integers(1, 40),
    batch_size=st.integers(1, 9),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    stop=st.integers(0, 30),
    rank_world=st.sampled_from([(0, 1), (1, 2), (2, 3)]),
)
def test_a_state_taken_anywhere_restores_the_exact_next_batches(
    block, batch_size, shuffle, drop_last, seed, stop, rank_world
):
    rank, world_size = rank_world
    options = dict(
        epochs=2, shuffle=shuffle, drop_last=drop_last, seed=seed, rank=rank, world_size=world_size
    )
    tokens = TOKENS[:400]
    iterator = iter(TokenIterDataset(tokens, block, batch_size, **options))
    for _ in range(stop):
        if next(iterator, None) is None:
            break
    state = json.loads(json.dumps(iterator.get_state()))  # what Grain's checkpoint writes
    rest = list(iterator)
    restored = iter(TokenIterDataset(tokens, block, batch_size, **options))
    restored.set_state(state)
    assert_same_batches(restored, rest)


def test_composed_with_map_filter_and_prefetch_the_state_restores_exactly():
    def pipeline():
        dataset = TokenIterDataset(DOCUMENTS, 16, 4, windows="packed", pad=0, seed=5, epochs=3)
        dataset = dataset.map(lambda batch: {**batch, "tokens": batch["input_ids"].sum()})
        dataset = dataset.filter(lambda batch: batch["tokens"] % 3 != 0)
        return grain.experimental.ThreadPrefetchIterDataset(dataset, prefetch_buffer_size=3)

    iterator = iter(pipeline())
    for _ in range(7):
        next(iterator)
    state = iterator.get_state()
    rest = list(iterator)
    assert rest
    restored = iter(pipeline())
    restored.set_state(state)
    assert_same_batches(restored, rest)


def test_a_checkpoint_made_with_grains_orbax_handler_restores_the_next_batch(tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    source, options = KINDS["mixture"]
    iterator = iter(TokenIterDataset(source(), 32, 8, epochs=3, **options))
    for _ in range(11):
        next(iterator)
    manager = ocp.CheckpointManager(tmp_path / "checkpoints")
    manager.save(11, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(iterator)))
    manager.wait_until_finished()
    expected = [next(iterator) for _ in range(5)]

    restored = iter(TokenIterDataset(source(), 32, 8, epochs=3, **options))
    manager.restore(
        manager.latest_step(),
        args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(restored)),
    )
    assert_same_batches([next(restored) for _ in range(5)], expected)
    manager.close()


def test_a_state_saved_under_one_process_count_loads_under_another():
    options = dict(seed=9, epochs=2)
    ranks = [iter(TokenIterDataset(TOKENS, 24, 5, rank=r, world_size=2, **options)) for r in (0, 1)]
    for _ in range(13):
        for iterator in ranks:
            next(iterator)
    state = ranks[0].get_state()
    # The ranks stand at one global position; only the record of who saved it differs.
    assert {**state, "rank": 1} == ranks[1].get_state()
    for world_size in (1, 3):
        for rank in range(world_size):
            dataset = TokenIterDataset(TOKENS, 24, 7, rank=rank, world_size=world_size, **options)
            iterator = iter(dataset)
            iterator.set_state(state)
            expected = stream_token_source(
                TOKENS, 24, 7, rank=rank, world_size=world_size, **options
            )
            expected.load_state_dict(state)
            assert_same_batches(iterator, expected)


def test_a_state_of_another_configuration_is_a_value_error_and_leaves_the_iterator_be():
    iterator = iter(TokenIterDataset(TOKENS, 16, 4, seed=1))
    other = iter(TokenIterDataset(TOKENS, 16, 4, seed=2))
    next(iterator)
    next(other)
    before = iterator.get_state()
    with pytest.raises(ValueError, match="seed"):
        iterator.set_state(other.get_state())
    with pytest.raises(TypeError):
        iterator.set_state("not a state")
    assert iterator.get_state() == before
    expected = stream_token_source(TOKENS, 16, 4, seed=1)
    next(expected)
    assert_same_batch(next(iterator), next(expected))


def test_rank_and_world_size_default_to_jax_processes_and_explicit_ones_win():
    pytest.importorskip("jax")
    import jax

    dataset = TokenIterDataset(TOKENS, 16, 4, seed=1)
    assert str(dataset).startswith(f"TokenIterDataset(rank={jax.process_index()}/")
    assert_same_batches(
        TokenIterDataset(TOKENS, 16, 4, seed=1, rank=1, world_size=3),
        stream_token_source(TOKENS, 16, 4, seed=1, rank=1, world_size=3),
    )


def test_slices_share_out_the_process_share_as_torch_workers_do():
    parts, tokens = [], np.arange(3_000)  # a window's first token is its position
    for worker in range(3):
        dataset = TokenIterDataset(tokens, 16, 4, rank=1, world_size=2, seed=4)
        dataset.set_slice(slice(worker, None, 3))
        dataset.set_slice(slice(worker, None, 3))  # a slice replaces, never composes
        expected = stream_token_source(tokens, 16, 4, rank=3 + worker, world_size=6, seed=4)
        batches = list(dataset)
        assert_same_batches(batches, expected)
        parts += [windows[:, 0] for windows, _ in batches]
    starts = np.concatenate(parts)
    assert len(np.unique(starts)) == len(starts) == ((len(tokens) - 16) // 6) * 3


@pytest.mark.parametrize(
    "bad", [slice(3, None, 3), slice(0, 5, 2), slice(-1, None, 2), slice(0, None, 0), slice("a")]
)
def test_a_slice_that_is_not_a_worker_of_workers_is_a_value_error(bad):
    dataset = TokenIterDataset(TOKENS, 16, 4)
    with pytest.raises(ValueError, match="slice"):
        dataset.set_slice(bad)


@pytest.mark.parametrize(
    ("arguments", "options", "error", "names"),
    [
        ((TOKENS, 0, 4), {}, ValueError, "block"),
        ((TOKENS, 16, "4"), {}, TypeError, "batch_size"),
        ((TOKENS, 16, 4), {"windows": "nope"}, ValueError, "windows"),
        ((TOKENS, 16, 4), {"rank": 2, "world_size": 2}, ValueError, "rank"),
        ((TOKENS, 16, 4), {"colour": 1}, TypeError, "colour"),
    ],
)
def test_bad_arguments_are_the_streams_errors_when_the_dataset_is_made(
    arguments, options, error, names
):
    with pytest.raises(error, match=names):
        TokenIterDataset(*arguments, **options)


def test_mp_prefetch_workers_yield_each_sample_once_and_a_mid_run_checkpoint_restores():
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # what absl.app.run does; Grain's workers read its flags
    tokens = np.arange(3_000, dtype=np.int64)

    def pipeline():
        dataset = TokenIterDataset(tokens, 8, 16, seed=2, rank=1, world_size=2)
        return dataset.map(lambda b: b[0]).mp_prefetch(grain.MultiprocessingOptions(num_workers=2))

    iterator = iter(pipeline())
    seen, state, taken = [], None, 0
    for windows in iterator:
        seen.append(windows[:, 0].copy())
        if len(seen) == 20:
            state, taken = iterator.get_state(), sum(map(len, seen))
    iterator.close()
    starts = np.concatenate(seen)
    # Process 1 of 2, 2 workers: effective ranks 2 and 3 of 4, the last n % 4 positions skipped.
    windows = len(tokens) - 8
    expected = [
        windows[:, 0]
        for rank in (2, 3)
        for windows, _ in stream_token_source(tokens, 8, 16, seed=2, rank=rank, world_size=4)
    ]
    assert len(starts) == len(np.unique(starts)) == (windows // 4) * 2
    assert set(starts) == set(np.concatenate(expected))
    restored = iter(pipeline())
    restored.set_state(state)
    rest = np.concatenate([windows[:, 0].copy() for windows in restored])
    restored.close()
    np.testing.assert_array_equal(rest, starts[taken:])


# ---- TokenMapDataset: O(1) samples of the unshuffled space


@pytest.mark.parametrize("kind", list(KINDS))
def test_sample_i_is_the_ith_row_of_the_unshuffled_stream(kind):
    source, options = KINDS[kind]
    options = {k: v for k, v in options.items() if k not in ("seed", "shuffle", "drop_last")}
    dataset = TokenMapDataset(source(), 32, **options)
    assert isinstance(dataset, grain.MapDataset)
    rows = [
        _rows(batch) for batch in stream_token_source(source(), 32, 16, shuffle=False, **options)
    ]
    rows = [row for batch in rows for row in batch]
    assert len(dataset) == len(rows)
    order = np.random.default_rng(1).permutation(len(rows))[:150]
    for index in [*order, 0, len(rows) - 1]:
        _assert_same_sample(dataset[int(index)], rows[index])
    _assert_same_sample(dataset[len(rows) + 2], rows[2])  # the next epoch's, as Grain indexes


def _rows(batch):
    if isinstance(batch, dict):
        count = len(batch["input_ids"])
        return [
            {k: v[i] for k, v in batch.items() if k not in ("cu_seqlens", "max_seqlen")}
            for i in range(count)
        ]
    windows, targets = batch
    return list(zip(windows, targets, strict=True))


def _assert_same_sample(got, expected):
    if isinstance(expected, dict):
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
            assert got[name].dtype == expected[name].dtype
    else:
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype


def test_a_packed_rows_pieces_are_its_own():
    dataset = TokenMapDataset(DOCUMENTS, 32, windows="packed", pad=0, extras=("cu_seqlens",))
    for index in (0, 5, len(dataset) - 1):
        sample = dataset[index]
        positions = sample["position_ids"] if "position_ids" in sample else None
        cu_seqlens = sample["cu_seqlens"]
        assert cu_seqlens[0] == 0 and cu_seqlens[-1] == 32
        assert sample["max_seqlen"] == int(np.diff(cu_seqlens).max())
        assert positions is None or positions.shape == (32,)


def test_grains_shuffle_batch_and_sharding_compose_with_the_samples():
    tokens = np.arange(2_000)  # a window's first token is its sample index
    dataset = TokenMapDataset(tokens, 16, targets="shifted")
    shard = dataset[1::2]  # what ds[jax.process_index()::jax.process_count()] makes
    assert isinstance(shard, grain.MapDataset) and len(shard) == len(dataset) // 2
    batches = shard.shuffle(seed=0).batch(8)
    starts = []
    for windows, shifted in batches:
        assert windows.shape == shifted.shape == (8, 16)
        np.testing.assert_array_equal(windows[:, 1:], shifted[:, :-1])
        starts += windows[:, 0].tolist()
    assert sorted(starts) == list(range(1, len(dataset), 2))


def test_the_map_dataset_pickles_for_grain_workers():
    dataset = TokenMapDataset(DOCUMENTS, 16, windows="within")
    first = dataset[7]
    copy = pickle.loads(pickle.dumps(dataset))
    _assert_same_sample(copy[7], first)
    assert len(copy) == len(dataset)


@pytest.mark.parametrize(
    "option",
    [
        "batch_size",
        "shuffle",
        "epochs",
        "rank",
        "world_size",
        "drop_last",
        "permutation",
        "prefetch",
        "reuse_buffers",
    ],
)
def test_an_option_grain_owns_is_a_value_error_naming_it(option):
    with pytest.raises(ValueError, match=f"takes no {option}"):
        TokenMapDataset(TOKENS, 16, **{option: 1})


@pytest.mark.parametrize("index", ["3", 1.5, None])
def test_an_index_that_is_not_an_int_is_a_type_error(index):
    with pytest.raises(TypeError, match="index"):
        TokenMapDataset(TOKENS, 16)[index]
