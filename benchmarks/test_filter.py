"""What the repetition filter (``instance_filter=True``, OLMo-core's defaults) costs packed rows.

``test_rate``: packed rows (``targets="shifted"``, loss mask) at block 2048 x 16 over ~2 * 10**7
uint16 tokens in documents of lognormal lengths, one in fifty of them holding a planted run (a
unit of 1-13 tokens repeated 40 times), with and without the filter, in one run (target: the
filtered stream at least 0.85x the plain one). Before timing, the first batches of both are
checked: the same tokens, and the filtered stream's instance mask says which rows hold a planted
run, their loss masks cleared.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tokstream import Corpus, stream_token_source

SHAPES = [(2048, 16)]


@pytest.fixture(scope="module")
def planted_corpus(settings, lognormal_lengths) -> Corpus:
    """About 2 * 10**7 uint16 tokens in documents, one in fifty with a 40-times repeated unit."""
    lengths = lognormal_lengths(settings.size(24_000, 2_000), 2)
    rng = np.random.default_rng(5)
    documents = [rng.integers(0, 50257, n).astype(np.uint16) for n in lengths]
    for document in documents[::50]:
        unit = rng.integers(0, 50257, int(rng.integers(1, 14))).astype(np.uint16)
        run = np.tile(unit, 40)[: document.shape[0]]
        document[: run.shape[0]] = run
    return Corpus.from_documents(documents)


def take(stream: Iterator[Any], batches: int) -> None:
    for _ in range(batches):
        next(stream)


@pytest.mark.parametrize("filtered", [False, True], ids=["packed", "packed + filter"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{n}" for b, n in SHAPES])
def test_rate(measure, settings, planted_corpus, shape, filtered) -> None:
    block, batch_size = shape
    common: dict[str, Any] = {"epochs": 1000, "windows": "packed", "pad": 0}
    plain = stream_token_source(planted_corpus, block, batch_size, **common)
    stream = stream_token_source(
        planted_corpus, block, batch_size, instance_filter=filtered, **common
    )
    for _ in range(4):
        expected, batch = next(plain), next(stream)
        np.testing.assert_array_equal(batch["input_ids"], expected["input_ids"])
        if filtered:
            kept = batch["instance_mask"]
            assert not batch["loss_mask"][~kept].any()
            np.testing.assert_array_equal(batch["loss_mask"][kept], expected["loss_mask"][kept])
    measure(
        take,
        args=(stream, settings.batches),
        group=f"repetition filter packed uint16 block={block} batch={batch_size}",
        side="packed + filter" if filtered else "packed",
        subject="packed + filter",
        units=settings.batches * batch_size * block,
    )
