"""A mixture's throughput against one corpus of the same shape, in one run.

The corpus of docs/benchmarks.md (``TOKENS`` seeded ids, uint16) is cut into three sources of 50%,
30% and 20% of its tokens and streamed three ways, shuffled with the implicit permutation:

- ``one corpus``: the whole array, one shard (the plain stream);
- ``same shards``: the three pieces as one :class:`tokstream.Corpus` of three shards;
- ``mixture``: ``tokstream.mix`` of the three pieces, weights 0.5 / 0.3 / 0.2.

For each shape the three are timed in turn, round after round; the table shows the median
Mtok/s of each and the ratios ``mixture / one corpus`` and ``mixture / same shards`` (the
second isolates the schedule: both gather from three shards).

``--world-size W`` streams rank 0 of ``W`` ranks for all three (a rank of several takes every
``W``-th sample, which the mixture reads along its cycle of period rows).

    python benchmarks/mixture_ratio.py [--tokens 10_000_000] [--rounds 5] [--batches 100]
        [--world-size 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from itertools import islice

import numpy as np

from tokstream import Corpus, mix, stream_token_source
from tokstream.bench import SHAPES, synthetic_corpus

WEIGHTS = {"web": 0.5, "code": 0.3, "math": 0.2}


def sources_of(ids: np.ndarray) -> dict[str, np.ndarray]:
    """The corpus cut into consecutive pieces of WEIGHTS' shares of its tokens."""
    cuts = np.cumsum([0] + [int(w * ids.shape[0]) for w in WEIGHTS.values()])
    cuts[-1] = ids.shape[0]
    return {name: ids[cuts[i] : cuts[i + 1]] for i, name in enumerate(WEIGHTS)}


def token_sources(ids: np.ndarray) -> dict[str, object]:
    """The three ways of streaming ``ids``, by label."""
    sources = sources_of(ids)
    return {
        "one corpus": ids,
        "same shards": Corpus(list(sources.values())),
        "mixture": mix(sources, WEIGHTS),
    }


def stream(token_ids: object, block: int, batch_size: int, world_size: int = 1):
    """A shuffled implicit stream (rank 0 of ``world_size``) long enough for any timing run;
    its first batch drawn."""
    batches = stream_token_source(
        token_ids,
        block,
        batch_size,
        epochs=1000,
        seed=0,
        permutation="implicit",
        world_size=world_size,
    )
    next(batches)
    return batches


def time_batches(batches, count: int) -> float:
    """Seconds to draw ``count`` batches."""
    start = time.perf_counter()
    for _ in islice(batches, count):
        pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--world-size", type=int, default=1)
    args = parser.parse_args()
    ways = token_sources(synthetic_corpus(args.tokens, "uint16", 0))
    print(
        f"{args.tokens:,} uint16 tokens, median of {args.rounds} rounds x {args.batches} batches"
        f", rank 0 of {args.world_size}"
    )
    print(
        f"{'block, batch':>14} {'one corpus':>11} {'same shards':>12} {'mixture':>9}"
        f" {'mix/one':>8} {'mix/shards':>11}  (Mtok/s)"
    )
    for block, batch_size in SHAPES:
        streams = {
            label: stream(t, block, batch_size, args.world_size) for label, t in ways.items()
        }
        seconds: dict[str, list[float]] = {label: [] for label in streams}
        for _ in range(args.rounds):
            for label, batches in streams.items():
                seconds[label].append(time_batches(batches, args.batches))
        rate = {
            label: args.batches * batch_size * block / statistics.median(times) / 1e6
            for label, times in seconds.items()
        }
        one, shards, mixture = rate["one corpus"], rate["same shards"], rate["mixture"]
        print(
            f"{block:>6}, {batch_size:<6} {one:>11,.0f} {shards:>12,.0f} {mixture:>9,.0f}"
            f" {mixture / one:>7.2f}x {mixture / shards:>10.2f}x"
        )


if __name__ == "__main__":
    main()
