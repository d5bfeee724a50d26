"""An object replaced while it is read: never a batch of two versions.

Every read of a remote object is conditional on the version it was opened at (``If-Match`` with
its ETag, and the answer's ETag and size checked): a re-upload of the same key mid-run makes the
next read of it fail with :class:`tokstream.shards.remote.RemoteChangedError` naming the object, and
every batch delivered before is the old version's. The same holds for the bytes a cache
directory keeps (named by the object's ETag: a reopened corpus reads the new version, not the
old bytes), for a manifest's shards reopened after their map was dropped, and for a local
manifest's shard files. Against moto's S3 server, which answers a stale ``If-Match`` with 412.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import tokstream
from tests.remote_cases import WRITERS, as_list, assert_same, documents, open_remote, require_remote
from tokstream.manifest import write_manifest

remote = require_remote()

OLD, NEW = documents(count=12, seed=21), documents(count=12, seed=22)
#: A generous bound: a changed object is an error at once, not after the 60 s retry deadline.
AT_ONCE_SECONDS = 20.0


def same_sizes(old: list[np.ndarray], new: list[np.ndarray]) -> list[np.ndarray]:
    """``new``'s tokens cut to ``old``'s document lengths: shards of the same sizes, other bytes."""
    flat = np.concatenate(new)
    flat = np.resize(flat, sum(d.shape[0] for d in old))
    flat = np.where(flat == np.concatenate(old), flat + 1, flat).astype(np.uint16)
    return np.split(flat, np.cumsum([d.shape[0] for d in old])[:-1])


def write(directory, docs, name="npy"):
    directory.mkdir(parents=True, exist_ok=True)
    return directory / WRITERS[name](directory, docs)


def stream(corpus, **options):
    return tokstream.stream_token_source(corpus, 16, 8, seed=5, **options)


@pytest.mark.parametrize("resized", [False, True], ids=["same-size", "resized"])
@pytest.mark.parametrize("cache", [False, True], ids=["memory", "cache_dir"])
def test_an_object_replaced_mid_run_is_an_error_never_a_splice(s3_bucket, tmp_path, resized, cache):
    new_docs = NEW if resized else same_sizes(OLD, NEW)
    old_spec = write(tmp_path / "old", OLD)
    new_spec = write(tmp_path / "new", new_docs)
    s3_bucket.upload(tmp_path / "old", prefix="data")
    options = dict(cache_dir=str(tmp_path)) if cache else {}
    corpus = open_remote(s3_bucket.url(f"data/{old_spec.name}"), **options)
    expected = as_list(stream(tokstream.open_tokens(str(old_spec)), shuffle=False))
    batches = iter(stream(corpus, shuffle=False))
    delivered = as_list(next(batches) for _ in range(2))
    s3_bucket.upload(tmp_path / "new", prefix="data")  # every shard re-uploaded, same keys
    began = time.monotonic()
    with pytest.raises(remote.RemoteChangedError) as error:
        for batch in batches:
            delivered.extend(as_list([batch]))
    assert time.monotonic() - began < AT_ONCE_SECONDS
    assert "changed after it was opened" in str(error.value)
    assert "shard_00" in str(error.value)
    # Every batch delivered is the old version's, in order: none holds a byte of the new one.
    assert len(delivered) < len(expected)
    assert_same(delivered, expected[: len(delivered)])
    # Opened again, the corpus is the new version's, whatever an earlier run cached.
    again = open_remote(s3_bucket.url(f"data/{new_spec.name}"), **options)
    assert_same(stream(again), stream(tokstream.open_tokens(str(new_spec))))


def test_a_cache_directory_keeps_each_version_apart(s3_bucket, tmp_path):
    new_docs = same_sizes(OLD, NEW)
    old_spec, new_spec = write(tmp_path / "old", OLD), write(tmp_path / "new", new_docs)
    cache = tmp_path / "cache"
    cache.mkdir()
    s3_bucket.upload(tmp_path / "old", prefix="data")
    url = s3_bucket.url(f"data/{old_spec.name}")
    assert_same(
        stream(open_remote(url, cache_dir=str(cache))), stream(tokstream.open_tokens(str(old_spec)))
    )
    s3_bucket.upload(tmp_path / "new", prefix="data")
    # The same keys and sizes, another ETag: none of the cached bytes are read as the new ones.
    assert_same(
        stream(open_remote(url, cache_dir=str(cache))), stream(tokstream.open_tokens(str(new_spec)))
    )


@pytest.fixture
def manifests(tmp_path):
    """The old and the new corpus, each as npy shards with a manifest over them."""

    def make(name, docs):
        directory = tmp_path / name
        spec = write(directory, docs)
        write_manifest(str(spec), directory / "manifest.json")
        return directory

    return make("old", OLD), make("new", same_sizes(OLD, NEW))


def epoch_then_rest(corpus, local):
    """The stream's first epoch (every shard opened, and with one map at a time all but the
    last dropped again) and an iterator over the rest; the old corpus's whole stream."""
    expected = as_list(stream(local, epochs=2))
    batches = iter(stream(corpus, epochs=2))
    delivered = as_list(next(batches) for _ in range(len(expected) // 2))
    return delivered, batches, expected


def test_a_remote_manifest_shard_replaced_between_its_opens_is_an_error(s3_bucket, manifests):
    old, new = manifests
    s3_bucket.upload(old, prefix="set")
    # One shard map at a time: every shard is opened again in the second epoch.
    corpus = tokstream.open_tokens(s3_bucket.url("set/manifest.json"), max_open_maps=1)
    local = tokstream.open_tokens(str(old / "manifest.json"))
    delivered, batches, expected = epoch_then_rest(corpus, local)
    for path in sorted(new.glob("shard_*")):
        s3_bucket.put(f"set/{path.name}", path)
    began = time.monotonic()
    with pytest.raises(remote.RemoteChangedError) as error:
        for batch in batches:
            delivered.extend(as_list([batch]))
    assert time.monotonic() - began < AT_ONCE_SECONDS
    assert "shard_00" in str(error.value)
    assert len(delivered) < len(expected)
    assert_same(delivered, expected[: len(delivered)])


def test_a_local_manifest_shard_replaced_between_its_opens_is_an_error(manifests):
    old, new = manifests
    corpus = tokstream.open_tokens(str(old / "manifest.json"), max_open_maps=1)
    local = tokstream.open_tokens(str(old / "manifest.json"))
    delivered, batches, expected = epoch_then_rest(corpus, local)
    for path in sorted(new.glob("shard_*")):
        replaced = old / path.name
        os.replace(path, replaced)  # a rerun writing the same names: same sizes, new files
        stat = replaced.stat()
        os.utime(replaced, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    with pytest.raises(ValueError, match="changed after it was first read") as error:
        for batch in batches:
            delivered.extend(as_list([batch]))
    assert "shard_00" in str(error.value)
    assert len(delivered) < len(expected)
    assert_same(delivered, expected[: len(delivered)])
