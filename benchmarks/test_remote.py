"""Object storage: a shuffled stream over token files in an S3 store, against the store itself.

The store is moto's S3 server on 127.0.0.1 behind the test suite's delaying proxy
(``tests/object_store.py``), which holds every request back 0 or 30 ms (a store across a
network); the objects are ``.npy`` files of seeded uint16 tokens. Needs obstore and
``moto[server]`` (skipped without them).

- ``test_remote_rate``: the store's rate, range GETs of one window's bytes at random offsets,
  64 in flight, straight with obstore (GETs/s), against a shuffled stream over
  ``open_tokens("s3://.../*.npy", remote=RemoteOptions(max_in_flight=64))`` after its first
  batch (windows/s; target 0.7 of the store's); noted: the bytes the proxy served per byte of
  the windows delivered (target: at most 1.2);
- ``test_remote_first_batch``: the stream's first batch from its creation, against the store's
  own time for as many range GETs (one per window, 64 in flight) from a new store;
- ``test_cache_epochs``: whole epochs of windows ``stride=block`` apart under each cache
  setting (no budget, 1 MiB, a budget above the corpus), windows/s; noted: bytes fetched per
  epoch;
- ``test_cache_memory``: 40 shuffled batches of a larger corpus under each setting; noted: the
  peak of the bytes the cache holds resident, and the bytes evicted;
- ``test_manifest_url``: a stream over the objects opened by their pattern against one opened by
  a manifest of them in the same bucket.

Every remote stream's first batch is checked identical to the same stream over the local files.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokstream
from tokstream.manifest import write_manifest
from tokstream.shards.remote import RemoteOptions

BLOCK, BATCH_SIZE, IN_FLIGHT = 1024, 64, 64
SHAPES = [(1024, 64), (128, 512)]
DELAYS = [0, 30]


@pytest.fixture(scope="module")
def store(settings, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The server, the proxy, the objects uploaded (and on disk), the client's environment."""
    pytest.importorskip("obstore")
    pytest.importorskip("moto.server")
    from tests.object_store import FaultProxy, S3Server

    server = S3Server()
    proxy = FaultProxy(server)
    saved = dict(os.environ)
    try:
        directory = tmp_path_factory.mktemp("objects")
        objects = settings.size(8, 2)
        bucket, keys = upload(server, directory, objects, settings.size(262_144, 16_384))
        write_manifest(str(directory / "*.npy"), directory / "manifest.json")
        for name in ("manifest.json", "manifest.documents.npy"):
            if (directory / name).is_file():
                server.put(bucket, f"tokens/{name}", directory / name)
        big = directory / "big"
        big.mkdir()
        big_bucket, _ = upload(server, big, objects, settings.size(4_000_000, 65_536))
        os.environ.update(proxy.env())
        yield {
            "server": server,
            "proxy": proxy,
            "bucket": bucket,
            "keys": keys,
            "url": f"s3://{bucket}/tokens/shard_*.npy",
            "manifest url": f"s3://{bucket}/tokens/manifest.json",
            "big url": f"s3://{big_bucket}/tokens/shard_*.npy",
            "local": tokstream.open_tokens(str(directory / "shard_*.npy")),
        }
    finally:
        os.environ.clear()
        os.environ.update(saved)
        proxy.stop()
        server.stop()


def upload(server: Any, directory: Path, objects: int, tokens: int) -> tuple[str, list]:
    """``objects`` .npy files of ``tokens`` seeded uint16 tokens each, in a new bucket (and in
    ``directory``): the bucket and ``(key, size)`` of each."""
    bucket = server.create_bucket("bench")
    rng = np.random.default_rng(0)
    keys = []
    for i in range(objects):
        path = directory / f"shard_{i:04d}.npy"
        np.save(path, rng.integers(0, 50257, tokens, dtype=np.uint16))
        server.put(bucket, f"tokens/{path.name}", path)
        keys.append((f"tokens/{path.name}", path.stat().st_size))
    return bucket, keys


def obstore_of(store: dict[str, Any]) -> Any:
    """An obstore S3 store of the bucket, through the proxy, with no retries."""
    from obstore.store import S3Store

    from tests import object_store

    env = object_store.client_environment(store["proxy"].endpoint)
    return S3Store(
        store["bucket"],
        endpoint=store["proxy"].endpoint,
        access_key_id=env["AWS_ACCESS_KEY_ID"],
        secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region=env["AWS_REGION"],
        client_options={"allow_http": True, "pool_max_idle_per_host": "1024"},
        retry_config={"max_retries": 0},
    )


async def range_gets(client: Any, keys: list, size: int, count: int, seed: int) -> int:
    """``count`` GETs of ``size`` bytes at random offsets, :data:`IN_FLIGHT` at once."""
    import obstore

    rng = random.Random(seed)
    semaphore = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> None:
        key, length = keys[rng.randrange(len(keys))]
        offset = rng.randrange(0, length - size)
        async with semaphore:
            data = await obstore.get_range_async(client, key, start=offset, end=offset + size)
        assert len(data) == size

    await asyncio.gather(*(one() for _ in range(count)))
    return count


def check_remote_matches_local(store: dict[str, Any], url: str, block: int, batch_size: int):
    far = tokstream.stream_token_source(tokstream.open_tokens(url), block, batch_size, seed=9)
    near = tokstream.stream_token_source(store["local"], block, batch_size, seed=9)
    for _ in range(2):
        (x, y), (u, v) = next(far), next(near)
        assert np.array_equal(x, u) and np.array_equal(y, v)
    far.close()


def served_bytes(store: dict[str, Any]) -> int:
    return sum(r.get("body_bytes", 0) for r in store["proxy"].stats()["requests"])


def smoke_skip(settings: Any, shape: tuple[int, int], delay: int) -> None:
    """A smoke run times one shape without delay (moto serves a few hundred GETs a second)."""
    if settings.tiny and (delay or shape != SHAPES[0]):
        pytest.skip("a smoke run times one shape, no delay")


def take(stream: Any, batches: int) -> int:
    windows = 0
    for _ in range(batches):
        windows += len(next(stream)[0])
    return windows


@pytest.mark.parametrize("side", ["tokstream", "store"])
@pytest.mark.parametrize("delay", DELAYS, ids=[f"{d}ms" for d in DELAYS])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{n}" for b, n in SHAPES])
def test_remote_rate(measure, settings, store, shape, delay, side) -> None:
    smoke_skip(settings, shape, delay)
    block, batch_size = shape
    store["proxy"].configure(delay_ms=delay)
    group = f"object storage block={block} batch={batch_size} delay={delay} ms"
    reads = settings.size(1024, batch_size)
    if side == "store":
        client = obstore_of(store)
        size = 2 * (block + 1)
        asyncio.run(range_gets(client, store["keys"], size, IN_FLIGHT, 1))  # the connections
        measure(
            lambda: asyncio.run(range_gets(client, store["keys"], size, reads, 0)),
            group=group,
            side="store range GETs",
            subject="tokstream",
            units=reads,
            unit="reads/s",
            scale=1,
        )
        return
    check_remote_matches_local(store, store["url"], block, batch_size)
    options = RemoteOptions(max_in_flight=IN_FLIGHT)
    corpus = tokstream.open_tokens(store["url"], remote=options)
    stream = tokstream.stream_token_source(corpus, block, batch_size, seed=1, epochs=1000)
    next(stream)
    store["proxy"].configure(delay_ms=delay)  # clears the proxy's log
    batches = max(1, reads // batch_size)
    windows = measure(
        take,
        args=(stream, batches),
        group=group,
        side="tokstream",
        units=lambda windows: windows,
        unit="reads/s",
        scale=1,
    )
    stream.close()
    delivered = windows * (block + 1) * corpus.dtype.itemsize * max(settings.rounds, 1)
    measure.note(
        group,
        f"served / delivered {served_bytes(store) / delivered:.2f} (the proxy's "
        "body bytes over the windows' bytes, the look-ahead included)",
    )


@pytest.mark.parametrize("side", ["tokstream", "store"])
@pytest.mark.parametrize("delay", DELAYS, ids=[f"{d}ms" for d in DELAYS])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{n}" for b, n in SHAPES])
def test_remote_first_batch(measure, settings, store, shape, delay, side) -> None:
    smoke_skip(settings, shape, delay)
    block, batch_size = shape
    store["proxy"].configure(delay_ms=delay)
    group = f"object storage first batch block={block} batch={batch_size} delay={delay} ms"
    if side == "store":

        def store_first_batch() -> int:
            client = obstore_of(store)  # new connections, as the stream's first batch has
            return asyncio.run(range_gets(client, store["keys"], 2 * (block + 1), batch_size, 2))

        function = store_first_batch
    else:
        check_remote_matches_local(store, store["url"], block, batch_size)
        options = RemoteOptions(max_in_flight=IN_FLIGHT)
        corpus = tokstream.open_tokens(store["url"], remote=options)
        rounds = iter(range(10**6))

        def function() -> Any:
            stream = tokstream.stream_token_source(corpus, block, batch_size, seed=next(rounds))
            try:
                return next(stream)
            finally:
                stream.close()

    measure(
        function,
        group=group,
        side=f"{side}: {batch_size} windows",
        subject=f"tokstream: {batch_size} windows",
        units=1,
        unit="s",
        rounds=settings.size(3, 1),
    )


def cache_settings(corpus_bytes: int) -> dict[str, Any]:
    return {
        "no budget": RemoteOptions(),
        "cache_max_bytes=1 MiB": RemoteOptions(cache_max_bytes=1 << 20),
        "cache_max_bytes > corpus": RemoteOptions(cache_max_bytes=2 * corpus_bytes),
    }


SETTINGS = ["no budget", "cache_max_bytes=1 MiB", "cache_max_bytes > corpus"]


@pytest.mark.parametrize("setting", SETTINGS)
def test_cache_epochs(measure, settings, store, setting) -> None:
    """Each round one whole epoch (each window once), the cache kept from round to round."""
    local = store["local"]
    options = cache_settings(local.num_tokens * local.dtype.itemsize)[setting]
    corpus = tokstream.open_tokens(store["url"], remote=options)
    store["proxy"].configure(delay_ms=0)
    epochs = iter(range(10**6))
    fetched: list[int] = []

    def epoch() -> int:
        seed = next(epochs)
        stream = tokstream.stream_token_source(
            corpus, BLOCK, BATCH_SIZE, seed=seed, epochs=1, stride=BLOCK
        )
        expected = tokstream.stream_token_source(
            local, BLOCK, BATCH_SIZE, seed=seed, epochs=1, stride=BLOCK
        )
        before = served_bytes(store)
        windows = 0
        for (x, _), (u, _) in zip(stream, expected, strict=True):
            assert np.array_equal(x, u)
            windows += x.shape[0]
        fetched.append(served_bytes(store) - before)
        return windows

    group = "object storage cache: epochs of windows stride=block"
    measure(
        epoch,
        group=group,
        side=setting,
        subject="no budget",
        units=lambda windows: windows,
        unit="windows/s",
        scale=1,
        rounds=settings.size(2, 1),
    )
    measure.note(
        group, f"{setting}: served per epoch " + ", ".join(f"{f / 2**20:.2f} MiB" for f in fetched)
    )


@pytest.mark.parametrize("setting", SETTINGS)
def test_cache_memory(measure, settings, store, setting) -> None:
    from tokstream.shards.remote._memory import remote_tokens_of

    big = tokstream.open_tokens(store["big url"])
    options = cache_settings(big.num_tokens * big.dtype.itemsize)[setting]
    corpus = tokstream.open_tokens(store["big url"], remote=options)
    cache = remote_tokens_of(corpus.shards[0]).object.cache
    batches = settings.size(40, 4)
    peaks: list[int] = []

    def run() -> int:
        stream = tokstream.stream_token_source(corpus, BLOCK, BATCH_SIZE, seed=len(peaks))
        peak = 0
        for _ in range(batches):
            next(stream)
            peak = max(peak, cache.resident_bytes)
        stream.close()
        peaks.append(peak)
        return batches * BATCH_SIZE

    group = f"object storage cache: {batches} shuffled batches of a larger corpus"
    measure(
        run,
        group=group,
        side=setting,
        subject="no budget",
        units=lambda w: w,
        unit="windows/s",
        scale=1,
        rounds=1,
    )
    measure.note(
        group,
        f"{setting}: peak resident {max(peaks) / 2**20:.2f} MiB, evicted "
        f"{cache.evicted_bytes / 2**20:.2f} MiB",
    )


@pytest.mark.parametrize("opened", ["pattern", "manifest"])
def test_manifest_url(measure, settings, store, opened) -> None:
    url = store["url"] if opened == "pattern" else store["manifest url"]
    store["proxy"].configure(delay_ms=0)
    check_remote_matches_local(store, url, BLOCK, BATCH_SIZE)
    stream = tokstream.stream_token_source(
        tokstream.open_tokens(url), BLOCK, BATCH_SIZE, seed=0, epochs=1000
    )
    next(stream)
    measure(
        take,
        args=(stream, settings.size(40, 2)),
        group="object storage: a pattern against a manifest at a URL",
        side=opened,
        subject="manifest",
        units=lambda windows: windows,
        unit="windows/s",
        scale=1,
    )
    stream.close()
