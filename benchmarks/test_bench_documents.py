"""Strides, documents and the batch extras against the plain gather (pytest-benchmark).

One group per (corpus dtype, shape, comparison), the feature and its baseline side by side:
``extras`` and ``eos`` (targets: at most 1.3x the plain gather's time), ``within`` against
``cross`` windows and ``stride=block`` against ``stride=1`` (targets: as fast). The corpus is
the benchmark corpus of docs/benchmarks.md, cut into documents
(``documents_ratios.documents_corpus``: recorded, or ended by an eos token for ``eos``); every
stream is shuffled with the implicit permutation and yields shifted targets, so only the
feature differs. Before timing, each side's first batch is
checked for its shape and dtype. For ratios measured in one process, run
``python benchmarks/documents_ratios.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.documents_ratios import COMPARISONS, DTYPES, SHAPES, corpus_for, make_stream

_corpora: dict = {}


@pytest.mark.parametrize("side", ["feature", "base"])
@pytest.mark.parametrize("comparison", COMPARISONS, ids=[c[0] for c in COMPARISONS])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{n}" for b, n in SHAPES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_documents_throughput(benchmark, settings, dtype, shape, comparison, side) -> None:
    name, feature, base, _target = comparison
    block, batch_size = shape
    corpus = corpus_for(feature, dtype, settings.num_tokens, _corpora)
    options = dict(feature if side == "feature" else base)
    benchmark.group = f"{dtype} block={block} batch={batch_size} {name}"
    stream = make_stream(corpus, block, batch_size, **options)
    batch = next(stream)
    windows = batch["input_ids"] if isinstance(batch, dict) else batch[0]
    assert windows.shape == (batch_size, block) and windows.dtype == np.int64

    def draw() -> None:
        for _ in range(settings.batches):
            next(stream)

    benchmark.pedantic(draw, rounds=settings.rounds, iterations=1)
    if benchmark.stats is not None:
        rate = settings.batches * batch_size * block / benchmark.stats.stats.median / 1e6
        benchmark.extra_info["median Mtok/s"] = rate
