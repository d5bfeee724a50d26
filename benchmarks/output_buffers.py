"""What the output buffer discipline costs the bare kernel: one buffer, several cycled, or fresh.

``python benchmarks/output_buffers.py [--tokens N] [--batches K]``

The C-loop baseline refills one buffer, which stays in the core's cache; a stream hands out a
fresh one per batch, and a caller that holds a batch while the next is made needs two whatever
the loader. This times ``gather_windows`` on fresh random int64 windows (no prefetch) writing
into 1, 2 or 3 cycled buffers or a fresh one per batch: microseconds per batch, best of 3.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tokstream import bench
from tokstream._windows import gather_windows

SHAPES = [(128, 512), (1024, 64), (2048, 16)]
DISCIPLINES = ["1 buffer", "2 cycled", "3 cycled", "fresh"]


def time_discipline(ids: np.ndarray, block: int, batch_size: int, discipline: str, batches: int):
    """Microseconds per batch of fresh random windows written as ``discipline`` says."""
    kernel = gather_windows.__signatures__["int64_t"]
    count = 0 if discipline == "fresh" else int(discipline[0])
    ring = [
        (np.empty((batch_size, block), np.int64), np.empty(batch_size, np.int64))
        for _ in range(count)
    ]
    starts = np.random.default_rng(len(discipline)).integers(
        0, ids.shape[0] - block - 1, (batches, batch_size)
    )
    started = time.perf_counter()
    for i, batch in enumerate(starts):
        if ring:
            windows, next_tokens = ring[i % count]
        else:
            windows, next_tokens = (
                np.empty((batch_size, block), np.int64),
                np.empty(batch_size, np.int64),
            )
        kernel(ids, batch, windows, next_tokens, None, 0)
    return (time.perf_counter() - started) / batches * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args(argv)
    ids = bench.synthetic_corpus(args.tokens, "int64", 0)
    print(f"{'block x batch':14}" + "".join(f"{d:>10}" for d in DISCIPLINES) + "   (us per batch)")
    for block, batch_size in SHAPES:
        best = {
            d: min(time_discipline(ids, block, batch_size, d, args.batches) for _ in range(3))
            for d in DISCIPLINES
        }
        print(
            f"{block:>5} x {batch_size:<6}" + "".join(f"{best[d]:10.1f}" for d in DISCIPLINES),
            flush=True,
        )


if __name__ == "__main__":
    main()
