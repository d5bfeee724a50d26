"""A background thread that assembles batches ahead of the consumer.

The kernel releases the GIL while it copies windows, so a producer thread overlaps the gather
with the consumer's training step. The thread holds only a weak reference to its stream: a
stream dropped mid-epoch is collected, and its thread notices within one poll interval and
exits. An exception in the producer is handed to the consumer, in order, as the next result.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

_POLL_SECONDS = 0.05
_END = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher:
    """Runs ``produce(owner)`` in a daemon thread, keeping up to ``depth`` results queued.

    ``produce`` returns the next result, or raises StopIteration at the end. ``owner`` is held
    weakly; the thread stops when it is collected, when :meth:`close` is called, or at the end.
    """

    def __init__(self, owner: Any, produce: Callable[[Any], Any], depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(
            target=_run,
            args=(weakref.ref(owner), produce, self._queue, self._stop),
            name="tokstream-prefetch",
            daemon=True,
        )
        weakref.finalize(owner, self._stop.set)
        self._thread.start()

    def get(self) -> Any:
        """The next result, in production order; StopIteration after the last one."""
        if self._finished:
            raise StopIteration
        item = self._queue.get()
        if item is _END:
            self._finished = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._finished = True
            raise item.error
        return item

    def close(self) -> None:
        """Stop the thread and wait for it; queued results are dropped."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()  # unblock a producer waiting on a full queue
            except queue.Empty:
                pass
            self._thread.join(_POLL_SECONDS)
        self._finished = True

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def _run(owner_ref: weakref.ref, produce: Callable[[Any], Any], out: queue.Queue,
         stop: threading.Event) -> None:
    while not stop.is_set():
        owner = owner_ref()
        if owner is None:
            return
        try:
            item = produce(owner)
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
