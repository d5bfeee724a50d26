"""Range GETs for the windows a stream is about to read: ahead of time, coalesced, bounded.

A :class:`Session` belongs to one :func:`tokstream.open_tokens` of a URL (its objects, clients
and event loop). The stream hands it the byte ranges of upcoming windows (:meth:`Session.fetch`,
which returns at once) and, just before a kernel call, the ranges of the batch it is about to
copy (:meth:`Session.ensure`, which returns only when every one of those bytes is in memory, or
raises). Ranges of one object that overlap or touch are fetched as one GET; at most
``options.max_in_flight`` GETs are in flight in the process. A range fetched ahead is not fetched
again: :meth:`ensure` waits for the fetch already under way. Every range is pinned in the
session's :class:`~tokstream.shards.remote._cache.Cache` from the moment it is scheduled until the
batch that reads it is copied, so nothing it needs is evicted; when the cache keeps bytes, the
objects' granule marks say what is present, otherwise a range is present only while its fetch is
pending (until its batch consumes it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from tokstream.shards.remote._cache import Cache, Pin
from tokstream.shards.remote._client import Client, RemoteOptions
from tokstream.shards.remote._loop import Loop
from tokstream.shards.remote._memory import GRANULE, ObjectBytes

#: A requested range: (object, first byte, end byte).
Request = tuple[ObjectBytes, int, int]

#: The process in which this module first used the client (0: none yet). A process forked
#: from it inherits the number; see :func:`check_process`.
_client_pid = 0

_FORKED = (
    "a remote corpus cannot be read in a process forked from one that had used the "
    "object-store client: obstore's runtime does not survive fork(), so a request here would "
    "wait forever; start the process with the 'spawn' or 'forkserver' multiprocessing context, "
    "which pickles the corpus (for DataLoader workers, tokstream.torch.data_loader chooses one)"
)


def check_process() -> None:
    """Raise RuntimeError in a process forked from one that had used the client.

    obstore runs every request on one process-wide runtime (tokio) whose threads are not in a
    forked child, so a request made there waits forever: whatever the child reads, a corpus
    inherited, unpickled or opened anew, it fails at once with this error instead. A process
    started with "spawn" or "forkserver" begins without the runtime and reads normally.
    """
    if _client_pid and _client_pid != os.getpid():
        raise RuntimeError(_FORKED)


def _used_in_this_process() -> None:
    global _client_pid
    if not _client_pid:
        _client_pid = os.getpid()


#: Where a batch stalled on object storage is told (and its recovery).
LOG = logging.getLogger("tokstream")

#: Ranges fetched ahead but never consumed (a stream that jumped) are forgotten past this many.
_MAX_PENDING = 1 << 20


class Session:
    """The clients, event loop and in-flight fetches of one remote corpus (module docstring)."""

    def __init__(self, options: RemoteOptions) -> None:
        self.options = options
        self.cache_dir = options.cache_dir
        self.cache = Cache(options)
        self._loop = Loop()
        self._clients: dict[str, Client] = {}
        self._lock = threading.Lock()
        # (object, start, end) -> [the future of the fetch that brings those bytes, the pin
        # that keeps them until a batch takes them over, how many batches fetched ahead still
        # read them (kept until the last of them takes them over)]. Keyed by the object itself,
        # held: a shard whose map was dropped and opened again is another object, and its
        # bytes are fetched again; an object's id, reused after it is freed, could have
        # named the new one's absent bytes present.
        self._pending: dict[tuple[ObjectBytes, int, int], list[Any]] = {}
        self._semaphores: dict[int, asyncio.Semaphore] = {}
        # The ranges being fetched now (sent or retried), with when their first attempt began.
        self._in_flight: dict[Request, float] = {}
        #: Bytes and GETs fetched so far (ranges as sent, after coalescing).
        self.bytes_fetched = 0
        self.requests = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return (Session, (self.options,))

    def client(self, root: str) -> Client:
        check_process()
        _used_in_this_process()
        with self._lock:
            client = self._clients.get(root)
            if client is None:
                client = self._clients[root] = Client(root, self.options)
            return client

    def run(self, coroutine: Any) -> Any:
        """Run a coroutine of this session's clients on its loop and wait for it."""
        try:
            check_process()
        except RuntimeError:
            coroutine.close()  # never awaited: closed, so no warning says it was forgotten
            raise
        return self._loop.run(coroutine)

    # ------------------------------------------------------------------ fetching

    def fetch(
        self, requests: Iterable[Request], after: Sequence[concurrent.futures.Future[None]] = ()
    ) -> list[concurrent.futures.Future[None]]:
        """Start fetching every range not yet present or under way, for a batch that will
        :meth:`ensure` them later; returns at once, with the futures the ranges wait on.

        With ``after``, the new requests are sent once those futures are done (a batch being
        waited for first: the store serves its last requests without these beside them).
        """
        return self._schedule(requests, ahead=1, after=after)

    def ensure(self, requests: Sequence[Request]) -> Pin:
        """Return once the bytes of every range are in memory, with the pin that keeps them
        there: release it once the kernel call reading them has returned.

        Raises :class:`~tokstream.shards.remote._client.RemoteReadError` (naming the object and
        range) as soon as one of the ranges fails past its deadline (counted from when the range
        was asked for, so that time queued for a slot counts), cancelling every fetch of the
        session still in flight: with the store gone, the error comes after about one deadline,
        not one per ``max_in_flight`` ranges in a row. Nothing is then reported present, so a
        later call fetches again.
        """
        # Pinned before presence is looked at: nothing found present is evicted after.
        pin = self.cache.pin(requests)
        try:
            self._wait(requests)
        except BaseException:
            pin.release()
            raise
        return pin

    def _wait(self, requests: Sequence[Request]) -> None:
        keys = [(obj, start, end) for obj, start, end in requests]
        while True:
            futures = self._schedule(requests, ahead=0)
            if not futures:
                return
            self._wait_warning_of_stalls(futures, requests)
            failed = next((f for f in futures if _failed(f) and not f.cancelled()), None)
            if failed is not None:
                self._cancel_pending()
                error = failed.exception()
                assert error is not None
                raise error
            taken = []
            with self._lock:
                for key in keys:
                    # This batch no longer needs the range; a later batch fetched ahead that
                    # reads it too (the next epoch's) still does, unless the fetch failed.
                    entry = self._pending.get(key)
                    if entry is not None:
                        entry[2] -= 1
                        if entry[2] <= 0 or _failed(entry[0]):
                            taken.append(self._pending.pop(key))
            for entry in taken:
                entry[1].release()  # the caller's pin holds the bytes from here on
            if not any(future.cancelled() for future in futures):
                return
            # Cancelled by close() (another stream over the same corpus closed) or by another
            # batch's failure: fetch again.

    def _wait_warning_of_stalls(
        self, futures: list[concurrent.futures.Future[None]], requests: Sequence[Request]
    ) -> None:
        """Wait until every future is done or one failed; past ``options.stall_warning``
        seconds, log a warning naming a range still awaited, and another once they are done."""
        first = concurrent.futures.FIRST_EXCEPTION
        began = time.monotonic()
        _, waiting = concurrent.futures.wait(futures, self.options.stall_warning, first)
        if not waiting:
            return
        wanted: dict[ObjectBytes, list[tuple[int, int]]] = {}
        for obj, start, end in requests:
            wanted.setdefault(obj, []).append((start, end))
        with self._lock:
            # The GETs in flight (or retried) for this batch's ranges, the longest running first.
            stalled = sorted(
                (since, obj, start, end)
                for (obj, start, end), since in self._in_flight.items()
                if any(a < end and start < b for a, b in wanted.get(obj, ()))
            )
        obj, start, end = stalled[0][1:] if stalled else requests[0]
        LOG.warning(
            "a batch has waited %.0f s on object storage for %d requests, the longest running "
            "for %s bytes [%d, %d); still retrying (deadline %g s)",
            time.monotonic() - began,
            len(stalled),
            obj.url,
            start,
            end,
            self.options.deadline,
        )
        concurrent.futures.wait(futures, return_when=first)
        if not any(_failed(future) for future in futures):
            LOG.warning(
                "the batch's byte ranges came after %.0f s (%s bytes [%d, %d) among them)",
                time.monotonic() - began,
                obj.url,
                start,
                end,
            )

    def _cancel_pending(self) -> None:
        """Cancel every fetch in flight and forget every range pending (a range failed for
        good: the others are not worth waiting for, and would keep the store's slots)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in {id(entry[0]): entry[0] for entry in pending.values()}.values():
            future.cancel()
        for entry in pending.values():
            entry[1].release()

    def _schedule(
        self,
        requests: Iterable[Request],
        ahead: int,
        after: Sequence[concurrent.futures.Future[None]] = (),
    ) -> list[concurrent.futures.Future[None]]:
        """The futures the requested ranges wait on, after scheduling those not under way;
        ``ahead`` (1 or 0): whether the request is a look-ahead's, counted in ``_pending``."""
        check_process()
        requests = list(requests)
        # Each range pinned before its presence is looked at, kept pinned (its present part
        # too) from the moment its fetch is scheduled until a batch takes the range over: its
        # bytes land in extents nothing evicts, and stay there.
        pins = self.cache.pin_each([[request] for request in requests])
        waits: dict[int, concurrent.futures.Future[None]] = {}
        # The ranges scheduled now: their pins and uses ahead.
        scheduled: dict[tuple[ObjectBytes, int, int], list[Any]] = {}
        spans: list[Request] = []
        dropped: list[Pin] = []
        with self._lock:
            for (obj, start, end), pin in zip(requests, pins, strict=True):
                key = (obj, start, end)
                entry = self._pending.get(key) or scheduled.get(key)
                span = None if entry is not None else obj.missing(start, end)
                if entry is not None:
                    entry[-1] += ahead  # a mixture's sources may share a piece in one batch
                    if key in self._pending:
                        waits[id(entry[0])] = entry[0]
                if span is None:
                    dropped.append(pin)
                else:
                    scheduled[key] = [pin, ahead]
                    spans.append((obj, *span))
        if spans:
            before = [f for f in after if not f.done()]
            since = time.monotonic()
            future = self._loop.submit(self._fetch_all(coalesce(spans), since, before))
            with self._lock:
                if len(self._pending) > _MAX_PENDING:
                    kept = {k: e for k, e in self._pending.items() if not e[0].done()}
                    dropped.extend(e[1] for k, e in self._pending.items() if k not in kept)
                    self._pending = kept
                for key, (pin, uses) in scheduled.items():
                    replaced = self._pending.get(key)
                    if replaced is not None:  # scheduled by another thread meanwhile
                        dropped.append(replaced[1])
                    self._pending[key] = [future, pin, uses]
            waits[id(future)] = future
        for pin in dropped:
            pin.release()
        return list(waits.values())

    async def _fetch_all(
        self,
        ranges: list[Request],
        since: float,
        after: Sequence[concurrent.futures.Future[None]] = (),
    ) -> None:
        """Fetch every range (asked for at ``since``, after ``after`` are done); the first
        failure cancels the others and is raised."""
        if after:  # done or failed alike: these requests wait for them, not on their results
            waited = [asyncio.wrap_future(f) for f in after]
            for future in waited:
                # Their failures are their own batch's to raise: taken here, so that no
                # "exception never retrieved" is logged from wherever the copies are collected.
                future.add_done_callback(_taken)
            await asyncio.wait(waited)
        tasks = [asyncio.ensure_future(self._fetch_one(*request, since)) for request in ranges]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()  # nothing for those done
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            error = None if task.cancelled() else task.exception()
            if error is not None:
                raise error

    async def _fetch_one(self, obj: ObjectBytes, start: int, end: int, since: float) -> None:
        loop_id = id(asyncio.get_running_loop())
        semaphore = self._semaphores.get(loop_id)
        if semaphore is None:
            semaphore = self._semaphores[loop_id] = asyncio.Semaphore(self.options.max_in_flight)
        async with semaphore:
            request = (obj, start, end)
            with self._lock:
                self._in_flight[request] = time.monotonic()
            try:
                data = await self.client(obj.root).read_range(
                    obj.key, start, end, obj.etag, obj.size, since
                )
            finally:
                with self._lock:
                    self._in_flight.pop(request, None)
        obj.write(start, data)
        self.bytes_fetched += end - start
        self.requests += 1

    def close(self) -> None:
        """Cancel the fetches in flight, end the loop's thread and drop every connection.

        A later :meth:`fetch` or :meth:`ensure` starts them again.
        """
        self._loop.close()
        with self._lock:
            pending, self._pending = self._pending, {}
            for entry in pending.values():
                entry[1].release()
            self._semaphores.clear()
            for client in self._clients.values():
                client.close()


def _taken(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def _failed(future: concurrent.futures.Future[None]) -> bool:
    """Whether a fetch is over without its bytes (cancelled, or failed); never waits."""
    return future.done() and (future.cancelled() or future.exception() is not None)


def coalesce(requests: Iterable[Request]) -> list[Request]:
    """The ranges of each object with every overlapping or touching pair merged, sorted.

    With a cache, ranges are widened to whole granules first (so that the granules they fill
    can be marked present).
    """
    by_object: dict[int, tuple[ObjectBytes, list[tuple[int, int]]]] = {}
    for obj, start, end in requests:
        if obj.granular:
            start, end = start // GRANULE * GRANULE, min(-(-end // GRANULE) * GRANULE, obj.size)
        by_object.setdefault(id(obj), (obj, []))[1].append((start, end))
    merged: list[Request] = []
    for obj, spans in by_object.values():
        spans.sort()
        low, high = spans[0]
        for start, end in spans[1:]:
            if start <= high:
                high = max(high, end)
            else:
                merged.append((obj, low, high))
                low, high = start, end
        merged.append((obj, low, high))
    return merged
