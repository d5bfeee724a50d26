"""What a batch holds: its buffers, the rules every fill's kernel call shares, the extras.

The fills themselves live beside their spaces in :mod:`tokstream.plan` (``WindowFill``,
``PackedFill``); here are the buffers they write, the checks and kernel specialisations they
share, and the batch the caller receives.

Without ``extras`` a batch is the tuple ``(windows, targets)``. With any extra it is a dict:
``"input_ids"`` (the windows), ``"labels"`` (the targets, as ``targets=`` says) and the extras
asked for, written by the document kernel in the gather's own loop (position ids and the loss
mask) or found from the position ids one read per piece (``cu_seqlens``; packed rows' copy
writes it as it goes):

- ``"position_ids"``, ``(b, block)`` int64: 0 at each row's first token and at every document
  start inside the row, else one more than the token before;
- ``"loss_mask"``, bool, shaped like ``"labels"``: False where the label belongs to another
  document than the token it is predicted from;
- ``"cu_seqlens"``, int32 ``(k + 1,)``: the boundaries of the document pieces of the flattened
  batch (every row start is one), from 0 to ``b * block``, with ``"max_seqlen"`` (a Python int),
  flash-attention's varlen interface;
- ``"source"``, ``(b,)`` int64: each row's source in a :func:`tokstream.mix` mixture (its index
  in the dict of sources), written by the mixture's order;
- ``"instance_mask"``, ``(b,)`` bool, with ``instance_filter=``: False for a row the repetition
  filter dropped (its loss mask then all False; :mod:`tokstream._repetition`);
- ``"origin"``, ``(b, 2)`` int64: each row's shard (its index in ``corpus.shards``; a mixture's
  shards are its sources' in order) and the offset of the row's first token in that shard (a
  packed row: its first piece's; a row of padding only: ``(-1, -1)``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import numpy as np

from tokstream._kernels.documents import document_pieces
from tokstream._options import StreamOptions

#: A batch: ``(windows, targets)``, or with extras a dict of arrays (and ``"max_seqlen"``, an
#: int, beside ``"cu_seqlens"``).
Batch: TypeAlias = tuple[np.ndarray, np.ndarray] | dict[str, np.ndarray | int]

#: The kernel requests about this many bytes of window data into the cache ahead of the window
#: it copies, and at most this many windows ahead (see :func:`cache_ahead`).
CACHE_AHEAD_BYTES = 2048
CACHE_AHEAD_MAX_WINDOWS = 32

#: A compiled kernel: a fused function, specialised once per stream (:func:`specialised`).
KernelT = TypeVar("KernelT", bound=Callable[..., Any])

#: The pieces a row may have for ``"cu_seqlens"`` to be found in one pass (see assemble).
PIECES_A_ROW = 4


def new_buffers(options: StreamOptions, rows: int) -> dict[str, np.ndarray]:
    """Uninitialised buffers for a batch of ``rows`` windows."""
    block, out = options.block, np.dtype(options.out_dtype)
    buffers = {
        "input_ids": np.empty((rows, block), out),
        "labels": np.empty((rows,) if options.targets == "next" else (rows, block), out),
    }
    if {"position_ids", "cu_seqlens"}.intersection(options.extras):
        # cu_seqlens is read from the position ids.
        buffers["position_ids"] = np.empty((rows, block), out)
    if "loss_mask" in options.extras:
        # Filled by the document kernel: one flag per label.
        width = 1 if options.targets == "next" else block
        buffers["label_continues"] = np.empty((rows, width), np.uint8)
    if "document_ids" in options.extras:
        buffers["document_ids"] = np.empty((rows, block), np.int32)
    if "source" in options.extras:
        buffers["source"] = np.empty(rows, np.int64)
    if "origin" in options.extras:
        buffers["origin"] = np.empty((rows, 2), np.int64)
    if options.instance_filter is not None:
        buffers["instance_mask"] = np.empty(rows, np.bool_)
    return buffers


#: Whether a reference count proves that nothing else holds an array: not in free-threaded
#: builds, where another thread's references may be counted late.
_REFCOUNTS_PROVE_FREE = getattr(sys, "_is_gil_enabled", lambda: True)()


class BufferPool:
    """Buffers for fresh batches, taken back once the caller holds nothing of them.

    A fresh batch is memory the caller owns. Allocated anew for every batch, buffers of a few
    hundred KiB can come back from the C allocator as pages it has just returned to the
    system, each of which faults again when the kernel writes it: in a plain loop over a
    corpus of documents, 3.5x the batch time (docs/memory.md). The pool keeps up to
    ``capacity`` sets of buffers and hands out views of a set whose arrays nothing but the pool
    references: no view, tensor or buffer export of the caller's points into it, so no batch
    the caller can still read is ever written again. The caller's views are its own to
    reshape; the kernels check every buffer's shape before they write (a set changed through
    ``.base`` is refused there). Free-threaded builds, where a reference count proves
    nothing, always allocate.
    """

    def __init__(self, options: StreamOptions, rows: int, capacity: int) -> None:
        self._options = options
        self._rows = rows
        self._capacity = capacity if _REFCOUNTS_PROVE_FREE else 0
        # The buffers' names, in the order of take()'s views (known once one set is made).
        self._names: tuple[str, ...] = ()
        self._sets: list[tuple[np.ndarray, ...]] = []
        # The count of an array only a set holds, taken as take() takes it (what a call's
        # argument adds to a count differs between Python versions).
        for array in (np.empty(1),):
            self._free = sys.getrefcount(array)

    def take_named(self, count: int) -> dict[str, np.ndarray]:
        """:meth:`take`, by buffer name (see :func:`new_buffers`)."""
        views = self.take(count)
        return dict(zip(self._names, views, strict=True))

    def take(self, count: int) -> tuple[np.ndarray, ...]:
        """Views of the first ``count`` rows of a set the caller holds nothing of, in the order
        of :func:`new_buffers`."""
        free = self._free
        for arrays in self._sets:
            for array in arrays:
                if sys.getrefcount(array) > free:
                    break
            else:
                return tuple([array[:count] for array in arrays])
        buffers = new_buffers(self._options, self._rows)
        self._names, arrays = tuple(buffers), tuple(buffers.values())
        if len(self._sets) < self._capacity:
            self._sets.append(arrays)
        return tuple([array[:count] for array in arrays])

    def clear(self) -> None:
        """Forget every set (the caller's views keep theirs alive)."""
        self._sets.clear()


def rows_of(buffers: dict[str, np.ndarray], count: int) -> dict[str, np.ndarray]:
    """The first ``count`` rows of every buffer (views)."""
    return {name: buffer[:count] for name, buffer in buffers.items()}


def cache_ahead(block: int, dtype: np.dtype) -> int:
    """How many windows ahead of the one it copies the kernel requests into the cache (a
    software prefetch), for a random order.

    Found by sweeping distances 0-64 over block 8-3072, int64 and uint16 corpora in and beyond
    the last-level cache (``test_prefetch_sweep`` in ``benchmarks/test_gather.py``): the best
    distance keeps about ``CACHE_AHEAD_BYTES`` (32 cache lines) of window data in flight, e.g.
    28 windows of 8 int64 tokens, 7 of 128 uint16 tokens, one of 1024 uint16 tokens or of 128
    int64 tokens. Windows longer than 33 cache lines (a 2 KiB window) are better off without:
    the hardware prefetcher streams each after its first lines, and the extra instructions cost
    up to 3x. The same rule holds for windows of the output dtype, which are copied by
    ``memcpy``: a stream of int64 windows of 129 tokens with shifted targets (two copies a
    window) ran 1.4-1.6x faster with one or two windows requested ahead than with none.
    """
    window_bytes = (block + 1) * dtype.itemsize
    if window_bytes > 33 * 64:
        return 0
    return max(1, min(CACHE_AHEAD_MAX_WINDOWS, CACHE_AHEAD_BYTES // window_bytes))


def rows_ahead(block: int, dtype: np.dtype) -> int:
    """How many packed rows ahead of the one it fills the packed-row kernel requests the pieces
    of into the cache, for shuffled packing (pieces of random documents, each a cache miss).

    About twice :data:`CACHE_AHEAD_BYTES` of rows (``block + 1`` slots of ``dtype`` tokens),
    none for rows longer than that, which the hardware prefetcher streams: a row of 129 int64
    tokens 3 ahead, of 1025 uint16 tokens one, of 1025 int64 tokens none. Measured on the
    documents corpus of ``benchmarks/test_out_dtype.py`` (load ~10): the kernel's time at block 128
    fell by a third with 2-4 rows ahead, at block 1024 it did not change.
    """
    row_bytes = (block + 1) * dtype.itemsize
    if row_bytes > 2 * CACHE_AHEAD_BYTES:
        return 0
    return max(1, min(CACHE_AHEAD_MAX_WINDOWS, 2 * CACHE_AHEAD_BYTES // row_bytes))


def specialised(kernel: KernelT, key: str) -> KernelT:
    """``kernel``'s specialisation ``key`` (see :func:`kernel_key`): a Cython fused function's
    entry in ``__signatures__``, called without the fused-type dispatch."""
    # Cython sets __signatures__ on fused functions; the .pyi stubs type only the call.
    signatures: dict[str, KernelT] = kernel.__signatures__  # type: ignore[attr-defined]
    return signatures[key]


def kernel_key(dtype: np.dtype, options: StreamOptions) -> str:
    """The key of a copy kernel's specialisation for tokens of ``dtype`` written in the
    stream's ``out_dtype`` (e.g. ``"uint16_t|int32_t"``), so no batch pays the fused-type
    dispatch."""
    return f"{dtype.name}_t|{options.out_dtype}_t"


class OutsideOutDtype:
    """The error of a batch holding a token its ``out_dtype`` cannot hold.

    Only ``out_dtype="int32"`` over uint32, int64 or uint64 tokens can meet one: those corpora
    are not scanned up front (a memory-mapped corpus of 10**10 tokens would take minutes), so
    each copy checks the tokens it writes, and a batch with a token outside int32 is refused
    whole, before the cursor moves; the stream stays where it was.
    """

    def __init__(self, dtype: np.dtype, output: str) -> None:
        self._message = (
            f"a token of this batch does not fit out_dtype={output!r} (the corpus holds "
            f"{dtype.name} tokens; int32 holds ids in [-2**31, 2**31 - 1]): use "
            "out_dtype='int64'; the stream has not moved"
        )

    def __call__(self) -> ValueError:
        return ValueError(self._message)


def check_shapes(
    rows: int,
    block: int,
    windows: np.ndarray,
    next_tokens: np.ndarray | None,
    targets: np.ndarray | None,
    position_ids: np.ndarray | None,
    label_continues: np.ndarray | None,
    document_ids: np.ndarray | None,
) -> None:
    """Raise ValueError unless every buffer given is the shape of a batch of ``rows`` windows.

    The kernels take their row count and width from the buffers, and a caller can reshape an
    array it was handed (``x.shape = ...``) in place, which must never make them write past
    its end. (The packed-row kernel checks its buffers itself.)
    """
    wide = (rows, block)
    if (
        windows.shape != wide
        or (next_tokens is not None and next_tokens.shape != (rows,))
        or (targets is not None and targets.shape != wide)
        or (position_ids is not None and position_ids.shape != wide)
        or (label_continues is not None and label_continues.shape not in (wide, (rows, 1)))
        or (document_ids is not None and document_ids.shape != wide)
    ):
        raise ValueError(
            f"a batch buffer is not {wide} (windows {windows.shape}): reshaped in place?"
        )


def kernel_buffers(
    buffers: dict[str, np.ndarray],
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray | None,
           np.ndarray | None]:  # fmt: skip
    """A batch's named ``buffers`` as a fill's arguments: ``(windows, next_tokens, targets,
    position_ids, label_continues, document_ids)``, those the batch does not have None."""
    labels = buffers["labels"]
    next_tokens, targets = (labels, None) if labels.ndim == 1 else (None, labels)
    return (
        buffers["input_ids"],
        next_tokens,
        targets,
        buffers.get("position_ids"),
        buffers.get("label_continues"),
        buffers.get("document_ids"),
    )


def write_origins(space: Any, windows_index: np.ndarray, out: np.ndarray) -> None:
    """The ``"origin"`` extra: ``(shard, first token in the shard)`` of each row into ``out``.

    ``space`` is the stream's window space; its ``token_starts`` gives each row's first token in
    the shards laid end to end (-1 for a row without one).
    """
    starts = space.token_starts(windows_index)
    shard_starts = space.corpus.shard_starts
    # The last shard starting at or before the token: an empty shard before it starts there too.
    shard = np.searchsorted(shard_starts, starts, side="right") - 1
    out[:, 0] = shard
    np.subtract(starts, shard_starts[shard], out=out[:, 1])
    out[starts < 0] = -1


def assemble(
    buffers: dict[str, np.ndarray],
    extras: tuple[str, ...],
    pieces: tuple[np.ndarray, int] | None = None,
    labels_ignore_index: int | None = None,
) -> Batch:
    """The batch the caller receives from filled ``buffers``; ``pieces`` its ``(cu_seqlens,
    max_seqlen)`` when the filler found them (see :func:`fill`). With ``labels_ignore_index``
    the labels hold it wherever the loss mask is False (Hugging Face's -100)."""
    if not extras:
        return buffers["input_ids"], buffers["labels"]
    batch: dict[str, np.ndarray | int] = {
        "input_ids": buffers["input_ids"],
        "labels": buffers["labels"],
    }
    if "source" in extras:
        batch["source"] = buffers["source"]
    if "origin" in extras:
        batch["origin"] = buffers["origin"]
    if "instance_mask" in buffers:
        batch["instance_mask"] = buffers["instance_mask"]
    if "document_ids" in extras:
        batch["document_ids"] = buffers["document_ids"]
    if "position_ids" in extras:
        batch["position_ids"] = buffers["position_ids"]
    if "loss_mask" in extras:
        continues = buffers["label_continues"].view(np.bool_)
        loss_mask = continues[:, 0] if buffers["labels"].ndim == 1 else continues
        batch["loss_mask"] = loss_mask
        if labels_ignore_index is not None:
            np.copyto(buffers["labels"], labels_ignore_index, where=~loss_mask)
    if "cu_seqlens" in extras and pieces is not None:
        batch["cu_seqlens"], batch["max_seqlen"] = pieces
    elif "cu_seqlens" in extras:
        # One pass while the batch has at most a few pieces a row (the common case); else a
        # second, into an array of the size the first one counted.
        positions = buffers["position_ids"]
        cu_seqlens = np.empty(positions.shape[0] * PIECES_A_ROW + 1, np.int32)
        count, longest = document_pieces(positions, cu_seqlens[:-1])
        if count < cu_seqlens.size:
            cu_seqlens = cu_seqlens[: count + 1]
        else:
            cu_seqlens = np.empty(count + 1, np.int32)
            document_pieces(positions, cu_seqlens[:-1])
        cu_seqlens[-1] = positions.size
        batch["cu_seqlens"] = cu_seqlens
        batch["max_seqlen"] = longest
    return batch
