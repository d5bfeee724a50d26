"""Background prefetching and buffer reuse: same batches, honest cursor, clean shutdown."""

from __future__ import annotations

import collections
import gc
import itertools
import os
import threading
import time
import weakref

import numpy as np
import pytest

from tokstream import _prefetch, reference, stream_token_source

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


def test_producer_error_reaches_the_consumer_in_order_and_the_next_call_retries_it(monkeypatch):
    stream = stream_token_source(IDS, 8, 16, prefetch=2, shuffle=False)
    calls = {"n": 0}
    real = stream._fill

    def failing_gather(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("disk went away")
        return real(*args, **kwargs)

    failing_gather.residency = real.residency  # type: ignore[attr-defined]
    monkeypatch.setattr(stream, "_fill", failing_gather)
    next(stream), next(stream)
    with pytest.raises(RuntimeError, match="disk went away"):
        next(stream)
    # As without prefetch: the stream has not moved past the failed batch, which the next
    # call makes again (never an early end of the stream).
    expected = list(stream_token_source(IDS, 8, 16, shuffle=False))[2:]
    rest = list(stream)
    assert len(rest) == len(expected)
    for got, want in zip(rest, expected, strict=True):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
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
    reuse = 4
    ring = reuse + (prefetch + 1 if prefetch else 0)  # the held batches and those ahead
    kwargs = {"epochs": 2, "seed": 1, "targets": targets}
    expected = batches_of(stream_token_source(IDS, 8, 64, **kwargs))
    stream = stream_token_source(IDS, 8, 64, reuse_buffers=reuse, prefetch=prefetch, **kwargs)
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
    ],
)
def test_bad_prefetch_and_buffer_options_raise_at_call_time(kwargs, error, named):
    with pytest.raises(error, match=named):
        stream_token_source(IDS, 8, 16, **kwargs)


# ---------------------------------------------------------------------------------------------
# Holding batches, interrupts, forks and restarts


def call_within(fn, seconds: float = 20.0):
    """``fn()``'s result, or a test failure if it has not returned in ``seconds`` (no hang)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as error:  # re-raised in the test's thread
            outcome["error"] = error

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(seconds)
    assert not runner.is_alive(), f"{fn} did not return in {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@pytest.mark.parametrize("prefetch", [0, 1, 2, 5])
@pytest.mark.parametrize("reuse", [1, 2, 4])
def test_a_reused_batch_stays_intact_until_the_caller_has_received_k_more(reuse, prefetch):
    kwargs = {"epochs": 2, "seed": 3, "targets": "shifted"}
    expected = batches_of(stream_token_source(IDS, 8, 32, **kwargs))
    stream = stream_token_source(IDS, 8, 32, reuse_buffers=reuse, prefetch=prefetch, **kwargs)
    held = collections.deque(maxlen=reuse)  # this batch and the reuse - 1 before it
    for i, (windows, targets) in enumerate(stream):
        held.append((i, windows, targets))
        if i < 40:
            time.sleep(0.002)  # let the thread run as far ahead as it may
        for j, w, t in held:
            assert (w.tolist(), t.tolist()) == expected[j], f"batch {j} changed at batch {i}"
    assert i == len(expected) - 1


def interrupt_prefetch_thread_starts(monkeypatch, when: str, starter=None) -> None:
    """Make the next prefetch thread start raise KeyboardInterrupt ``when`` ("before" or
    "after") it launches the thread that starts the prefetch thread, as a Ctrl-C landing on the
    line before or after does. ``starter(start)`` wraps what that thread runs."""
    real = _prefetch.start_new_thread

    def launch(function, args):
        monkeypatch.setattr(_prefetch, "start_new_thread", real)  # only this one
        if when == "after":
            real(function if starter is None else starter(function), args)
            time.sleep(0.05)  # the new thread is running: it must not produce anything
        raise KeyboardInterrupt

    monkeypatch.setattr(_prefetch, "start_new_thread", launch)


@pytest.mark.parametrize("when", ["before", "after"])
def test_ctrl_c_around_the_prefetch_threads_start_orphans_nothing_and_skips_nothing(
    monkeypatch, when
):
    expected = batches_of(stream_token_source(IDS, 8, 64, epochs=2, seed=4))
    stream = stream_token_source(IDS, 8, 64, epochs=2, seed=4, prefetch=3)
    interrupt_prefetch_thread_starts(monkeypatch, when)
    with pytest.raises(KeyboardInterrupt):
        next(stream)
    wait_for_no_prefetch_threads()
    assert stream.state_dict()["position"] == 0
    assert call_within(lambda: batches_of(stream)) == expected
    stream.close()
    assert prefetch_threads() == []


def test_ctrl_c_after_the_start_does_not_wait_for_a_thread_that_has_not_run_yet(monkeypatch):
    # The thread that starts the prefetch thread has not run when the interrupt lands (here it
    # waits for an Event): the stream goes on without waiting for it, and the prefetch thread,
    # once it runs, sees the stop and ends having produced nothing.
    expected = batches_of(stream_token_source(IDS, 8, 64, epochs=2, seed=4))
    stream = stream_token_source(IDS, 8, 64, epochs=2, seed=4, prefetch=3)
    late = threading.Event()

    def starter(start):
        return lambda thread: (late.wait(), start(thread))

    interrupt_prefetch_thread_starts(monkeypatch, "after", starter)
    with pytest.raises(KeyboardInterrupt):
        call_within(lambda: next(stream))
    assert stream.state_dict()["position"] == 0
    assert call_within(lambda: batches_of(stream)) == expected
    stream.close()
    late.set()
    wait_for_no_prefetch_threads()


def test_thread_start_never_runs_in_the_consumers_thread(monkeypatch):
    # CPython's Thread.start waits on an Event: a Ctrl-C landing in that wait could leave the
    # Event's lock held (the new thread then blocked in its bootstrap for good, listed by
    # threading.enumerate(): seen once in CI under a stress of interrupts) or release it twice
    # ("RuntimeError: release unlocked lock"). No signal handler runs outside the main thread.
    real_start, starters = threading.Thread.start, []

    def start(thread):
        if thread.name == "tokstream-prefetch":
            starters.append(threading.current_thread())
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    stream = stream_token_source(IDS, 8, 64, epochs=2, seed=4, prefetch=3)
    state = stream.state_dict()
    next(stream)
    stream.load_state_dict(state)  # a restart
    next(stream)
    stream.close()
    assert len(starters) == 2
    assert threading.main_thread() not in starters


def test_a_thread_that_cannot_start_is_an_error_of_the_next_call_which_retries(monkeypatch):
    expected = batches_of(stream_token_source(IDS, 8, 64, epochs=2, seed=4))
    stream = stream_token_source(IDS, 8, 64, epochs=2, seed=4, prefetch=3)
    real_start = threading.Thread.start

    def start(thread):
        monkeypatch.setattr(threading.Thread, "start", real_start)
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        call_within(lambda: next(stream))
    assert call_within(lambda: batches_of(stream)) == expected
    stream.close()
    wait_for_no_prefetch_threads()


def interrupt_prefetch_thread_join(monkeypatch) -> None:
    """Make the next join of a prefetch thread raise KeyboardInterrupt, as a Ctrl-C landing
    while ``close()`` or ``load_state_dict()`` waits for the thread does."""
    real_join = threading.Thread.join
    left = {"n": 1}

    def join(thread, timeout=None):
        if thread.name == "tokstream-prefetch" and left["n"]:
            left["n"] -= 1
            raise KeyboardInterrupt
        return real_join(thread, timeout)

    monkeypatch.setattr(threading.Thread, "join", join)


@pytest.mark.skipif(
    not hasattr(threading.Thread, "_wait_for_tstate_lock"), reason="CPython before 3.13 only"
)
def test_a_running_thread_that_cpython_marked_stopped_still_delivers():
    # On CPython before 3.13, a Ctrl-C landing inside Thread.is_alive() or join() (in
    # Thread._wait_for_tstate_lock's except branch, bpo-45274) releases the running thread's
    # state lock and marks it stopped for good. The consumer polled is_alive() while waiting, so
    # the next next() that found the handoff empty raised "the prefetch thread is gone" (seen in
    # the interrupt stress of test_lifecycle.py). Simulated by doing what that branch does.
    from tokstream._prefetch import Prefetcher

    class Owner:
        pass

    def produce(owner, prefetcher):
        time.sleep(0.12)  # longer than the consumer's poll: it finds the handoff empty
        return 1

    owner = Owner()
    prefetcher = Prefetcher(owner, produce, 1)
    assert call_within(prefetcher.get) == 1
    thread = prefetcher._thread
    thread._tstate_lock.release()
    thread._stop()
    assert not thread.is_alive()  # what CPython now says of the running thread
    assert [call_within(prefetcher.get) for _ in range(3)] == [1, 1, 1]
    prefetcher.close()
    wait_for_no_prefetch_threads()


def test_ctrl_c_during_close_still_closes_the_stream(monkeypatch):
    stream = stream_token_source(IDS, 8, 16, epochs=5, seed=1, prefetch=3)
    for _ in range(4):
        next(stream)
    interrupt_prefetch_thread_join(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        stream.close()
    with pytest.raises(StopIteration):
        call_within(lambda: next(stream))
    assert stream.state_dict()["position"] == 4 * 16
    wait_for_no_prefetch_threads()


def test_ctrl_c_during_load_state_dict_leaves_the_stream_where_it_was(monkeypatch):
    kwargs = {"epochs": 3, "seed": 2}
    expected = batches_of(stream_token_source(IDS, 8, 64, **kwargs))
    stream = stream_token_source(IDS, 8, 64, prefetch=4, **kwargs)
    early = stream.state_dict()
    for _ in range(5):
        next(stream)
    time.sleep(0.05)  # the thread runs 4 batches ahead
    interrupt_prefetch_thread_join(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        stream.load_state_dict(early)
    # The load did not happen: the stream continues after the 5 batches it delivered.
    assert call_within(lambda: batches_of(itertools.islice(stream, 3))) == expected[5:8]
    stream.load_state_dict(early)
    assert call_within(lambda: batches_of(stream)) == expected
    stream.close()
    wait_for_no_prefetch_threads()


def test_rewinding_a_prefetching_stream_leaves_no_finalizer_or_prefetcher_behind():
    stream = stream_token_source(IDS, 8, 16, epochs=2, prefetch=2)
    start = stream.state_dict()
    next(stream)
    finalizers = len(weakref.finalize._registry)
    old = []
    for _ in range(500):
        old.append(weakref.ref(stream._prefetcher))
        stream.load_state_dict(start)
        next(stream)
    gc.collect()
    assert len(weakref.finalize._registry) <= finalizers
    assert sum(ref() is not None for ref in old) == 0
    assert len(prefetch_threads()) == 1
    stream.close()
    assert prefetch_threads() == []


FORK_OK = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
# Python 3.12+ warns that forking a process with threads may deadlock: the very case tested.
FORK_WITH_THREADS = pytest.mark.filterwarnings("ignore:This process .* fork:DeprecationWarning")


@FORK_OK
@FORK_WITH_THREADS
@pytest.mark.parametrize("reuse", [0, 6])
def test_a_child_forked_after_prefetching_started_continues_the_stream(reuse):
    kwargs = {"epochs": 2, "seed": 7}
    expected = batches_of(stream_token_source(IDS, 8, 64, **kwargs))
    stream = stream_token_source(IDS, 8, 64, prefetch=3, reuse_buffers=reuse, **kwargs)
    parent_first = batches_of(itertools.islice(stream, 3))
    time.sleep(0.05)  # the queue is full when the fork happens
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next batches (or its error) and leave at once
        try:
            os.close(read_end)
            result = repr(batches_of(itertools.islice(stream, 10)))
        except BaseException as error:
            result = repr(error)
        with os.fdopen(write_end, "w") as out:
            out.write(result)
        os._exit(0)
    os.close(write_end)
    try:
        with os.fdopen(read_end) as report:
            child = call_within(report.read, 30)
    finally:
        deadline = time.monotonic() + 5
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, 9)
            time.sleep(0.01)
    assert parent_first == expected[:3]
    assert child == repr(expected[3:13])
    # The parent's stream is untouched by the child.
    assert batches_of(itertools.islice(stream, 2)) == expected[3:5]
    stream.close()
