"""How close the batch extras come to the least any implementation must write, in one process.

``python benchmarks/extras_floor.py [--tokens N] [--rounds R] [--batches K]``

On the documents corpus of ``documents_ratios.py`` (shuffled, implicit, shifted targets), three
streams with rounds alternating: the plain stream, the stream with every extra, and the *floor*:
the plain stream plus, per batch, a ``(b, block)`` int64 array set to ``0, 1, 2, ...`` in every
row and a bool array set to ones, the memory the position ids and the loss mask take, with no
document logic and no ``cu_seqlens`` (one buffer each, reused: no allocation, no page fault;
the rows copied from a ramp, NumPy's fastest write). Printed: us a batch (median of the
rounds) and the rate of each against the plain stream's. No stream with int64 position ids
can beat the floor's ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
from documents_ratios import DTYPES, EXTRAS, SHAPES, documents_corpus, make_stream


def floor_batch(
    stream: Iterator[Any], ramp: np.ndarray, positions: np.ndarray, mask: np.ndarray
) -> None:
    """A plain batch, then the position ids' and the loss mask's memory written as fast as
    NumPy writes: one reused buffer each, rows copied from a ramp, the mask set to ones."""
    next(stream)
    np.copyto(positions, ramp)
    mask.fill(True)


def measure(corpus: Any, block: int, batch_size: int, rounds: int, batches: int) -> dict:
    """Median us a batch of the plain stream, the stream with every extra and the floor."""
    sides: dict[str, Callable[[], Any]] = {
        "plain": partial(next, make_stream(corpus, block, batch_size)),
        "extras": partial(next, make_stream(corpus, block, batch_size, extras=EXTRAS)),
        "floor": partial(
            floor_batch,
            make_stream(corpus, block, batch_size),
            np.arange(block, dtype=np.int64),
            np.empty((batch_size, block), np.int64),
            np.empty((batch_size, block), np.bool_),
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, step in sides.items():
            start = time.perf_counter()
            for _ in range(batches):
                step()
            times[name].append((time.perf_counter() - start) / batches * 1e6)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=100)
    args = parser.parse_args()
    print(
        f"{'dtype':6} {'block':>5} {'batch':>5} {'plain':>7} {'extras':>7} {'floor':>7}"
        f" {'extras/plain':>13} {'floor/plain':>12}  (us a batch; ratios of rates)"
    )
    for dtype in DTYPES:
        corpus = documents_corpus(args.tokens, dtype)
        for block, batch_size in SHAPES:
            us = measure(corpus, block, batch_size, args.rounds, args.batches)
            print(
                f"{dtype:6} {block:5} {batch_size:5} {us['plain']:7.1f} {us['extras']:7.1f}"
                f" {us['floor']:7.1f} {us['plain'] / us['extras']:13.2f}"
                f" {us['plain'] / us['floor']:12.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
