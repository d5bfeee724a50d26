"""``tokstream.split``: a deterministic partition of a corpus by a keyed hash of each unit's index.

The oracle is the fuzz model's (``fuzz.split_model``: units assigned in pure Python, ``math.log``,
Python integers modulo ``2**64``, one unit at a time, and the corpus cut with slicing); the split
corpora must hold exactly its runs, in order, with their documents.
"""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokstream
from fuzz.split_model import model_split, split_owners
from tokstream import Corpus, Mixture, mix, split, stream_token_source, write_tokens
from tokstream.split import RANGE_TOKENS, assign


@pytest.fixture(scope="module", autouse=True, params=["listed runs", "runs read by a source"])
def runs_held(request):
    """Every test twice: the runs of a split as a tuple of views, and read through
    ``tokstream.split.SplitShards`` (what a split of more than ``LISTED_RUNS`` runs uses)."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "runs read by a source":
            patch.setattr(sys.modules["tokstream.split"], "LISTED_RUNS", 0)
        yield request.param


def oracle_split(shards, documents, fractions, seed, range_tokens):
    """``{name: [(tokens, document boundaries or None), ...]}``: the fuzz model's runs, as lists
    (``shards_of`` gives a split corpus's runs in the same form)."""
    has_documents = any(d is not None for d in documents)
    runs = model_split(shards, documents, fractions, seed, range_tokens)
    return {
        name: [(tokens.tolist(), bounds if has_documents else None) for tokens, bounds in name_runs]
        for name, name_runs in runs.items()
    }


def shards_of(corpus: Corpus):
    return [
        (shard.tolist(), None if (d := corpus.shard_documents(j)) is None else d.tolist())
        for j, shard in enumerate(corpus.shards)
    ]


def assert_matches_oracle(corpus, shards, documents, fractions, seed, range_tokens):
    result = split(corpus, fractions, seed=seed, range_tokens=range_tokens)
    expected = oracle_split(shards, documents, fractions, seed, range_tokens)
    assert list(result) == list(fractions)
    for name, runs in expected.items():
        got = result[name]
        assert got.dtype == corpus.dtype
        if runs:
            assert shards_of(got) == runs, name
        else:
            assert got.num_tokens == 0 and len(got.shards) == 1, name
    return result


# ------------------------------------------------------------------ against the oracle

fraction_dicts = st.dictionaries(
    st.sampled_from(["train", "valid", "test", "held", "x"]),
    st.floats(0.01, 5.0),
    min_size=1,
    max_size=4,
)


@st.composite
def corpora(draw):
    """Shards of 0-40 tokens, with documents (empty ones among them) or without."""
    num_shards = draw(st.integers(1, 4))
    shards = [
        np.arange(draw(st.integers(0, 40)), dtype=np.int32) + 1000 * j for j in range(num_shards)
    ]
    if draw(st.booleans()):
        documents = []
        for shard in shards:
            cuts = sorted(draw(st.lists(st.integers(0, len(shard)), max_size=8)))
            documents.append(np.array([0, *cuts, len(shard)], dtype=np.int64))
        if draw(st.booleans()):
            documents[0] = None  # a shard without recorded documents is one document
    else:
        documents = [None] * num_shards
    return shards, documents


@settings(max_examples=150, deadline=None)
@given(corpora(), fraction_dicts, st.integers(0, 2**32 - 1), st.integers(1, 12))
def test_split_corpora_are_the_oracles_runs_with_their_documents(
    corpus_and_documents, fractions, seed, range_tokens
):
    shards, documents = corpus_and_documents
    corpus = Corpus._from_arrays(shards, [f"s{j}" for j in range(len(shards))], "c", documents)
    assert_matches_oracle(corpus, shards, documents, fractions, seed, range_tokens)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 3000), fraction_dicts, st.integers(0, 2**32 - 1))
def test_assign_matches_the_oracle_unit_by_unit(num_units, fractions, seed):
    names = list(fractions)
    got = [names[i] for i in assign(num_units, fractions, seed)]
    assert got == split_owners(num_units, fractions, seed)


# ------------------------------------------------------------------ the stated properties


@settings(max_examples=100, deadline=None)
@given(fraction_dicts, st.text(min_size=1, max_size=5), st.floats(0.01, 5.0), st.integers(0, 99))
def test_adding_a_name_moves_units_only_into_it(fractions, new_name, new_fraction, seed):
    if new_name in fractions:
        return
    before = [list(fractions)[i] for i in assign(2000, fractions, seed)]
    larger = {**fractions, new_name: new_fraction}
    after = [list(larger)[i] for i in assign(2000, larger, seed)]
    assert all(a in (b, new_name) for a, b in zip(after, before, strict=True))


def test_the_order_of_the_names_does_not_change_the_split():
    forward = {"train": 0.8, "valid": 0.1, "test": 0.1}
    backward = dict(reversed(forward.items()))
    names_forward, names_backward = list(forward), list(backward)
    assert [names_forward[i] for i in assign(5000, forward, 3)] == [
        names_backward[i] for i in assign(5000, backward, 3)
    ]


def test_each_name_gets_its_fraction_of_the_units():
    # 200,000 units: a share's binomial standard deviation is at most 0.0012 here.
    fractions = {"train": 0.9, "valid": 0.07, "test": 0.03}
    owners = assign(200_000, fractions, seed=11)
    shares = np.bincount(owners, minlength=3) / owners.size
    np.testing.assert_allclose(shares, [0.9, 0.07, 0.03], atol=0.006)
    # A sum other than 1: the same shares, and the very same split (only ratios matter).
    scaled = {name: 10 * f for name, f in fractions.items()}
    np.testing.assert_array_equal(assign(200_000, scaled, seed=11), owners)


def test_the_split_is_a_partition_of_the_documents_and_covers_every_token():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 30, 500)
    documents = [rng.integers(0, 50_000, n).astype(np.uint16) for n in lengths]
    corpus = Corpus.from_documents(documents)
    parts = split(corpus, {"train": 0.8, "valid": 0.2}, seed=1)
    assert sum(p.num_tokens for p in parts.values()) == corpus.num_tokens
    # Every document is in one split, whole (documents are unique by content here, nearly).
    seen = sorted(
        tuple(shard[a:b].tolist())
        for part in parts.values()
        for j, shard in enumerate(part.shards)
        for a, b in zip(part.shard_documents(j)[:-1], part.shard_documents(j)[1:], strict=True)
    )
    assert seen == sorted(tuple(d.tolist()) for d in documents)
    assert all(part.shards[0].base is not None for part in parts.values())  # views, no copies


def test_the_same_seed_gives_the_same_split_and_another_seed_another():
    corpus = Corpus.from_documents([np.arange(5) + 10 * i for i in range(300)])
    first = split(corpus, {"a": 1, "b": 1}, seed=4)
    again = split(corpus, {"a": 1, "b": 1}, seed=4)
    other = split(corpus, {"a": 1, "b": 1}, seed=5)
    assert shards_of(first["a"]) == shards_of(again["a"]) != shards_of(other["a"])


def test_without_documents_equal_token_ranges_of_each_shard_are_split():
    shards = [np.arange(10 * RANGE_TOKENS + 7) % 5000, np.arange(3 * RANGE_TOKENS) % 5000]
    corpus = Corpus(shards)
    parts = split(corpus, {"train": 0.5, "valid": 0.5}, seed=2)
    owners = assign(11 + 3, {"train": 0.5, "valid": 0.5}, 2)
    assert sum(p.num_tokens for p in parts.values()) == corpus.num_tokens
    lengths = [len(s) for s in parts["valid"].shards]
    assert sum(lengths) == RANGE_TOKENS * int(owners[:10].sum() + owners[11:].sum()) + 7 * int(
        owners[10]
    )
    assert not parts["valid"].has_documents


def test_a_split_with_no_unit_is_one_empty_shard_and_streams_nothing():
    parts = split(Corpus.from_documents([np.arange(40)]), {"all": 1.0, "none": 1e-9})
    assert parts["all"].num_tokens == 40
    assert parts["none"].num_tokens == 0 and parts["none"].dtype == parts["all"].dtype


def test_a_split_streams_its_documents_windows_within_them():
    documents = [np.full(n, i, dtype=np.int32) for i, n in enumerate([9, 3, 12, 7, 9, 15, 8] * 5)]
    parts = split(Corpus.from_documents(documents), {"train": 0.7, "valid": 0.3}, seed=0)
    for part in parts.values():
        for windows, _ in stream_token_source(part, 4, 3, windows="within", seed=1):
            assert (windows == windows[:, :1]).all()  # one document's tokens per window


# ------------------------------------------------------------------ inputs


def test_paths_and_arrays_are_opened_as_corpora(tmp_path):
    tokens = np.arange(3 * RANGE_TOKENS, dtype=np.uint16)
    path = write_tokens(tmp_path / "t.npy", tokens)
    fractions = {"train": 0.6, "valid": 0.4}
    from_path = split(str(path), fractions, seed=7)
    from_list = split([path], fractions, seed=7)
    from_array = split(tokens, fractions, seed=7)
    for name in fractions:
        assert shards_of(from_path[name]) == shards_of(from_list[name])
        assert shards_of(from_path[name]) == shards_of(from_array[name])


def test_a_mixture_is_split_source_by_source_and_mixed_again():
    web = Corpus.from_documents([np.arange(7) + 100 * i for i in range(200)])
    code = Corpus.from_documents([np.arange(5) + 100_000 + 100 * i for i in range(100)])
    fractions = {"train": 0.9, "valid": 0.1}
    parts = split(mix({"web": web, "code": code}, {"web": 3, "code": 1}), fractions, seed=1)
    by_hand = {source: split(c, fractions, seed=1) for source, c in (("web", web), ("code", code))}
    for name in fractions:
        assert isinstance(parts[name], Mixture)
        assert parts[name].integer_weights == (3, 1)
        for source in ("web", "code"):
            assert shards_of(parts[name].sources[source]) == shards_of(by_hand[source][name])


def test_a_staged_mixture_is_split_and_mixed_again_with_its_stages():
    web = Corpus.from_documents([np.arange(7) + 100 * i for i in range(200)])
    code = Corpus.from_documents([np.arange(5) + 100_000 + 100 * i for i in range(100)])
    stages = [(0, {"web": 1}), (50, {"web": 1, "code": 3}), (90, {"code": 1})]
    mixture = mix({"web": web, "code": code}, stages)
    for part in split(mixture, {"train": 0.9, "valid": 0.1}, seed=1).values():
        assert part.integer_stages == ((0, (1, 0)), (50, (1, 3)), (90, (0, 1)))


def test_a_mixture_split_that_leaves_a_source_empty_is_a_value_error():
    big = Corpus.from_documents([np.arange(5) + 10 * i for i in range(100)])
    tiny = mix({"big": big, "one": Corpus.from_documents([np.arange(5)])}, {"big": 1, "one": 1})
    with pytest.raises(ValueError, match="of source 'one' received no tokens"):
        split(tiny, {"a": 1, "b": 1}, seed=0)


def test_a_split_of_many_runs_holds_arrays_of_runs_not_an_object_per_run():
    # 20,000 one-token documents split in half: about 5,000 runs each, past LISTED_RUNS.
    corpus = Corpus.from_documents([np.array([i], dtype=np.int32) for i in range(20_000)])
    split_module = sys.modules["tokstream.split"]
    for part in split(corpus, {"a": 1, "b": 1}, seed=3).values():
        assert len(part.shards) > split_module.LISTED_RUNS
        assert isinstance(part.source, split_module.SplitShards)
        assert part.document_boundaries.shape == (part.num_tokens + 1,)
        windows = np.concatenate([x[:, 0] for x, _ in stream_token_source(part, 1, 512)])
        assert set(windows.tolist()) < set(range(20_000))


def test_split_is_exported_from_tokstream():
    assert "split" in tokstream.__all__ and tokstream.split is split


@pytest.mark.parametrize(
    ("fractions", "kwargs", "error", "match"),
    [
        ([("train", 1.0)], {}, TypeError, "fractions must be a dict"),
        ({}, {}, ValueError, "fractions must name at least one split"),
        ({"train": 0.0}, {}, ValueError, r"fractions\['train'\] must be positive"),
        ({"train": -0.5}, {}, ValueError, r"fractions\['train'\] must be positive"),
        ({"train": float("nan")}, {}, ValueError, r"fractions\['train'\] must be finite"),
        ({"train": float("inf")}, {}, ValueError, r"fractions\['train'\] must be finite"),
        ({"train": "0.9"}, {}, TypeError, r"fractions\['train'\] must be a number"),
        ({"train": True}, {}, TypeError, r"fractions\['train'\] must be a number"),
        ({"train": 1e-320}, {}, ValueError, r"fractions\['train'\] must be between 2\*\*-1022"),
        ({"train": 2**2000}, {}, ValueError, r"fractions\['train'\] must be between 2\*\*-1022"),
        ({1: 0.5}, {}, TypeError, "split names must be str"),
        ({"": 0.5}, {}, ValueError, "split name must not be empty"),
        ({"train": 1}, {"seed": -1}, ValueError, "seed must be nonnegative"),
        ({"train": 1}, {"seed": 2**32}, ValueError, "seed must be at most"),
        ({"train": 1}, {"seed": 1.5}, ValueError, "seed must be an exact integer"),
        ({"train": 1}, {"range_tokens": 0}, ValueError, "range_tokens must be positive"),
        ({"train": 1}, {"range_tokens": "8"}, TypeError, "range_tokens must be an int"),
    ],
)
def test_bad_arguments_are_errors_naming_the_argument(fractions, kwargs, error, match):
    with pytest.raises(error, match=match):
        split(np.arange(100), fractions, **kwargs)


def test_bad_corpus_or_paths_is_an_error_naming_it():
    with pytest.raises(TypeError, match="corpus_or_paths"):
        split(np.array(["a", "b"]), {"train": 1})
    with pytest.raises(FileNotFoundError):
        split("/nonexistent/tokens.npy", {"train": 1})


def test_a_split_of_mapped_files_pickles_as_files_and_offsets_not_tokens(tmp_path):
    # Spawned DataLoader workers receive the corpus pickled: views of a mapped file must travel
    # as the file and their offsets, not as a copy of every token.
    path = write_tokens(tmp_path / "t.npy", np.arange(2_000_000) % 50_000)
    parts = split(tokstream.open_tokens(path), {"train": 0.9, "valid": 0.1}, range_tokens=1 << 14)
    for part in parts.values():
        restored = pickle.loads(pickle.dumps(part))
        assert len(pickle.dumps(part)) < 20_000 < part.num_tokens  # the tokens are 4 MB or more
        assert shards_of(restored) == shards_of(part)


def test_a_split_that_received_no_unit_is_one_empty_shard_of_no_documents():
    corpus = tokstream.Corpus([np.arange(100, dtype=np.uint16), np.arange(50, dtype=np.uint16)])
    parts = tokstream.split(corpus, {"all": 1.0, "none": 1e-12}, seed=0)
    empty = parts["none"]
    assert empty.num_tokens == 0 and len(empty.shards) == 1
    assert empty.document_boundaries.tolist() == [0]
    assert parts["all"].num_tokens == 150
