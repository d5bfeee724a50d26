"""Object storage: a shuffled stream over token files in an S3 store, against the store itself.

The object-storage protocol (docs/benchmarks.md): the store is moto's S3 server on 127.0.0.1 with
the fault proxy of the test suite in front of it (``tests/object_store.py``), which holds every
request back ``--delay`` milliseconds (0 and 30 by default: a store across a network). For each
delay, side by side in one run:

- the store's rate: range GETs of one window's bytes (``2 * (block + 1)`` for uint16) at random
  offsets of the objects, ``--in-flight`` at once, made straight with obstore (the client the
  ``remote`` extra uses): GETs per second over at least ``--seconds``;
- tokstream's rate: a shuffled stream over ``open_tokens("s3://bucket/tokens/*.npy")`` with the
  same ``--in-flight`` (``RemoteOptions(max_in_flight=...)``), windows per second over at least
  ``--seconds`` after the first batch; the first batch's time from the stream's creation; the
  bytes fetched per byte of the windows delivered (the look-ahead's last windows included);
- the store's own time for the first batch: the range GETs of exactly that batch's windows
  (one per window, ``--batch-size`` of them), ``--in-flight`` at once, straight with obstore from
  a new store (no pooled connection, as the stream's first batch has none), timed from the
  store's creation to the last byte: the floor of tokstream's first batch.

The two alternate round by round; every remote batch is first checked byte-identical to the same
stream over the same files on disk.

    python benchmarks/remote.py                          # 0 and 30 ms, block 1024, 64 in flight
    python benchmarks/remote.py --delay 30 --in-flight 256 --block 128

Needs ``moto[server]`` and obstore (``pip install '.[remote]' 'moto[server]'``); run from the
repository root (it starts the test suite's servers).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import tokstream
from tokstream.shards.remote import RemoteOptions
from tokstream.shards.remote._memory import remote_tokens_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the suite's server machinery

from tests.object_store import FaultProxy, S3Server, client_environment  # noqa: E402


def store_of(bucket: str, endpoint: str) -> Any:
    """An obstore S3 store of ``bucket`` at ``endpoint``, with no retries (none are needed)."""
    from obstore.store import S3Store

    env = client_environment(endpoint)
    return S3Store(
        bucket,
        endpoint=endpoint,
        access_key_id=env["AWS_ACCESS_KEY_ID"],
        secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region=env["AWS_REGION"],
        client_options={"allow_http": True, "pool_max_idle_per_host": "1024"},
        retry_config={"max_retries": 0},
    )


async def _range_gets(
    store: Any, objects: Sequence[tuple[str, int]], size: int, in_flight: int, seconds: float
) -> tuple[int, float]:
    """GETs of ``size`` bytes at random offsets, ``in_flight`` at once, for ``seconds``:
    (GETs completed, seconds taken)."""
    import obstore

    rng = random.Random(0)
    done = 0
    start = time.perf_counter()
    end = start + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < end:
            key, length = objects[rng.randrange(len(objects))]
            offset = rng.randrange(0, length - size)
            data = await obstore.get_range_async(store, key, start=offset, end=offset + size)
            assert len(data) == size
            done += 1

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return done, time.perf_counter() - start


async def _gets(store: Any, ranges: Sequence[tuple[str, int, int]], in_flight: int) -> None:
    """The range GETs ``ranges`` (key, start, end), ``in_flight`` at once."""
    import obstore

    semaphore = asyncio.Semaphore(in_flight)

    async def one(key: str, start: int, end: int) -> None:
        async with semaphore:
            data = await obstore.get_range_async(store, key, start=start, end=end)
        assert len(data) == end - start

    await asyncio.gather(*(one(*r) for r in ranges))


def store_first_batch(
    bucket: str, endpoint: str, ranges: Sequence[tuple[str, int, int]], in_flight: int
) -> float:
    """Seconds for the store to serve ``ranges`` from a new store (new connections)."""
    begin = time.perf_counter()
    asyncio.run(_gets(store_of(bucket, endpoint), ranges, in_flight))
    return time.perf_counter() - begin


def first_batch_ranges(
    url: str, block: int, batch_size: int, seed: int
) -> list[tuple[str, int, int]]:
    """(key, start, end) of the windows of the first batch of the stream :func:`stream_rate`
    makes with ``seed``, one range per window, found without fetching a token."""
    stream = tokstream.stream_token_source(tokstream.open_tokens(url), block, batch_size, seed=seed)
    order, residency = stream._order, stream._fill.residency
    windows = order.batch_windows(order.first_cursor(), order.rows_at(order.first_cursor()))
    ranges = [(obj.key, a, b) for obj, a, b in residency.window_requests(stream._space, windows)]
    stream.close()
    return ranges


def store_rate(
    store: Any, objects: Sequence[tuple[str, int]], size: int, in_flight: int, seconds: float
) -> float:
    """The store's own rate: range GETs of ``size`` bytes per second at ``in_flight`` at once,
    straight with the client (no tokstream), after one untimed warm-up of the connections."""
    asyncio.run(_range_gets(store, objects, size, in_flight, min(seconds, 0.5)))
    done, took = asyncio.run(_range_gets(store, objects, size, in_flight, seconds))
    return done / took


def stream_rate(
    url: str, block: int, batch_size: int, in_flight: int, seconds: float, seed: int
) -> tuple[float, float, float]:
    """tokstream's side: ``(windows per second after the first batch, the first batch's
    seconds from the stream's creation, bytes fetched / bytes of the windows delivered)``."""
    corpus = tokstream.open_tokens(url, remote=RemoteOptions(max_in_flight=in_flight))
    begin = time.perf_counter()
    stream = tokstream.stream_token_source(corpus, block, batch_size, seed=seed)
    next(stream)
    first = time.perf_counter() - begin
    batches = 0
    begin = time.perf_counter()
    while time.perf_counter() - begin < seconds:
        next(stream)
        batches += 1
    rate = batches * batch_size / (time.perf_counter() - begin)
    stream.close()
    fetched = remote_tokens_of(corpus.shards[0]).object.session.bytes_fetched
    delivered = (batches + 1) * batch_size * (block + 1) * corpus.dtype.itemsize
    return rate, first, fetched / delivered


def check_identical(url: str, local: Path, block: int, batch_size: int) -> None:
    """The remote stream's first batches are the local stream's, byte for byte."""
    far = tokstream.stream_token_source(tokstream.open_tokens(url), block, batch_size, seed=9)
    near = tokstream.stream_token_source(
        tokstream.open_tokens(str(local / "*.npy")), block, batch_size, seed=9
    )
    for _ in range(3):
        (x, y), (u, v) = next(far), next(near)
        if not (np.array_equal(x, u) and np.array_equal(y, v)):
            raise SystemExit("the remote stream's batches differ from the local files'")
    far.close()


def upload_tokens(
    server: S3Server, objects: int, tokens: int, directory: Path
) -> tuple[str, list[tuple[str, int]]]:
    """``objects`` .npy files of ``tokens`` seeded uint16 tokens each, in a new bucket (and in
    ``directory``)."""
    bucket = server.create_bucket("bench")
    rng = np.random.default_rng(0)
    keys = []
    for i in range(objects):
        path = directory / f"shard_{i:04d}.npy"
        np.save(path, rng.integers(0, 50257, tokens, dtype=np.uint16))
        key = f"tokens/{path.name}"
        server.put(bucket, key, path)
        keys.append((key, path.stat().st_size))
    return bucket, keys


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, nargs="+", default=[0, 30], help="ms per request")
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--objects", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=1 << 19, help="tokens per object")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    server = S3Server()
    proxy = FaultProxy(server)
    local = Path(tempfile.mkdtemp(prefix="tokstream-bench-"))
    try:
        bucket, objects = upload_tokens(server, args.objects, args.tokens, local)
        os.environ.update(proxy.env())
        url = f"s3://{bucket}/tokens/*.npy"
        check_identical(url, local, args.block, args.batch_size)
        store = store_of(bucket, proxy.endpoint)
        size = 2 * (args.block + 1)
        print(
            f"{args.objects} objects x {args.tokens} uint16 tokens; block {args.block}, "
            f"GETs of {size} bytes, {args.in_flight} in flight; load {os.getloadavg()[0]:.1f}"
        )
        for delay in args.delay:
            proxy.configure(delay_ms=delay)
            rates, streams, firsts, fetched, floors = [], [], [], [], []
            for round_ in range(args.rounds):
                rates.append(store_rate(store, objects, size, args.in_flight, args.seconds))
                ranges = first_batch_ranges(url, args.block, args.batch_size, round_)
                floors.append(store_first_batch(bucket, proxy.endpoint, ranges, args.in_flight))
                rate, first, ratio = stream_rate(
                    url, args.block, args.batch_size, args.in_flight, args.seconds, round_
                )
                streams.append(rate)
                firsts.append(first)
                fetched.append(ratio)
            line = f"delay {delay:4.0f} ms: store {statistics.median(rates):8.0f} GETs/s"
            line += f" (rounds {', '.join(f'{r:.0f}' for r in rates)})"
            line += f"; tokstream {statistics.median(streams):8.0f} windows/s"
            line += f" (rounds {', '.join(f'{r:.0f}' for r in streams)})"
            line += f" = {statistics.median(streams) / statistics.median(rates):.2f} of the store"
            line += f"; first batch {statistics.median(firsts):.2f} s (max {max(firsts):.2f})"
            line += f", the store's {statistics.median(floors):.2f} s for its {len(ranges)} GETs"
            pairs = zip(firsts, floors, strict=True)
            line += f" (rounds {', '.join(f'{a:.2f}/{b:.2f}' for a, b in pairs)})"
            line += f"; fetched / delivered {max(fetched):.3f} at most"
            print(line, flush=True)
    finally:
        proxy.stop()
        server.stop()
        shutil.rmtree(local, ignore_errors=True)


if __name__ == "__main__":
    main()
