"""Background prefetching and buffer reuse: same batches, honest cursor, clean shutdown."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

from tokstream import reference, stream_token_source

IDS = np.random.default_rng(0).integers(0, 50257, 5000).astype(np.uint16)


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tokstream-prefetch"]


def wait_for_no_prefetch_threads(seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert prefetch_threads() == []


def batches_of(stream) -> list[tuple[list, list]]:
    return [(w.tolist(), t.tolist()) for w, t in stream]


@pytest.mark.parametrize("prefetch", [1, 2, 5])
@pytest.mark.parametrize("shuffle", [True, False])
def test_prefetched_stream_yields_the_reference_batches(prefetch, shuffle):
    kwargs = {"epochs": 3, "shuffle": shuffle, "seed": 4}
    fast = stream_token_source(IDS, 16, 100, prefetch=prefetch, **kwargs)
    assert batches_of(fast) == batches_of(reference.stream_token_source(IDS, 16, 100, **kwargs))
    wait_for_no_prefetch_threads()


@pytest.mark.parametrize("permutation", ["materialized", "implicit"])
def test_state_dict_reports_delivered_batches_not_prefetched_ones(permutation):
    kwargs = {"epochs": 3, "seed": 8, "permutation": permutation}
    plain = stream_token_source(IDS, 32, 300, **kwargs)
    ahead = stream_token_source(IDS, 32, 300, prefetch=4, **kwargs)
    for step in range(len(plain)):
        assert ahead.state_dict() == plain.state_dict(), step
        assert ahead.__length_hint__() == plain.__length_hint__()
        (w1, t1), (w2, t2) = next(plain), next(ahead)
        assert np.array_equal(w1, w2) and np.array_equal(t1, t2)
        time.sleep(0.001 * (step % 3))  # let the producer run ahead by varying amounts
    ahead.close()


def test_resume_from_a_prefetching_stream_into_a_prefetching_stream():
    kwargs = {"epochs": 2, "seed": 3}
    whole = batches_of(stream_token_source(IDS, 8, 256, **kwargs))
    first = stream_token_source(IDS, 8, 256, prefetch=3, **kwargs)
    for _ in range(13):
        next(first)
    state = first.state_dict()
    first.close()
    second = stream_token_source(IDS, 8, 256, prefetch=2, **kwargs)
    next(second)  # start its thread, then rewind it
    second.load_state_dict(state)
    assert batches_of(second) == whole[13:]


def test_close_and_garbage_collection_stop_the_thread_mid_epoch():
    stream = stream_token_source(IDS, 8, 16, epochs=50, prefetch=2)
    next(stream)
    assert len(prefetch_threads()) == 1
    stream.close()
    assert prefetch_threads() == []
    with pytest.raises(StopIteration):
        next(stream)

    dropped = stream_token_source(IDS, 8, 16, epochs=50, prefetch=2)
    next(dropped)
    del dropped
    gc.collect()
    wait_for_no_prefetch_threads()


def test_consumer_that_stops_early_leaves_no_thread_once_closed():
    for _ in range(5):
        stream = stream_token_source(IDS, 8, 16, epochs=10, prefetch=3)
        for i, _batch in enumerate(stream):
            if i == 7:
                break
        stream.close()
    assert prefetch_threads() == []


def test_producer_error_reaches_the_consumer_in_order(monkeypatch):
    stream = stream_token_source(IDS, 8, 16, prefetch=2, shuffle=False)
    calls = {"n": 0}
    real = stream._gather

    def failing_gather(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("disk went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(stream, "_gather", failing_gather)
    next(stream), next(stream)
    with pytest.raises(RuntimeError, match="disk went away"):
        next(stream)
    with pytest.raises(StopIteration):
        next(stream)
    wait_for_no_prefetch_threads()


def test_threads_sharing_a_prefetching_stream_get_disjoint_batches():
    ids = np.arange(20_000, dtype=np.int64)
    stream = stream_token_source(ids, 4, 10, shuffle=False, prefetch=3)
    seen: list[int] = []
    lock = threading.Lock()

    def consume():
        for windows, _ in stream:
            with lock:
                seen.extend(windows[:, 0].tolist())

    workers = [threading.Thread(target=consume) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert sorted(seen) == list(range(ids.shape[0] - 4))


@pytest.mark.parametrize("targets", ["next", "shifted"])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_reused_buffers_cycle_and_hold_the_right_batch_when_received(targets, prefetch):
    ring = 4 if prefetch == 0 else prefetch + 2
    kwargs = {"epochs": 2, "seed": 1, "targets": targets}
    expected = batches_of(stream_token_source(IDS, 8, 64, **kwargs))
    stream = stream_token_source(IDS, 8, 64, reuse_buffers=ring, prefetch=prefetch, **kwargs)
    received = []
    for i, (windows, next_tokens) in enumerate(stream):
        assert (windows.tolist(), next_tokens.tolist()) == expected[i]
        received.append(windows)
    assert len(received) == len(expected)
    for i in range(len(received) - ring):
        assert np.shares_memory(received[i], received[i + ring])
        for j in range(i + 1, i + ring):
            assert not np.shares_memory(received[i], received[j])


def test_reused_partial_last_batch_is_a_contiguous_view():
    stream = stream_token_source(np.arange(30), 4, 8, shuffle=False, reuse_buffers=2)
    *_, (windows, next_tokens) = list(stream)
    assert windows.shape == (2, 4) and windows.flags.c_contiguous
    assert next_tokens.tolist() == [28, 29]


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"prefetch": -1}, ValueError, "prefetch"),
        ({"prefetch": True}, TypeError, "prefetch"),
        ({"prefetch": 1.5}, ValueError, "prefetch"),
        ({"reuse_buffers": -2}, ValueError, "reuse_buffers"),
        ({"reuse_buffers": "4"}, TypeError, "reuse_buffers"),
        ({"reuse_buffers": 3, "prefetch": 2}, ValueError, "reuse_buffers"),
    ],
)
def test_bad_prefetch_and_buffer_options_raise_at_call_time(kwargs, error, named):
    with pytest.raises(error, match=named):
        stream_token_source(IDS, 8, 16, **kwargs)
