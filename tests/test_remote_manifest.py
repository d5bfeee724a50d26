"""A manifest in object storage: ``open_tokens("s3://bucket/dir/manifest.json")`` and a directory
URL holding one (a ``tokstream tokenize`` directory writes one) against moto's S3 server, behind
the fault proxy that counts the requests.

Opening reads the manifest only; a shard is checked at its first read as a local manifest's is;
every batch equals the same manifest's batches on disk.
"""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

import tokstream
from tests.remote_cases import EOS, WRITERS, assert_same, documents, open_remote, require_remote
from tokstream.manifest import write_manifest

require_remote()

#: Stream options: shuffled windows, documents, packed rows.
STREAMS = [
    dict(seed=3),
    dict(seed=4, windows="within", eos=EOS),
    dict(seed=5, extras=("position_ids",), windows="within", eos=EOS),
    dict(seed=6, windows="packed", eos=EOS, pad=0),
]


def stream(corpus, **options):
    options = {"epochs": 2, **options}
    return tokstream.stream_token_source(corpus, 16, 32, **options)


@pytest.fixture(params=["npy", "bin", "llmc", "megatron-glob", "tokenized"])
def listed(request, proxied_bucket, tmp_path):
    """Files of one format and the manifest over them, on disk and in the bucket: (local
    corpus through the manifest, URL of the manifest, URL of its directory)."""
    directory = tmp_path / "data"
    directory.mkdir()
    spec = WRITERS[request.param](directory, documents())
    if request.param == "tokenized":
        directory = directory / spec  # the tokenize job wrote manifest.json itself
        manifest = directory / "manifest.json"
        assert manifest.is_file()
    else:
        manifest = write_manifest(str(directory / spec), directory / "manifest.json")
    proxied_bucket.upload(directory, prefix="set")
    local = tokstream.open_tokens(str(manifest))
    return local, proxied_bucket.url("set/manifest.json"), proxied_bucket.url("set")


@pytest.mark.parametrize("options", STREAMS, ids=["shuffled", "within", "extras", "packed"])
def test_a_manifest_at_a_url_streams_the_batches_of_the_same_manifest_on_disk(listed, options):
    local, url, _ = listed
    far = open_remote(url)
    assert far.source is not None  # read on demand
    assert far.num_tokens == local.num_tokens and far.dtype == local.dtype
    assert np.array_equal(far.lengths, local.lengths)
    got = stream(far, **options)
    assert_same(got, stream(local, **options))
    got.close()


def test_a_directory_url_holding_a_manifest_opens_it(listed):
    local, _, directory = listed
    far = open_remote(directory)
    assert far.source is not None
    assert np.array_equal(far.document_boundaries, local.document_boundaries)
    assert_same(stream(far, seed=8), stream(local, seed=8))


def test_opening_reads_the_manifest_only_and_a_batch_its_shards(listed, proxied_bucket):
    local, url, directory = listed
    ports = proxied_bucket.proxy.ports()
    for spec in (url, directory):
        # Requests cancelled by the last close() are logged when the proxy ends them.
        assert proxied_bucket.proxy.wait_until_no_connection(besides=ports) == []
        proxied_bucket.proxy.configure()
        far = open_remote(spec)
        served = [r["target"] for r in proxied_bucket.proxy.stats()["requests"]]
        opened = ("manifest.json" in t or t.rstrip("/").endswith("/set") for t in served)
        assert served and all(opened), served
        assert len(served) <= 2, served
        first = stream(far, seed=1)
        next(first)
        first.close()  # no look-ahead left in flight for the next spec
        served = [r["target"] for r in proxied_bucket.proxy.stats()["requests"]]
        assert any("shard" in t or "part" in t or "train" in t for t in served)


def test_a_shard_that_disagrees_with_the_manifest_is_refused_at_its_first_read(
    proxied_bucket, tmp_path
):
    directory = tmp_path / "data"
    directory.mkdir()
    spec = WRITERS["npy"](directory, documents())
    write_manifest(str(directory / spec), directory / "manifest.json")
    proxied_bucket.upload(directory, prefix="set")
    shorter = tokstream.open_tokens(str(directory / "shard_001.npy")).shards[0][:-3]
    tokstream.write_tokens(tmp_path / "short.npy", shorter)
    proxied_bucket.put("set/shard_001.npy", tmp_path / "short.npy")
    far = open_remote(proxied_bucket.url("set/manifest.json"))  # opening reads no shard
    with pytest.raises(ValueError, match=r"shard_001\.npy: \d+ bytes, the manifest .* says"):
        list(stream(far, seed=2, shuffle=False))


def test_a_manifest_url_is_opened_on_its_own_and_without_format(listed, proxied_bucket):
    _, url, _ = listed
    with pytest.raises(ValueError, match="is a manifest; format= does not apply"):
        tokstream.open_tokens(url, format="npy")
    with pytest.raises(ValueError, match="open it on its own"):
        tokstream.open_tokens([url, url])


def test_a_remote_manifest_corpus_pickles_and_closing_its_stream_ends_the_fetch_thread(listed):
    local, url, _ = listed
    before = set(threading.enumerate())
    far = open_remote(url)
    again = pickle.loads(pickle.dumps(far))
    first = stream(far, seed=9)
    next(first)
    first.close()
    assert {t for t in threading.enumerate() if t.name == "tokstream-remote"} - before == set()
    assert_same(stream(again, seed=9), stream(local, seed=9))


def test_a_remote_manifest_corpus_keeps_its_cache_budget(listed):
    local, url, _ = listed
    far = open_remote(url, cache_max_bytes=0)
    assert_same(stream(far, seed=10), stream(local, seed=10))
    cache = far.source.session.cache
    assert cache.pinned_extents() == 0 and cache.resident_bytes == 0


@pytest.mark.parametrize("shards", [3, 12])
def test_a_tokenize_directory_opens_in_requests_independent_of_its_shards(
    proxied_bucket, tmp_path, shards
):
    """Through its manifest.json: the directory probe and the manifest. Without one (a
    directory from an older tokstream): one request for each shard's header and one for its
    documents, no more."""
    directory = tmp_path / "data"
    directory.mkdir()
    docs = documents(count=4 * shards, longest=60)
    spec = WRITERS["tokenized"](directory, docs)
    tokenized = directory / spec
    count = len(list(tokenized.glob("shard_*.documents.npy")))
    assert count >= 2
    proxied_bucket.upload(tokenized, prefix="tok")
    proxied_bucket.proxy.configure()
    with_manifest = open_remote(proxied_bucket.url("tok"))
    assert len(proxied_bucket.proxy.stats()["requests"]) <= 2
    for name in ("manifest.json", "manifest.documents.npy"):
        (tokenized / name).unlink()
    proxied_bucket.upload(tokenized, prefix="old")
    proxied_bucket.proxy.configure()
    without = open_remote(proxied_bucket.url("old"))
    served = proxied_bucket.proxy.stats()["requests"]
    assert without.source is None
    assert len(served) <= 2 * count + 3, [r["target"] for r in served]
    assert_same(stream(without, seed=2), stream(with_manifest, seed=2))
