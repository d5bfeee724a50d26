"""Cold cache: a shuffled stream over a token file that is not in memory, against the device.

The cold-cache protocol (docs/benchmarks.md), side by side in one run. For each shape and round, the
file's pages are evicted (``posix_fadvise(POSIX_FADV_DONTNEED)``) before each of:

- the device's rate: reads of one window's bytes at random offsets by ``--threads`` threads of
  ``pread`` (that many reads in flight), reads per second;
- tokstream: a shuffled stream (implicit permutation) over ``open_tokens(FILE)``, windows per
  second over at least ``--seconds``, with its read-ahead (the default) and without it.

Ratios are to the device's rate of the same round; the table shows medians over the rounds.
``--warm`` measures the same streams again with the file in the page cache (read-ahead on and
off, every shape of docs/benchmarks.md): read-ahead must cost nothing there.

``--packed``: the file is a Megatron dataset (``PREFIX.bin`` + ``PREFIX.idx``, memory-mapped)
and the streams are shuffled ``windows="packed"`` rows (``pad=0``), rows per second with the
read-ahead of each batch's pieces and without it; with ``--create``, a dataset of seeded
lognormal document lengths (median 500, mean 900, as ``benchmarks/packing.py``) is written. The
device's rate is still of reads of ``block + 1`` tokens (a row's bytes, in one piece).

    python benchmarks/cold_cache.py /tmp/tokens.npy --create 2.2     # write 2.2 GB of tokens
    python benchmarks/cold_cache.py /tmp/tokens.npy --rounds 3 --warm
    python benchmarks/cold_cache.py /tmp/packed --packed --create 1.3 --rounds 3

Linux only (eviction); the file must be larger than a few seconds of reading. Delete a file
made with ``--create`` when done (both files of a Megatron dataset).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from functools import partial

import numpy as np
from packing import lognormal_lengths

from tokstream import Corpus, open_tokens, stream_token_source, write_tokens
from tokstream._kernels.advice import resident_fraction
from tokstream.bench._device import read_at

COLD_SHAPES = ((1024, 64), (128, 512))
WARM_SHAPES = ((8, 4096), (128, 512), (1024, 64), (1024, 512), (2048, 16))


def create(path: str, gigabytes: float) -> None:
    """Write ``gigabytes`` GB of seeded random uint16 tokens as ``.npy`` (real, not sparse)."""
    count = int(gigabytes * 1e9) // 2
    tokens = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(count,))
    rng = np.random.default_rng(0)
    step = 1 << 26
    for start in range(0, count, step):
        stop = min(start + step, count)
        tokens[start:stop] = rng.integers(0, 50257, stop - start, dtype=np.uint16)
    tokens.flush()
    del tokens
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_documents(prefix: str, gigabytes: float) -> None:
    """Write ``gigabytes`` GB of seeded random uint16 tokens as a Megatron dataset whose
    documents have lognormal lengths (``benchmarks/packing.py``'s)."""
    count = int(gigabytes * 1e9) // 2
    tokens = np.random.default_rng(0).integers(0, 50257, count, dtype=np.uint16)
    lengths = lognormal_lengths(2 * count // 900 + 16)
    cuts = np.cumsum(lengths)
    corpus = Corpus.from_documents(np.split(tokens, cuts[cuts < count]))
    del tokens
    write_tokens(prefix, corpus, format="megatron")
    for suffix in (".bin", ".idx"):
        fd = os.open(prefix + suffix, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def evict(path: str) -> None:
    """Drop the file's pages from the page cache; fail loudly if they stay."""
    gc.collect()  # unmapped pages only can be dropped: let go of every earlier stream's map
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    tokens = np.memmap(path, dtype=np.uint8, mode="r")
    left = resident_fraction(tokens)
    del tokens
    if left > 0.01:
        sys.exit(f"eviction failed: {left:.1%} of {path} is still in memory (tmpfs? mapped?)")


def device_rate(path: str, window_bytes: int, seconds: float, threads: int) -> float:
    """Random reads of ``window_bytes`` per second with ``threads`` reads in flight."""
    evict(path)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead: the bytes asked for
    size = os.fstat(fd).st_size
    done = [0] * threads
    deadline = time.perf_counter() + seconds

    def run(index: int) -> None:
        rng = np.random.default_rng(index)
        buffer = bytearray(window_bytes)
        while time.perf_counter() < deadline:
            offsets = rng.integers(0, size - window_bytes, 16, dtype=np.int64)
            done[index] += read_at(fd, offsets, buffer)  # without the GIL

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    os.close(fd)
    return sum(done) / elapsed


def stream_rate(
    path: str,
    block: int,
    batch_size: int,
    seconds: float,
    readahead: bool,
    prefetch: int,
    corpus: Corpus | None = None,
    packed: bool = False,
) -> float:
    """Windows (packed rows) per second of a shuffled stream, for ``seconds``.

    Over the file, evicted first, or over ``corpus`` when one is given (the warm case).
    """
    if corpus is None:
        evict(data_file(path, packed))
        corpus = open_tokens(path)
    # Packed rows are the packing's own shuffle; windows the implicit permutation's.
    layout: dict[str, object] = (
        {"windows": "packed", "pad": 0} if packed else {"permutation": "implicit"}
    )
    stream = stream_token_source(
        corpus,
        block,
        batch_size,
        seed=time.monotonic_ns() % 2**32,
        epochs=1000,
        prefetch=prefetch,
        **layout,
    )
    if not readahead:
        stream._readahead = None  # the stream without its read-ahead, for comparison only
    windows = 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        batch = next(stream)
        windows += len(batch["input_ids"] if packed else batch[0])
    stream.close()
    return windows / elapsed


def data_file(path: str, packed: bool) -> str:
    """The file whose pages a stream over ``path`` reads: a Megatron dataset's ``.bin``."""
    return path + ".bin" if packed else path


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *rows]
    )


def spread(top: list[float], bottom: list[float]) -> str:
    """Median ratio of two same-round series, with its range over the rounds."""
    ratios = [a / b for a, b in zip(top, bottom, strict=True)]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def interleaved(rounds: int, measures: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Each measure once per round, in a rotating order, so drift spreads over all of them."""
    names = list(measures)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            rates[name].append(measures[name]())
            print(f"  round {round_index + 1} {name}: {rates[name][-1]:,.0f}", file=sys.stderr)
    return rates


def cold(args: argparse.Namespace, itemsize: int) -> None:
    rows = []
    for block, batch_size in COLD_SHAPES:
        print(f"block {block}, batch {batch_size}:", file=sys.stderr)
        shape = (args.file, block, batch_size, args.seconds)
        device_file = data_file(args.file, args.packed)
        rates = interleaved(
            args.rounds,
            {
                "device": partial(
                    device_rate, device_file, (block + 1) * itemsize, args.seconds, args.threads
                ),
                "read-ahead": partial(stream_rate, *shape, True, args.prefetch, packed=args.packed),
                "none": partial(stream_rate, *shape, False, args.prefetch, packed=args.packed),
            },
        )
        rows.append(
            [
                f"{block} x {batch_size}",
                f"{statistics.median(rates['device']):,.0f}",
                f"{statistics.median(rates['read-ahead']):,.0f}",
                spread(rates["read-ahead"], rates["device"]),
                f"{statistics.median(rates['none']):,.0f}",
                spread(rates["none"], rates["device"]),
            ]
        )
    unit = "packed rows" if args.packed else "windows"
    print(
        f"\ncold cache, {unit} (reads) per second, median of rounds; ratio to the device's rate "
        "in the same round (range over rounds)"
    )
    header = ["shape", "device reads/s", "read-ahead", "ratio", "no read-ahead", "ratio"]
    print(table(header, rows))


def warm(args: argparse.Namespace) -> None:
    corpus = open_tokens(args.file)
    for shard in corpus.shards:  # into the page cache and this process' page tables
        for start in range(0, shard.shape[0], 1 << 24):
            shard[start : start + (1 << 24)].max()
    rows = []
    for block, batch_size in WARM_SHAPES:
        print(f"warm block {block}, batch {batch_size}:", file=sys.stderr)
        shape = (args.file, block, batch_size, 1.0)
        rates = interleaved(
            max(args.rounds, 5),
            {
                "read-ahead": partial(stream_rate, *shape, True, args.prefetch, corpus),
                "none": partial(stream_rate, *shape, False, args.prefetch, corpus),
            },
        )
        rows.append(
            [
                f"{block} x {batch_size}",
                f"{statistics.median(rates['read-ahead']) * block / 1e6:,.0f}",
                f"{statistics.median(rates['none']) * block / 1e6:,.0f}",
                spread(rates["read-ahead"], rates["none"]),
            ]
        )
    print("\nwarm cache (file in the page cache), Mtok/s, median of rounds")
    print(table(["shape", "read-ahead", "no read-ahead", "ratio (range)"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="a token file open_tokens reads (npy, llm.c, raw)")
    parser.add_argument("--create", type=float, metavar="GB", help="first write a file this big")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--prefetch", type=int, default=0, help="the stream's prefetch=")
    parser.add_argument("--warm", action="store_true", help="also measure with the file cached")
    parser.add_argument(
        "--packed", action="store_true", help="FILE is a Megatron prefix; stream packed rows"
    )
    args = parser.parse_args()
    if args.packed and args.warm:
        parser.error("--warm measures windows only")
    if args.create:
        (create_documents if args.packed else create)(args.file, args.create)
    itemsize = open_tokens(args.file).dtype.itemsize
    print(
        f"{args.file}: {os.path.getsize(data_file(args.file, args.packed)) / 1e9:.2f} GB, "
        f"{args.rounds} rounds of "
        f"{args.seconds} s, device at {args.threads} reads in flight, stream "
        f"prefetch={args.prefetch}"
    )
    cold(args, itemsize)
    if args.warm:
        warm(args)


if __name__ == "__main__":
    main()
