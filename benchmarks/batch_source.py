"""Where batches are made: in the training process, with or without a prefetch thread, or in
PyTorch DataLoader workers, timed in one run with nothing done to the batches.

``python benchmarks/batch_source.py [--tokens N] [--block B] [--batch-size K] [--batches N]
[--rounds R]`` (needs the ``torch`` extra)

Every way streams the same seeded int64 corpus in RAM, shuffled with the implicit permutation:

- ``prefetch=0``: ``stream_token_source`` in the calling thread;
- ``prefetch=2``: the same with two batches assembled ahead by a background thread;
- ``workers=K``: ``DataLoader(TokenDataset(...), batch_size=None, num_workers=K)``, each batch
  pickled into shared memory by a worker process and unpickled here.

Each way's stream is started (and its workers have made a first batch) before timing; rounds of
the ways alternate. Printed: the median Mtok/s of each way over ``--rounds`` rounds of
``--batches`` batches.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from itertools import islice
from typing import Any

import numpy as np
from torch.utils.data import DataLoader

from tokstream import stream_token_source
from tokstream.torch import TokenDataset

#: Enough epochs that no way runs out of batches.
EPOCHS = 10**6


def ways(ids: np.ndarray, block: int, batch_size: int) -> dict[str, Iterator[Any]]:
    """Each way's batch iterator, its first batch drawn."""
    options = {"epochs": EPOCHS, "permutation": "implicit", "seed": 0}
    made: dict[str, Iterator[Any]] = {
        f"prefetch={p}": stream_token_source(ids, block, batch_size, prefetch=p, **options)
        for p in (0, 2)
    }
    for workers in (1, 2):
        dataset = TokenDataset(ids, block, batch_size, **options)
        loader = DataLoader(dataset, batch_size=None, num_workers=workers)
        made[f"workers={workers}"] = iter(loader)
    for batches in made.values():
        next(batches)
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    ids = np.random.default_rng(0).integers(0, 50257, args.tokens, dtype=np.int64)
    made = ways(ids, args.block, args.batch_size)
    seconds: dict[str, list[float]] = {name: [] for name in made}
    for _ in range(args.rounds):
        for name, batches in made.items():
            start = time.perf_counter()
            for _ in islice(batches, args.batches):
                pass
            seconds[name].append(time.perf_counter() - start)
    tokens = args.batches * args.batch_size * args.block
    print(
        f"int64 in RAM, block {args.block}, batch {args.batch_size}, shuffled (implicit); "
        f"median of {args.rounds} rounds x {args.batches} batches"
    )
    for name, times in seconds.items():
        print(f"{name:12} {tokens / statistics.median(times) / 1e6:9,.0f} Mtok/s")


if __name__ == "__main__":
    main()
