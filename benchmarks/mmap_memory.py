"""Memory figures of a memory-mapped corpus, as quoted in README ("Token files and memory").

Not a test and not a pytest-benchmark: it writes big files and runs for a while. Linux only (it
reads ``/proc/self/status`` and ``/proc/self/io``).

``python benchmarks/mmap_memory.py tracemalloc DIR``
    Peak traced allocation of an epoch of a 50,000,000-token uint16 file, ``shuffle=False``:
    tokstream's whole epoch, and the reference path (its peak is set before the first batch, by
    the int64 copy of the corpus and the ``arange`` order, so it runs only ``--reference-batches``).
``python benchmarks/mmap_memory.py rss DIR --advice {auto,normal} [--cold] [--drop-every K]``
    RssAnon / RssFile of this process along a long shuffled run on a larger file, in a fresh
    process per configuration. ``auto`` is what a stream does (``MADV_RANDOM`` when shuffled);
    ``normal`` puts the kernel's default back after the stream advised. ``--cold`` evicts the
    file from the page cache first (``posix_fadvise(DONTNEED)``, this file only), so
    ``read_bytes`` shows the disk traffic. ``--drop-every K`` calls ``madvise(MADV_DONTNEED)``
    on the mapping every K batches: it unmaps the pages from this process (RssFile falls back)
    without discarding them from the page cache.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from tokstream import open_tokens, stream_token_source, write_tokens
from tokstream import reference as ref

MB = 1 << 20


def proc_fields(path: str, *names: str) -> dict[str, int]:
    values = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in names:
                values[key] = int(rest.split()[0])
    return values


def ensure_file(path: Path, n: int) -> Path:
    if path.exists() and path.stat().st_size == 2 * n:
        return path
    chunk = 1 << 24
    rng = np.random.default_rng(0)
    # Written piecewise so preparing a 1 GB file needs no 1 GB array.
    tmp = path.with_suffix(".part")
    with open(tmp, "wb") as f:
        for start in range(0, n, chunk):
            f.write(rng.integers(0, 50257, min(chunk, n - start), dtype=np.uint16).tobytes())
    os.replace(tmp, path)
    return path


def cmd_tracemalloc(args: argparse.Namespace) -> None:
    n, block, batch = 50_000_000, args.block, args.batch_size
    path = args.dir / "tokens_50m.bin"
    if not path.exists():
        pattern = np.random.default_rng(0).integers(0, 50257, 1 << 16).astype(np.uint16)
        write_tokens(path, np.resize(pattern, n), format="bin")

    tracemalloc.start()
    batches = 0
    for _ in stream_token_source(open_tokens(path), block, batch, shuffle=False):
        batches += 1
    _, fast_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    buffers = 2 * batch * (block + 1) * 8
    print(
        f"tokstream, {batches} batches (whole epoch): peak {fast_peak / MB:.2f} MiB "
        f"(batch buffers {buffers / MB:.2f} MiB, beyond them {(fast_peak - buffers) / MB:.2f})"
    )

    tracemalloc.start()
    mapped = open_tokens(path).shards[0]
    stream = ref.stream_token_source(mapped, block, batch, shuffle=False)
    for _, _ in zip(range(args.reference_batches), stream, strict=False):
        pass
    _, ref_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"reference, first {args.reference_batches} batches: peak {ref_peak / MB:.2f} MiB "
        f"({ref_peak / max(fast_peak, 1):.0f}x)"
    )


def cmd_rss(args: argparse.Namespace) -> None:
    path = ensure_file(args.dir / f"tokens_{args.tokens // 1_000_000}m.bin", args.tokens)
    if args.cold:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    corpus = open_tokens(path)
    stream = stream_token_source(
        corpus, args.block, args.batch_size, shuffle=True, seed=0, permutation=args.permutation
    )
    maps = list(corpus.memory_maps())
    if args.advice == "normal":
        for m in maps:
            m.madvise(mmap.MADV_NORMAL)
    io0 = proc_fields("/proc/self/io", "read_bytes")["read_bytes"]
    marks = sorted({int(args.batches * f) for f in (0.01, 0.05, 0.1, 0.25, 0.5, 1.0)})
    print(
        f"file {path.stat().st_size / MB:.0f} MiB, block {args.block}, batch "
        f"{args.batch_size}, advice {args.advice}, cold={args.cold}, drop_every="
        f"{args.drop_every}, permutation={args.permutation}"
    )
    print(f"{'batches':>8} {'RssAnon MiB':>12} {'RssFile MiB':>12} {'read MiB':>9} {'s':>6}")
    started = time.perf_counter()
    done = 0
    for mark in marks:
        while done < mark:
            next(stream)
            done += 1
            if args.drop_every and done % args.drop_every == 0:
                for m in maps:
                    m.madvise(mmap.MADV_DONTNEED)
        status = proc_fields("/proc/self/status", "RssAnon", "RssFile")
        read = proc_fields("/proc/self/io", "read_bytes")["read_bytes"] - io0
        print(
            f"{done:>8} {status['RssAnon'] / 1024:>12.1f} {status['RssFile'] / 1024:>12.1f} "
            f"{read / MB:>9.1f} {time.perf_counter() - started:>6.1f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tm = sub.add_parser("tracemalloc")
    tm.add_argument("dir", type=Path)
    tm.add_argument("--block", type=int, default=8)
    tm.add_argument("--batch-size", type=int, default=1 << 16)
    tm.add_argument("--reference-batches", type=int, default=20)
    rss = sub.add_parser("rss")
    rss.add_argument("dir", type=Path)
    rss.add_argument("--tokens", type=int, default=500_000_000)
    rss.add_argument("--block", type=int, default=128)
    rss.add_argument("--batch-size", type=int, default=64)
    rss.add_argument("--batches", type=int, default=20_000)
    rss.add_argument("--advice", choices=("auto", "normal"), default="auto")
    rss.add_argument("--permutation", choices=("implicit", "materialized"), default="implicit")
    rss.add_argument("--cold", action="store_true")
    rss.add_argument("--drop-every", type=int, default=0)
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    {"tracemalloc": cmd_tracemalloc, "rss": cmd_rss}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
