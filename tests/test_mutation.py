"""The caller's array mutated while a stream reads it: defined behaviour.

A 1-D, C-contiguous, native-order integer array is read in place, never copied: a stream sees
the array as it is when each batch is gathered, so later batches see a mutation. Any other
input (floats, Python sequences, strided or byte-swapped arrays, odd integer dtypes) is
converted once, when the stream is made: mutating the original afterwards has no effect.
Neither case can make the kernel read out of range: token values are copied, never used as
indices, and NumPy refuses to resize an array that a stream references.
"""

from __future__ import annotations

import numpy as np
import pytest

from tokstream import Corpus, open_tokens, stream_token_source, write_tokens


@pytest.mark.parametrize("dtype", ["u2", "i4", "i8", "u8"])
def test_a_contiguous_integer_array_is_read_in_place_so_later_batches_see_a_mutation(dtype):
    ids = np.arange(100, dtype=dtype)
    stream = stream_token_source(ids, 4, 8, shuffle=False)
    first, _ = next(stream)
    ids[:] = 7
    second, next_tokens = next(stream)
    assert first.tolist()[0] == [0, 1, 2, 3]
    assert second.tolist() == [[7] * 4] * 8 and next_tokens.tolist() == [7] * 8
    # Batches already handed out are copies: the mutation did not reach them.
    assert first.tolist()[0] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "make_input",
    [
        pytest.param(lambda a: a.astype(np.float64), id="float64"),
        pytest.param(lambda a: a.astype(np.float32), id="float32"),
        pytest.param(lambda a: list(a), id="list"),
        pytest.param(lambda a: np.repeat(a, 2)[::2], id="strided"),
        pytest.param(lambda a: a.astype(">i4"), id="byteswapped"),
    ],
)
def test_an_input_converted_at_call_time_is_unaffected_by_later_mutation(make_input):
    original = np.arange(100)
    source = make_input(original)
    stream = stream_token_source(source, 4, 8, shuffle=False)
    expected = [w.tolist() for w, _ in stream_token_source(original, 4, 8, shuffle=False)]
    if isinstance(source, list):
        source[:] = [7] * len(source)
    else:
        source[...] = 7
    assert [w.tolist() for w, _ in stream] == expected


def test_the_callers_array_cannot_be_resized_under_a_live_stream():
    ids = np.arange(100, dtype=np.int64)
    stream = stream_token_source(ids, 4, 8)
    with pytest.raises(ValueError, match="resize"):
        ids.resize(10)
    assert len(list(stream)) == len(stream)


def test_a_token_file_is_mapped_read_only(tmp_path):
    path = write_tokens(tmp_path / "tokens.npy", np.arange(100), dtype=np.uint16)
    shard = open_tokens(path).shards[0]
    assert not shard.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        shard[0] = 1


# ---------------------------------------------------------------------------------------------
# Nothing a caller assigns can move the kernel's bounds


def test_stream_options_and_sizes_are_read_only():
    stream = stream_token_source(np.arange(100), 4, 8, reuse_buffers=2)
    for name in (
        "block",
        "batch_size",
        "num_windows",
        "world_size",
        "rank",
        "reuse_buffers",
        "positions_per_epoch",
        "batches_per_epoch",
        "corpus",
        "options",
    ):
        with pytest.raises(AttributeError):
            setattr(stream, name, 10**6)
    with pytest.raises(AttributeError):
        stream.options.block = 10**6
    assert [w.shape for w, _ in stream][0] == (8, 4)


def test_corpus_shards_and_lengths_are_read_only():
    corpus = Corpus([np.arange(50), np.arange(30)])
    with pytest.raises(AttributeError):
        corpus.shards = (np.arange(10**6),)
    with pytest.raises(ValueError, match="read-only"):
        corpus.lengths[0] = 10**6
    with pytest.raises(ValueError, match="read-only"):
        corpus.document_boundaries[1] = 10**6
    stream = stream_token_source(corpus, 4, 8, shuffle=False)
    assert sum(len(w) for w, _ in stream) == 46 + 26


def test_there_is_no_public_constructor_that_trusts_its_input():
    assert not hasattr(Corpus, "from_validated")
