"""A mixture's throughput beside one corpus of the same shape (target: >= 0.9x, docs/benchmarks.md).

One pytest-benchmark group per shape, holding the three ways of ``mixture_ratio.py``: the
whole corpus as one shard, its three pieces as one corpus of three shards, and their mixture,
all shuffled with the implicit permutation. Before a round is timed, the mixture's first batch
is checked against its windows cut out of the sources with NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.mixture_ratio import token_sources
from tokstream import bench, stream_token_source
from tokstream._state import Cursor

SHAPES = list(bench.SHAPES)
WAYS = ["one corpus", "same shards", "mixture"]


def check_first_mixture_batch(mixture, block: int, batch_size: int, seed: int) -> None:
    stream = stream_token_source(mixture, block, batch_size, seed=seed)
    windows, next_tokens = next(stream)
    index = stream._order.batch_windows(Cursor(0, 0, None), batch_size)
    starts = stream._space.token_starts(index)
    tokens = np.concatenate(mixture.corpus.shards)
    assert np.array_equal(windows, np.stack([tokens[s : s + block] for s in starts]))
    assert np.array_equal(next_tokens, tokens[starts + block])


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{n}" for b, n in SHAPES])
def test_mixture_throughput(benchmark, settings, corpus_uint16, shape, way) -> None:
    block, batch_size = shape
    token_ids = token_sources(corpus_uint16)[way]
    if way == "mixture":
        check_first_mixture_batch(token_ids, block, batch_size, settings.seed)
    benchmark.group = f"mixture uint16 shuffled block={block} batch={batch_size}"
    needed = 1 + settings.rounds * settings.batches
    epochs = bench.epochs_for(corpus_uint16.shape[0], block, batch_size, needed)
    batches = stream_token_source(
        token_ids, block, batch_size, epochs=epochs, seed=settings.seed, permutation="implicit"
    )
    next(batches)
    windows_per_round = benchmark.pedantic(
        bench.consume, args=(batches, settings.batches), rounds=settings.rounds, iterations=1
    )
    benchmark.extra_info["units_per_round"] = windows_per_round * block
    benchmark.extra_info["unit"] = "Mtok/s"
