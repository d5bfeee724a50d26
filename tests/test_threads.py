"""Threads: private streams over one shared corpus, and one stream shared between threads.

The kernel copies windows with the GIL released, so threads really do run it concurrently. Each
thread's stream over a shared read-only corpus must give exactly the serial batches; a stream
shared between threads hands each ``next()`` one whole batch, so the threads together receive
the serial sequence, each batch exactly once.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tokstream import Corpus, open_tokens, stream_token_source, write_tokens

THREADS = 4


def batches_as_bytes(stream):
    return [(w.tobytes(), t.tobytes()) for w, t in stream]


def run_threads(target, count=THREADS):
    errors = []
    start = threading.Barrier(count)

    def wrapped(i):
        try:
            start.wait()
            target(i)
        except BaseException as exc:  # reported below, in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


STREAM_OPTIONS = [
    pytest.param({"shuffle": True}, id="materialized"),
    pytest.param(
        {"shuffle": True, "permutation": "implicit", "targets": "shifted"}, id="implicit_shifted"
    ),
    pytest.param({"shuffle": False, "world_size": 3, "rank": 2}, id="sequential_rank"),
]


@pytest.mark.parametrize("options", STREAM_OPTIONS)
def test_threads_with_their_own_streams_over_one_corpus_get_the_serial_batches(options):
    corpus = Corpus(
        [np.arange(5000, dtype=np.uint16) * 7 % 50257, np.arange(3000, dtype=np.uint16)]
    )
    # Each thread gets another seed, so a stream reading another's state would show.
    serial = {
        i: batches_as_bytes(stream_token_source(corpus, 32, 64, epochs=2, seed=i, **options))
        for i in range(THREADS)
    }
    results = {}

    def own_stream(i):
        results[i] = batches_as_bytes(
            stream_token_source(corpus, 32, 64, epochs=2, seed=i, **options)
        )

    run_threads(own_stream)
    assert results == serial


def test_threads_with_their_own_streams_over_one_memory_mapped_file(tmp_path):
    path = write_tokens(tmp_path / "tokens.npy", np.arange(20_000) % 50_000, dtype=np.uint16)
    corpus = open_tokens(path)
    serial = batches_as_bytes(stream_token_source(corpus, 64, 32, seed=5))
    results = {}

    def own_stream(i):
        results[i] = batches_as_bytes(stream_token_source(corpus, 64, 32, seed=5))

    run_threads(own_stream)
    assert all(result == serial for result in results.values())


@pytest.mark.parametrize("options", STREAM_OPTIONS)
def test_threads_sharing_one_stream_receive_each_serial_batch_exactly_once(options):
    ids = np.arange(20_000, dtype=np.int64)  # distinct tokens: a batch's bytes identify it
    serial = batches_as_bytes(stream_token_source(ids, 16, 8, epochs=3, seed=9, **options))
    shared = stream_token_source(ids, 16, 8, epochs=3, seed=9, **options)
    received = {i: [] for i in range(THREADS)}

    def consume(i):
        for windows, targets in shared:
            received[i].append((windows.tobytes(), targets.tobytes()))

    run_threads(consume)
    everything = [batch for batches in received.values() for batch in batches]
    assert sorted(everything) == sorted(serial)  # the same multiset: nothing lost or repeated
    for batches in received.values():
        # A thread's own batches come in stream order (a subsequence of it): next() is atomic.
        rest = iter(serial)
        assert all(batch in rest for batch in batches)


def test_state_dicts_taken_while_threads_iterate_are_consistent_cursors():
    ids = np.arange(10_000, dtype=np.int64)
    serial = batches_as_bytes(stream_token_source(ids, 8, 16, epochs=2, seed=4))
    shared = stream_token_source(ids, 8, 16, epochs=2, seed=4)
    states = []
    done = threading.Event()

    def worker(i):
        if i == 0:
            # At least one state, even when the other threads finish before this one runs.
            while not states or not done.is_set():
                states.append(shared.state_dict())
        else:
            for _ in shared:
                pass
            done.set()

    run_threads(worker, count=3)
    assert states
    for state in states[:: max(1, len(states) // 25)]:
        resumed = stream_token_source(ids, 8, 16, epochs=2, seed=4)
        resumed.load_state_dict(state)
        skipped = (
            state["epoch"] * resumed.batches_per_epoch
            + state["position"] // resumed.global_batch_size
        )
        assert batches_as_bytes(resumed) == serial[skipped:]
