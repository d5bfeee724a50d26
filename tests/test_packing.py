"""The packing contract (tokstream.packing), checked against a slow oracle written from its rules.

Token ``t`` of the corpus has the value ``t`` (its index in the shards laid end to end), so a
batch says which tokens it holds; the oracle derives, from the document boundaries alone, which
labels an epoch must hold once each and which documents must stay whole.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import oracle_packing
from tests.oracle_packing import fill_rows
from tokstream import Corpus
from tokstream._kernels.pack import group_pieces
from tokstream.packing import Packing, RowPieces, best_fit, piece_counts

PAD = -1


def boundaries_of(lengths: list[int]) -> np.ndarray:
    boundaries = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=boundaries[1:])
    return boundaries


def epoch_batch(packing: Packing, epoch: int) -> dict[str, np.ndarray]:
    tokens = np.arange(int(packing.boundaries[-1]), dtype=np.int64)
    rows = packing.rows(epoch, np.arange(packing.num_rows, dtype=np.int64))
    return fill_rows((tokens,), np.zeros(1, np.int64), rows, packing.block, PAD)


def slots_of(batch: dict[str, np.ndarray]) -> np.ndarray:
    """Each row's ``block + 1`` slots: the inputs, then the last label."""
    return np.concatenate([batch["input_ids"], batch["labels"][:, -1:]], axis=1)


def check_contract(boundaries: np.ndarray, block: int, batch: dict[str, np.ndarray]) -> None:
    """Everything the documentation promises of one epoch's rows, token by token."""
    slots = slots_of(batch)
    rows, width = slots.shape
    lengths = np.diff(boundaries)
    # Every token of every document but its first is a label exactly once, predicted from the
    # token before it; nothing else is.
    expected = sorted(
        t for d, length in enumerate(lengths) for t in range(boundaries[d] + 1, boundaries[d + 1])
    )
    mask = batch["loss_mask"]
    got = batch["labels"][mask]
    assert sorted(got.tolist()) == expected
    assert (batch["input_ids"][mask] == got - 1).all()
    # Padding is never a label, and only ends rows; no row is all padding.
    assert not mask[batch["labels"] == PAD].any()
    for row in slots:
        padding = np.flatnonzero(row == PAD)
        assert padding.shape[0] < width
        if padding.shape[0]:
            assert padding[0] + padding.shape[0] == width
    # The extras follow the pieces: a piece is a run of consecutive tokens of one document
    # (or the padding), and a new one starts wherever a label is masked inside the row.
    # A slot starts a piece at a row's start, at a document's first token, where its token does
    # not follow the slot before's (the padding included), and where the padding begins.
    firsts = np.isin(slots, boundaries[:-1][lengths >= 2])
    follows = slots[:, 1:] == slots[:, :-1] + 1
    padding = slots == PAD
    starts = np.ones((rows, width), bool)
    starts[:, 1:] = np.where(padding[:, 1:], ~padding[:, :-1], firsts[:, 1:] | ~follows)
    assert (mask == ~starts[:, 1:] & ~padding[:, 1:]).all()
    # A document of 2 .. block + 1 tokens is whole in one row: its first token is in exactly one
    # piece start, followed by the rest. A longer one's pieces start at k * block.
    where = {int(slots[r, c]): (r, c) for r, c in zip(*np.nonzero(starts & ~padding), strict=True)}
    for d, length in enumerate(lengths):
        start = int(boundaries[d])
        if 2 <= length <= block + 1:
            r, c = where[start]
            assert (slots[r, c : c + length] == np.arange(start, start + length)).all()
        elif length > block + 1:
            for first in range(start, start + length - 1, block):
                r, c = where[first]
                end = min(first + block + 1, start + length)
                assert (slots[r, c : c + end - first] == np.arange(first, end)).all()
    document_ids = np.cumsum(starts, axis=1) - 1
    assert (batch["document_ids"] == document_ids[:, :block]).all()
    columns = np.arange(width)
    last_start = np.maximum.accumulate(np.where(starts, columns, 0), axis=1)
    assert (batch["position_ids"] == (columns - last_start)[:, :block]).all()
    flat = np.flatnonzero(starts[:, :block].ravel())
    assert batch["cu_seqlens"].tolist() == [*flat.tolist(), rows * block]
    assert batch["max_seqlen"] == int(np.diff(batch["cu_seqlens"]).max(initial=0))


layouts = st.one_of(
    st.lists(st.integers(0, 40), min_size=1, max_size=60),
    st.lists(st.integers(0, 3), min_size=1, max_size=30),
    st.tuples(st.integers(0, 500), st.lists(st.integers(0, 12), max_size=10)).map(
        lambda t: [t[0], *t[1]]
    ),
)


@settings(max_examples=150, deadline=None)
@given(
    lengths=layouts,
    block=st.integers(1, 17),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    group_documents=st.one_of(st.none(), st.integers(1, 9)),
)
def test_every_epoch_keeps_the_packing_contract(lengths, block, shuffle, seed, group_documents):
    packing = Packing(
        boundaries_of(lengths), block, shuffle=shuffle, seed=seed, group_documents=group_documents
    )
    for epoch in range(2):
        check_contract(packing.boundaries, block, epoch_batch(packing, epoch))


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.one_of(layouts, st.lists(st.integers(0, 90), min_size=1, max_size=300)),
    block=st.integers(1, 40),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    group_documents=st.one_of(st.none(), st.integers(1, 120)),
)
def test_every_group_table_is_the_rule_applied_in_numpy(
    lengths, block, shuffle, seed, group_documents
):
    packing = Packing(
        boundaries_of(lengths), block, shuffle=shuffle, seed=seed, group_documents=group_documents
    )
    for epoch in range(3):
        for group in range(packing.num_groups):
            got = packing.group_table(group, epoch)
            expected = oracle_packing.group_table(packing, group, epoch)
            for name, array in zip(RowPieces._fields, expected, strict=True):
                assert getattr(got, name).tolist() == array.tolist(), name


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("length", [2, 5, 9])
def test_documents_of_exactly_block_plus_one_tokens_fill_rows_alone(shuffle, length):
    block = length - 1
    packing = Packing(boundaries_of([length] * 30), block, shuffle=shuffle, seed=3)
    assert packing.num_rows == 30
    batch = epoch_batch(packing, 1)
    check_contract(packing.boundaries, block, batch)
    assert (batch["labels"] != PAD).all()


@pytest.mark.parametrize("placement", ["first", "last"])
def test_eos_boundaries_first_or_last_pack_every_document(placement):
    rng = np.random.default_rng(5)
    documents = [rng.integers(1, 50, int(n)) for n in rng.integers(1, 30, 40)]
    eos = np.array([0])
    joined = [np.concatenate([eos, d] if placement == "first" else [d, eos]) for d in documents]
    corpus = Corpus([np.concatenate(joined)])
    boundaries = corpus.boundaries_with_eos(0)
    packing = Packing(boundaries, 16, shuffle=True, seed=0)
    check_contract(boundaries, 16, epoch_batch(packing, 0))


def test_one_huge_document_is_cut_like_stride_block_windows():
    block = 8
    packing = Packing(boundaries_of([3, 1000, 4]), block, shuffle=True, seed=1)
    full, short = piece_counts(np.array([1000]), block)
    assert full.tolist() == [124] and short.tolist() == [8]  # 999 labels = 124 * 8 + 7
    check_contract(packing.boundaries, block, epoch_batch(packing, 0))


def test_a_corpus_without_documents_packs_each_shard_as_one():
    corpus = Corpus([np.arange(5), np.arange(7), np.arange(30)])
    packing = Packing(corpus.document_boundaries, 8, shuffle=False, seed=0)
    check_contract(corpus.document_boundaries, 8, epoch_batch(packing, 0))


def lognormal_lengths(count: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    sigma = np.sqrt(2 * np.log(900 / 500))  # median 500, mean 900
    return rng.lognormal(np.log(500), sigma, count).astype(int).tolist()


def test_shuffled_epochs_pack_different_rows_of_the_same_count():
    # A full piece fills its row alone every epoch; rows of several pieces are recombined.
    packing = Packing(boundaries_of(lognormal_lengths(3000)), 2048, shuffle=True, seed=0)
    shared = []
    for epoch in range(2):
        r = packing.rows(epoch, np.arange(packing.num_rows))
        pieces = [
            r.starts[r.row_offsets[i] : r.row_offsets[i + 1]] for i in range(packing.num_rows)
        ]
        shared.append({tuple(p.tolist()) for p in pieces if p.shape[0] > 1})
    assert len(shared[0] & shared[1]) < 0.3 * len(shared[0])


def test_unshuffled_epochs_are_the_corpus_order_packed():
    packing = Packing(boundaries_of(lognormal_lengths(500)), 1024, shuffle=False, seed=0)
    first, second = (packing.rows(e, np.arange(packing.num_rows)) for e in range(2))
    assert all((a == b).all() for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("block", [2048, 8192])
def test_lognormal_documents_pad_at_most_half_a_percent(block):
    lengths = lognormal_lengths(40_000, seed=block)
    for shuffle in (False, True):
        packing = Packing(boundaries_of(lengths), block, shuffle=shuffle, seed=0)
        full, short = piece_counts(np.array(lengths), block)
        tokens = int((full * (block + 1) + short).sum())
        assert 1 - tokens / (packing.num_rows * (block + 1)) <= 0.005


def test_any_samples_are_the_rows_of_the_whole_epoch():
    packing = Packing(boundaries_of(lognormal_lengths(2000, 1)), 256, shuffle=True, seed=9)
    whole = packing.rows(3, np.arange(packing.num_rows))
    samples = np.random.default_rng(0).permutation(packing.num_rows)[:50]
    fresh = Packing(packing.boundaries, 256, shuffle=True, seed=9)
    some = fresh.rows(3, samples)
    for i, sample in enumerate(samples.tolist()):
        low, high = whole.row_offsets[sample], whole.row_offsets[sample + 1]
        mine = slice(some.row_offsets[i], some.row_offsets[i + 1])
        assert some.starts[mine].tolist() == whole.starts[low:high].tolist()
        assert some.lengths[mine].tolist() == whole.lengths[low:high].tolist()


def test_best_fit_places_each_item_in_the_tightest_open_row():
    assert best_fit(np.array([6, 5, 4, 3, 2]), 10).tolist() == [0, 1, 0, 1, 1]
    assert best_fit(np.array([6, 5, 5, 6]), 10).tolist() == [0, 1, 1, 2]
    assert best_fit(np.array([], np.int64), 10).tolist() == []


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 200), data=st.data())
def test_best_fit_matches_its_definition(capacity, data):
    lengths = data.draw(st.lists(st.integers(1, capacity), max_size=80))
    got = best_fit(np.array(lengths, np.int64), capacity).tolist()
    assert got == oracle_packing.best_fit(lengths, capacity)


@pytest.mark.parametrize("lengths", [[0], [11], [-1]])
def test_best_fit_refuses_lengths_outside_the_capacity(lengths):
    with pytest.raises(ValueError, match="best_fit"):
        best_fit(np.array(lengths), 10)


@settings(max_examples=200, deadline=None)
@given(lengths=layouts, block=st.integers(1, 17), data=st.data())
def test_a_group_s_pieces_are_counted_as_piece_counts_counts_them(lengths, block, data):
    boundaries = boundaries_of(lengths)
    documents = np.array(
        data.draw(st.lists(st.integers(0, len(lengths) - 1), max_size=40)), np.int64
    )
    starts, full, short = np.full((3, documents.shape[0]), -7, np.int64)
    found = group_pieces(boundaries, documents, block, starts, full, short)
    expected_full, expected_short = piece_counts(np.diff(boundaries)[documents], block)
    assert starts.tolist() == boundaries[documents].tolist()
    assert full.tolist() == expected_full.tolist()
    assert short.tolist() == expected_short.tolist()
    assert found == (int(expected_full.sum()), int(np.count_nonzero(expected_short)))


@pytest.mark.parametrize(
    ("documents", "block", "rows", "message"),
    [
        ([0, 3], 4, 2, "document 3 outside"),  # past the last document
        ([-1], 4, 1, "document -1 outside"),
        ([0, 1], 4, 1, "lengths disagree"),
        ([0], 0, 1, "block < 1"),
    ],
)
def test_a_group_s_pieces_refuse_documents_outside_the_boundaries(documents, block, rows, message):
    boundaries = boundaries_of([5, 0, 9])
    starts, full, short = np.zeros((3, rows), np.int64)
    with pytest.raises(ValueError, match=message):
        group_pieces(boundaries, np.array(documents, np.int64), block, starts, full, short)
