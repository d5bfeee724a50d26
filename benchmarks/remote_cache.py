"""Object storage: what the bounded cache keeps, and a manifest at a URL against a pattern.

The store is moto's S3 server behind the test suite's proxy (``tests/object_store.py``), as in
``benchmarks/remote.py``; a shuffled stream (block 1024, batch 64, 64 GETs in flight) over
``--objects`` uint16 ``.npy`` objects. Three parts, in one run:

- **epochs**: for each ``RemoteOptions`` setting (no cache budget; ``--budget`` bytes in memory;
  a budget above the corpus), ``--epochs`` whole epochs of windows ``stride=block`` apart (each
  window once an epoch): the bytes fetched in each epoch and its windows per second.
- **memory**: the same settings over a corpus of ``--big-tokens`` per object, 40 batches: the
  peak of the resident bytes the cache reports after each batch (the pages holding fetched
  bytes), and the bytes of pages evicted.
- **manifest**: windows per second over ``--seconds`` of a stream over the objects opened by
  their pattern and by a manifest of them in the same bucket (``open_tokens(".../manifest.json")``),
  rounds alternating; every stream's first batch is checked against the local files first.

    python benchmarks/remote_cache.py                   # 8 objects of 200,000 tokens, 0 ms
    python benchmarks/remote_cache.py --delay 30 --rounds 3

Needs ``moto[server]`` and obstore; run from the repository root.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import tokstream
from tokstream.manifest import write_manifest
from tokstream.shards.remote import RemoteOptions
from tokstream.shards.remote._memory import remote_tokens_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the suite's server machinery

from benchmarks.remote import upload_tokens  # noqa: E402
from tests.object_store import FaultProxy, S3Server  # noqa: E402

BLOCK, BATCH_SIZE = 1024, 64


def epochs_of(url: str, local: tokstream.Corpus, options: RemoteOptions, epochs: int) -> str:
    """One cache setting's line: bytes fetched and windows/s per epoch."""
    corpus = tokstream.open_tokens(url, remote=options)
    objects = remote_tokens_of(corpus.shards[0])
    assert objects is not None
    cache, session = objects.object.cache, objects.object.session
    fetched, rates = [], []
    for epoch in range(epochs):
        stream = tokstream.stream_token_source(
            corpus, BLOCK, BATCH_SIZE, seed=epoch, epochs=1, stride=BLOCK
        )
        expected = tokstream.stream_token_source(
            local, BLOCK, BATCH_SIZE, seed=epoch, epochs=1, stride=BLOCK
        )
        before, windows, start = session.bytes_fetched, 0, time.perf_counter()
        for (x, _), (u, _) in zip(stream, expected, strict=True):
            if not np.array_equal(x, u):
                raise SystemExit("the remote stream's batches differ from the local files'")
            windows += x.shape[0]
        rates.append(windows / (time.perf_counter() - start))
        fetched.append(session.bytes_fetched - before)
        stream.close()
    mib = 2**20
    return (
        f"fetched per epoch {', '.join(f'{f / mib:.2f}' for f in fetched)} MiB; windows/s per "
        f"epoch {', '.join(f'{r:.0f}' for r in rates)}; evicted {cache.evicted_bytes / mib:.2f} MiB"
    )


def memory_of(url: str, options: RemoteOptions, batches: int = 40) -> str:
    """One cache setting's line: the peak resident bytes over ``batches`` shuffled batches."""
    corpus = tokstream.open_tokens(url, remote=options)
    objects = remote_tokens_of(corpus.shards[0])
    assert objects is not None
    cache, session = objects.object.cache, objects.object.session
    stream = tokstream.stream_token_source(corpus, BLOCK, BATCH_SIZE, seed=1)
    peak = 0
    for _ in range(batches):
        next(stream)
        peak = max(peak, cache.resident_bytes)
    stream.close()
    mib = 2**20
    return (
        f"{batches} batches fetched {session.bytes_fetched / mib:.2f} MiB; peak resident "
        f"{peak / mib:.2f} MiB; evicted {cache.evicted_bytes / mib:.2f} MiB"
    )


def manifest_rates(
    urls: dict[str, str], local: tokstream.Corpus, seconds: float, rounds: int
) -> dict[str, list[float]]:
    """Windows per second after the first batch, by how the corpus was opened, per round."""
    rates: dict[str, list[float]] = {name: [] for name in urls}
    for round_ in range(rounds):
        for name, url in urls.items():
            stream = tokstream.stream_token_source(
                tokstream.open_tokens(url), BLOCK, BATCH_SIZE, seed=round_
            )
            expected = tokstream.stream_token_source(local, BLOCK, BATCH_SIZE, seed=round_)
            if not np.array_equal(next(stream)[0], next(expected)[0]):
                raise SystemExit(f"the {name} stream's batches differ from the local files'")
            windows, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                windows += next(stream)[0].shape[0]
            rates[name].append(windows / (time.perf_counter() - start))
            stream.close()
    return rates


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0, help="ms per request")
    parser.add_argument("--objects", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=200_000, help="tokens per object")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--big-tokens", type=int, default=4_000_000, help="the memory part's")
    parser.add_argument("--budget", type=int, default=1 << 20, help="a budget below the corpus")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    server = S3Server()
    proxy = FaultProxy(server)
    directory = Path(tempfile.mkdtemp(prefix="tokstream-bench-"))
    (directory / "big").mkdir()
    try:
        bucket, _ = upload_tokens(server, args.objects, args.tokens, directory)
        write_manifest(str(directory / "*.npy"), directory / "manifest.json")
        for name in ("manifest.json", "manifest.documents.npy"):
            if (directory / name).is_file():
                server.put(bucket, f"tokens/{name}", directory / name)
        os.environ.update(proxy.env())
        proxy.configure(delay_ms=args.delay)
        local = tokstream.open_tokens(str(directory / "shard_*.npy"))
        url = f"s3://{bucket}/tokens/shard_*.npy"
        corpus_bytes = local.num_tokens * local.dtype.itemsize
        print(
            f"{args.objects} objects x {args.tokens} uint16 tokens ({corpus_bytes / 2**20:.2f} "
            f"MiB); block {BLOCK}, batch {BATCH_SIZE}, 64 in flight, delay {args.delay:g} ms; "
            f"load {os.getloadavg()[0]:.1f}"
        )
        settings = {
            "no budget": RemoteOptions(),
            f"cache_max_bytes={args.budget}": RemoteOptions(cache_max_bytes=args.budget),
            "cache_max_bytes > corpus": RemoteOptions(cache_max_bytes=2 * corpus_bytes),
        }
        for name, options in settings.items():
            print(f"epochs, {name}: {epochs_of(url, local, options, args.epochs)}", flush=True)
        big, _ = upload_tokens(server, args.objects, args.big_tokens, directory / "big")
        big_bytes = args.objects * args.big_tokens * 2
        settings["cache_max_bytes > corpus"] = RemoteOptions(cache_max_bytes=2 * big_bytes)
        print(f"memory: {args.objects} objects x {args.big_tokens} tokens")
        for name, options in settings.items():
            line = memory_of(f"s3://{big}/tokens/shard_*.npy", options)
            print(f"memory, {name}: {line}", flush=True)
        urls = {"pattern": url, "manifest": f"s3://{bucket}/tokens/manifest.json"}
        rates = manifest_rates(urls, local, args.seconds, args.rounds)
        pattern, listed = (statistics.median(rates[name]) for name in urls)
        print(
            f"manifest: pattern {pattern:.0f} windows/s (rounds "
            f"{', '.join(f'{r:.0f}' for r in rates['pattern'])}), manifest {listed:.0f} (rounds "
            f"{', '.join(f'{r:.0f}' for r in rates['manifest'])}) = {listed / pattern:.2f}"
        )
    finally:
        proxy.stop()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
