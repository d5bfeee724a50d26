"""tokstream.shards.remote's own parts: URLs, options, coalescing, fetch accounting, the cache.

The batches themselves (every format and policy against the local files, faults, lifecycle) are
the remote suites' (``test_remote_parity.py``, ``test_remote_faults.py``,
``test_remote_lifecycle.py``); these tests need moto's S3 server only where they fetch.
"""

from __future__ import annotations

import importlib.util
import threading

import numpy as np
import pytest

import tokstream
from tokstream.shards.remote import RemoteOptions, is_url
from tokstream.shards.remote._memory import remote_tokens_of
from tokstream.shards.remote._session import coalesce
from tokstream.shards.url import split_url


class FakeObject:
    """Stands in for an object's bytes where only coalescing is asked about."""

    granular = False
    size = 10_000


def test_urls_of_object_storage_are_told_from_paths():
    for url in ["s3://b/k.bin", "gs://b/x/*.npy", "az://c/p", "https://host/a.bin", "S3://b/k"]:
        assert is_url(url)
    for path in ["data/x.bin", "/abs/s3://x", "file:///x", "s3:/b/k", "", None, b"s3://b/k"]:
        assert not is_url(path)
    assert split_url("s3://bucket/a/b.bin") == ("s3://bucket", "a/b.bin")
    assert split_url("https://host:9000/a") == ("https://host:9000", "a")


def test_overlapping_and_touching_ranges_are_one_request_and_gaps_are_not():
    a, b = FakeObject(), FakeObject()
    requests = [(a, 100, 200), (a, 150, 260), (a, 260, 300), (a, 301, 400), (b, 0, 10), (a, 0, 5)]
    merged = coalesce(requests)
    assert sorted((id(o), s, e) for o, s, e in merged) == sorted(
        [(id(a), 0, 5), (id(a), 100, 300), (id(a), 301, 400), (id(b), 0, 10)]
    )


@pytest.mark.parametrize(
    "options, error",
    [
        (dict(max_in_flight=0), ValueError),
        (dict(max_in_flight=2.0), TypeError),
        (dict(max_in_flight=True), TypeError),
        (dict(timeout=0), ValueError),
        (dict(deadline=-1.0), ValueError),
        (dict(deadline=float("nan")), ValueError),
        (dict(backoff=float("inf")), ValueError),
        (dict(max_backoff="1"), TypeError),
        (dict(cache_dir=3), TypeError),
    ],
)
def test_bad_remote_options_are_refused_naming_the_option(options, error):
    with pytest.raises(error, match=next(iter(options))):
        RemoteOptions(**options)


def test_open_tokens_takes_remote_options_or_none():
    with pytest.raises(TypeError, match="remote must be"):
        tokstream.open_tokens("s3://bucket/x.bin", remote={"deadline": 1})


# ------------------------------------------------------------------ against moto's S3 server

needs_obstore = pytest.mark.skipif(
    importlib.util.find_spec("obstore") is None,
    reason="the remote extra (obstore) is not installed",
)


@pytest.fixture
def shards(s3_bucket, tmp_path):
    """Two uint16 .npy shards on disk and in the bucket: (local corpus, URL pattern)."""
    rng = np.random.default_rng(3)
    for i in range(2):
        ids = rng.integers(0, 50_000, 20_000, dtype=np.uint16)
        tokstream.write_tokens(tmp_path / f"part_{i}.npy", ids)
    s3_bucket.upload(tmp_path, prefix="data")
    return tokstream.open_tokens(str(tmp_path / "part_*.npy")), s3_bucket.url("data/part_*.npy")


def session_of(corpus):
    return remote_tokens_of(corpus.shards[0]).object.session


@needs_obstore
def test_bytes_fetched_are_at_most_the_window_bytes_delivered(shards):
    local, url = shards
    far = tokstream.open_tokens(url)
    block, batch_size, batches = 128, 16, 20
    stream = tokstream.stream_token_source(far, block, batch_size, seed=1)
    expected = tokstream.stream_token_source(local, block, batch_size, seed=1)
    for _ in range(batches):
        (x, y), (u, v) = next(stream), next(expected)
        assert np.array_equal(x, u) and np.array_equal(y, v)
    stream.close()
    delivered = batches * batch_size * (block + 1) * 2
    session = session_of(far)
    # The read-ahead fetches up to its depth beyond the batches taken.
    ahead = 4 * 64 * (block + 1) * 2
    assert 0 < session.bytes_fetched <= delivered + ahead


@needs_obstore
def test_close_ends_the_fetch_thread_and_a_later_batch_starts_it_again(shards):
    local, url = shards
    before = threading.active_count()
    stream = tokstream.stream_token_source(tokstream.open_tokens(url), 64, 8, seed=2)
    next(stream)
    assert threading.active_count() == before + 1
    stream.close()
    assert threading.active_count() == before
    stream.load_state_dict(stream.state_dict())
    expected = tokstream.stream_token_source(local, 64, 8, seed=2)
    next(expected)
    assert np.array_equal(next(stream)[0], next(expected)[0])
    stream.close()
    assert threading.active_count() == before


@needs_obstore
def test_a_cache_directory_serves_a_later_run_without_fetching(shards, tmp_path):
    local, url = shards
    cache = tmp_path / "cache"
    cache.mkdir()
    options = RemoteOptions(cache_dir=str(cache))
    first = tokstream.open_tokens(url, remote=options)
    expected = list(tokstream.stream_token_source(local, 32, 64, seed=4, epochs=1))
    got = list(tokstream.stream_token_source(first, 32, 64, seed=4, epochs=1))
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(got, expected, strict=True))
    assert session_of(first).bytes_fetched > 0
    again = tokstream.open_tokens(url, remote=options)
    got = list(tokstream.stream_token_source(again, 32, 64, seed=4, epochs=1))
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(got, expected, strict=True))
    assert session_of(again).bytes_fetched == 0


@needs_obstore
def test_an_empty_object_opens_as_the_same_empty_file_does(s3_bucket, tmp_path):
    (tmp_path / "a_empty.bin").write_bytes(b"")
    tokstream.write_tokens(tmp_path / "b_full.bin", np.arange(100, dtype=np.uint16), "bin")
    s3_bucket.upload(tmp_path, prefix="raw")
    spec = ["a_empty.bin", "b_full.bin"]
    local = tokstream.open_tokens([str(tmp_path / name) for name in spec], dtype="uint16")
    far = tokstream.open_tokens([s3_bucket.url(f"raw/{name}") for name in spec], dtype="uint16")
    assert np.array_equal(far.lengths, local.lengths) and far.lengths.tolist() == [0, 100]
