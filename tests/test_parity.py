"""The fast path against the reference path: byte-identical batches for every valid input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import KERNEL_DTYPES, assert_same_batches
from tokstream import reference, stream_token_source

# Largest integer each float dtype holds exactly, so a random exact float corpus stays exact.
FLOAT_EXACT = {"f2": 2**11, "f4": 2**24, "f8": 2**53}


@st.composite
def corpora(draw):
    kind = draw(st.sampled_from(["int", "float", "list"]))
    length = draw(st.integers(0, 1200))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if kind == "int":
        dtype = np.dtype(draw(st.sampled_from(KERNEL_DTYPES)))
        info = np.iinfo(dtype)
        low, high = int(info.min), min(int(info.max), 2**63 - 1)
        return rng.integers(low, high, length, dtype=dtype, endpoint=True)
    if kind == "float":
        dtype = draw(st.sampled_from(sorted(FLOAT_EXACT)))
        bound = FLOAT_EXACT[dtype]
        return rng.integers(-bound, bound, length, endpoint=True).astype(dtype)
    return [int(v) for v in rng.integers(-(2**63), 2**63 - 1, length, endpoint=True)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ids=corpora(),
    block=st.integers(1, 300),
    batch_size=st.integers(1, 1000),
    epochs=st.integers(0, 3),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_fast_path_matches_reference_on_random_corpora(
    ids, block, batch_size, epochs, shuffle, seed
):
    kwargs = {"epochs": epochs, "shuffle": shuffle, "seed": seed}
    fast = stream_token_source(ids, block, batch_size, **kwargs)
    ref = reference.stream_token_source(ids, block, batch_size, **kwargs)
    n = max(len(ids) - block, 0)
    assert len(fast) == (epochs * -(-n // batch_size) if n else 0)
    assert_same_batches(fast, ref)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("shuffle", [True, False])
def test_shuffled_and_sequential_epochs_match_reference_for_every_dtype(dtype, shuffle):
    info = np.iinfo(dtype)
    ids = np.random.default_rng(3).integers(
        int(info.min), min(int(info.max), 2**63 - 1), 3000, dtype=dtype, endpoint=True
    )
    kwargs = {"epochs": 3, "shuffle": shuffle, "seed": 11}
    assert_same_batches(
        stream_token_source(ids, 17, 100, **kwargs),
        reference.stream_token_source(ids, 17, 100, **kwargs),
    )


@pytest.mark.parametrize(
    ("length", "block", "expected_batches"),
    [(0, 1, 0), (5, 5, 0), (5, 9, 0), (6, 5, 1), (7, 5, 1), (20, 1, 4)],
)
def test_batch_counts_at_the_edges(length, block, expected_batches):
    ids = np.arange(length)
    fast = assert_same_batches(
        stream_token_source(ids, block, 5), reference.stream_token_source(ids, block, 5)
    )
    assert len(fast) == expected_batches


def test_last_batch_is_partial_and_zero_epochs_yield_nothing():
    ids = np.arange(30)
    batches = list(stream_token_source(ids, 4, 8, shuffle=False))
    assert [len(w) for w, _ in batches] == [8, 8, 8, 2]
    assert batches[-1][0].tolist() == [[24, 25, 26, 27], [25, 26, 27, 28]]
    assert batches[-1][1].tolist() == [28, 29]
    assert list(stream_token_source(ids, 4, 8, epochs=0)) == []


def test_each_batch_is_fresh_writeable_contiguous_memory_the_caller_owns():
    ids = np.arange(200, dtype=np.int64)
    batches = list(stream_token_source(ids, 8, 16, epochs=2))
    for windows, next_tokens in batches:
        assert windows.flags.c_contiguous and windows.flags.writeable
        assert next_tokens.flags.c_contiguous and next_tokens.flags.writeable
        assert not np.shares_memory(windows, ids) and not np.shares_memory(next_tokens, ids)
    for (a, _), (b, _) in zip(batches, batches[1:], strict=False):
        assert not np.shares_memory(a, b)
    batches[0][0][:] = -1  # writing into a batch touches neither the corpus nor later batches
    assert ids.tolist() == list(range(200))


def test_python_list_and_exact_floats_match_their_int64_equivalent():
    ints = np.random.default_rng(5).integers(0, 2**20, 500)
    for ids in (ints.tolist(), ints.astype(np.float64), ints.astype(np.float32)):
        assert_same_batches(
            stream_token_source(ids, 9, 13, seed=2),
            reference.stream_token_source(ints, 9, 13, seed=2),
        )


def test_fixed_hole_float_two_pow_53_plus_one_in_a_list_is_kept_exact():
    ids = [0.0, 1, 2**53 + 1, 3, 4]
    ((windows, next_tokens),) = list(stream_token_source(ids, 2, 8, shuffle=False))
    assert windows[:, :].tolist() == [[0, 1], [1, 2**53 + 1], [2**53 + 1, 3]]
    assert next_tokens.tolist() == [2**53 + 1, 3, 4]
