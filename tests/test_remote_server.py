"""The remote suites' own servers do what those suites rely on: moto answers S3 range GETs over
TCP, and the proxy in front of it forwards them unchanged, or delays, refuses, drops, truncates
or stalls exactly the requests its rules name. Read with plain ``http.client`` (moto checks no
signature; the objects are public), so that these checks hold whatever client tokstream uses."""

from __future__ import annotations

import http.client
import time
import urllib.parse

import pytest

DATA = bytes(range(256)) * 64  # 16 KiB


def get(endpoint: str, path: str, byte_range: tuple[int, int] | None = None, timeout=10.0):
    """(status, body) of one GET, ``byte_range`` inclusive as HTTP writes it."""
    url = urllib.parse.urlsplit(endpoint)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        headers = {"Range": "bytes={}-{}".format(*byte_range)} if byte_range else {}
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def put_public(bucket, key: str) -> None:
    bucket.server.client.put_object(Bucket=bucket.name, Key=key, Body=DATA, ACL="public-read")


@pytest.fixture
def obj(proxied_bucket):
    put_public(proxied_bucket, "shards/a.bin")
    return proxied_bucket, f"/{proxied_bucket.name}/shards/a.bin"


def test_the_server_answers_range_gets_with_exactly_those_bytes(s3_bucket):
    put_public(s3_bucket, "x.bin")
    status, body = get(s3_bucket.server.endpoint, f"/{s3_bucket.name}/x.bin", (100, 4195))
    assert status == 206
    assert body == DATA[100:4196]


def test_the_proxy_forwards_requests_unchanged_and_logs_them(obj):
    bucket, path = obj
    assert get(bucket.proxy.endpoint, path, (10, 19)) == (206, DATA[10:20])
    assert get(bucket.proxy.endpoint, path) == (200, DATA)
    log = bucket.proxy.stats()["requests"]
    assert [(r["method"], r["range"], r["body_bytes"], r["action"]) for r in log] == [
        ("GET", "bytes=10-19", 10, "forward"),
        ("GET", None, len(DATA), "forward"),
    ]


def test_the_delay_holds_every_request_back(obj):
    bucket, path = obj
    bucket.proxy.configure(delay_ms=30)
    started = time.monotonic()
    for _ in range(3):
        assert get(bucket.proxy.endpoint, path, (0, 9)) == (206, DATA[:10])
    assert time.monotonic() - started >= 3 * 0.029


@pytest.mark.parametrize("status", [500, 503])
def test_a_status_rule_answers_the_matching_requests_times_then_forwards(obj, status):
    bucket, path = obj
    bucket.proxy.configure(rules=[{"action": "status", "status": status, "times": 2}])
    assert get(bucket.proxy.endpoint, path, (0, 9))[0] == status
    assert get(bucket.proxy.endpoint, path, (0, 9))[0] == status
    assert get(bucket.proxy.endpoint, path, (0, 9)) == (206, DATA[:10])


def test_a_rule_skips_its_first_matches_and_names_a_path_and_ranged_requests(obj):
    bucket, path = obj
    put_public(bucket, "shards/b.bin")
    bucket.proxy.configure(rules=[{"action": "status", "status": 500, "path": "b.bin", "skip": 1}])
    b_path = path.replace("a.bin", "b.bin")
    assert get(bucket.proxy.endpoint, b_path, (0, 9))[0] == 206  # skipped
    assert get(bucket.proxy.endpoint, b_path, (0, 9))[0] == 500
    assert get(bucket.proxy.endpoint, path, (0, 9))[0] == 206  # another path
    bucket.proxy.configure(rules=[{"action": "status", "status": 500, "ranged": True}])
    assert get(bucket.proxy.endpoint, path)[0] == 200
    assert get(bucket.proxy.endpoint, path, (0, 9))[0] == 500


def test_a_dropped_connection_is_closed_unanswered(obj):
    bucket, path = obj
    bucket.proxy.configure(rules=[{"action": "drop", "times": 1}])
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        get(bucket.proxy.endpoint, path, (0, 9))
    assert get(bucket.proxy.endpoint, path, (0, 9)) == (206, DATA[:10])


def test_a_truncated_response_announces_the_whole_body_and_sends_half(obj):
    bucket, path = obj
    bucket.proxy.configure(rules=[{"action": "truncate", "times": 1}])
    with pytest.raises(http.client.IncompleteRead) as error:
        get(bucket.proxy.endpoint, path, (0, 999))
    assert len(error.value.partial) == 500
    assert error.value.partial == DATA[:500]
    assert bucket.proxy.stats()["requests"][-1]["body_bytes"] == 500


def test_a_stall_answers_nothing_until_the_client_gives_up(obj):
    bucket, path = obj
    bucket.proxy.configure(rules=[{"action": "stall", "ms": 60_000}])
    before = bucket.proxy.ports()
    with pytest.raises(TimeoutError):
        get(bucket.proxy.endpoint, path, (0, 9), timeout=0.3)
    # The client's close ends the stall: the proxy holds no connection for the minute.
    assert bucket.proxy.wait_until_no_connection(besides=before) == []


def test_the_proxy_counts_open_client_connections(obj):
    # Run after the other remote suites, whose clients' pooled connections may still be open:
    # this connection is told apart by its port.
    bucket, path = obj
    url = urllib.parse.urlsplit(bucket.proxy.endpoint)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    connection.request("GET", path, headers={"Range": "bytes=0-9"})
    assert connection.getresponse().read() == DATA[:10]
    port = connection.sock.getsockname()[1]
    others = bucket.proxy.ports() - {port}
    assert port in bucket.proxy.ports()  # kept alive
    connection.close()
    assert bucket.proxy.wait_until_no_connection(besides=others) == []
