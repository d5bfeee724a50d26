"""Leaks and per-batch memory: a long run holds nothing per batch, a batch allocates O(b x block).

RSS is read from ``/proc/self/status`` (Linux); the bounds are loose enough for allocator noise
and tight enough that keeping any one batch's buffers alive per step would blow through them
(100,000 steps x 320 bytes of buffers = 32 MB).
"""

from __future__ import annotations

import gc
import sys
import tracemalloc

import numpy as np
import pytest

from tests.conftest import stress
from tokstream import Corpus, stream_token_source

# A quarter under the debug build (25,000 steps still keep 8 MB of buffers alive if leaked).
STEPS = stress(100_000)
KB = 1024


def rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise LookupError("VmRSS")


def run(stream, steps: int) -> int:
    """Consume ``steps`` batches, touching each; return how many were consumed."""
    done = 0
    for windows, targets in stream:
        windows[0, 0] = targets.flat[0]  # write to the buffers, as a consumer would
        done += 1
        if done == steps:
            break
    return done


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"shuffle": False}, id="sequential"),
        pytest.param({"shuffle": True}, id="materialized"),
        pytest.param(
            {"shuffle": True, "permutation": "implicit", "targets": "shifted"},
            id="implicit_shifted",
        ),
    ],
)
def test_a_hundred_thousand_batches_do_not_grow_rss(options):
    ids = np.random.default_rng(0).integers(0, 50_000, 20_000).astype(np.uint16)
    # Many short epochs, so the per-epoch order is drawn and dropped again and again.
    stream = stream_token_source(ids, 8, 4, epochs=10**6, seed=3, **options)
    run(stream, 10_000)  # warm-up: allocator pools, the first orders
    gc.collect()
    before = rss_kb()
    assert run(stream, STEPS) == STEPS
    gc.collect()
    after = rss_kb()
    print(f"RSS over {STEPS} batches ({options}): {before} kB -> {after} kB")
    assert after - before < 4 * KB


def test_a_hundred_thousand_batches_leave_no_traced_allocation_behind():
    corpus = Corpus([np.arange(3000, dtype=np.int32), np.arange(5000, dtype=np.int32)])
    stream = stream_token_source(corpus, 6, 3, epochs=10**6, seed=1)
    run(stream, 2_000)
    gc.collect()
    tracemalloc.start()
    try:
        run(stream, 1_000)
        gc.collect()
        start, _ = tracemalloc.get_traced_memory()
        run(stream, STEPS)
        gc.collect()
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"traced memory over {STEPS} batches: {start} B -> {end} B")
    # One epoch's order (7988 int64 windows) may be live at either end; nothing grows per batch.
    assert end - start < 8 * 8_000 + 16 * KB


def traced_peak_per_batch(stream, batches: int) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        run(stream, batches)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base


@pytest.mark.parametrize("batch_size", [16, 256])
@pytest.mark.parametrize(
    ("shards", "options"),
    [
        pytest.param(1, {"shuffle": False}, id="sequential"),
        pytest.param(1, {"permutation": "implicit", "targets": "shifted"}, id="implicit_shifted"),
        pytest.param(3, {"permutation": "implicit"}, id="three_shards"),
        pytest.param(1, {"world_size": 4, "rank": 3, "permutation": "implicit"}, id="sharded"),
    ],
)
def test_peak_allocation_per_batch_is_a_few_batch_buffers(batch_size, shards, options):
    block = 64
    corpus = Corpus([np.arange(200_000, dtype=np.uint16) for _ in range(shards)])
    stream = stream_token_source(corpus, block, batch_size, epochs=2, **options)
    windows, targets = next(stream)  # the first call also sets up the epoch
    batch_bytes = windows.nbytes + targets.nbytes
    peak = traced_peak_per_batch(stream, 50)
    print(
        f"peak per batch, b={batch_size} {options} shards={shards}: {peak} B "
        f"({peak / batch_bytes:.2f} x one batch of {batch_bytes} B)"
    )
    # At the peak two batches are alive: the one being filled and the one the consumer's loop
    # variable still holds. Index arrays (b int64s) and constant overhead come on top.
    assert peak < 2 * batch_bytes + 32 * KB


def test_a_materialized_order_is_the_only_allocation_proportional_to_the_corpus():
    windows = 500_000
    stream = stream_token_source(np.arange(windows + 8, dtype=np.uint16), 8, 32, seed=0)
    peak = traced_peak_per_batch(stream, 50)  # the first batch draws the epoch's order
    order = windows * 8
    assert order <= peak < 2 * order + 32 * 8 * 8 * 2 + 32 * KB
    peak_after = traced_peak_per_batch(stream, 50)
    assert peak_after < 32 * 8 * 8 * 2 * 2 + 32 * KB
