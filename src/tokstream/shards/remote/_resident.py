"""What a stream asks of a remote corpus: the bytes of these windows, now or soon.

The kernels copy windows from raw addresses. :class:`Residency` maps addresses (or windows of a
window space) to the remote objects whose maps hold them and asks each object's session to fetch
those byte ranges: :meth:`Residency.fetch_windows` returns at once (look-ahead, driven by the
stream's :class:`~tokstream._readahead.ReadAhead` through :meth:`Residency.advisor`), while
:meth:`Residency.ensure_windows` returns only when every byte the kernel call will read is in
memory, and raises :class:`~tokstream.shards.remote.RemoteReadError` otherwise, before the
kernel runs, so a batch is whole or not made at all. It returns a
:class:`~tokstream.shards.remote._cache.Pin`: the kernel call runs inside ``with pin:``, so none
of those bytes is evicted before it returns.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tokstream.shards.remote._cache import Pin

if TYPE_CHECKING:  # the sessions (asyncio, the client) load with the first remote corpus
    from tokstream.shards.remote._memory import ObjectBytes, RemoteTokens
    from tokstream.shards.remote._session import Request, Session

Futures = Sequence[concurrent.futures.Future[None]]

#: Windows a remote stream keeps requested ahead of the batch being copied, per GET allowed in
#: flight: enough to keep every allowed GET busy while a batch waits, few enough that little
#: is fetched for nothing when the stream stops.
AHEAD_PER_GET = 4
#: A run of tokens read whole (an eos scan, a conversion) is fetched in GETs of this many bytes.
PIECE_BYTES = 8 << 20


class Residency:
    """The remote shards of one corpus, by the address range of their tokens (``shards``: the
    memory of each, at least one)."""

    def __init__(self, shards: Sequence[RemoteTokens]) -> None:
        found = []
        for tokens in shards:
            start = tokens.object.address + tokens.offset
            found.append((start, start + tokens.count * tokens.dtype.itemsize, tokens))
        found.sort(key=lambda entry: entry[0])
        self._starts = np.array([entry[0] for entry in found], np.uint64)
        self._ends = np.array([entry[1] for entry in found], np.uint64)
        # Each shard's object and the object offset of its first token.
        self._objects: list[ObjectBytes] = [entry[2].object for entry in found]
        self._offsets = np.array(
            [entry[2].object.address for entry in found], np.uint64
        )  # object base addresses
        self._itemsize = found[0][2].dtype.itemsize if found else 1
        sessions: dict[int, Session] = {}
        for obj in self._objects:
            sessions.setdefault(id(obj.session), obj.session)
        self._sessions = list(sessions.values())
        #: Windows to keep requested ahead of the batch being copied (see AHEAD_PER_GET).
        self.windows_ahead = AHEAD_PER_GET * max(s.options.max_in_flight for s in self._sessions)

    def requests_at(self, addresses: np.ndarray, nbytes: np.ndarray | int) -> list[Request]:
        """The object byte ranges of reads of ``nbytes`` at ``addresses`` (remote ones only),
        each clipped to the end of its shard."""
        addresses = np.asarray(addresses, np.uint64)
        spans = np.broadcast_to(np.asarray(nbytes, np.uint64), addresses.shape)
        which = np.searchsorted(self._starts, addresses, side="right").astype(np.int64) - 1
        inside = which >= 0
        safe = np.where(inside, which, 0)
        inside &= addresses < self._ends[safe]
        ends = np.minimum(addresses + spans, self._ends[safe])
        firsts = addresses - self._offsets[safe]
        lasts = ends - self._offsets[safe]
        objects = self._objects
        return [
            (objects[int(i)], int(first), int(last))
            for i, first, last in zip(
                safe[inside].tolist(), firsts[inside].tolist(), lasts[inside].tolist(), strict=True
            )
        ]

    def window_requests(self, space: Any, windows_index: np.ndarray) -> list[Request]:
        """The byte ranges the kernels read for these windows of ``space`` (a window space)."""
        # The addresses only name objects here, nothing is read through them: the shards'
        # readable guard need not be held.
        _, addresses, _ = space.locate(np.ascontiguousarray(windows_index, np.int64))
        return self.requests_at(addresses, (space.block + 1) * space.corpus.dtype.itemsize)

    def ensure_at(self, addresses: np.ndarray, nbytes: np.ndarray | int) -> Pin:
        """Return once the ``nbytes`` at each of ``addresses`` (remote ones) are in memory,
        pinned there until the pin is released."""
        return self.ensure(self.requests_at(addresses, nbytes))

    def ensure_windows(self, space: Any, windows_index: np.ndarray) -> Pin:
        """Return once every byte of these windows is in memory (see the module docstring)."""
        return self.ensure(self.window_requests(space, windows_index))

    def fetch_windows(self, space: Any, windows_index: np.ndarray, after: Futures = ()) -> Futures:
        """Start fetching these windows' bytes (see :meth:`fetch`); returns at once."""
        return self.fetch(self.window_requests(space, windows_index), after)

    def fetch_rows(self, space: Any, windows_index: np.ndarray, after: Futures = ()) -> Futures:
        """Start fetching the pieces of these packed rows of ``space`` (a packed space); returns
        at once. The ranges are those :meth:`ensure_pieces` asks for."""
        addresses, nbytes = space.piece_addresses(windows_index)
        return self.fetch(self.requests_at(addresses, nbytes), after)

    def fetch(self, requests: list[Request], after: Futures = ()) -> Futures:
        """Start fetching these ranges, once the futures ``after`` are done; returns at once,
        with the futures the ranges wait on."""
        futures: list[concurrent.futures.Future[None]] = []
        for session in self._sessions:
            mine = [r for r in requests if r[0].session is session]
            if mine:
                futures.extend(session.fetch(mine, after))
        return futures

    def ensure_pieces(
        self, rows: np.ndarray, row_offsets: np.ndarray, addresses: np.ndarray, lengths: np.ndarray
    ) -> Pin:
        """:meth:`ensure_windows` for packed rows: rows ``rows`` of one group's table, whose
        pieces ``row_offsets[r]:row_offsets[r + 1]`` are ``lengths[i]`` tokens at
        ``addresses[i]`` (as ``PackedSpace.row_runs`` yields them)."""
        pieces = np.concatenate(
            [np.arange(row_offsets[row], row_offsets[row + 1]) for row in rows.tolist()]
        )
        return self.ensure(self.requests_at(addresses[pieces], lengths[pieces] * self._itemsize))

    def ensure(self, requests: list[Request]) -> Pin:
        """Return once every range is in memory, pinned until the returned pin is released."""
        pins: list[Pin] = []
        try:
            for session in self._sessions:
                mine = [r for r in requests if r[0].session is session]
                if mine:
                    pins.append(session.ensure(mine))
        except BaseException:
            Pin.join(pins).release()
            raise
        return Pin.join(pins)

    def advisor(self, space: Any) -> _Advisor:
        """A stand-in for ``space`` in :class:`~tokstream._readahead.ReadAhead`, whose advice
        to the OS becomes range GETs started ahead."""
        return _Advisor(self, space)

    def close(self) -> None:
        """Cancel what is in flight; end every loop thread and connection of the sessions."""
        for session in self._sessions:
            session.close()


class _Advisor:
    def __init__(self, residency: Residency, space: Any) -> None:
        self._residency, self._space = residency, space
        # A packed space says where its rows' pieces are; a window space where its windows are.
        self._fetch = (
            residency.fetch_rows if hasattr(space, "piece_addresses") else (residency.fetch_windows)
        )
        self._waited: Futures | None = None  # None: the next batch advised is waited for
        self._cold = True

    def cold_start(self) -> None:
        """The next batch advised is one the stream is about to wait for (nothing was read
        ahead: the first batch, or one after a jump): the batches advised after it are fetched
        once its bytes are in. At 64 in flight the store otherwise serves the look-ahead's
        requests beside that batch's last ones, and the batch takes longer to arrive."""
        self._cold = True

    def advise(self, windows_index: np.ndarray, sample: int) -> int:
        """Start fetching the windows (or packed rows); never "all resident", so look-ahead
        never stops."""
        if self._cold:
            self._cold = False
            self._waited = self._fetch(self._space, windows_index)
        else:
            waited = self._waited or ()
            self._fetch(self._space, windows_index, [f for f in waited if not f.done()])
        return max(1, int(windows_index.shape[0]))
