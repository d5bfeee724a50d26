"""What ``windows="packed"`` costs and saves, measured in one process.

``python benchmarks/packing.py [--documents N] [--start-documents M] [--rounds R] [--batches K]
[--parts padding split start rate]``

Documents of seeded lognormal lengths (median 500, mean 900 tokens, as issue targets state):

- ``padding``: the share of a packed epoch's slots that are padding, at block 2048 and 8192,
  shuffled and not, over ``--documents`` documents (target: at most 0.5%);
- ``split``: the share of documents (of at least 2 tokens) whose tokens do not all lie in one
  sample: packed (exactly those longer than ``block + 1``) against ``stride=block`` windows of
  the concatenated documents; and the share of the labels each window policy keeps
  (``stride=block`` cross windows, within-document windows, packed rows);
- ``start``: the time to make a shuffled packed stream over ``--start-documents`` documents (a
  sparse memory-mapped uint16 file, so only the boundaries are real) and draw its first batch
  (target: under a second at 10**7), the memory it allocates beyond the corpus' boundaries
  (tracemalloc) and its ``state_dict()``'s JSON size (target: under 16 KB); then the same with
  the corpus opened first, from a Megatron dataset of those documents and through a manifest of
  it (the open, its checks and the documents read included);
- ``rate``: packed streaming against the ``stride=block`` stream (``targets="shifted"``, loss
  mask) over the same ~2 * 10**7 uint16 tokens, rounds alternating, median Mtok/s of each and
  their ratio (target: at least 0.5); also per second of the thread's CPU time, which a host
  shared with other work disturbs less than the wall clock.

``--parts`` picks some of them (default: all).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from tokstream import Corpus, open_tokens, stream_token_source
from tokstream.formats import megatron
from tokstream.manifest import write_manifest
from tokstream.packing import Packing, piece_counts

PARTS = ("padding", "split", "start", "rate")
SIGMA = float(np.sqrt(2 * np.log(900 / 500)))  # lognormal median 500, mean 900


def lognormal_lengths(count: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.lognormal(np.log(500), SIGMA, count).astype(np.int64)


def boundaries_of(lengths: np.ndarray) -> np.ndarray:
    boundaries = np.zeros(lengths.shape[0] + 1, np.int64)
    np.cumsum(lengths, out=boundaries[1:])
    return boundaries


def padding(documents: int) -> None:
    lengths = lognormal_lengths(documents)
    boundaries = boundaries_of(lengths)
    print(f"padding over {documents:,} documents (share of a packed epoch's slots)")
    for block in (2048, 8192):
        full, short = piece_counts(lengths, block)
        tokens = int((full * (block + 1) + short).sum())
        for shuffle in (False, True):
            packing = Packing(boundaries, block, shuffle=shuffle, seed=0)
            share = 1 - tokens / (packing.num_rows * (block + 1))
            print(
                f"  block {block:5d} shuffle={shuffle!s:5}: {share:.3%} "
                f"of {packing.num_rows:,} rows"
            )


def split(documents: int) -> None:
    lengths = lognormal_lengths(documents)
    starts = boundaries_of(lengths)[:-1]
    counted = lengths >= 2
    labels = int(np.maximum(lengths - 1, 0).sum())
    print(f"documents split and labels kept over {documents:,} documents")
    for block in (2048, 8192):
        packed = float((lengths[counted] > block + 1).mean())
        # stride=block windows of the concatenation: sample k holds tokens [k * block, (k + 1)
        # * block]; a document is whole when one sample holds its first and its last token.
        first = starts // block
        concatenated = float(((starts + lengths - 1) > first * block + block)[counted].mean())
        within = int(((lengths - 1) // block * block)[lengths > block].sum())
        print(
            f"  block {block:5d}: split packed {packed:.2%}, concatenated {concatenated:.2%}; "
            f"labels kept: cross 100% (less the tail), within {within / labels:.1%}, packed 100%"
        )


def start(documents: int) -> None:
    lengths = lognormal_lengths(documents, seed=1)
    boundaries = boundaries_of(lengths)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tokens.bin")
        with open(path, "wb") as f:
            f.truncate(int(boundaries[-1]) * 2)  # sparse: only the boundaries are real
        tokens = np.memmap(path, np.uint16, "r")
        corpus = Corpus._from_arrays([tokens], [path], path, [boundaries])
        first_batch(f"start over {documents:,} documents (boundaries in hand)", lambda: corpus)
        print(f"  ({int(boundaries[-1]):,} tokens; boundaries {boundaries.nbytes / 2**20:.0f} MiB)")
        # The same documents as a user has them: a Megatron dataset (its index real, its
        # tokens sparse), opened by path and through a manifest of it.
        prefix = os.path.join(directory, "docs")
        with open(prefix + ".idx", "wb") as f:
            megatron.write_index(f, boundaries, np.dtype(np.uint16))
        os.rename(path, prefix + ".bin")
        write_manifest([prefix + ".bin"], os.path.join(directory, "toc", "manifest.json"))
        first_batch("  opened from its Megatron files", lambda: open_tokens(prefix))
        toc = os.path.join(directory, "toc")
        first_batch("  opened through a manifest of them", lambda: open_tokens(toc))


def first_batch(label: str, corpus_of: Callable[[], Corpus]) -> None:
    """Time ``corpus_of()`` (an open, or nothing) and a shuffled packed stream's first batch."""
    tracemalloc.start()
    began, cpu = time.perf_counter(), time.thread_time()
    stream = stream_token_source(corpus_of(), 2048, 16, windows="packed", pad=0)
    next(stream)
    seconds, cpu = time.perf_counter() - began, time.thread_time() - cpu
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    state = len(json.dumps(stream.state_dict()))
    print(
        f"{label} (block 2048, batch 16, shuffled): first batch {seconds:.2f} s "
        f"({cpu:.2f} s of CPU), peak {peak / 2**20:.1f} MiB allocated, state_dict {state:,} bytes"
    )


def rate(rounds: int, batches: int) -> None:
    lengths = lognormal_lengths(24_000, seed=2)
    boundaries = boundaries_of(lengths)
    tokens = np.random.default_rng(3).integers(0, 50257, int(boundaries[-1])).astype(np.uint16)
    corpus = Corpus._from_arrays([tokens], ["tokens"], "tokens", [boundaries])
    print(f"rate over {tokens.shape[0]:,} uint16 tokens in {lengths.shape[0]:,} documents")
    for block, batch_size in ((2048, 16), (1024, 64), (8192, 4)):
        common = {"epochs": 1000, "targets": "shifted", "extras": ("loss_mask",)}
        sides = {
            "packed": stream_token_source(
                corpus, block, batch_size, windows="packed", pad=0, **common
            ),
            "stride=block": stream_token_source(corpus, block, batch_size, stride=block, **common),
        }
        for stream in sides.values():
            next(stream)
        rates: dict[str, list[float]] = {name: [] for name in sides}
        cpu_rates: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(rounds):
            for name, stream in sides.items():
                began, cpu = time.perf_counter(), time.thread_time()
                for _ in range(batches):
                    next(stream)
                tokens = batches * batch_size * block
                rates[name].append(tokens / (time.perf_counter() - began))
                cpu_rates[name].append(tokens / max(time.thread_time() - cpu, 1e-9))
        packed, strided = (statistics.median(rates[name]) / 1e6 for name in sides)
        cpu_packed, cpu_strided = (statistics.median(cpu_rates[name]) / 1e6 for name in sides)
        print(
            f"  block {block:5d} batch {batch_size:3d}: packed {packed:,.0f} Mtok/s, "
            f"stride=block {strided:,.0f} Mtok/s, ratio {packed / strided:.2f} "
            f"(per CPU second: {cpu_packed:,.0f} vs {cpu_strided:,.0f}, "
            f"ratio {cpu_packed / cpu_strided:.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--start-documents", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument(
        "--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure"
    )
    args = parser.parse_args()
    if "padding" in args.parts:
        padding(args.documents)
    if "split" in args.parts:
        split(args.documents)
    if "start" in args.parts:
        start(args.start_documents)
    if "rate" in args.parts:
        rate(args.rounds, args.batches)


if __name__ == "__main__":
    main()
