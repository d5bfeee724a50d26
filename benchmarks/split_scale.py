"""How long ``tokstream.split`` of millions of documents takes, and a stream's first batch over a
split (the splits' runs are many shards: ``2 f (1 - f) N`` of them for fractions ``f, 1 - f``).

    python benchmarks/split_scale.py [--documents N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tokstream import Corpus, split, stream_token_source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=5_000_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    offsets = np.zeros(args.documents + 1, np.int64)
    np.cumsum(rng.integers(1, 21, args.documents), out=offsets[1:])
    tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.uint16)
    corpus = Corpus._from_arrays([tokens], ["bench"], "bench", [offsets])
    print(f"{args.documents:,} documents of 1-20 tokens, {tokens.size:,} uint16 tokens")
    for fractions in ({"train": 0.99, "valid": 0.01}, {"a": 0.5, "b": 0.5}):
        started = time.perf_counter()
        parts = split(corpus, fractions, seed=0)
        made = time.perf_counter() - started
        name = list(fractions)[-1]
        started = time.perf_counter()
        next(stream_token_source(parts[name], 16, 64))
        first = time.perf_counter() - started
        runs = ", ".join(f"{n} {len(p.shards):,}" for n, p in parts.items())
        print(f"{fractions}: split {made:.2f} s (runs: {runs})")
        print(f"  first batch of a stream over {name!r}: {first:.2f} s")


if __name__ == "__main__":
    main()
