"""``windows="packed"`` streams: the packing contract through the stream, its ranks, resume,
buffers and bad arguments."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.oracle_packing import fill_rows
from tests.test_packing import PAD, boundaries_of, check_contract, layouts, lognormal_lengths
from tokstream import Corpus, stream_token_source
from tokstream._kernels.packed_copy import piece_addresses

EXTRAS = ("document_ids", "position_ids", "cu_seqlens")


def corpus_of(lengths: list[int]) -> Corpus:
    """Documents of ``lengths`` whose tokens are their own indices (int64)."""
    boundaries = boundaries_of(lengths)
    tokens = np.arange(int(boundaries[-1]), dtype=np.int64)
    return Corpus.from_documents(
        [tokens[a:b] for a, b in zip(boundaries, boundaries[1:], strict=False)]
    )


def packed(corpus: Corpus, **overrides: Any):
    args: dict[str, Any] = {"block": 8, "batch_size": 3, "windows": "packed", "pad": PAD}
    args["extras"] = EXTRAS
    args.update(overrides)
    return stream_token_source(corpus, **args)


def joined(batches: list[dict[str, Any]], block: int) -> dict[str, Any]:
    """One epoch's batches as one batch (``cu_seqlens`` rebuilt over the joined rows)."""
    batch = {
        name: np.concatenate([b[name] for b in batches])
        for name in ("input_ids", "labels", "loss_mask", "document_ids", "position_ids")
    }
    offsets, base = [], 0
    for b in batches:
        offsets.extend((b["cu_seqlens"][:-1] + base).tolist())
        base += b["input_ids"].size
    batch["cu_seqlens"] = np.array([*offsets, base], np.int32)
    batch["max_seqlen"] = max(b["max_seqlen"] for b in batches)
    return batch


def same(a: Any, b: Any) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), name


@settings(max_examples=60, deadline=None)
@given(
    lengths=layouts,
    block=st.integers(1, 12),
    batch_size=st.integers(1, 5),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_each_epoch_of_a_stream_keeps_the_packing_contract(
    lengths, block, batch_size, shuffle, seed
):
    corpus = corpus_of(lengths)
    stream = packed(corpus, block=block, batch_size=batch_size, shuffle=shuffle, seed=seed)
    stream = packed(
        corpus, block=block, batch_size=batch_size, shuffle=shuffle, seed=seed, epochs=2
    )
    batches = list(stream)
    per_epoch = stream.batches_per_epoch
    assert len(batches) == 2 * per_epoch
    for epoch in range(2):
        epoch_batches = batches[epoch * per_epoch : (epoch + 1) * per_epoch]
        if epoch_batches:
            check_contract(corpus.document_boundaries, block, joined(epoch_batches, block))


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_share_the_rows_as_windows_are_shared(world_size, drop_last):
    corpus = corpus_of(lognormal_lengths(300, seed=4))
    options = {"block": 64, "drop_last": drop_last}
    single = list(packed(corpus, batch_size=world_size * 2, **options))
    ranks = [
        list(packed(corpus, batch_size=2, rank=r, world_size=world_size, **options))
        for r in range(world_size)
    ]
    assert len({len(r) for r in ranks}) == 1
    # Every full global batch is the single stream's; a partial last one is cut as the
    # ranks' epoch tail says (tokstream.plan.order), as for windows.
    full = [batch for batch in single if batch["input_ids"].shape[0] == world_size * 2]
    assert len(ranks[0]) - len(full) in (0, 1)
    for step, whole in enumerate(full):
        for r in range(world_size):
            assert np.array_equal(ranks[r][step]["input_ids"], whole["input_ids"][r::world_size])


def test_resuming_after_every_batch_continues_exactly():
    corpus = corpus_of(lognormal_lengths(200, seed=2))
    options = {"block": 32, "batch_size": 4, "epochs": 3, "seed": 5}
    whole = list(packed(corpus, **options))
    stream = packed(corpus, **options)
    for expected in whole:
        state = json.loads(json.dumps(stream.state_dict()))
        assert len(json.dumps(state)) < 16 * 1024
        stream = packed(corpus, **options)
        stream.load_state_dict(state)
        same(next(stream), expected)
    with pytest.raises(StopIteration):
        next(stream)


def test_elastic_resume_keeps_the_global_batches():
    corpus = corpus_of(lognormal_lengths(200, seed=3))
    options = {"block": 32, "epochs": 2, "seed": 1}
    single = list(packed(corpus, batch_size=4, **options))
    ranks = [packed(corpus, batch_size=2, rank=r, world_size=2, **options) for r in range(2)]
    for stream in ranks:
        for _ in range(5):
            next(stream)
    resumed = packed(corpus, batch_size=4, **options)
    resumed.load_state_dict(ranks[0].state_dict())
    for expected, got in zip(single[5:], resumed, strict=True):
        same(got, expected)


@pytest.mark.parametrize(
    "knobs", [{"prefetch": 2}, {"reuse_buffers": 2}, {"prefetch": 1, "reuse_buffers": 1}]
)
def test_prefetch_and_reused_buffers_give_the_same_batches(knobs):
    corpus = corpus_of(lognormal_lengths(150, seed=6))
    options = {"block": 16, "batch_size": 5, "epochs": 2}
    expected = [{k: np.copy(v) for k, v in b.items()} for b in packed(corpus, **options)]
    for got, want in zip(packed(corpus, **options, **knobs), expected, strict=True):
        same({k: np.copy(v) for k, v in got.items()}, want)


def test_a_packed_batch_is_a_dict_with_the_loss_mask_and_pad_defaults_to_eos():
    tokens = np.array([5, 6, 0, 7, 8, 9, 0, 4, 0], np.uint16)
    stream = stream_token_source(tokens, 4, 8, windows="packed", eos=0, shuffle=False)
    batch = next(stream)
    assert set(batch) == {"input_ids", "labels", "loss_mask"}
    assert batch["input_ids"].tolist() == [[7, 8, 9, 0], [5, 6, 0, 4]]
    assert batch["labels"].tolist() == [[8, 9, 0, 0], [6, 0, 4, 0]]
    assert batch["loss_mask"].tolist() == [[True, True, True, False], [True, True, False, True]]


def test_the_state_names_the_documents_packed():
    a, b = corpus_of([5, 9, 3, 12]), corpus_of([9, 5, 3, 12])
    state = packed(a).state_dict()
    with pytest.raises(ValueError, match="window_segments_sha256"):
        packed(b).load_state_dict(state)


BAD = [
    ({"targets": "next"}, ValueError, "targets='next'"),
    ({"pad": None}, ValueError, "needs pad="),
    ({"pad": 1 << 40, "dtype": np.uint16}, ValueError, "pad must be a token id"),
    ({"pad": -1, "dtype": np.uint8}, ValueError, "pad must be a token id"),
    ({"pad": 1.5}, ValueError, "pad must be an exact integer"),
    ({"pad": "0"}, TypeError, "pad"),
    ({"stride": 8}, ValueError, "stride=8"),
    ({"permutation": "materialized"}, ValueError, "permutation='materialized'"),
    ({"windows": "cross"}, ValueError, "pad needs windows='packed'"),
    ({"windows": "shelves"}, ValueError, "windows"),
]


@pytest.mark.parametrize(("overrides", "error", "message"), BAD)
def test_bad_packed_arguments_name_the_argument(overrides, error, message):
    dtype = overrides.pop("dtype", np.int64)
    corpus = Corpus.from_documents([np.arange(5, dtype=dtype), np.arange(3, dtype=dtype)])
    with pytest.raises(error, match=message):
        packed(corpus, **overrides)


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.uint64, np.int8])
def test_the_compiled_fill_is_the_oracle_s_over_shards_of_any_dtype(dtype):
    rng = np.random.default_rng(int(np.dtype(dtype).itemsize))
    shards = [rng.integers(0, 100, n).astype(dtype) for n in (40, 300, 7, 1000)]
    corpus = Corpus(shards)
    stream = stream_token_source(
        corpus, 16, 7, windows="packed", pad=101, epochs=2, extras=EXTRAS, seed=3
    )
    space, rows = stream._space, stream.batches_per_epoch
    for step, batch in enumerate(stream):
        epoch, first = divmod(step, rows)
        samples = np.arange(first * 7, min((first + 1) * 7, space.num_windows))
        pieces = space.packing.rows(epoch, samples)
        shard_starts = corpus.shard_starts
        expected = fill_rows(corpus.shards, shard_starts, pieces, 16, 101)
        same(batch, expected)


@pytest.mark.parametrize("ahead", [1, 3, 63, 2**40])
def test_requesting_rows_ahead_into_the_cache_never_changes_the_rows(ahead):
    rng = np.random.default_rng(5)
    corpus = Corpus.from_documents([rng.integers(0, 100, n) for n in rng.integers(1, 60, 300)])
    streams = [packed(corpus, block=16, batch_size=64, epochs=2, seed=1) for _ in range(2)]
    streams[0]._fill._rows_ahead = 0
    streams[1]._fill._rows_ahead = ahead
    for plain, ahead_batch in zip(*streams, strict=True):
        same(plain, ahead_batch)


def test_pieces_found_by_the_copy_are_the_position_ids_pieces_however_many_a_row_holds():
    # Rows of many short documents: more pieces than the first batch had room for; later
    # batches get more room. Either way cu_seqlens is where the position ids restart.
    rng = np.random.default_rng(2)
    corpus = Corpus.from_documents([rng.integers(0, 100, n) for n in rng.integers(2, 5, 2000)])
    stream = packed(corpus, block=64, batch_size=8, epochs=2, seed=4)
    assert stream._fill.pieces_a_row == 4
    for batch in stream:
        positions = batch["position_ids"]
        starts = np.flatnonzero(positions.ravel() == 0)
        assert batch["cu_seqlens"].tolist() == [*starts.tolist(), positions.size]
        assert batch["max_seqlen"] == int(np.diff(batch["cu_seqlens"]).max())
    assert stream._fill.pieces_a_row > 4


@pytest.mark.parametrize("room", [0, 1, 3, 50])
def test_the_copy_writes_as_many_piece_starts_as_it_has_room_for_and_counts_them_all(room):
    rng = np.random.default_rng(3)
    corpus = Corpus.from_documents([rng.integers(0, 100, n) for n in rng.integers(2, 9, 200)])
    stream = packed(corpus, block=16, batch_size=4, seed=1)
    expected = next(packed(corpus, block=16, batch_size=4, seed=1))["cu_seqlens"][:-1]
    fill = stream._fill
    buffers = {name: np.empty((4, 16), dtype) for name, dtype in
               [("input_ids", np.int64), ("labels", np.int64), ("position_ids", np.int64),
                ("document_ids", np.int32), ("mask", np.uint8)]}  # fmt: skip
    ((first, rows, (row_offsets, addresses, lengths), readable),) = fill.space.row_runs(
        np.arange(4, dtype=np.int64)
    )
    guarded = np.full(room + 4, -5, np.int32)
    with readable:
        fitted, pieces, longest = fill._fill_packed(
            fill._anchor, addresses, lengths, row_offsets, rows, 0, first, 16, PAD,
            buffers["input_ids"], buffers["labels"], buffers["mask"], buffers["position_ids"],
            buffers["document_ids"], 0, guarded[2 : 2 + room],
        )  # fmt: skip
    assert fitted and pieces == expected.shape[0] > 3
    assert longest == int(np.diff([*expected.tolist(), 64]).max())
    written = min(room, pieces)
    assert guarded[2 : 2 + written].tolist() == expected[:written].tolist()
    assert (guarded[:2] == -5).all() and (guarded[2 + written :] == -5).all()


@pytest.mark.parametrize("reuse_buffers", [0, 1])
@pytest.mark.parametrize("name", ["input_ids", "labels", "loss_mask", "position_ids"])
def test_a_packed_buffer_reshaped_through_base_is_refused_not_written_past(reuse_buffers, name):
    corpus = corpus_of([5, 9, 3, 12, 7] * 20)
    stream = packed(
        corpus, batch_size=4, reuse_buffers=reuse_buffers, extras=(*EXTRAS, "loss_mask")
    )
    batch = next(stream)
    batch[name].base.shape = (2, 16)
    del batch
    with pytest.raises(ValueError, match=r"not 8 wide.*reshaped"):
        for _ in range(3):
            next(stream)


@pytest.mark.parametrize(("rows", "row_base"), [([0, 1, 7], 0), ([-1], 0), ([3, 4], 4), ([9], 5)])
def test_the_copy_refuses_rows_outside_its_table_before_writing(rows, row_base):
    stream = packed(corpus_of([5, 9, 3, 12, 7] * 4), batch_size=3, shuffle=False)
    fill = stream._fill
    ((_, _, (row_offsets, addresses, lengths), readable),) = fill.space.row_runs(
        np.arange(3, dtype=np.int64)
    )
    table = (addresses, lengths, row_offsets[:5])  # rows 0 .. 3 of the group's table
    inputs, labels = np.zeros((2, 3, 8), np.int64)
    with readable, pytest.raises(ValueError, match="outside the table's 4 rows"):
        fill._fill_packed(
            fill._anchor, *table, np.array(rows, np.int64), row_base, 0, 8, PAD, inputs, labels,
            None, None, None,
        )  # fmt: skip
    assert not inputs.any() and not labels.any()


def _shard_tables(lengths: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    bases = (np.arange(len(lengths), dtype=np.uint64) + np.uint64(1)) << np.uint64(32)
    return starts, starts + np.asarray(lengths, np.int64), bases


def test_piece_addresses_find_each_piece_s_shard_past_empty_ones_as_numpy_does():
    rng = np.random.default_rng(0)
    shard_lengths = [0, 50, 0, 0, 7, 300, 0, 1, 90]
    shard_starts, shard_ends, bases = _shard_tables(shard_lengths)
    full = [s for s, n in enumerate(shard_lengths) if n]
    shard = rng.choice(full, 200)
    offsets = (rng.random(200) * np.asarray(shard_lengths)[shard]).astype(np.int64)
    lengths = 1 + (rng.random(200) * (np.asarray(shard_lengths)[shard] - offsets)).astype(np.int64)
    starts = shard_starts[shard] + offsets
    row_offsets = np.arange(0, 201, dtype=np.int64)
    addresses = np.empty(200, np.uint64)
    assert not piece_addresses(
        starts, lengths, row_offsets, 300, shard_starts, shard_ends, bases, 2, addresses
    )
    found = np.searchsorted(shard_starts, starts, side="right") - 1
    np.testing.assert_array_equal(found, shard)
    np.testing.assert_array_equal(addresses, bases[shard] + (offsets * 2).astype(np.uint64))


@pytest.mark.parametrize(
    ("starts", "lengths", "row_offsets", "broken"),
    [
        ([0, 5], [5, 0], [0, 2], 2),  # an empty piece
        ([-1, 5], [1, 1], [0, 2], 1),  # before the first shard
        ([8, 5], [3, 1], [0, 2], 1),  # across a shard's end
        ([25, 5], [6, 1], [0, 2], 1),  # past the corpus
        ([0, 5], [5, 5], [0, 2], -1),  # a row of 10 tokens in 9 slots
        ([0, 5], [5, 5], [0, 1, 0], -2),  # rows that go back
        ([0, 5], [5, 5], [0, 3], -1),  # a row past the pieces
        ([0, 5], [5, 5], [-1, 1], -1),  # a row before them
    ],
)
def test_piece_addresses_name_the_first_piece_or_row_that_breaks_the_kernel_s_promise(
    starts, lengths, row_offsets, broken
):
    shard_starts, shard_ends, bases = _shard_tables([10, 20])
    tables = [np.asarray(t, np.int64) for t in (starts, lengths, row_offsets)]
    addresses = np.empty(2, np.uint64)
    assert piece_addresses(*tables[:3], 9, shard_starts, shard_ends, bases, 8, addresses) == broken
    with pytest.raises(ValueError, match="lengths disagree"):
        piece_addresses(*tables[:3], 9, shard_starts, shard_ends, bases[:1], 8, addresses)


def test_a_group_table_outside_the_corpus_is_refused_before_any_row_is_copied(monkeypatch):
    stream = packed(corpus_of([5, 9, 3, 12, 7] * 4), batch_size=2)
    table = stream._space.packing.group_table(0, 0)
    bad = type(table)(table.row_offsets, table.starts + 10_000, table.lengths)
    monkeypatch.setattr(stream._space.packing, "group_table", lambda group, epoch: bad)
    with pytest.raises(RuntimeError, match="a packing bug"):
        next(stream)
