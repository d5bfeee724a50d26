"""What strides, documents and the batch extras cost, as ratios measured in one process.

``python benchmarks/documents_ratios.py [--tokens N] [--rounds R] [--batches K]``

The corpus of docs/benchmarks.md (10,000,000 seeded ids below 50257, as uint16 and as int64)
cut into documents of seeded exponential lengths (mean ``MEAN_DOCUMENT`` tokens) with
``Corpus.from_documents``. Every stream is shuffled with the implicit permutation and yields
``targets="shifted"``, so that only the feature differs between the two sides of a ratio:

- ``extras``: ``extras=("position_ids", "loss_mask", "cu_seqlens")`` against the plain gather
  (target: at most 1.3x the time, i.e. a rate ratio of at least 0.77);
- ``eos``: the same, with the documents told by ``eos=EOS`` alone, on the same tokens with each
  document's last token set to ``EOS`` and no recorded boundaries (nanoGPT's and llm.c's
  files);
- ``within``: ``windows="within"`` against ``windows="cross"`` (target: as fast);
- ``strided``: ``stride=block`` against ``stride=1`` (target: as fast).

Rounds of the variants alternate, so drift on a shared machine hits both sides alike; each
figure is the median over ``--rounds`` rounds of ``--batches`` batches (the first batch of
each stream is drawn untimed). Printed: median Mtok/s of each side and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from tokstream import Corpus, bench, stream_token_source

SHAPES = [(1024, 64), (128, 512)]
DTYPES = ["uint16", "int64"]
MEAN_DOCUMENT = 2000
EXTRAS = ("position_ids", "loss_mask", "cu_seqlens")
#: GPT-2's end-of-text token, closing each document of the ``eos`` comparison's corpus.
EOS = 50256

#: Each comparison: (name, the feature's options, the baseline's options, target ratio).
COMPARISONS: list[tuple[str, dict[str, Any], dict[str, Any], float]] = [
    ("extras", {"extras": EXTRAS}, {}, 1 / 1.3),
    ("eos", {"extras": EXTRAS, "eos": EOS}, {}, 1 / 1.3),
    ("within", {"windows": "within"}, {"windows": "cross"}, 1.0),
    ("strided", {"stride": "block"}, {"stride": 1}, 1.0),
]


def documents_corpus(num_tokens: int, dtype: str, seed: int = 0, eos: bool = False) -> Corpus:
    """The benchmark corpus as documents of exponential lengths (some empty): recorded, or
    (``eos``) one array whose documents each end with :data:`EOS`."""
    ids = bench.synthetic_corpus(num_tokens, dtype, seed)
    rng = np.random.default_rng(seed + 1)
    lengths = rng.exponential(MEAN_DOCUMENT, 2 * num_tokens // MEAN_DOCUMENT + 16).astype(int)
    cuts = np.cumsum(lengths)
    cuts = cuts[cuts < num_tokens]
    if eos:
        ids = ids.copy()
        ids[cuts[cuts > 0] - 1] = EOS
        return Corpus([ids])
    return Corpus.from_documents(np.split(ids, cuts))


def corpus_for(feature: dict[str, Any], dtype: str, num_tokens: int, cache: dict) -> Corpus:
    """The corpus a comparison runs on (its documents told by ``eos`` or recorded), made once."""
    key = (dtype, "eos" in feature)
    if key not in cache:
        cache[key] = documents_corpus(num_tokens, dtype, eos=key[1])
    return cache[key]


def make_stream(corpus: Corpus, block: int, batch_size: int, **options: Any) -> Iterator[Any]:
    """A shuffled implicit stream over enough epochs for any benchmark, first batch drawn."""
    if options.get("stride") == "block":
        options["stride"] = block
    stream = stream_token_source(
        corpus,
        block,
        batch_size,
        epochs=10**6,
        seed=0,
        permutation="implicit",
        targets="shifted",
        **options,
    )
    next(stream)
    return stream


def consume(stream: Iterator[Any], batches: int) -> None:
    for _ in range(batches):
        next(stream)


def measure(
    corpus: Corpus,
    block: int,
    batch_size: int,
    sides: list[dict[str, Any]],
    rounds: int,
    batches: int,
) -> list[float]:
    """Median Mtok/s of each side, their rounds alternating."""
    streams = [make_stream(corpus, block, batch_size, **dict(side)) for side in sides]
    times: list[list[float]] = [[] for _ in sides]
    for _ in range(rounds):
        for stream, kept in zip(streams, times, strict=True):
            start = time.perf_counter()
            consume(stream, batches)
            kept.append(time.perf_counter() - start)
    return [batches * batch_size * block / statistics.median(t) / 1e6 for t in times]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args(argv)
    print(
        f"{args.tokens:,} tokens in documents of mean {MEAN_DOCUMENT}, shuffled, implicit, "
        f"targets='shifted'; median of {args.rounds} rounds x {args.batches} batches (Mtok/s)"
    )
    print(
        f"{'dtype':6} {'block':>5} {'batch':>5} {'what':8} {'feature':>9} {'base':>9} "
        f"{'ratio':>6} {'target':>7}"
    )
    corpora: dict = {}
    for dtype in DTYPES:
        for block, batch_size in SHAPES:
            for name, feature, base, target in COMPARISONS:
                corpus = corpus_for(feature, dtype, args.tokens, corpora)
                with_feature, without = measure(
                    corpus, block, batch_size, [feature, base], args.rounds, args.batches
                )
                ratio = with_feature / without
                print(
                    f"{dtype:6} {block:5} {batch_size:5} {name:8} {with_feature:9,.0f} "
                    f"{without:9,.0f} {ratio:6.2f} {'>=' + format(target, '.2f'):>7}"
                    + ("" if ratio >= target else "  MISSED"),
                    flush=True,
                )


if __name__ == "__main__":
    main()
