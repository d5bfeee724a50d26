"""What a remote stream fetches ahead: the next batches' bytes are requested before the batch is
asked for, into the next epoch and for packed rows too.

Each test takes a batch, waits until the fetches it started are done, then has the fault proxy
refuse every later token request (403, which is not retried): the batches that follow, up to
the look-ahead's depth, must still come, byte-identical to the local stream's, from the bytes
fetched ahead. Without look-ahead the next batch would fail with a RemoteReadError.
"""

from __future__ import annotations

import concurrent.futures

import pytest

import tokstream
from tests.remote_cases import (
    EOS,
    as_list,
    assert_same,
    documents,
    open_remote,
    require_remote,
    uploaded_npy,
)
from tokstream.shards.remote._memory import remote_tokens_of
from tokstream.shards.remote._session import coalesce

remote = require_remote()

DOCS = documents(count=24, seed=52)
REFUSE = [{"action": "status", "status": 403, "ranged": True}]


@pytest.fixture
def files(proxied_bucket, tmp_path):
    """(local corpus, remote corpus) of the same npy shards, reached through the proxy."""
    local, url = uploaded_npy(proxied_bucket, tmp_path, DOCS)
    return tokstream.open_tokens(str(local)), open_remote(url, deadline=5.0)


def session_of(corpus):
    return remote_tokens_of(corpus.shards[0]).object.session


def settle(corpus) -> None:
    """Wait until every fetch started for ``corpus`` so far is done."""
    sessions = {id(s): s for s in (remote_tokens_of(x).object.session for x in corpus.shards)}
    for session in sessions.values():
        with session._lock:
            futures = [entry[0] for entry in session._pending.values()]
        concurrent.futures.wait(futures, timeout=60)


def refuse_from_now_on(proxied_bucket, corpus) -> None:
    settle(corpus)
    proxied_bucket.proxy.configure(rules=REFUSE)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_the_next_epochs_first_batches_are_fetched_before_the_epoch_ends(
    files, proxied_bucket, shuffle, prefetch
):
    local, far = files
    options = dict(seed=5, epochs=2, shuffle=shuffle, prefetch=prefetch)
    expected = as_list(tokstream.stream_token_source(local, 8, 16, **options))
    stream = tokstream.stream_token_source(far, 8, 16, **options)
    per_epoch = stream.batches_per_epoch
    assert per_epoch >= 4
    stream.seek(per_epoch - 2)
    got = [next(stream), next(stream)]  # the first epoch's last batch
    refuse_from_now_on(proxied_bucket, far)
    got += [next(stream), next(stream)]  # the second epoch's first two, fetched ahead
    assert_same(got, expected[per_epoch - 2 : per_epoch + 2])
    stream.close()


def test_a_materialized_shuffle_streams_the_same_batches_across_the_epoch(files):
    # Its next epoch's order is drawn when the epoch ends, so the look-ahead stops there.
    local, far = files
    options = dict(seed=5, epochs=3, permutation="materialized")
    assert_same(
        tokstream.stream_token_source(far, 8, 16, **options),
        tokstream.stream_token_source(local, 8, 16, **options),
    )


@pytest.mark.parametrize("shuffle", [True, False])
def test_packed_rows_are_fetched_ahead(files, proxied_bucket, shuffle):
    local, far = files
    options = dict(seed=3, epochs=2, shuffle=shuffle, windows="packed", eos=EOS)
    expected = as_list(tokstream.stream_token_source(local, 16, 4, **options))
    stream = tokstream.stream_token_source(far, 16, 4, **options)
    per_epoch = stream.batches_per_epoch
    got = [next(stream)]
    refuse_from_now_on(proxied_bucket, far)
    got += [next(stream), next(stream)]
    stream.seek(per_epoch - 1)
    proxied_bucket.proxy.configure()
    got.append(next(stream))
    refuse_from_now_on(proxied_bucket, far)
    got.append(next(stream))  # the next epoch's first packed batch
    assert_same(got, [*expected[:3], *expected[per_epoch - 1 : per_epoch + 1]])
    stream.close()


def test_packed_rows_of_a_mixture_are_fetched_ahead(files, proxied_bucket, tmp_path):
    local, far = files
    options = dict(seed=3, windows="packed", eos=EOS, samples=40)
    expected = as_list(
        tokstream.stream_token_source(
            tokstream.mix({"a": local, "b": local}, {"a": 1, "b": 2}), 16, 4, **options
        )
    )
    stream = tokstream.stream_token_source(
        tokstream.mix({"a": far, "b": far}, {"a": 1, "b": 2}), 16, 4, **options
    )
    got = [next(stream)]
    refuse_from_now_on(proxied_bucket, far)
    got += [next(stream), next(stream)]
    assert_same(got, expected[:3])
    stream.close()


def test_without_look_ahead_the_refused_store_fails_the_next_batch(files, proxied_bucket):
    # The check the tests above rely on: a batch whose bytes were not fetched ahead fails.
    local, far = files
    stream = tokstream.stream_token_source(far, 8, 16, seed=5)
    next(stream)
    refuse_from_now_on(proxied_bucket, far)
    stream.seek(stream.batches_per_epoch // 2)  # a jump: nothing fetched ahead there
    with pytest.raises(remote.RemoteReadError, match="403|Forbidden|cannot read"):
        next(stream)
    stream.close()


def first_gets(stream) -> int:
    """The range GETs of the batch at the stream's cursor (its windows' ranges, coalesced)."""
    order, residency = stream._order, stream._fill.residency
    windows = order.batch_windows(stream._cursor, order.rows_at(stream._cursor))
    return len(coalesce(residency.window_requests(stream._space, windows)))


def test_a_batch_waited_for_is_fetched_before_the_batches_ahead_of_it(files, proxied_bucket):
    # Each request takes 200 ms at the proxy: the look-ahead's requests, sent only once the
    # first batch's bytes are in, cannot have been answered when that batch is handed out.
    local, far = files
    expected = as_list(tokstream.stream_token_source(local, 8, 16, seed=5))
    proxied_bucket.proxy.configure(delay_ms=200)
    stream = tokstream.stream_token_source(far, 8, 16, seed=5)
    session = session_of(far)
    gets = first_gets(stream)
    got = [next(stream)]
    assert session.requests == gets
    settle(far)
    assert session.requests > gets  # then the batches ahead are fetched
    # The same after a jump, where nothing was fetched ahead.
    stream.seek(20)
    before, gets = session.requests, first_gets(stream)
    got.append(next(stream))
    assert session.requests - before == gets
    assert_same(got, [expected[0], expected[20]])
    stream.close()
