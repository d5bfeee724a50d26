"""A background thread that assembles batches ahead of the consumer.

The kernel releases the GIL while it copies windows, so a producer thread overlaps the gather
with the consumer's training step. The thread holds only a weak reference to its owner (the
stream): a stream dropped mid-epoch is collected, and its thread notices within one poll interval
and exits. An exception in the producer is handed to the consumer, in order, as the next result.

Interrupts and forks. A ``KeyboardInterrupt`` can land on any line of the consumer's thread, so
``Thread.start`` (which an interrupt can break) runs in a short-lived thread of its own; the
prefetch thread produces nothing until the start has returned, and a start that did not complete
stops the thread and marks the prefetcher :attr:`~Prefetcher.stopped`. A
child process forked after the thread started has the parent's queue but not its thread: every
such prefetcher is marked :attr:`~Prefetcher.orphaned` in the child, and its owner's ``on_fork``
runs there first (the owner's locks may have been held by the vanished thread). The owner
discards a stopped or orphaned prefetcher and starts a new one where it wants to continue. The
consumer's side (:meth:`~Prefetcher.get`, :meth:`~Prefetcher.stop`) takes no lock the thread
needs, so an interrupt landing inside it cannot leave one held (see :class:`_Handoff`).
"""

from __future__ import annotations

import collections
import os
import queue
import threading
import weakref
from _thread import start_new_thread
from collections.abc import Callable
from typing import Any

_POLL_SECONDS = 0.05
_END = object()

# Prefetchers whose thread started in this process, for the fork hook.
_STARTED: weakref.WeakSet[Prefetcher] = weakref.WeakSet()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Handoff:
    """At most ``depth`` results on their way from the producer thread to the consumer.

    A signal handler's exception (Ctrl-C's KeyboardInterrupt) is raised in the consumer between
    any two bytecodes, and ``queue.Queue`` cannot take that: landing inside its Condition's
    acquire or release, it left the queue's lock held (the next ``get`` and the producer then
    waited for each other forever) or released twice (``RuntimeError: release unlocked lock``
    in place of the interrupt). Here nobody holds a lock: results move through a deque (append
    and popleft are atomic), and each side wakes the other by releasing a lock the other waits on
    with a timeout: an interrupt can lose a wake-up (the waiter looks again after the timeout),
    or the result a ``get`` had taken but not yet returned, never the handoff itself.
    """

    def __init__(self, depth: int) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._depth = depth
        self._added = _held_lock()
        self._taken = _held_lock()

    def put(self, item: Any, timeout: float) -> bool:
        """Producer: append ``item``; False if ``depth`` results still wait after ``timeout``."""
        if len(self._items) >= self._depth:
            self._taken.acquire(timeout=timeout)
            if len(self._items) >= self._depth:
                return False
        self._items.append(item)
        _wake(self._added)
        return True

    def get(self, timeout: float) -> Any:
        """Consumer: the oldest result; ``queue.Empty`` if none came within ``timeout``."""
        if not self._items:
            self._added.acquire(timeout=timeout)
        try:
            item = self._items.popleft()
        except IndexError:
            raise queue.Empty from None
        _wake(self._taken)
        return item

    def empty(self) -> bool:
        return not self._items

    def drop(self) -> None:
        """Consumer: forget the waiting results and wake a producer waiting for room."""
        self._items.clear()
        _wake(self._taken)


def _held_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


def _wake(lock: threading.Lock) -> None:
    """Let one wait on ``lock`` return (a no-op if a wake-up is already pending)."""
    try:
        lock.release()
    except RuntimeError:  # already released: a wake-up is pending
        pass


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
        self._handoff = _Handoff(depth)
        # Set by the consumer, read by the thread: a flag, not an Event (whose lock an
        # interrupt in the consumer could leave held).
        self._stopping = False
        # Released once the start has returned: the thread produces nothing before.
        self._go = _held_lock()
        # Set by the thread when it starts running this module (see _join), and when it leaves
        # it. The thread's own word, not Thread.is_alive(): on CPython before 3.13 an interrupt
        # landing inside is_alive() or join() (Thread._wait_for_tstate_lock) marks a running
        # thread as stopped for good.
        self._entered = False
        self._exited = False
        self._thread: threading.Thread | None = None
        self._finished = False
        # Set once a result was a failure (the thread then ends).
        self._failed = False
        self.orphaned = False

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` (or :meth:`close`) was called or the start was interrupted."""
        return self._stopping

    @property
    def usable(self) -> bool:
        """False when the owner must discard this prefetcher (stopped, orphaned by a fork, or
        ended by a failure it handed over)."""
        return not (self.orphaned or self._stopping or self._failed)

    def _start(self) -> None:
        thread = threading.Thread(
            target=self._run,
            name="tokstream-prefetch",
            daemon=True,
        )
        self._thread = thread
        try:
            _STARTED.add(self)
            # Thread.start waits on an Event for the new thread. In the main thread a Ctrl-C
            # landing in that wait could leave the Event's lock held (the new thread then
            # blocked in its bootstrap for good, listed by threading.enumerate()) or release it
            # twice. A thread of its own starts it instead, where no signal handler runs; and
            # start_new_thread is one call, which an interrupt lands before or after.
            start_new_thread(self._start_thread, (thread,))
            _wake(self._go)  # the thread produces nothing before this
        except BaseException:
            # Interrupted just before or after: the thread must not run on unseen (told to
            # stop, it produces nothing). It may have produced at most what the owner's rewind
            # undoes.
            self.stop()
            self._join()
            raise

    def _start_thread(self, thread: threading.Thread) -> None:
        try:
            thread.start()
        except BaseException as error:  # no thread ("can't start new thread"): the consumer's
            self._handoff.put(_Failure(error), _POLL_SECONDS)
            self._exited = True

    def _run(self) -> None:
        """The thread: produce until stopped, the end, a failure, or the owner is collected."""
        self._entered = True
        try:
            self._produce_until_done()
        finally:
            self._exited = True

    def _produce_until_done(self) -> None:
        while not self._go.acquire(timeout=_POLL_SECONDS):
            if self._owner_ref() is None:
                return
        while not self._stopping:
            owner = self._owner_ref()
            if owner is None:
                return
            try:
                item = self._produce(owner, self)
            except StopIteration:
                item = _END
            except BaseException as error:  # handed to the consumer, who decides
                item = _Failure(error)
            del owner
            while not self._stopping:
                if self._handoff.put(item, _POLL_SECONDS):
                    break
                if self._owner_ref() is None:
                    return
            if item is _END or isinstance(item, _Failure):
                return

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
                item = self._handoff.get(_POLL_SECONDS)
                break
            except queue.Empty:
                if self.orphaned or self._thread is None or self._exited:
                    if self._handoff.empty():
                        raise RuntimeError(
                            "the prefetch thread is gone (stopped, or lost in a fork)"
                        ) from None
        if item is _END:
            self._finished = True
            raise StopIteration
        if isinstance(item, _Failure):
            # The thread has ended: the owner discards this prefetcher and starts another at
            # the last batch it delivered, so the next call makes the failed batch again
            # (and fails again, or delivers it), never ending the stream early.
            self._finished = self._failed = True
            raise item.error
        return item

    def stop(self) -> None:
        """Ask the thread to stop; no result begins after its next check. Does not wait."""
        if self.orphaned:
            return  # no thread to tell
        self._stopping = True
        _wake(self._go)

    def close(self) -> None:
        """Stop the thread and wait for it; queued results are dropped."""
        self.stop()
        self._join()
        self._finished = True

    def _join(self) -> None:
        """Wait for the stopped thread to end, unless it has not run any of this module yet:
        such a thread ends as soon as it does (told to stop, it produces nothing)."""
        thread = self._thread
        if thread is None or not self._entered:
            return
        while not self._exited and not self.orphaned:
            self._handoff.drop()  # a producer waiting for room sees the stop sooner
            thread.join(_POLL_SECONDS)
        thread.join(_POLL_SECONDS)  # the few bytecodes it runs after leaving this module


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
