"""The kernel and the plain C loop at every software-prefetch distance, on fresh random windows.

``python benchmarks/prefetch_sweep.py [--tokens N] [--dtype int64,uint16] [--rounds R]``

For each shape of docs/benchmarks.md, both copy the same number of fresh random windows (about 2M
tokens a round, new windows every round, one reused output buffer) at each distance of
``tokstream.bench.baselines.C_LOOP_DISTANCES``; the best round of each is printed in Mtok/s, with
the distance ``tokstream._space.cache_ahead`` picks for the kernel. The sweep behind that
rule.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tokstream import bench
from tokstream._space import cache_ahead
from tokstream._windows import gather_windows
from tokstream.bench._loop import copy_windows
from tokstream.bench.baselines import C_LOOP_DISTANCES


def sweep(ids: np.ndarray, block: int, batch_size: int, rounds: int) -> dict[str, dict[int, float]]:
    """Best Mtok/s of the kernel and of the C loop at each distance."""
    kernel = gather_windows.__signatures__[f"{ids.dtype.name}_t"]
    loop = copy_windows.__signatures__[f"{ids.dtype.name}_t"]
    windows = np.empty((batch_size, block), np.int64)
    next_tokens = np.empty(batch_size, np.int64)
    batches = max(4, 2_000_000 // (batch_size * block))
    rng = np.random.default_rng(1)
    best: dict[str, dict[int, float]] = {"kernel": {}, "C loop": {}}
    for _ in range(rounds):
        for distance in C_LOOP_DISTANCES:
            for name in best:
                starts = rng.integers(0, ids.shape[0] - block - 1, (batches, batch_size))
                started = time.perf_counter()
                for batch in starts:
                    if name == "kernel":
                        kernel(ids, batch, windows, next_tokens, None, distance)
                    else:
                        loop(ids, batch, windows, next_tokens, distance)
                rate = batches * batch_size * block / (time.perf_counter() - started) / 1e6
                best[name][distance] = max(best[name].get(distance, 0.0), rate)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--dtype", default="int64,uint16")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print("best Mtok/s at each prefetch distance (windows ahead; 0: none)")
    print(
        f"{'dtype':6} {'block':>5} {'batch':>5} {'path':7} {'rule':>4}  "
        + "".join(f"{d:>7}" for d in C_LOOP_DISTANCES)
    )
    for dtype in args.dtype.split(","):
        ids = bench.synthetic_corpus(args.tokens, dtype, 0)
        for block, batch_size in bench.SHAPES:
            rule = cache_ahead(block, ids.dtype)
            for name, rates in sweep(ids, block, batch_size, args.rounds).items():
                print(
                    f"{dtype:6} {block:5} {batch_size:5} {name:7} {rule:4}  "
                    + "".join(f"{rates[d]:7,.0f}" for d in C_LOOP_DISTANCES),
                    flush=True,
                )


if __name__ == "__main__":
    main()
