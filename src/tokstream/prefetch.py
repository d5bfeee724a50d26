"""A background thread that assembles batches ahead of the consumer.

The kernel releases the GIL while it copies windows, so a producer thread overlaps the gather
with the consumer's training step. The thread holds only a weak reference to its owner (the
stream): a stream dropped mid-epoch is collected, and its thread notices within one poll interval
and exits. An exception in the producer is handed to the consumer, in order, as the next result.

Interrupts and forks. A ``KeyboardInterrupt`` can land on any line, including inside
``Thread.start``; the thread therefore produces nothing until the start has returned, and a start
that did not complete stops the thread and marks the prefetcher :attr:`~Prefetcher.stopped`. A
child process forked after the thread started has the parent's queue but not its thread: every
such prefetcher is marked :attr:`~Prefetcher.orphaned` in the child, and its owner's ``on_fork``
runs there first (the owner's locks may have been held by the vanished thread). The owner
discards a stopped or orphaned prefetcher and starts a new one where it wants to continue.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

_POLL_SECONDS = 0.05
_END = object()

# Prefetchers whose thread started in this process, for the fork hook.
_STARTED: weakref.WeakSet[Prefetcher] = weakref.WeakSet()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher:
    """Runs ``produce(owner, prefetcher)`` in a daemon thread, keeping up to ``depth`` results.

    ``produce`` returns the next result, or raises StopIteration at the end; it should check
    :attr:`stopped` under the lock that guards its owner's state, so that no result begins after
    :meth:`stop`. The thread starts on the first :meth:`get`. ``owner`` is held weakly; the
    thread ends when the owner is collected, when :meth:`stop` or :meth:`close` is called, or at
    the end. ``on_fork(owner)`` runs in a child process forked while the thread runs.
    """

    def __init__(
        self,
        owner: Any,
        produce: Callable[[Any, Prefetcher], Any],
        depth: int,
        on_fork: Callable[[Any], None] | None = None,
    ) -> None:
        self._owner_ref = weakref.ref(owner)
        self._produce = produce
        self._on_fork = on_fork
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._go = threading.Event()
        self._thread: threading.Thread | None = None
        self._finished = False
        self.orphaned = False

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` (or :meth:`close`) was called or the start was interrupted."""
        return self._stop.is_set()

    @property
    def usable(self) -> bool:
        """False when the owner must discard this prefetcher (stopped, or orphaned by a fork)."""
        return not (self.orphaned or self._stop.is_set())

    def _start(self) -> None:
        thread = threading.Thread(
            target=_run,
            args=(self._owner_ref, self._produce, self, self._queue, self._stop, self._go),
            name="tokstream-prefetch",
            daemon=True,
        )
        try:
            self._thread = thread
            thread.start()
            _STARTED.add(self)
            self._go.set()  # the thread produces nothing before this
        except BaseException:
            # Interrupted inside Thread.start (or just after): the thread must not run on
            # unseen. It may have produced at most what the owner's rewind undoes.
            self._stop.set()
            self._go.set()
            if thread.ident is not None:
                thread.join()
            raise

    def get(self) -> Any:
        """The next result, in production order; StopIteration after the last one.

        Raises RuntimeError instead of waiting forever when the thread is gone without
        delivering an end (stopped, or orphaned by a fork).
        """
        if self._finished:
            raise StopIteration
        if self._thread is None:
            self._start()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_SECONDS)
                break
            except queue.Empty:
                if self.orphaned or not self._thread.is_alive():
                    if self._queue.empty():
                        raise RuntimeError(
                            "the prefetch thread is gone (stopped, or lost in a fork)"
                        ) from None
        if item is _END:
            self._finished = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._finished = True
            raise item.error
        return item

    def stop(self) -> None:
        """Ask the thread to stop; no result begins after its next check. Does not wait."""
        if self.orphaned:
            return  # no thread to tell, and its events' locks may have been held by it
        self._stop.set()
        self._go.set()

    def close(self) -> None:
        """Stop the thread and wait for it; queued results are dropped."""
        self.stop()
        thread = self._thread
        while thread is not None and thread.is_alive() and not self.orphaned:
            try:
                self._queue.get_nowait()  # unblock a producer waiting on a full queue
            except queue.Empty:
                pass
            thread.join(_POLL_SECONDS)
        self._finished = True


def _run(
    owner_ref: weakref.ref,
    produce: Callable[[Any, Prefetcher], Any],
    prefetcher: Prefetcher,
    out: queue.Queue,
    stop: threading.Event,
    go: threading.Event,
) -> None:
    go.wait()
    while not stop.is_set():
        owner = owner_ref()
        if owner is None:
            return
        try:
            item = produce(owner, prefetcher)
        except StopIteration:
            item = _END
        except BaseException as error:  # handed to the consumer, who decides
            item = _Failure(error)
        del owner
        while not stop.is_set():
            try:
                out.put(item, timeout=_POLL_SECONDS)
                break
            except queue.Full:
                if owner_ref() is None:
                    return
        if item is _END or isinstance(item, _Failure):
            return


def _after_fork_in_child() -> None:
    # Only the forking thread exists in the child: every prefetch thread is gone.
    for prefetcher in list(_STARTED):
        prefetcher.orphaned = True
        owner = prefetcher._owner_ref()
        if owner is not None and prefetcher._on_fork is not None:
            prefetcher._on_fork(owner)
    _STARTED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
