"""An asyncio event loop in its own daemon thread: where every request to an object store runs.

The consumer (or the stream's prefetch thread) never waits on the network in its own frames but
on a future the loop fulfils, so an interrupt there leaves the loop's state whole. The thread
starts on first use and :meth:`Loop.close` cancels what is in flight and joins it; a process
forked while it runs starts a loop of its own on first use (the parent's thread is not there).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: Seconds close() waits for the loop's thread to end.
_JOIN_SECONDS = 10.0


class Loop:
    """A lazily started event loop thread (see the module docstring)."""

    def __init__(self, name: str = "tokstream-remote") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._pid == os.getpid()

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is not None and self._pid == os.getpid():
                return self._loop
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                try:
                    loop.run_forever()
                finally:
                    loop.run_until_complete(loop.shutdown_asyncgens())
                    loop.close()

            thread = threading.Thread(target=run, name=self._name, daemon=True)
            thread.start()
            started.wait()
            self._loop, self._thread, self._pid = loop, thread, os.getpid()
            # A loop nobody holds any more (its corpus and streams were dropped unclosed) ends
            # its thread too; the thread itself holds nothing of this object. Not waited for:
            # a finalizer runs wherever the collector does, and must not block there.
            weakref.finalize(self, _stop, loop, thread, False)
            return loop

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` on the loop; its future (cancel it to cancel the coroutine)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._start())

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result (an interrupt cancels it)."""
        future = self.submit(coroutine)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        """Cancel every task in flight and end the thread (a later use starts a new one)."""
        with self._lock:
            loop, thread, pid = self._loop, self._thread, self._pid
            self._loop = self._thread = None
        if loop is None or thread is None or pid != os.getpid():
            return

        _stop(loop, thread)


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread, join: bool = True) -> None:
    """End a loop's thread, cancelling what is left in flight; ``join``: wait for it to end."""
    if not thread.is_alive():
        return

    async def cancel_all() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.get_running_loop().stop()

    try:
        asyncio.run_coroutine_threadsafe(cancel_all(), loop)
    except RuntimeError:  # the loop already stopped
        return
    if join and thread is not threading.current_thread():
        thread.join(_JOIN_SECONDS)
