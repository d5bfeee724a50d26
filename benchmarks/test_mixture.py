"""Corpora made of other corpora: a mixture against one corpus, and splits of many documents.

- ``test_mixture``: the uint16 benchmark corpus cut into three sources of 50%, 30% and 20% of
  its tokens, streamed three ways, shuffled with the implicit permutation: ``one corpus`` (the
  whole array, one shard), ``same shards`` (the three pieces as one corpus of three shards) and
  ``mixture`` (``tokstream.mix`` of the pieces, weights 0.5 / 0.3 / 0.2), one group per shape
  (target: mixture >= 0.9x one corpus; mixture / same shards isolates the schedule). The
  mixture's first rows are checked against the sources' tokens before timing.
- ``test_split``: ``tokstream.split`` of millions of documents of 1-20 tokens (99/1 and 50/50:
  ``2 f (1 - f) N`` runs), and the first batch of a stream over the last part, timed in seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tokstream import Corpus, bench, mix, open_tokens, split, stream_token_source
from tokstream.formats import megatron

SHAPES = list(bench.SHAPES)
WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}
WAYS = ["one corpus", "same shards", "mixture"]


def sources_of(ids: np.ndarray) -> dict[str, np.ndarray]:
    """The corpus cut into consecutive pieces of WEIGHTS' shares of its tokens."""
    cuts = np.cumsum([0] + [int(w * ids.shape[0]) for w in WEIGHTS.values()])
    cuts[-1] = ids.shape[0]
    return {name: ids[cuts[i] : cuts[i + 1]] for i, name in enumerate(WEIGHTS)}


@pytest.fixture(scope="module")
def ways(corpus_uint16) -> dict[str, Any]:
    sources = sources_of(corpus_uint16)
    return {
        "one corpus": corpus_uint16,
        "same shards": Corpus(list(sources.values())),
        "mixture": mix(sources, WEIGHTS),
    }


def take(batches: Iterator[Any], count: int) -> None:
    for _ in range(count):
        next(batches)


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{n}" for b, n in SHAPES])
def test_mixture(measure, settings, corpus_uint16, check_rows_in, ways, shape, way) -> None:
    block, batch_size = shape
    batches = stream_token_source(
        ways[way], block, batch_size, epochs=10**6, seed=settings.seed, permutation="implicit"
    )
    windows, next_tokens = next(batches)  # untimed: the set-up
    assert windows.shape == (batch_size, block)
    check_rows_in(corpus_uint16, windows, next_tokens)
    measure(
        take,
        args=(batches, settings.batches),
        group=f"mixture uint16 shuffled block={block} batch={batch_size}",
        side=way,
        subject="mixture",
        units=settings.batches * batch_size * block,
    )


@pytest.fixture(scope="module")
def documents(settings, tmp_path_factory) -> Corpus:
    """Millions of documents of 1-20 uint16 tokens, as a Megatron dataset opened from disk."""
    count = settings.size(5_000_000, 20_000)
    rng = np.random.default_rng(0)
    boundaries = np.zeros(count + 1, np.int64)
    np.cumsum(rng.integers(1, 21, count), out=boundaries[1:])
    prefix = tmp_path_factory.mktemp("split") / "documents"
    rng.integers(0, 50_000, int(boundaries[-1]), dtype=np.uint16).tofile(f"{prefix}.bin")
    with open(f"{prefix}.idx", "wb") as index:
        megatron.write_index(index, boundaries, np.dtype(np.uint16))
    corpus = open_tokens(str(prefix))
    assert corpus.document_lengths.shape == (count,)
    return corpus


FRACTIONS = [{"train": 0.99, "valid": 0.01}, {"a": 0.5, "b": 0.5}]


@pytest.mark.parametrize("what", ["split", "first batch"])
@pytest.mark.parametrize("fractions", FRACTIONS, ids=["99-1", "50-50"])
def test_split(measure, settings, documents, fractions, what) -> None:
    """Seconds to split the documents, and to make a stream over the last part and draw its
    first batch (the part's runs are many shards)."""
    parts = split(documents, fractions, seed=0)
    name = list(fractions)[-1]
    first = next(stream_token_source(parts[name], 16, 64))
    assert first[0].shape == (64, 16)
    group = f"split of {documents.document_lengths.shape[0]:,} documents {fractions}: {what}"
    if what == "split":
        measure(
            lambda: split(documents, fractions, seed=0),
            group=group,
            side=what,
            units=1,
            unit="s",
            subject="split",
            rounds=settings.size(3, 1),
        )
        runs = ", ".join(f"{n} {len(p.shards):,}" for n, p in parts.items())
        measure.note(group, f"runs: {runs}")
    else:
        measure(
            lambda: next(stream_token_source(parts[name], 16, 64)),
            group=group,
            side=f"first batch over {name!r}",
            units=1,
            unit="s",
            subject="split",
            rounds=settings.size(3, 1),
        )
