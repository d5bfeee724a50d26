"""No surprise at start: no silent minutes or gigabytes before the first batch.

A materialized order too large for the machine's memory is refused when the stream is made,
before anything is allocated; the implicit order starts a 10**10-token corpus in a few MiB, in
one process and in every DataLoader worker. Memory is measured with tracemalloc (NumPy reports
its buffers to it; the file's pages are a mapping, not an allocation), never with a clock.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from tokstream import open_tokens, stream_token_source
from tokstream._memory import available_memory
from tokstream.plan.order import ORDER_MEMORY_FRACTION

HUGE = 10**10  # tokens of the sparse file: 20 GB of uint16 that cost no disk
BLOCK, BATCH = 1024, 64


@pytest.fixture(scope="module")
def huge_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("start") / "huge.bin"
    with open(path, "wb") as f:
        f.truncate(2 * HUGE)
    yield path
    path.unlink()


def peak_bytes(action):
    """``action()``'s result and the peak of memory traced while it ran."""
    tracemalloc.start()
    try:
        result = action()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_first_implicit_batch_of_ten_billion_tokens_takes_a_few_mib(huge_file):
    def first_batch():
        stream = stream_token_source(
            open_tokens(huge_file, np.uint16), BLOCK, BATCH, permutation="implicit"
        )
        return next(stream)

    (windows, next_tokens), peak = peak_bytes(first_batch)
    assert windows.shape == (BATCH, BLOCK) and next_tokens.shape == (BATCH,)
    assert peak < 4 * 2**20  # the batch itself is 0.5 MiB


def test_a_materialized_order_beyond_the_memory_is_refused_before_anything_is_allocated(
    huge_file,
):
    available = available_memory()
    if available is None or 8 * (HUGE - BLOCK) <= ORDER_MEMORY_FRACTION * available:
        pytest.skip("this machine could hold the order of a 10**10-token corpus")
    corpus = open_tokens(huge_file, np.uint16)

    def make():
        with pytest.raises(ValueError, match="permutation='implicit'") as error:
            stream_token_source(corpus, BLOCK, BATCH, permutation="materialized")
        return error

    error, peak = peak_bytes(make)
    assert "permutation='materialized'" in str(error.value) and "GiB" in str(error.value)
    assert peak < 2**20


def test_an_order_that_fits_is_still_the_reference_generators():
    ids = np.arange(5_000)
    stream = stream_token_source(ids, 8, 16, seed=3)
    order = np.random.RandomState(3).permutation(5_000 - 8)
    np.testing.assert_array_equal(next(stream)[0][:, 0], order[:16])


def test_every_dataloader_worker_starts_ten_billion_tokens_without_an_order(huge_file):
    torch = pytest.importorskip("torch")
    from tokstream.torch import TokenDataset

    available = available_memory()
    if available is None or 8 * (HUGE - BLOCK) <= ORDER_MEMORY_FRACTION * available:
        pytest.skip("a materialized order would fit here, so success would prove nothing")
    # With a materialized default each worker would have to draw a 74 GiB order, which the rule
    # above refuses in the worker: getting batches proves the workers hold no order at all.
    dataset = TokenDataset(open_tokens(huge_file, np.uint16), BLOCK, BATCH)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == 4:
            break
    assert [tuple(windows.shape) for windows, _ in batches] == [(BATCH, BLOCK)] * 4
