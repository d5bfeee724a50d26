"""Grain adapter: a token stream as a ``grain.IterDataset`` and its samples as a ``MapDataset``.

Only this module needs Grain (the ``tokstream[grain]`` extra); ``import tokstream`` never
imports it.

:class:`TokenIterDataset` yields exactly the batches :func:`tokstream.stream_token_source`
yields with the same arguments; its iterator's ``get_state()`` / ``set_state()`` are the
stream's :meth:`~tokstream.TokenStream.state_dict` / :meth:`~tokstream.TokenStream.load_state_dict`
(a JSON-serialisable dict, what Grain's Orbax checkpoint handler writes), so composed with
Grain's transformations, whose iterators carry their parent's state, a restored pipeline goes
on with the exact next batch.

Sharding. On process ``r`` of ``W`` (``rank`` and ``world_size`` when given; else
``jax.process_index()`` / ``jax.process_count()`` when JAX is imported; else one process),
``ds.mp_prefetch(MultiprocessingOptions(num_workers=K))`` slices the dataset in worker ``w``
with ``slice(w, None, K)`` (:meth:`TokenIterDataset.set_slice`), and worker ``w`` streams as
rank ``r * K + w`` of ``W * K``, the convention of :mod:`tokstream.torch`: every window of
an epoch goes to exactly one worker of one process, less the last ``n % (W * K)`` positions
of each epoch's order. A state counts global samples, so a state saved under one ``W`` loads
under any other (:meth:`tokstream.TokenStream.load_state_dict`).

:class:`TokenMapDataset` is the unshuffled sample space for Grain's own ``shuffle``,
``batch`` and sharding: ``ds[i]`` is sample ``i``, found by arithmetic on the stream's cursor
(:meth:`tokstream.TokenStream.seek`), not read from a table of samples.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Mapping
from typing import Any, TypeAlias

import numpy as np

from tokstream._extras import install_hint

try:
    import grain
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without grain
    raise ImportError(
        "tokstream.grain needs Grain, which could not be imported; install the extra with "
        f"{install_hint('grain')}. Original error: {exc}"
    ) from exc

from tokstream import TokenStream, stream_token_source
from tokstream._options import stream_signature

__all__ = ["Sample", "TokenDatasetIterator", "TokenIterDataset", "TokenMapDataset"]

#: One sample of :class:`TokenMapDataset`: ``(window, target)`` (a ``(block,)`` array and the
#: next token, or the ``(block,)`` shifted window), or with ``extras`` (or over a mixture) a dict
#: of the row's arrays by name.
Sample: TypeAlias = tuple[np.ndarray, Any] | dict[str, Any]


def process_share(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)`` of this process: explicit ones win; else JAX's process index and
    count when JAX is imported (build the dataset after ``jax.distributed.initialize``); else
    one process."""
    default_rank, default_world = 0, 1
    jax = sys.modules.get("jax")
    if jax is not None and (rank is None or world_size is None):
        default_rank, default_world = jax.process_index(), jax.process_count()
    return (
        default_rank if rank is None else rank,
        default_world if world_size is None else world_size,
    )


class TokenDatasetIterator(grain.DatasetIterator):  # type: ignore[misc]  # grain is untyped
    """The iterator of a :class:`TokenIterDataset`: a :class:`tokstream.TokenStream` whose
    cursor is Grain's state.

    ``get_state()`` is the stream's ``state_dict()`` (the batches delivered so far, a
    JSON-serialisable dict of about 5 KB); ``set_state(state)`` loads one, checked first:
    a state from another configuration is a ``ValueError`` naming the mismatch, and the
    iterator is left as it was.
    """

    def __init__(self, stream: TokenStream) -> None:
        super().__init__()
        self._stream = stream

    def __next__(self) -> Any:
        self._assert_not_closed()
        return next(self._stream)

    def get_state(self) -> dict[str, Any]:
        return self._stream.state_dict()

    def set_state(self, state: dict[str, Any]) -> None:
        self._stream.load_state_dict(state)

    def close(self) -> None:
        """Stop the stream (and its prefetch thread, if any); later ``next()`` is an error."""
        self._stream.close()
        super().close()

    def __str__(self) -> str:
        return f"TokenDatasetIterator({self._stream!r})"


class TokenIterDataset(grain.IterDataset):  # type: ignore[misc]  # grain is untyped
    """Batches of :func:`tokstream.stream_token_source` as a Grain ``IterDataset``.

    Takes the arguments of :func:`tokstream.stream_token_source` (checked now, once) and yields
    exactly its batches: ``(windows, targets)`` arrays, or a dict of arrays with ``extras``, a
    packed stream or a mixture. ``rank`` and ``world_size`` default to JAX's process index and
    count when JAX is imported (see the module docstring). Each ``iter()`` is one pass over
    every epoch from the start; restore a position with the iterator's ``set_state``.
    """

    def __init__(self, token_ids: Any, block: Any, batch_size: Any, **options: Any) -> None:
        super().__init__()
        self._rank, self._world_size = process_share(
            options.pop("rank", None), options.pop("world_size", None)
        )
        self._arguments = (token_ids, block, batch_size, options)
        # Worker ``w`` of ``K`` (Grain's slice(w, None, K)): a share of this process' share.
        self._worker = (0, 1)
        self._stream()  # every argument checked now, not in a worker

    __init__.__signature__ = stream_signature(  # type: ignore[attr-defined]
        "self", "token_ids", defaults={"rank": None, "world_size": None}
    )

    def _stream(self) -> TokenStream:
        token_ids, block, batch_size, options = self._arguments
        worker, workers = self._worker
        return stream_token_source(
            token_ids,
            block,
            batch_size,
            rank=self._rank * workers + worker,
            world_size=self._world_size * workers,
            **options,
        )

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Stream worker ``sl.start``'s share of ``sl.step`` workers of this process.

        Grain calls it in each ``mp_prefetch`` worker (and each ``multithread_prefetch``
        thread's copy) with ``slice(w, None, K)``; the slice replaces any earlier one. The
        share is the stream's strided one (see the module docstring) whatever
        ``sequential_slice`` says: every position goes to one worker either way.

        Raises
        ------
        ValueError
            ``sl`` is not of the form ``slice(w, None, K)`` with ``0 <= w < K``.
        """
        start, stop, step = sl.start or 0, sl.stop, 1 if sl.step is None else sl.step
        if (
            stop is not None
            or not isinstance(start, int)
            or not isinstance(step, int)
            or not 0 <= start < step
        ):
            raise ValueError(
                f"TokenIterDataset can be sliced as worker w of K workers, slice(w, None, K) "
                f"with 0 <= w < K, not {sl}"
            )
        self._worker = (start, step)

    def __iter__(self) -> TokenDatasetIterator:
        return TokenDatasetIterator(self._stream())

    def __str__(self) -> str:
        worker, workers = self._worker
        return f"TokenIterDataset(rank={self._rank}/{self._world_size}, worker={worker}/{workers})"


# What a stream needs to walk an epoch that a single sample does not, or Grain does itself.
_STREAM_ONLY = (
    "batch_size",
    "shuffle",
    "epochs",
    "rank",
    "world_size",
    "drop_last",
    "permutation",
    "prefetch",
    "reuse_buffers",
)


def _without(signature: inspect.Signature, names: tuple[str, ...]) -> inspect.Signature:
    """``signature`` less the parameters ``names``."""
    kept = [p for p in signature.parameters.values() if p.name not in names]
    return signature.replace(parameters=kept)


class TokenMapDataset(grain.MapDataset):  # type: ignore[misc]  # grain is untyped
    """The samples of a token stream, unshuffled, as a Grain ``MapDataset``.

    Takes the arguments of :func:`tokstream.stream_token_source` but ``batch_size`` and what
    Grain does with its own operations (order, epochs, sharding: ``shuffle``, ``epochs``,
    ``rank``, ``world_size``, ``drop_last``, ``permutation``; and ``prefetch``,
    ``reuse_buffers``), which are a ``ValueError`` here. ``len(ds)`` is the samples of one
    epoch; ``ds[i]`` is sample ``i % len(ds)`` of the unshuffled stream (the ``i``-th row that
    ``stream_token_source(..., shuffle=False)`` yields), found in O(1) by moving the stream's
    cursor: ``(window, target)`` or, with ``extras``, a packed stream or a mixture, a dict of
    the row's arrays (``cu_seqlens`` and ``max_seqlen`` those of the row alone, which Grain's
    ``batch`` cannot stack). Each sample is fresh memory the caller owns.

    Use Grain for the rest: ``ds.shuffle(seed=0).repeat(epochs)``,
    ``ds[jax.process_index()::jax.process_count()]``, ``.batch(b)``.
    """

    def __init__(self, token_ids: Any, block: Any, **options: Any) -> None:
        super().__init__()
        refused = [name for name in _STREAM_ONLY if name in options]
        if refused:
            raise ValueError(
                f"TokenMapDataset takes no {', '.join(refused)}: it is the unshuffled samples "
                "of one epoch; shuffle, repeat, shard and batch them with Grain's own "
                "operations (ds.shuffle(seed), ds.repeat(epochs), ds[rank::world_size], "
                "ds.batch(batch_size)), or stream batches with TokenIterDataset"
            )
        self._arguments = (token_ids, block, options)
        self._cursor_stream: TokenStream | None = self._new_stream()
        self._length = self._cursor_stream.batches_per_epoch
        self._lock = threading.Lock()

    __init__.__signature__ = _without(  # type: ignore[attr-defined]
        stream_signature("self", "token_ids"), _STREAM_ONLY
    )

    def _new_stream(self) -> TokenStream:
        token_ids, block, options = self._arguments
        return stream_token_source(token_ids, block, 1, shuffle=False, **options)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise TypeError(f"index must be an int or a slice, got {type(index).__name__}")
        if not self._length:
            raise IndexError("TokenMapDataset has no samples")
        with self._lock:
            stream = self._cursor_stream
            if stream is None:  # unpickled (in a Grain worker): made on first use
                stream = self._cursor_stream = self._new_stream()
            stream.seek(int(index) % self._length)
            batch = next(stream)
        return _first_row(batch)

    def __getstate__(self) -> dict[str, Any]:
        # Workers receive a pickled copy: the stream (and its locks) stays behind.
        state = self.__dict__.copy()
        state["_cursor_stream"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __str__(self) -> str:
        return f"TokenMapDataset(samples={self._length})"


def _first_row(batch: Any) -> Sample:
    """The one row of a one-row batch, each array without its row axis."""
    if isinstance(batch, Mapping):
        return {
            name: value
            if name in ("cu_seqlens", "max_seqlen") or not isinstance(value, np.ndarray)
            else value[0]
            for name, value in batch.items()
        }
    windows, targets = batch
    return windows[0], targets[0]
