"""Requests that can never succeed fail at once, and keys a pattern cannot match are never listed.

A key the client cannot parse (an empty segment, ``.`` or ``..``, a control character), a
pattern over a bucket that does not exist, or a request the store answers 400 is an error at
the first answer (a ValueError naming the URL, or a RemoteNotFoundError), not retried until the
deadline; only what may succeed later (5xx, dropped, short or stalled answers) is retried. A
pattern lists one level at a time from its fixed folder, so a shared bucket's other keys, even
ones the client cannot parse, do not make it unopenable. Against moto's S3 server, through the
fault proxy that counts the requests.
"""

from __future__ import annotations

import time

import pytest

import tokstream
from tests.remote_cases import WRITERS, assert_same, documents, open_remote, require_remote

remote = require_remote()

#: The default retry deadline is 60 s: an error well inside this bound was not retried until it.
AT_ONCE_SECONDS = 20.0
#: Requests a failure at once may take (the open's few, no retries).
FEW_REQUESTS = 10


def timed_error(error_type, call):
    began = time.monotonic()
    with pytest.raises(error_type) as error:
        call()
    elapsed = time.monotonic() - began
    assert elapsed < AT_ONCE_SECONDS, f"{elapsed:.1f} s: retried until the deadline"
    return error.value


BAD_KEYS = {
    "empty-segment": "a//b.npy",
    "dot-dot": "../x.npy",
    "dot": "a/./b.npy",
    "nul": "a/b\x00.npy",
    "control": "a/b\x01.npy",
}


@pytest.mark.parametrize("key", BAD_KEYS.values(), ids=BAD_KEYS.keys())
def test_a_key_the_client_cannot_parse_is_a_value_error_at_once(proxied_bucket, key):
    url = proxied_bucket.url(key)
    error = timed_error(ValueError, lambda: open_remote(url))
    assert url.split("/", 3)[3].split("/")[-1].strip("\x00\x01") in str(error)
    assert proxied_bucket.name in str(error)
    assert len(proxied_bucket.proxy.stats()["requests"]) < FEW_REQUESTS


def test_a_pattern_over_a_missing_bucket_is_not_found_at_once(proxied_bucket):
    url = f"s3://{proxied_bucket.name}-missing/data/*.npy"
    error = timed_error(remote.RemoteNotFoundError, lambda: open_remote(url))
    assert f"{proxied_bucket.name}-missing" in str(error)
    assert isinstance(error, FileNotFoundError)
    assert len(proxied_bucket.proxy.stats()["requests"]) < FEW_REQUESTS


@pytest.mark.parametrize("status", [400, 405, 411])
@pytest.mark.parametrize("when", ["open", "read"])
def test_a_request_answered_4xx_fails_at_once(proxied_bucket, tmp_path, status, when):
    data = tmp_path / "data"
    data.mkdir()
    spec = WRITERS["npy"](data, documents(count=8))
    proxied_bucket.upload(data, prefix="data")
    url = proxied_bucket.url(f"data/{spec}")
    rule = {"action": "status", "status": status}
    expected = ValueError if status == 400 else remote.RemoteReadError
    if when == "open":
        proxied_bucket.proxy.configure(rules=[rule])
        error = timed_error(expected, lambda: open_remote(url))
    else:
        corpus = open_remote(url)
        proxied_bucket.proxy.configure(rules=[{**rule, "ranged": True}])
        batches = tokstream.stream_token_source(corpus, 16, 8, seed=1)
        error = timed_error(expected, lambda: list(batches))
        assert "shard_00" in str(error)
    assert proxied_bucket.name in str(error)
    assert str(status) in str(error)
    requests = proxied_bucket.proxy.stats()["requests"]
    asked = [(r["target"], r["range"]) for r in requests]
    assert len(set(asked)) == len(asked), "a request was retried"
    if when == "open":
        assert len(requests) < FEW_REQUESTS


#: Keys another tool wrote into a shared bucket, none in a folder the patterns below list.
ODD_KEYS = [
    "data/logs//run.txt",
    "data/logs/../run.txt",
    "data/logs/./run.txt",
    "data/logs/run\x01.txt",
    "logs/2026//x",
    "tmp/a/../x.npy",
    "tmp/a/\x01/x.npy",
]
#: More odd keys, beside the folder of a pattern whose first segment is fixed (its listing
#: starts inside data/, and the bucket's top is never listed).
BESIDE_DATA = ["../x.npy", "logs//x", "tmp/../x.npy", "\x01x.npy", "data2/../a.npy"]


@pytest.mark.parametrize(
    "pattern, odd",
    [
        ("data/shard_*.npy", ODD_KEYS + BESIDE_DATA),
        ("data/*.npy", ODD_KEYS + BESIDE_DATA),
        ("*/shard_*.npy", ODD_KEYS),
        ("d*/shard_00[0-9].npy", ODD_KEYS),
    ],
)
def test_odd_keys_a_pattern_cannot_match_do_not_make_it_unopenable(
    s3_bucket, tmp_path, pattern, odd
):
    data = tmp_path / "data"
    data.mkdir()
    spec = WRITERS["npy"](data, documents(count=8))
    s3_bucket.upload(data, prefix="data")
    for key in odd:
        s3_bucket.put(key, b"written by another tool")
    local = tokstream.open_tokens(str(data / spec))
    far = open_remote(s3_bucket.url(pattern))
    assert far.lengths.tolist() == local.lengths.tolist()
    assert_same(
        tokstream.stream_token_source(far, 16, 8, seed=2),
        tokstream.stream_token_source(local, 16, 8, seed=2),
    )


def test_a_pattern_lists_only_the_levels_it_can_match(proxied_bucket, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    spec = WRITERS["npy"](data, documents(count=8))
    proxied_bucket.upload(data, prefix="data")
    for key in ["data/logs/a.txt", "data/logs/deep/b.txt", "other/c.npy"]:
        proxied_bucket.put(key, b"x")
    proxied_bucket.proxy.configure()
    far = open_remote(proxied_bucket.url(f"data/{spec}"))
    assert far.lengths.shape == (3,)
    listings = [r for r in proxied_bucket.proxy.stats()["requests"] if "list-type" in r["target"]]
    assert len(listings) == 1, listings
    assert "prefix=data%2F" in listings[0]["target"] and "delimiter=%2F" in listings[0]["target"]


def test_a_pattern_matching_a_key_the_client_cannot_parse_is_a_value_error_at_once(s3_bucket):
    # What obstore's listing cannot skip: a folder name it cannot parse on a level the
    # pattern lists ("data/" holds "data/../"), a clear error naming it, at once.
    s3_bucket.put("data/a.npy", b"x")
    s3_bucket.put("data/../b.npy", b"x")
    error = timed_error(ValueError, lambda: open_remote(s3_bucket.url("*/a.npy")))
    assert s3_bucket.name in str(error) and ".." in str(error)
