"""``windows="packed"`` over a :func:`tokstream.mix` mixture: each source packs its own documents,
the mixture's schedule picks whose row comes next."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_packing import PAD, check_contract, layouts, lognormal_lengths
from tests.test_packing_stream import EXTRAS, corpus_of, joined, packed, same
from tokstream import mix, stream_token_source


def rows_by_source(stream: Any, sources: int, wanted: list[int]) -> list[list[dict[str, Any]]]:
    """Each source's rows in the order the stream gives them (one-row batches), until source
    ``s`` has ``wanted[s]`` of them."""
    rows: list[list[dict[str, Any]]] = [[] for _ in range(sources)]
    for batch in stream:
        s = int(batch["source"][0])
        if len(rows[s]) < wanted[s]:
            rows[s].append({k: np.copy(v) for k, v in batch.items() if k != "source"})
        if all(len(r) >= w for r, w in zip(rows, wanted, strict=True)):
            break
    return rows


def test_the_first_source_packs_as_the_same_corpus_alone():
    a, b = corpus_of(lognormal_lengths(120, seed=1)), corpus_of(lognormal_lengths(90, seed=2))
    options = {"block": 64, "seed": 3, "epochs": 40}
    alone = [dict(batch) for batch in packed(a, batch_size=1, **options)]
    mixed = packed(
        mix({"a": a, "b": b}, {"a": 1, "b": 2}),
        batch_size=1,
        extras=(*EXTRAS, "source"),
        **options,
    )
    first, _ = rows_by_source(mixed, 2, [len(alone) // 2, 0])
    for got, expected in zip(first, alone, strict=False):
        same(got, expected)


@settings(max_examples=40, deadline=None)
@given(
    layout_a=layouts,
    layout_b=layouts,
    weights=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    block=st.integers(1, 12),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_each_source_epoch_keeps_the_packing_contract(
    layout_a, layout_b, weights, block, shuffle, seed
):
    corpora = [corpus_of(layout_a), corpus_of(layout_b)]
    lone = [packed(c, block=block, shuffle=shuffle, seed=seed) for c in corpora]
    if any(stream.num_windows == 0 for stream in lone):
        return  # a source without a packed row is refused (tested below)
    sizes = [stream.num_windows for stream in lone]
    stream = packed(
        mix({"a": corpora[0], "b": corpora[1]}, {"a": weights[0], "b": weights[1]}),
        block=block,
        batch_size=1,
        shuffle=shuffle,
        seed=seed,
        epochs=2 * max(sizes) * sum(weights),
        extras=(*EXTRAS, "source"),
    )
    # Two epochs of each source: each keeps the contract on its own.
    rows = rows_by_source(stream, 2, [2 * size for size in sizes])
    for corpus, size, source_rows in zip(corpora, sizes, rows, strict=True):
        for epoch in range(2):
            epoch_rows = source_rows[epoch * size : (epoch + 1) * size]
            check_contract(corpus.document_boundaries, block, joined(epoch_rows, block))


def test_the_sources_come_in_the_windows_mixtures_schedule():
    sources = {
        "a": corpus_of(lognormal_lengths(100, seed=4)),
        "b": corpus_of(lognormal_lengths(100, seed=5)),
        "c": corpus_of(lognormal_lengths(60, seed=6)),
    }
    weights = [(0, {"a": 1, "b": 3, "c": 1}), (40, {"a": 2, "c": 1})]
    common = {"samples": 97, "epochs": 2, "extras": ("source",), "batch_size": 8}
    windows = stream_token_source(mix(sources, weights), 16, **common)
    rows = packed(mix(sources, weights), block=16, **common)
    expected = np.concatenate([batch["source"] for batch in windows])
    got = np.concatenate([batch["source"] for batch in rows])
    assert got.tolist() == expected.tolist()
    assert 1 not in got[40:97].tolist()  # the second stage leaves "b" out


def test_resuming_a_packed_mixture_after_every_batch_continues_exactly():
    sources = {"a": corpus_of(lognormal_lengths(80, seed=7)), "b": corpus_of([3, 40, 2, 9])}
    mixture = mix(sources, {"a": 2, "b": 1})
    options = {"block": 16, "batch_size": 3, "epochs": 3, "seed": 2, "extras": (*EXTRAS, "source")}
    whole = list(packed(mixture, **options))
    stream = packed(mixture, **options)
    for expected in whole:
        state = json.loads(json.dumps(stream.state_dict()))
        assert len(json.dumps(state)) < 16 * 1024
        stream = packed(mixture, **options)
        stream.load_state_dict(state)
        same(next(stream), expected)
    with pytest.raises(StopIteration):
        next(stream)


@pytest.mark.parametrize("knobs", [{"prefetch": 2}, {"rank": 1, "world_size": 2}])
def test_ranks_and_prefetch_share_the_packed_mixture_rows(knobs):
    sources = {"a": corpus_of(lognormal_lengths(70, seed=8)), "b": corpus_of([30] * 20)}
    mixture = mix(sources, {"a": 1, "b": 1})
    options = {"block": 16, "epochs": 2, "extras": (*EXTRAS, "source", "origin")}
    world = knobs.get("world_size", 1)
    single = [
        {k: np.copy(v) for k, v in b.items()} for b in packed(mixture, batch_size=4, **options)
    ]
    got = packed(mixture, batch_size=4 // world, **options, **knobs)
    rank = knobs.get("rank", 0)
    for whole, batch in zip(single, got, strict=False):
        for name in ("input_ids", "labels", "loss_mask", "source", "origin"):
            assert np.array_equal(batch[name], whole[name][rank::world]), name


def test_the_origin_of_a_packed_mixture_row_is_in_the_mixtures_corpus():
    a, b = corpus_of([5, 9, 3]), corpus_of([7, 4, 6, 8])
    stream = packed(mix({"a": a, "b": b}, {"a": 1, "b": 1}), extras=("source", "origin"))
    for batch in stream:
        for source, (shard, token), row in zip(
            batch["source"], batch["origin"], batch["input_ids"], strict=True
        ):
            assert shard == source  # one shard each
            assert row[0] == token  # a token's value is its index in its source


def test_a_source_without_a_packed_row_is_refused_naming_it():
    sources = {"a": corpus_of([5, 6]), "b": corpus_of([1, 0, 1])}
    with pytest.raises(ValueError, match=r"sources\['b'\] holds no document of at least 2"):
        packed(mix(sources, {"a": 1, "b": 1}))


def test_pad_is_written_in_the_padding_of_every_source():
    sources = {"a": corpus_of([3, 4]), "b": corpus_of([2, 2, 2])}
    for batch in packed(mix(sources, {"a": 1, "b": 1}), block=10, batch_size=2):
        assert (batch["input_ids"][~batch["loss_mask"]][1:] == PAD).any()
