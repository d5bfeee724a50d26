"""Prefetch overlap: a consumer that works as long per batch as the gather takes.

Without prefetching the run takes gather + work per batch; with ``prefetch=2`` the background
thread gathers the next batch while the consumer works, so the run should take about
max(gather, work): about half. The consumer's "work" sleeps (as a training loop waiting on an
accelerator does), so the figure isolates the overlap from competition for the two cores.

    pytest benchmarks/test_bench_prefetch.py --benchmark-group-by=group
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from tokstream import stream_token_source

BLOCK, BATCH, BATCHES = 1024, 1024, 40


@pytest.fixture(scope="module")
def corpus() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 50257, 10_000_000, dtype=np.int64)


def primed_stream(corpus: np.ndarray, prefetch: int):
    """A stream past its first batch, so that set-up and thread start are not timed."""
    stream = stream_token_source(
        corpus, BLOCK, BATCH, seed=1, epochs=1000, permutation="implicit", prefetch=prefetch
    )
    next(stream)
    return stream


@pytest.fixture(scope="module")
def gather_seconds(corpus) -> float:
    stream = primed_stream(corpus, 0)
    start = time.perf_counter()
    for _ in range(BATCHES):
        next(stream)
    return (time.perf_counter() - start) / BATCHES


def consume(stream, work_seconds: float) -> None:
    for _ in range(BATCHES):
        next(stream)
        if work_seconds:
            time.sleep(work_seconds)
    stream.close()


def timed(benchmark, corpus, prefetch: int, work_seconds: float) -> None:
    benchmark.group = "prefetch overlap: work per batch = gather time"
    benchmark.pedantic(
        consume,
        setup=lambda: ((primed_stream(corpus, prefetch), work_seconds), {}),
        rounds=5,
        iterations=1,
    )


@pytest.mark.parametrize("prefetch", [0, 2])
def test_consumer_as_slow_as_the_gather(benchmark, corpus, gather_seconds, prefetch):
    benchmark.extra_info["gather_ms_per_batch"] = gather_seconds * 1e3
    timed(benchmark, corpus, prefetch, gather_seconds)


def test_gather_alone(benchmark, corpus):
    timed(benchmark, corpus, 0, 0.0)
