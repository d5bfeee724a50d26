"""What a batch holds: its buffers, which kernel fills them, and the document extras.

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
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeAlias

import numpy as np

from tokstream import _windows
from tokstream._kernels.documents import document_pieces, gather_documents
from tokstream._kernels.packed_copy import fill_packed
from tokstream._options import StreamOptions
from tokstream._packed import PackedMixtureSpace, PackedSpace
from tokstream._space import WindowSpace, cache_ahead, rows_ahead
from tokstream.shards.source import residency_of

#: A batch: ``(windows, targets)``, or with extras a dict of arrays (and ``"max_seqlen"``, an
#: int, beside ``"cu_seqlens"``).
Batch: TypeAlias = tuple[np.ndarray, np.ndarray] | dict[str, np.ndarray | int]

#: The pieces a row may have for ``"cu_seqlens"`` to be found in one pass (see assemble).
_PIECES_A_ROW = 4


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


class WindowFill:
    """Which kernel fills a batch's buffers with the windows of a :class:`WindowSpace`.

    A space of one segment in one shard maps window indices to first tokens in the gather
    itself; any other space has each window looked up (its address, one kernel call) and then
    copied from its address by one more call, whatever shards the windows lie in; a batch with
    document extras is copied by the document kernel, which also writes them. The kernels are
    taken specialised for the corpus dtype once, so no batch pays the fused-type dispatch.
    """

    #: Whether a call writes the batch's pieces (``cu_seqlens``) as it copies.
    finds_pieces = False

    def __init__(self, space: WindowSpace, options: StreamOptions) -> None:
        self.space = space
        self._block = space.block
        dtype = space.corpus.dtype
        key = kernel_key(dtype, options)
        self._gather_windows = _windows.gather_windows.__signatures__[key]
        self._gather_at = _windows.gather_at.__signatures__[key]
        self._gather_documents = gather_documents.__signatures__[key]
        # Selects the kernels' specialisation only; the windows are read from their addresses.
        self._anchor = np.empty(0, dtype)
        # Windows whose cache lines the kernels request ahead of the copy (0: none).
        self._cache_ahead = cache_ahead(space.block, dtype) if space.random_order else 0
        self._one_shard = space.one_shard
        self._refuse = _OutsideOutDtype(dtype, options.out_dtype)
        # Remote shards: each batch's windows are fetched into memory before a kernel reads them.
        self.residency = residency_of(space.corpus)
        self._window_bytes = (space.block + 1) * dtype.itemsize

    def __call__(
        self,
        windows_index: np.ndarray,
        windows: np.ndarray,
        next_tokens: np.ndarray | None = None,
        targets: np.ndarray | None = None,
        position_ids: np.ndarray | None = None,
        label_continues: np.ndarray | None = None,
        document_ids: np.ndarray | None = None,
        piece_starts: np.ndarray | None = None,
    ) -> tuple[int, int] | None:
        """Fill ``windows`` (and ``next_tokens`` or ``targets``) for global ``windows_index``.

        With ``position_ids``, ``label_continues`` or ``document_ids`` (any of them) also the
        rows' document positions, their loss mask or each token's piece within its row.
        ``piece_starts`` is not written: windows' pieces are read back from their position ids
        (:func:`assemble`), so None is returned (see :attr:`finds_pieces`).

        Raises ValueError when a buffer's shape is not the batch's (see :func:`check_shapes`).
        """
        check_shapes(
            windows_index.shape[0], self._block, windows, next_tokens, targets, position_ids,
            label_continues, document_ids,
        )  # fmt: skip
        documents = not (position_ids is None and label_continues is None and document_ids is None)
        if self._one_shard is not None and not documents:
            # One segment in one shard: the kernel maps indices to first tokens itself.
            shard, stride, base = self._one_shard
            with self._resident(windows_index):
                fitted = self._gather_windows(
                    shard, windows_index, windows, next_tokens, targets, self._cache_ahead, stride,
                    base,
                )  # fmt: skip
            if not fitted:
                raise self._refuse()
            return None
        starts, addresses, readable = self.space.locate(windows_index)
        # The addresses are valid until readable is released (shards read on demand).
        with readable, self._resident_at(addresses):
            if not documents:
                if not self._gather_at(
                    self._anchor, addresses, windows, next_tokens, targets, self._cache_ahead
                ):
                    raise self._refuse()
                return None
            document_starts, document_buckets, document_shift, eos, use_eos = self.space.documents
            fitted = self._gather_documents(
                self._anchor,
                addresses,
                starts,
                windows,
                next_tokens,
                targets,
                self._cache_ahead,
                document_starts,
                document_buckets,
                document_shift,
                eos,
                use_eos,
                position_ids,
                label_continues,
                document_ids,
                np.empty((windows_index.shape[0], 3), np.int64),
            )
        if not fitted:
            raise self._refuse()
        return None

    def _resident(self, windows_index: np.ndarray) -> AbstractContextManager[Any]:
        """Remote windows fetched and pinned in memory for the kernel call inside the block."""
        if self.residency is None:
            return nullcontext()
        return self.residency.ensure_windows(self.space, windows_index)

    def _resident_at(self, addresses: np.ndarray) -> AbstractContextManager[Any]:
        if self.residency is None:
            return nullcontext()
        return self.residency.ensure_at(addresses, self._window_bytes)


class PackedFill:
    """Which kernel fills a batch's buffers with the rows of a :class:`PackedSpace`: the
    packed-row kernel, once per run of rows of one group (the space checks each group's table
    of pieces before any of its rows is copied). The kernel knows each row's pieces, so it
    writes their starts (``cu_seqlens``) as it copies."""

    finds_pieces = True

    def __init__(self, space: PackedSpace | PackedMixtureSpace, options: StreamOptions) -> None:
        self.space = space
        self._block = space.block
        self._pad = space.pad
        dtype = space.corpus.dtype
        self._fill_packed = fill_packed.__signatures__[kernel_key(dtype, options)]
        # Selects the kernel's specialisation only; the pieces are read from their addresses.
        self._anchor = np.empty(0, dtype)
        self._refuse = _OutsideOutDtype(dtype, options.out_dtype)
        self.residency = residency_of(space.corpus)
        # Rows whose pieces the kernel requests ahead of the copy (0: none); unshuffled rows
        # read consecutive documents, which the hardware prefetcher streams.
        self._rows_ahead = rows_ahead(space.block, dtype) if options.shuffle else 0
        #: Room for this many pieces a row in a batch's ``piece_starts`` (see :func:`fill`):
        #: raised when a batch has more, so that rows of many short documents fill it in one pass.
        self.pieces_a_row = _PIECES_A_ROW

    def __call__(
        self,
        windows_index: np.ndarray,
        windows: np.ndarray,
        next_tokens: np.ndarray | None = None,
        targets: np.ndarray | None = None,
        position_ids: np.ndarray | None = None,
        label_continues: np.ndarray | None = None,
        document_ids: np.ndarray | None = None,
        piece_starts: np.ndarray | None = None,
    ) -> tuple[int, int]:
        """:meth:`WindowFill.__call__` for packed rows, whose labels are always ``targets``
        and whose loss mask is per label. Returns ``(pieces, longest)`` of the batch's input
        slots (each piece's, each row's padding), the first ``len(piece_starts)`` of their
        starts written into ``piece_starts`` as flat indices of the batch.

        The kernel checks every buffer's shape and every row against its table before it
        writes (a ValueError); most batches lie in the group the last one ended in, with its
        pieces in memory, and are one kernel call.
        """
        if next_tokens is not None or targets is None:
            raise ValueError("a packed batch's buffers are targets and a per-label loss mask")
        buffers = (self._pad, windows, targets, label_continues, position_ids, document_ids)
        current = self.space.current_group(windows_index) if self.residency is None else None
        if current is not None:
            low, (row_offsets, addresses, lengths) = current
            fitted, found, longest = self._fill_packed(
                self._anchor, addresses, lengths, row_offsets, windows_index, low, 0,
                self._block, *buffers, self._rows_ahead, piece_starts,
            )  # fmt: skip
            if not fitted:
                raise self._refuse()
            return found, longest
        found = longest = 0
        runs = self.space.row_runs(windows_index)
        for first, rows, (row_offsets, addresses, lengths), readable in runs:
            # Each run's pieces after the runs' before it (none written once it is full).
            starts = None if piece_starts is None else piece_starts[found:]
            # The pieces' addresses are valid until readable is released; remote pieces are
            # fetched and pinned in memory until the kernel call returns.
            with readable, self._resident(rows, row_offsets, addresses, lengths):
                fitted, pieces, most = self._fill_packed(
                    self._anchor, addresses, lengths, row_offsets, rows, 0, first, self._block,
                    *buffers, self._rows_ahead, starts,
                )  # fmt: skip
            if not fitted:
                raise self._refuse()
            found += pieces
            longest = max(longest, most)
        return found, longest

    def _resident(
        self, rows: np.ndarray, row_offsets: np.ndarray, addresses: np.ndarray, lengths: np.ndarray
    ) -> AbstractContextManager[Any]:
        if self.residency is None:
            return nullcontext()
        return self.residency.ensure_pieces(rows, row_offsets, addresses, lengths)


#: A batch's filler: the kernel calls for a window space or a packed one.
Fill: TypeAlias = WindowFill | PackedFill


def kernel_key(dtype: np.dtype, options: StreamOptions) -> str:
    """The key of a copy kernel's specialisation for tokens of ``dtype`` written in the
    stream's ``out_dtype`` (e.g. ``"uint16_t|int32_t"``), so no batch pays the fused-type
    dispatch."""
    return f"{dtype.name}_t|{options.out_dtype}_t"


class _OutsideOutDtype:
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


def filler(space: WindowSpace | PackedSpace | PackedMixtureSpace, options: StreamOptions) -> Fill:
    """The filler of a stream's batches over ``space``."""
    if isinstance(space, WindowSpace):
        return WindowFill(space, options)
    return PackedFill(space, options)


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


def fill(
    filling: Fill,
    windows_index: np.ndarray,
    buffers: dict[str, np.ndarray],
    cu_seqlens: bool = False,
) -> tuple[np.ndarray, int] | None:
    """Have the kernels copy windows ``windows_index`` (and their positions) into ``buffers``.

    With ``cu_seqlens``, a filler that finds the batch's pieces as it copies (packed rows)
    returns ``(cu_seqlens, max_seqlen)``; None when it does not, or found more than it had
    room for (:func:`assemble` then reads them from the position ids). The order's own
    extras (a mixture's ``"source"``) are the order's to fill.
    """
    labels, windows = buffers["labels"], buffers["input_ids"]
    next_tokens, targets = (labels, None) if labels.ndim == 1 else (None, labels)
    starts = None
    if cu_seqlens and filling.finds_pieces:
        starts = np.empty(windows.shape[0] * filling.pieces_a_row + 1, np.int32)
    found = filling(
        windows_index,
        windows,
        next_tokens,
        targets,
        buffers.get("position_ids"),
        buffers.get("label_continues"),
        buffers.get("document_ids"),
        None if starts is None else starts[:-1],
    )
    if "origin" in buffers:
        write_origins(filling.space, windows_index, buffers["origin"])
    if starts is None or found is None:
        return None
    pieces, longest = found
    if pieces >= starts.shape[0]:
        # Later batches get room for twice as many pieces a row as this one had.
        filling.pieces_a_row = 2 * -(-pieces // max(1, windows.shape[0]))
        return None
    starts[pieces] = windows.size
    return starts[: pieces + 1], longest


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
    positions = buffers.get("position_ids")
    if "position_ids" in extras:
        batch["position_ids"] = positions
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
        cu_seqlens = np.empty(positions.shape[0] * _PIECES_A_ROW + 1, np.int32)
        pieces, longest = document_pieces(positions, cu_seqlens[:-1])
        if pieces < cu_seqlens.size:
            cu_seqlens = cu_seqlens[: pieces + 1]
        else:
            cu_seqlens = np.empty(pieces + 1, np.int32)
            document_pieces(positions, cu_seqlens[:-1])
        cu_seqlens[-1] = positions.size
        batch["cu_seqlens"] = cu_seqlens
        batch["max_seqlen"] = longest
    return batch
