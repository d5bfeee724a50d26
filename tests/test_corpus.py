"""The corpus: shards kept in place in their own dtype, and the window index space over them.

The contract: integer shards are referenced, not copied, unless they are byte-swapped or strided
(then copied once, to native contiguous memory); every shard has one dtype; a shard of length
``L`` holds ``max(L - block, 0)`` windows and no window crosses into the next shard.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import KERNEL_DTYPES, assert_same_batches, sharded_oracle_batches
from tokstream import Corpus, reference, stream_token_source
from tokstream._frozen import frozen

# ---------------------------------------------------------------------------------------------
# Shards in place


def test_contiguous_native_int64_corpus_is_not_copied():
    ids = np.arange(100, dtype=np.int64)
    assert Corpus.from_tokens(ids).shards[0] is ids
    stream = stream_token_source(ids, 4, 8)
    assert stream.corpus.shards[0] is ids


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_integer_corpus_is_read_in_its_own_dtype(dtype):
    ids = np.arange(50).astype(dtype)
    assert Corpus.from_tokens(ids).shards[0] is ids


def test_byte_swapped_and_strided_inputs_are_copied_once_to_native_contiguous():
    swapped = np.arange(20, dtype=">i4")
    strided = np.arange(40, dtype=np.int64)[::2]
    for ids in (swapped, strided):
        shard = Corpus.from_tokens(ids).shards[0]
        assert shard.flags.c_contiguous and shard.dtype.isnative
        assert shard.tolist() == ids.tolist()


def test_a_non_contiguous_array_is_copied_once_into_a_contiguous_one():
    ids = np.arange(1000, dtype=np.uint16)
    strided = ids[::2]
    corpus = Corpus.from_tokens(strided)
    shard = corpus.shards[0]
    assert not np.shares_memory(shard, ids)
    assert shard.flags.c_contiguous and shard.dtype == np.uint16
    assert np.array_equal(shard, strided)
    assert_same_batches(
        stream_token_source(corpus, 8, 40, seed=1, permutation="materialized"),
        reference.stream_token_source(strided, 8, 40, seed=1),
    )


def test_a_corpus_is_passed_through_from_tokens_unchanged():
    corpus = Corpus([np.arange(10), np.arange(5)])
    assert Corpus.from_tokens(corpus) is corpus


@pytest.mark.parametrize(
    ("shards", "error", "message"),
    [
        pytest.param(np.arange(10), TypeError, "shards must be a sequence", id="bare_array"),
        pytest.param("tokens", TypeError, "shards must be a sequence", id="string"),
        pytest.param(7, TypeError, "shards must be a sequence", id="integer"),
        pytest.param([], ValueError, "at least one shard", id="no_shards"),
        pytest.param([np.arange(3), np.ones((2, 2))], ValueError, r"shards\[1\]", id="2d_shard"),
        pytest.param(
            [np.arange(3, dtype=np.uint16), np.arange(3, dtype=np.uint32)],
            ValueError,
            r"mix token dtypes.*shards\[1\] is uint32",
            id="mixed_dtypes",
        ),
    ],
)
def test_bad_shards_are_rejected_naming_them(shards, error, message):
    with pytest.raises(error, match=message):
        Corpus(shards)


# ---------------------------------------------------------------------------------------------
# The window index space


def test_windows_per_shard_and_their_offsets():
    corpus = Corpus([np.arange(10), np.arange(3), np.arange(7)])
    assert corpus.lengths.tolist() == [10, 3, 7] and corpus.num_tokens == len(corpus) == 20
    assert corpus.window_offsets(4).tolist() == [0, 6, 6, 9]
    assert corpus.num_windows(4) == 9
    assert corpus.num_windows(2**70) == 0  # a block longer than every shard leaves none


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=5),
    block=st.integers(1, 9),
    batch_size=st.integers(1, 12),
    epochs=st.integers(0, 3),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    targets=st.sampled_from(["next", "shifted"]),
)
def test_sharded_batches_match_the_oracle_and_never_cross_a_shard(
    lengths, block, batch_size, epochs, shuffle, seed, targets
):
    # Shard j holds j * 1000 + position, so a window that crossed shards would show it.
    shards = [(np.arange(n) + 1000 * j).astype(np.uint16) for j, n in enumerate(lengths)]
    stream = stream_token_source(
        Corpus(shards),
        block,
        batch_size,
        epochs=epochs,
        shuffle=shuffle,
        seed=seed,
        targets=targets,
        permutation="materialized",
    )
    actual = assert_same_batches(
        stream, sharded_oracle_batches(shards, block, batch_size, epochs, shuffle, seed, targets)
    )
    for windows, _ in actual:
        assert np.all(windows // 1000 == windows[:, :1] // 1000)


@pytest.mark.parametrize("num_shards", [2, 8, 9, 30])
def test_the_gather_reads_every_shard_alike_with_few_or_many_shards(num_shards):
    # Up to 8 shards the gather groups a batch's rows with a pass per shard, beyond by a sort.
    rng = np.random.default_rng(num_shards)
    shards = [rng.integers(0, 1000, int(rng.integers(3, 40))) for _ in range(num_shards)]
    stream = stream_token_source(
        Corpus(shards), 2, 16, epochs=2, seed=1, permutation="materialized"
    )
    assert_same_batches(stream, sharded_oracle_batches(shards, 2, 16, 2, True, 1))


# ---------------------------------------------------------------------------------------------
# What a stream's bounds come from


def _bounds_arrays(corpus):
    return {
        "lengths": corpus.lengths,
        "document_boundaries": corpus.document_boundaries,
        "shard_starts": corpus.shard_starts,
        "document_lengths": corpus.document_lengths,
    }


@pytest.mark.parametrize("pickled", [False, True], ids=["made", "unpickled"])
def test_the_arrays_a_stream_is_bounded_by_cannot_be_made_writeable(pickled):
    corpus = Corpus([np.arange(30), np.arange(20)])
    corpus = Corpus._from_arrays(
        list(corpus.shards), ["a", "b"], "shards", [np.array([0, 10, 30]), None]
    )
    if pickled:
        corpus = pickle.loads(pickle.dumps(corpus))
    for name in ("lengths", "document_boundaries"):
        array = getattr(corpus, name)
        # Neither the array nor anything it is a view of can be made writeable.
        while isinstance(array, np.ndarray):
            with pytest.raises(ValueError, match="WRITEABLE"):
                array.setflags(write=True)
            array = array.base
    # The arrays computed from them are the caller's own copies: editing one changes nothing.
    for array in _bounds_arrays(corpus).values():
        if array.flags.writeable:
            array[...] = 10**12
    assert corpus.lengths.tolist() == [30, 20]
    assert corpus.document_boundaries.tolist() == [0, 10, 30, 50]


def test_a_frozen_array_is_frozen_again_without_a_copy_and_anything_else_is_copied():
    array = frozen(np.arange(10, dtype=np.int64))
    assert frozen(array) is array and frozen(array[2:5]).base is array.base
    # Memory someone can still write, or a strided view, is copied into immutable memory.
    mutable = bytearray(np.arange(10, dtype=np.int64).tobytes())
    for source in (np.frombuffer(mutable, np.int64), array[::2], np.arange(4)):
        copy = frozen(source)
        assert copy is not source and np.array_equal(copy, source)
        root = copy
        while isinstance(root, np.ndarray):
            root = root.base
        assert type(root) is bytes
    copy = frozen(np.frombuffer(mutable, np.int64))
    mutable[8:16] = bytes(8)
    assert copy[1] == 1


# A caller's worst: every array the corpus hands out edited to point far outside the shards,
# every public attribute of a corpus, a mixture and a stream reassigned. In a child process,
# since a kernel reading out of bounds ends it with SIGSEGV.
_EDIT = """
import numpy as np

def edit(array):
    try:
        array.setflags(write=True)
    except ValueError:
        return
    array[...] = 2**40
"""
_HOSTILE_EDITS = (
    _EDIT
    + """
from tokstream import Corpus, mix, stream_token_source

shards = [np.arange(2000, dtype=np.uint16), np.arange(3000, dtype=np.uint16)]
corpus = Corpus._from_arrays(shards, ["a", "b"], "s", [np.array([0, 700, 2000]), None])

def first_columns(windows):
    stream = stream_token_source(corpus, 64, 32, windows=windows, shuffle=False)
    return [b[0].copy() for b in stream]

expected = {windows: first_columns(windows) for windows in ("cross", "within")}
for array in (corpus.lengths, corpus.document_boundaries, corpus.shard_starts):
    edit(array)
for name in [n for n in dir(corpus) if not n.startswith("_")]:
    # A method replaced on the instance too: boundaries_with_eos gives a stream its documents.
    try:
        setattr(corpus, name, lambda *args, **kwargs: np.array([0, 10**9], dtype=np.int64))
    except AttributeError:
        pass
    else:
        raise AssertionError(f"corpus.{name} was replaced")
expected["eos"] = [b[0].copy() for b in stream_token_source(
    shards[0], 64, 32, windows="within", eos=5, shuffle=False
)]
for windows in ("cross", "within"):
    got = first_columns(windows)
    assert len(got) == len(expected[windows]), windows
    assert all(np.array_equal(g, e) for g, e in zip(got, expected[windows])), windows

plain = Corpus([shards[0]])
for name in ("boundaries_with_eos", "shard_starts"):
    try:
        setattr(plain, name, lambda *args: np.array([0, 10**9], dtype=np.int64))
    except AttributeError:
        pass
got = [b[0] for b in stream_token_source(plain, 64, 32, windows="within", eos=5, shuffle=False)]
assert all(np.array_equal(g, e) for g, e in zip(got, expected["eos"], strict=True))

stream = stream_token_source(corpus, 64, 32, shuffle=False)
for name in ("block", "batch_size", "stride", "corpus", "num_windows", "options"):
    try:
        setattr(stream, name, 10**9)
    except AttributeError:
        pass
assert all(np.array_equal(b[0], e) for b, e in zip(stream, expected["cross"]))

mixture = mix({"a": corpus, "b": np.arange(500, dtype=np.uint16)}, {"a": 1, "b": 1})
mixture.corpus = Corpus([np.arange(100, dtype=np.uint16)])
mixture.sources = {"a": Corpus([np.arange(10**6, dtype=np.uint16)])}
mixture.weights = {"a": 1.0}
for array in (mixture.corpus.lengths, mixture.corpus.document_boundaries):
    edit(array)
try:
    for windows, _ in stream_token_source(mixture, 8, 16, epochs=3):
        assert windows.max() < 100
except ValueError:
    pass
print("ok")
"""
)


def test_no_edit_a_caller_can_make_lets_a_stream_read_outside_the_shards():
    done = subprocess.run(
        [sys.executable, "-c", _HOSTILE_EDITS], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# The same edits after a pickle round trip, as a spawned DataLoader worker receives a corpus:
# NumPy unpickles every array writeable, so each table is frozen again as it arrives. A corpus
# read through a manifest (a shard source), its shards opened before the edits.
_UNPICKLED_EDITS = (
    _EDIT
    + """
import pickle, sys
from tokstream import Corpus, mix, open_tokens, split, stream_token_source

def batches(corpus, **options):
    stream = stream_token_source(corpus, 8, 4, shuffle=True, seed=3, epochs=2, **options)
    return [(b["input_ids"] if isinstance(b, dict) else b[0]).copy() for b in stream]

opened = open_tokens(sys.argv[1])
sources = {
    "manifest": opened,
    "mixture": mix({"m": opened, "a": np.arange(300, dtype=np.uint16)}, {"m": 1, "a": 1}),
    "split": split(opened, {"train": 0.7, "val": 0.3})["train"],
}
for name, source in sources.items():
    for options in ({}, {"windows": "within"}, {"windows": "packed", "pad": 0}):
        expected = batches(source, **options)
        worker = pickle.loads(pickle.dumps(source))
        assert all(np.array_equal(g, e) for g, e in zip(batches(worker, **options), expected))
        corpora = [worker]
        if not isinstance(worker, Corpus):  # a mixture: its joined corpus and its sources
            corpora = [worker.corpus, *worker.sources.values()]
        for corpus in corpora:
            for array in (corpus.lengths, corpus.document_boundaries, corpus.shard_starts):
                edit(array)
            if corpus.source is not None:
                edit(corpus.source.lengths)
        got = batches(worker, **options)
        assert len(got) == len(expected), (name, options)
        assert all(np.array_equal(g, e) for g, e in zip(got, expected)), (name, options)
print("ok")
"""
)


def test_no_edit_of_an_unpickled_corpus_lets_a_stream_read_outside_the_shards(tmp_path):
    from tokstream import writing
    from tokstream.manifest import write_manifest

    rng = np.random.default_rng(0)
    for i in range(3):
        documents = [rng.integers(0, 1000, n).astype(np.uint16) for n in rng.integers(1, 60, 12)]
        writing.write_tokens(
            tmp_path / f"part{i}", Corpus.from_documents(documents), format="megatron"
        )
    manifest = write_manifest(str(tmp_path / "part*.bin"), tmp_path / "manifest.json")
    done = subprocess.run(
        [sys.executable, "-c", _UNPICKLED_EDITS, str(manifest)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
