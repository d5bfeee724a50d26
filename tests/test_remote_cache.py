"""The bounded cache of a remote corpus: pins, eviction, the budget, and batches unchanged by it.

The first tests drive :class:`tokstream.shards.remote._cache.Cache` over real object maps with no
server (bytes written as a fetch writes them); the rest stream from moto's S3 server and compare
every batch with the same files read locally, counting resident bytes as the cache reports
them and the bytes the server sent.
"""

from __future__ import annotations

import ctypes
import importlib.util
import mmap
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokstream
from tokstream.shards.remote import RemoteOptions
from tokstream.shards.remote._cache import EXTENT, PAGE
from tokstream.shards.remote._memory import ObjectBytes, remote_tokens_of
from tokstream.shards.remote._session import Session

needs_obstore = pytest.mark.skipif(
    importlib.util.find_spec("obstore") is None,
    reason="the remote extra (obstore) is not installed",
)


def object_bytes(options: RemoteOptions, size: int) -> ObjectBytes:
    return ObjectBytes(Session(options), "s3://bucket", "tokens.bin", size, "etag")


def content(size: int) -> np.ndarray:
    return (np.arange(size, dtype=np.int64) * 7 + 3).astype(np.uint8)


@pytest.mark.parametrize("budget", [None, 0, EXTENT, 3 * EXTENT])
def test_a_pinned_extent_is_never_evicted_and_an_evicted_one_reads_as_zeros(budget):
    size = 8 * EXTENT + 100
    obj = object_bytes(RemoteOptions(cache_max_bytes=budget), size)
    cache, data = obj.cache, content(size)
    pinned = cache.pin([(obj, 0, EXTENT + 1)])  # extents 0 and 1
    for extent in range(9):
        start, end = extent * EXTENT, min((extent + 1) * EXTENT, size)
        with cache.pin([(obj, start, end)]):
            obj.write(start, data[start:end])
    assert np.array_equal(obj.view[: EXTENT + 1], data[: EXTENT + 1])
    assert cache.resident_bytes <= max(budget or 0, 2 * EXTENT)
    pinned.release()
    assert cache.resident_bytes <= (budget or 0)
    # What is left is exactly the object's bytes; the rest reads as zeros and is missing.
    kept = obj.view != 0
    assert np.array_equal(obj.view[kept], data[kept])
    for extent in range(9):
        start, end = extent * EXTENT, min((extent + 1) * EXTENT, size)
        if not kept[start:end].any():
            assert obj.missing(start, end) is not None


@settings(max_examples=60, deadline=None)
@given(
    budget_extents=st.integers(0, 4),
    operations=st.lists(
        st.tuples(st.booleans(), st.integers(0, 6 * EXTENT), st.integers(1, 3 * EXTENT)),
        min_size=1,
        max_size=30,
    ),
)
def test_the_cache_keeps_its_budget_and_only_the_objects_bytes(budget_extents, operations):
    """Random reads (pin, fetch what is missing, check, release), some held to the end: every
    read sees the object's bytes, and after each release the resident pages are within the
    budget plus what is still pinned."""
    size = 6 * EXTENT + 17
    budget = budget_extents * EXTENT
    obj = object_bytes(RemoteOptions(cache_max_bytes=budget), size)
    cache, data = obj.cache, content(size)
    held = []
    for keep, start, length in operations:
        start = min(start, size - 1)
        end = min(start + length, size)
        pin = cache.pin([(obj, start, end)])
        span = obj.missing(start, end)
        if span is not None:
            obj.write(span[0], data[span[0] : span[1]])
        if cache.keeps:  # with a budget of 0 nothing is remembered past the pins
            assert obj.missing(start, end) is None
        assert np.array_equal(obj.view[start:end], data[start:end])
        if keep:
            held.append((pin, start, end))
        else:
            pin.release()
        pinned_bytes = cache.pinned_extents() * EXTENT
        assert cache.resident_bytes <= budget + pinned_bytes
    for pin, start, end in held:
        assert np.array_equal(obj.view[start:end], data[start:end])
        pin.release()
    assert cache.resident_bytes <= budget
    resident_pages = np.flatnonzero(
        [obj.view[p : p + PAGE].any() for p in range(0, size, PAGE)]
    ).shape[0]
    assert resident_pages * PAGE <= cache.resident_bytes


def test_without_a_budget_or_a_directory_nothing_outlives_its_pins():
    obj = object_bytes(RemoteOptions(), 4 * EXTENT)
    data = content(4 * EXTENT)
    with obj.cache.pin([(obj, 0, 4 * EXTENT)]):
        obj.write(0, data)
        assert obj.cache.resident_bytes == 4 * EXTENT
        # Nothing is remembered: a range is present only while its fetch is pending.
        assert obj.missing(0, 10) == (0, 10)
    assert obj.cache.resident_bytes == 0
    assert not obj.view.any()


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's mincore")
def test_evicted_pages_leave_the_process_memory():
    obj = object_bytes(RemoteOptions(cache_max_bytes=EXTENT), 64 * EXTENT)
    data = content(64 * EXTENT)
    for extent in range(64):
        with obj.cache.pin([(obj, extent * EXTENT, (extent + 1) * EXTENT)]):
            obj.write(extent * EXTENT, data[extent * EXTENT : (extent + 1) * EXTENT])
    assert obj.cache.resident_bytes <= EXTENT
    assert resident_bytes(obj.address, 64 * EXTENT) <= EXTENT


def resident_bytes(address: int, length: int) -> int:
    """Bytes of ``[address, address + length)`` resident in memory (``mincore``): counted over
    the range itself, since the kernel may merge the mapping with a neighbouring anonymous one
    (its smaps entry then counts the neighbour's pages too)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pages = -(-length // PAGE)
    vector = (ctypes.c_ubyte * pages)()
    start = address - address % PAGE
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vector) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vector) * PAGE


def test_a_bounded_cache_directory_is_a_slot_of_this_process(tmp_path):
    options = RemoteOptions(cache_dir=str(tmp_path), cache_max_bytes=2 * EXTENT)
    first = object_bytes(options, 4 * EXTENT)
    second = object_bytes(options, 4 * EXTENT)  # another corpus open at the same time
    assert first.cache.directory == tmp_path / "bounded-0"
    assert second.cache.directory == tmp_path / "bounded-1"
    data = content(4 * EXTENT)
    for extent in range(4):
        with first.cache.pin([(first, extent * EXTENT, (extent + 1) * EXTENT)]):
            first.write(extent * EXTENT, data[extent * EXTENT : (extent + 1) * EXTENT])
    allocated = sum(path.stat().st_blocks * 512 for path in (tmp_path / "bounded-0").glob("*.data"))
    assert first.cache.resident_bytes <= 2 * EXTENT
    assert allocated <= 2 * EXTENT
    kept = [e for e in range(4) if first.missing(e * EXTENT, (e + 1) * EXTENT) is None]
    del first
    import gc

    gc.collect()
    # A later run takes the free slot over and finds what the first one kept.
    again = object_bytes(options, 4 * EXTENT)
    assert again.cache.directory == tmp_path / "bounded-0"
    assert again.cache.resident_bytes == len(kept) * EXTENT
    for extent in kept:
        assert again.missing(extent * EXTENT, (extent + 1) * EXTENT) is None
        piece = slice(extent * EXTENT, (extent + 1) * EXTENT)
        assert np.array_equal(again.view[piece], data[piece])


@pytest.mark.parametrize(
    "value, error", [(-1, ValueError), (1.5, TypeError), (True, TypeError), ("1", TypeError)]
)
def test_a_bad_cache_max_bytes_is_refused_naming_it(value, error):
    with pytest.raises(error, match="cache_max_bytes"):
        RemoteOptions(cache_max_bytes=value)


# ------------------------------------------------------------------ against moto's S3 server


@pytest.fixture
def shards(s3_bucket, tmp_path):
    """Two uint16 .npy shards of several extents each, on disk and in the bucket."""
    rng = np.random.default_rng(5)
    for i in range(2):
        ids = rng.integers(0, 50_000, 3 * EXTENT // 2 + 1000 * i, dtype=np.uint16)
        tokstream.write_tokens(tmp_path / f"part_{i}.npy", ids)
    s3_bucket.upload(tmp_path, prefix="data")
    return tokstream.open_tokens(str(tmp_path / "part_*.npy")), s3_bucket.url("data/part_*.npy")


def cache_of(corpus):
    return remote_tokens_of(corpus.shards[0]).object.cache


def session_of(corpus):
    return remote_tokens_of(corpus.shards[0]).object.session


def stream(corpus, seed, epochs=1, **options):
    # Windows of one block a stride apart: an epoch is a few hundred range GETs.
    return tokstream.stream_token_source(
        corpus, 512, 16, seed=seed, epochs=epochs, stride=512, **options
    )


def check_epochs(far, local, seed, epochs, after_each=None):
    remote_stream, local_stream = stream(far, seed, epochs), stream(local, seed, epochs)
    count = 0
    for (x, y), (u, v) in zip(remote_stream, local_stream, strict=True):
        assert np.array_equal(x, u) and np.array_equal(y, v)
        count += 1
        if after_each is not None:
            after_each()
    remote_stream.close()
    assert count > 0


@needs_obstore
@pytest.mark.parametrize("budget", [None, EXTENT])
def test_memory_stays_within_the_budget_and_the_pins_while_streaming(shards, budget):
    local, url = shards
    far = tokstream.open_tokens(url, remote=RemoteOptions(cache_max_bytes=budget))
    cache = cache_of(far)
    seen = []

    def within() -> None:
        seen.append(cache.resident_bytes)
        assert cache.resident_bytes <= (budget or 0) + cache.pinned_extents() * EXTENT

    check_epochs(far, local, seed=3, epochs=2, after_each=within)
    assert max(seen) > 0 and cache.evicted_bytes > 0
    assert cache.resident_bytes <= (budget or 0)  # closed: nothing is pinned any more


@needs_obstore
@pytest.mark.parametrize("on_disk", [False, True])
def test_a_large_enough_cache_fetches_nothing_in_the_second_epoch(shards, tmp_path, on_disk):
    local, url = shards
    corpus_bytes = sum(shard.nbytes for shard in local.shards)
    options = RemoteOptions(
        cache_max_bytes=corpus_bytes + 4 * EXTENT, cache_dir=str(tmp_path) if on_disk else None
    )
    far = tokstream.open_tokens(url, remote=options)
    session = session_of(far)
    check_epochs(far, local, seed=3, epochs=1)
    first = session.bytes_fetched
    check_epochs(far, local, seed=4, epochs=1)
    assert first > 0 and session.bytes_fetched == first
    assert cache_of(far).evicted_bytes == 0


@needs_obstore
@pytest.mark.parametrize("on_disk", [False, True])
def test_a_small_cache_evicts_and_gives_the_same_batches(shards, tmp_path, on_disk):
    local, url = shards
    options = RemoteOptions(cache_max_bytes=EXTENT, cache_dir=str(tmp_path) if on_disk else None)
    far = tokstream.open_tokens(url, remote=options)
    check_epochs(far, local, seed=5, epochs=3)
    cache = cache_of(far)
    assert cache.evicted_bytes > 0 and cache.resident_bytes <= EXTENT
    if on_disk:
        allocated = sum(p.stat().st_blocks * 512 for p in (tmp_path / "bounded-0").glob("*.data"))
        assert allocated <= EXTENT


@needs_obstore
def test_an_eos_scan_of_a_remote_corpus_reads_its_bytes_within_the_budget(shards):
    local, url = shards
    far = tokstream.open_tokens(url, remote=RemoteOptions(cache_max_bytes=EXTENT))
    eos = int(local.shards[0][5])
    assert np.array_equal(far.boundaries_with_eos(eos), local.boundaries_with_eos(eos))
    assert cache_of(far).resident_bytes <= EXTENT


def test_pages_are_counted_in_whole_pages():
    assert EXTENT % PAGE == 0 and PAGE == mmap.PAGESIZE


def test_a_dropped_object_no_longer_counts_and_its_number_is_not_reused():
    import gc

    session = Session(RemoteOptions(cache_max_bytes=8 * EXTENT))
    first = ObjectBytes(session, "s3://bucket", "a.bin", 2 * EXTENT, "etag")
    with session.cache.pin([(first, 0, 2 * EXTENT)]):
        first.write(0, content(2 * EXTENT))
    assert session.cache.resident_bytes == 2 * EXTENT
    number = first.number
    del first
    gc.collect()
    second = ObjectBytes(session, "s3://bucket", "b.bin", EXTENT, "etag")
    assert second.number != number
    with session.cache.pin([(second, 0, EXTENT)]):
        second.write(0, content(EXTENT))
    assert session.cache.resident_bytes == EXTENT
