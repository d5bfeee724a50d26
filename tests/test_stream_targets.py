"""``targets="shifted"``: the full next-token sequence language-model training trains on.

The contract: ``x`` is exactly the reference's context windows, ``y`` is ``x`` shifted by one
token (``y[:, :-1] == x[:, 1:]``) whose last column is the reference's next token, in the
reference's order, for every token dtype the kernel reads.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import KERNEL_DTYPES
from tokstream import Corpus, reference, stream_token_source


def random_tokens(dtype: str, size: int, seed: int) -> np.ndarray:
    """Tokens spread over the dtype's whole range (capped at int64's, the lossless limit)."""
    info = np.iinfo(dtype)
    high = min(int(info.max), int(np.iinfo(np.int64).max))
    return (
        np.random.default_rng(seed).integers(int(info.min), high, size, endpoint=True).astype(dtype)
    )


def assert_shifted_matches_reference(tokens, block, batch_size, **controls) -> int:
    """Compare every shifted batch with the reference batch at the same place; count them."""
    fast = stream_token_source(tokens, block, batch_size, targets="shifted", **controls)
    slow = reference.stream_token_source(tokens, block, batch_size, **controls)
    count = 0
    for (x, y), (ref_windows, ref_next) in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(x, ref_windows)
        np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
        np.testing.assert_array_equal(y[:, -1], ref_next)
        count += 1
    return count


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("shuffle", [True, False])
def test_shifted_targets_match_reference_for_every_dtype(dtype, shuffle):
    tokens = random_tokens(dtype, 97, seed=3)
    batches = assert_shifted_matches_reference(
        tokens, block=7, batch_size=8, epochs=2, shuffle=shuffle, seed=11
    )
    assert batches == 2 * 12  # 90 windows per epoch: 11 full batches and one of 2


def test_shifted_targets_of_an_exact_integer_float_corpus_match_reference():
    tokens = np.arange(40, dtype=np.float64) * 3
    assert assert_shifted_matches_reference(tokens, block=5, batch_size=6, seed=2) == 6


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(0, 60),
    block=st.integers(1, 12),
    batch_size=st.integers(1, 9),
    epochs=st.integers(0, 3),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_shifted_targets_match_reference_for_any_shape(
    size, block, batch_size, epochs, shuffle, seed
):
    tokens = random_tokens("uint16", size, seed=size)
    batches = assert_shifted_matches_reference(
        tokens, block, batch_size, epochs=epochs, shuffle=shuffle, seed=seed
    )
    windows = max(size - block, 0)
    assert batches == epochs * -(-windows // batch_size)


def test_shifted_batches_are_fresh_contiguous_int64_arrays_the_caller_owns():
    x, y = next(stream_token_source(np.arange(50, dtype=np.uint8), 6, 4, targets="shifted"))
    for array in (x, y):
        assert array.dtype == np.int64
        assert array.shape == (4, 6)
        assert array.flags.c_contiguous and array.flags.writeable
    assert not np.shares_memory(x, y)


def test_shifted_targets_never_cross_a_shard_boundary():
    corpus = Corpus([np.arange(10), np.arange(100, 104), np.arange(200, 215)])
    shifted = stream_token_source(corpus, 3, 4, targets="shifted", seed=5)
    plain = stream_token_source(corpus, 3, 4, targets="next", seed=5)
    for (x, y), (windows, next_tokens) in zip(shifted, plain, strict=True):
        np.testing.assert_array_equal(x, windows)
        np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
        np.testing.assert_array_equal(y[:, -1], next_tokens)
        # Every shard is a run of consecutive ids, so a window that crossed shards would not be.
        np.testing.assert_array_equal(np.diff(np.concatenate([x, y[:, -1:]], axis=1)), 1)


def test_shifted_targets_follow_the_rank_share_of_the_order():
    tokens = np.arange(64, dtype=np.int32)
    for rank in range(3):
        shifted = stream_token_source(tokens, 4, 5, targets="shifted", rank=rank, world_size=3)
        plain = stream_token_source(tokens, 4, 5, rank=rank, world_size=3)
        for (x, y), (windows, next_tokens) in zip(shifted, plain, strict=True):
            np.testing.assert_array_equal(x, windows)
            np.testing.assert_array_equal(y[:, -1], next_tokens)


@pytest.mark.parametrize(
    ("targets", "error"),
    [
        ("shift", ValueError),
        ("", ValueError),
        ("Shifted", ValueError),
        ("next ", ValueError),
        (None, TypeError),
        (1, TypeError),
        (True, TypeError),
        (b"shifted", TypeError),
        (["shifted"], TypeError),
    ],
)
def test_bad_targets_are_rejected_naming_the_argument_and_value(targets, error):
    with pytest.raises(error, match=r"targets") as excinfo:
        stream_token_source(np.arange(20), 4, 2, targets=targets)
    assert repr(targets) in str(excinfo.value)
