"""A remote corpus behind a slow or failing store: delayed requests change nothing, failed ones
are retried until they succeed (the same batches arrive), and a request still failing at its
deadline is an error naming the object and the byte range, raised instead of a batch: never a
wrong or skipped one.

Every request goes through the fault proxy of ``tests/s3_processes.py`` in front of moto's S3
server; the proxy's rules pick which requests fail and how, and its log shows that they did.
"""

from __future__ import annotations

import re
import time

import pytest

import tokstream
from tests.remote_cases import WRITERS, as_list, assert_same, documents, open_remote, require_remote

remote = require_remote()

DOCS = documents(count=12, seed=21)
#: Few requests in flight, so that moto's server (a few hundred answers a second) answers each
#: well within the timeout even on a loaded machine: a timeout here is an injected fault's.
IN_FLIGHT = 8
#: A request that fails for good is given up after 1.5 s, so that such a test ends in seconds.
QUICK = dict(max_in_flight=IN_FLIGHT, timeout=0.5, deadline=1.5, backoff=0.01, max_backoff=0.2)
#: A request that fails a few times (a stalled one for the 1 s timeout) then succeeds.
PATIENT = dict(max_in_flight=IN_FLIGHT, timeout=1.0, deadline=30.0, backoff=0.01, max_backoff=0.2)


@pytest.fixture
def files(proxied_bucket, tmp_path):
    """``(local corpus, URL)`` of the documents as .npy shards, uploaded to the proxied bucket."""

    def make(name: str = "npy"):
        data = tmp_path / name
        data.mkdir()
        spec = WRITERS[name](data, DOCS)
        proxied_bucket.upload(data, prefix=name)
        return tokstream.open_tokens(str(data / spec)), proxied_bucket.url(f"{name}/{spec}")

    return make


def stream(corpus, **options):
    return tokstream.stream_token_source(corpus, 16, 32, seed=5, **options)


def faults(proxy, action: str) -> list[dict]:
    return [r for r in proxy.stats()["requests"] if r["action"] == action]


@pytest.mark.parametrize("delay_ms", [0, 30])
@pytest.mark.parametrize("name", ["npy", "megatron"])
def test_delayed_requests_bring_the_same_batches(files, proxied_bucket, delay_ms, name):
    proxied_bucket.proxy.configure(delay_ms=delay_ms)
    local, url = files(name)
    corpus = open_remote(url, max_in_flight=IN_FLIGHT)
    assert assert_same(stream(corpus, prefetch=1, epochs=2), stream(local, epochs=2)) > 10


TRANSIENT = {
    "500": {"action": "status", "status": 500},
    "503": {"action": "status", "status": 503},
    "drop": {"action": "drop"},
    "truncate": {"action": "truncate"},
    "stall": {"action": "stall", "ms": 60_000},
}


@pytest.mark.parametrize("rule", TRANSIENT.values(), ids=TRANSIENT.keys())
def test_failed_range_gets_are_retried_and_bring_the_same_batches(files, proxied_bucket, rule):
    local, url = files()
    corpus = open_remote(url, **PATIENT)
    # Opened; now the first two range GETs of the tokens fail.
    proxied_bucket.proxy.configure(rules=[{**rule, "ranged": True, "times": 2}])
    assert_same(stream(corpus), stream(local))
    assert len(faults(proxied_bucket.proxy, rule["action"])) == 2


@pytest.mark.parametrize("rule", TRANSIENT.values(), ids=TRANSIENT.keys())
def test_failed_requests_while_opening_are_retried(files, proxied_bucket, rule):
    local, url = files("megatron")
    proxied_bucket.proxy.configure(rules=[{**rule, "times": 2}])
    corpus = open_remote(url, **PATIENT)
    assert corpus.document_boundaries.tolist() == local.document_boundaries.tolist()
    assert len(faults(proxied_bucket.proxy, rule["action"])) == 2
    assert_same(stream(corpus), stream(local))


def assert_names_object_and_range(error: BaseException, url_of_object: str) -> None:
    message = str(error)
    assert url_of_object in message, message
    assert re.search(r"\d+, \d+", message), f"no byte range in: {message}"


@pytest.mark.parametrize(
    "rule, prefetch",
    [(rule, 0) for rule in TRANSIENT.values()] + [(TRANSIENT["503"], 2)],
    ids=[*TRANSIENT, "503-prefetch"],
)
def test_a_range_failing_past_its_deadline_is_an_error_naming_object_and_range(
    files, proxied_bucket, rule, prefetch
):
    local, url = files()
    corpus = open_remote(url, **QUICK)
    broken = url.replace("shard_*", "shard_001")
    # Every request for the second shard's tokens fails from now on.
    proxied_bucket.proxy.configure(rules=[{**rule, "path": "shard_001", "ranged": True}])
    # In order: the batches of the first shard's windows come, the one reaching into the
    # second shard does not, though the stream asked for its bytes long before.
    expected = as_list(stream(local, shuffle=False))
    far = stream(corpus, shuffle=False, prefetch=prefetch)
    delivered = []
    with pytest.raises(remote.RemoteReadError) as error:
        for batch in far:
            delivered.append(batch)
    assert_names_object_and_range(error.value, broken)
    # The batches before the error are the right ones, none skipped or half-filled.
    first_shard_windows = local.lengths[0] - 16
    assert len(delivered) == first_shard_windows // 32
    assert_same(delivered, expected[: len(delivered)])
    far.close()
    assert len(faults(proxied_bucket.proxy, rule["action"])) >= 2, "failed without a retry"


def test_an_object_failing_past_its_deadline_while_opening_is_an_error_naming_it(
    files, proxied_bucket
):
    local, url = files()
    proxied_bucket.proxy.configure(rules=[{"action": "status", "status": 503, "path": "shard_002"}])
    with pytest.raises(remote.RemoteReadError) as error:
        open_remote(url, **QUICK)
    assert url.replace("shard_*", "shard_002") in str(error.value)
    assert len(faults(proxied_bucket.proxy, "status")) >= 2


def test_an_object_deleted_after_opening_is_an_error_naming_it(files, proxied_bucket):
    local, url = files()
    corpus = open_remote(url, **PATIENT)
    key = url.split("/", 3)[3].replace("shard_*", "shard_000")
    proxied_bucket.server.client.delete_object(Bucket=proxied_bucket.name, Key=key)
    with pytest.raises(OSError) as error:
        list(stream(corpus, shuffle=False))
    assert "shard_000" in str(error.value)


def test_a_refused_credential_is_an_error_at_once_not_retried_until_the_deadline(
    files, proxied_bucket
):
    local, url = files()
    proxied_bucket.proxy.configure(rules=[{"action": "status", "status": 403}])
    with pytest.raises(OSError) as error:
        open_remote(url, timeout=5.0, deadline=20.0)
    assert url.rsplit("/", 1)[0] in str(error.value)  # the listing of the pattern's folder
    # Not retried until the deadline: a handful of requests at most.
    assert len(faults(proxied_bucket.proxy, "status")) < 10


#: The store gone: a short deadline, few requests in flight and a batch of many windows, so
#: that a batch failing range after range would take many deadlines.
DEAD = dict(max_in_flight=2, timeout=0.5, deadline=2.0, backoff=0.01, max_backoff=0.2)
#: A generous bound on one next() with the store gone: a few deadlines, where a batch of 32
#: windows failing range after range, two at a time, would take about 16.
DEAD_SECONDS = 4 * DEAD["deadline"] + 4


@pytest.mark.parametrize("prefetch", [0, 2])
@pytest.mark.parametrize("gone", ["drop", "stall", "503"])
def test_with_the_store_gone_next_fails_within_a_deadline_and_resumes_once_it_is_back(
    proxied_bucket, tmp_path, prefetch, gone
):
    data = tmp_path / "wide"
    data.mkdir()
    # Windows far apart: each of a batch's 32 windows is a range GET of its own.
    spec = WRITERS["npy"](data, documents(count=60, seed=8, longest=2000))
    proxied_bucket.upload(data, prefix="wide")
    local = tokstream.open_tokens(str(data / spec))
    url = proxied_bucket.url(f"wide/{spec}")
    corpus = open_remote(url, **DEAD)
    expected = as_list(stream(local, epochs=1))[:6]
    batches = stream(corpus, prefetch=prefetch)
    delivered = as_list([next(batches)])
    rule = {"drop": TRANSIENT["drop"], "stall": TRANSIENT["stall"], "503": TRANSIENT["503"]}[gone]
    proxied_bucket.proxy.configure(rules=[rule])  # every request fails from now on
    began = time.monotonic()
    with pytest.raises(remote.RemoteReadError) as error:
        next(batches)
    elapsed = time.monotonic() - began
    assert elapsed < DEAD_SECONDS, f"{elapsed:.1f} s with the store gone"
    folder = url.rsplit("/", 1)[0]
    assert re.search(re.escape(folder) + r"/shard_\d{3}\.npy bytes \[\d+, \d+\)", str(error.value))
    # Back: the same batch comes again, then the rest, none lost, repeated or mixed.
    proxied_bucket.proxy.configure()
    delivered.extend(as_list(next(batches) for _ in range(len(expected) - 1)))
    assert_same(delivered, expected)
    batches.close()


def test_a_batch_stalled_on_the_store_is_logged_once_and_again_when_it_recovers(
    files, proxied_bucket, caplog
):
    local, url = files()
    corpus = open_remote(url, **{**PATIENT, "timeout": 10.0}, stall_warning=0.5)
    # Every range GET of the second shard waits 1.5 s: its first batch stalls, then comes.
    proxied_bucket.proxy.configure(
        rules=[{"action": "delay", "ms": 1500, "path": "shard_001", "ranged": True}]
    )
    with caplog.at_level("WARNING", logger="tokstream"):
        assert_same(stream(corpus, shuffle=False), stream(local, shuffle=False))
    records = [r for r in caplog.records if r.name == "tokstream"]
    stalls = [r.getMessage() for r in records if "has waited" in r.getMessage()]
    recoveries = [r.getMessage() for r in records if "came after" in r.getMessage()]
    assert stalls and len(stalls) == len(recoveries), [r.getMessage() for r in records]
    assert re.search(r"shard_001\.npy bytes \[\d+, \d+\)", stalls[0]), stalls[0]
    assert re.search(r"waited \d+ s", stalls[0])


def test_a_stream_that_never_stalls_logs_nothing(files, caplog):
    local, url = files()
    corpus = open_remote(url, **PATIENT)
    with caplog.at_level("DEBUG", logger="tokstream"):
        assert_same(stream(corpus), stream(local))
    assert not [r for r in caplog.records if r.name == "tokstream"]
