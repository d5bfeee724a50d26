"""The stream: batches of windows, their buffers, the prefetch glue, and the resumable cursor.

A :class:`TokenStream` walks a :class:`~tokstream._state.Cursor` through the batches its
:class:`~tokstream._order.WindowOrder` lays out and has the compiled kernel copy each batch's
windows out of the corpus. With the default arguments it yields exactly the reference
generator's batches (:func:`tokstream.reference.stream_token_source`): per shuffled epoch one
``RandomState(seed).permutation(n)`` drawn from a single generator, batches of ``batch_size``
windows in that order, the last one partial. :mod:`tokstream._order` describes the order, the
ranks' shares and the epoch tail.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from tokstream import _batch, _loss_masks, _state, _validate
from tokstream._batch import Batch
from tokstream._options import StreamOptions, expose_options, stream_signature
from tokstream._order import warn_if_slow_draw
from tokstream._packed import PackedMixtureSpace, PackedSpace, packed_parts
from tokstream._prefetch import Prefetcher
from tokstream._readahead import read_ahead
from tokstream._repetition import filter_rows
from tokstream._space import WindowSpace, window_space
from tokstream._state import Cursor
from tokstream.corpus import Corpus
from tokstream.mixture import Mixture, window_order


@expose_options
class TokenStream(Iterator[Batch]):
    """An iterator of ``(windows, targets)`` micro-batches with a resumable cursor.

    Takes the arguments of :func:`stream_token_source`, which documents them. Each batch is
    fresh memory the caller owns: ``windows`` is a C-contiguous, writeable ``(b, block)`` array
    of ``out_dtype`` and the targets are ``(b,)`` next tokens (``targets="next"``) or the ``(b,
    block)`` windows shifted by one token (``targets="shifted"``), of the same dtype. No later
    batch writes into it while anything of the caller's refers to it; once the caller holds
    nothing of it, its buffers serve a later batch (``tokstream._batch.BufferPool``).

    With ``reuse_buffers=k`` the stream instead cycles through preallocated batches: a batch
    stays intact until the caller has received ``k`` more, then its arrays are overwritten, so a
    caller that keeps a batch longer copies it. With ``prefetch=p`` a background thread
    assembles up to ``p`` batches ahead (the kernel runs without the GIL); :meth:`state_dict`
    still reports the batches delivered, not the ones assembled, and :meth:`close` (or dropping
    the stream) stops the thread. A ``KeyboardInterrupt`` anywhere in ``next()``, ``close()`` or
    :meth:`load_state_dict` leaves no thread running unseen and no batch skipped by it, and a
    child process forked while the thread runs continues the stream with a thread of its own.

    One stream may be shared between threads: each ``next()`` is atomic, so the threads receive
    disjoint batches of the one sequence (in an order that depends on scheduling).

    The options and sizes are read-only attributes (``stream.block``, ``stream.num_windows``,
    ...): they are what the kernel's buffers were sized for.
    """

    def __init__(self, token_ids: Any, block: Any, batch_size: Any, **options: Any) -> None:
        self._setup(*stream_source(token_ids, block, batch_size, **options))

    __init__.__signature__ = stream_signature("self", "token_ids")  # type: ignore[attr-defined]

    @classmethod
    def _over(cls, source: Corpus | Mixture, options: StreamOptions) -> TokenStream:
        """A stream over an already validated corpus (or mixture) and options."""
        stream = cls.__new__(cls)
        stream._setup(source, options)
        return stream

    def _setup(self, source: Corpus | Mixture, options: StreamOptions) -> None:
        corpus = source.corpus if isinstance(source, Mixture) else source
        self._corpus = corpus
        self._options = options
        packed = options.windows == "packed"
        self._space: WindowSpace | PackedSpace | PackedMixtureSpace
        if packed:
            self._space, self._order = packed_parts(source, options)
        else:
            self._space = window_space(corpus, options)
            self._order = window_order(source, self._space, options)
        self._fill = _batch.filler(self._space, options)
        # The corpus's recorded loss masks, copied by a fill of their own beside the batch's.
        self._mask_fill = _loss_masks.mask_fill(source, options)
        corpus.advise(options.shuffle)
        self._readahead = read_ahead(self._order, self._space, options, self._fill.residency)
        self._lock = threading.Lock()
        self._closed = False
        self._cursor = self._order.first_cursor()
        self._ring: list[dict[str, np.ndarray]] = []
        self._ring_next = self._ring_after = 0
        # Fresh batches: a batch held by the caller, or waiting in the prefetch queue, or being
        # made, keeps its set; the rest are taken back.
        self._fresh = _batch.BufferPool(options, self._order.max_rows, options.prefetch + 2)
        self._prefetcher: Prefetcher | None = None
        self._deliver_lock = threading.Lock()
        # The cursor and ring position after the last batch handed out, while a prefetch thread
        # runs ahead of them; None when the live ones are the delivered ones.
        self._delivered: tuple[Cursor, int] | None = None
        # (a loaded cursor, the next epoch's it moved to) when the loaded one had no batch left
        # under this shape: state_dict() reports the loaded one until a batch is handed out.
        self._moved: tuple[Cursor, Cursor] | None = None
        # Rows handed out and rows of them the repetition filter dropped (see stats()).
        self._delivered_rows = self._filtered_rows = 0

    # ------------------------------------------------------------------ read-only attributes

    @property
    def options(self) -> StreamOptions:
        """The validated options (frozen)."""
        return self._options

    @property
    def corpus(self) -> Corpus:
        return self._corpus

    @property
    def num_windows(self) -> int:
        """Windows in the corpus for this ``block``: the size of an epoch's order."""
        return self._order.num_windows

    @property
    def positions_per_epoch(self) -> int:
        """Order positions streamed per epoch, all ranks together."""
        return self._order.positions_per_epoch

    @property
    def batches_per_epoch(self) -> int:
        """Batches per epoch on each rank."""
        return self._order.batches_per_epoch

    @property
    def global_batch_size(self) -> int:
        return self._options.global_batch_size

    def __len__(self) -> int:
        """Batches of the whole run on this rank, from the first epoch to the last."""
        return self._options.epochs * self.batches_per_epoch

    def __length_hint__(self) -> int:
        """Batches still to come from the current cursor."""
        epoch, position, _ = self._delivered_cursor()
        if self._closed or epoch >= self._options.epochs:
            return 0
        later_epochs = (self._options.epochs - epoch - 1) * self.batches_per_epoch
        return later_epochs + self._order.batches_from(position)

    def _delivered_cursor(self) -> Cursor:
        """The cursor after the last batch the caller received."""
        return self._cursor if self._delivered is None else self._delivered[0]

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> Batch:
        if not self._options.prefetch:
            with self._lock:
                return self._count(self._produce())
        with self._deliver_lock:
            if self._closed:
                raise StopIteration
            prefetcher = self._prefetcher
            if prefetcher is not None and not prefetcher.usable:
                # Stopped by an interrupted start, close() or load_state_dict(), or left
                # without its thread by a fork: its batches were never handed out.
                self._discard_prefetcher()
                prefetcher = None
            if prefetcher is None:
                self._delivered = (self._cursor, self._ring_next)
                prefetcher = self._prefetcher = Prefetcher(
                    self,
                    TokenStream._produce_ahead,
                    self._options.prefetch,
                    on_fork=TokenStream._after_fork,
                )
            batch, self._delivered = prefetcher.get()
            return self._count(batch)

    def _count(self, batch: Batch) -> Batch:
        """Count a batch handed out (and the rows the repetition filter dropped of it)."""
        if isinstance(batch, dict):
            inputs, kept = batch["input_ids"], batch.get("instance_mask")
            if isinstance(kept, np.ndarray):
                self._filtered_rows += kept.shape[0] - int(np.count_nonzero(kept))
        else:
            inputs = batch[0]
        assert isinstance(inputs, np.ndarray)
        self._delivered_rows += inputs.shape[0]
        return batch

    def stats(self) -> dict[str, int]:
        """What this stream object has handed out: ``{"samples": rows, "filtered": rows the
        repetition filter dropped}`` (``instance_filter=``; 0 without it), counted since it was
        made (a loaded state or a seek does not reset them; batches assembled ahead by a
        prefetch thread count once handed out)."""
        return {"samples": self._delivered_rows, "filtered": self._filtered_rows}

    def _produce_ahead(self, prefetcher: Prefetcher) -> tuple[Batch, tuple[Cursor, int]]:
        with self._lock:
            if prefetcher.stopped:  # checked under the lock: _discard_prefetcher rewinds under it
                raise StopIteration
            batch = self._produce()
            return batch, (self._cursor, self._ring_next)

    def _discard_prefetcher(self) -> None:
        """Stop the prefetch thread and move the live cursor back to the delivered one.

        The caller holds ``_deliver_lock``. Safe to interrupt and to call again: once the
        thread is asked to stop it assembles nothing more, and the rewind is one assignment.
        """
        prefetcher = self._prefetcher
        if prefetcher is None:
            return
        prefetcher.stop()
        with self._lock:  # waits out a batch being assembled; none begins after stop()
            if self._delivered is not None:
                (self._cursor, self._ring_next), self._delivered = self._delivered, None
            self._prefetcher = None
        prefetcher.close()

    def _after_fork(self) -> None:
        # In a child forked while the prefetch thread ran: that thread is gone and may have
        # held these locks, which would then never be released.
        self._lock = threading.Lock()
        self._deliver_lock = threading.Lock()

    def _produce(self) -> Batch:
        """Assemble the batch at the live cursor and advance it; the caller holds the lock."""
        cursor, options, order = self._cursor, self._options, self._order
        if self._closed or cursor.epoch >= options.epochs or order.batches_per_epoch == 0:
            raise StopIteration
        count = order.rows_at(cursor)
        if self._readahead is None:
            windows_index = order.batch_windows(cursor, count)
        else:
            windows_index = self._readahead.batch_windows(cursor, count)
        if options.extras:
            buffers = (
                _batch.rows_of(self._ring_slot(), count)
                if options.reuse_buffers
                else self._fresh.take_named(count)
            )
            pieces = _batch.fill(self._fill, windows_index, buffers, "cu_seqlens" in options.extras)
            if self._mask_fill is not None:
                _loss_masks.apply(self._mask_fill, windows_index, buffers)
            order.fill_extras(windows_index, buffers)
            if options.instance_filter is not None:
                filter_rows(
                    options.instance_filter,
                    buffers["input_ids"],
                    buffers["labels"],
                    buffers["label_continues"],
                    options.windows == "packed",
                    buffers["instance_mask"],
                )
            batch = _batch.assemble(buffers, options.extras, pieces, options.labels_ignore_index)
        else:
            # The plain batch, without the buffer bookkeeping (the fixed cost small batches feel).
            if options.reuse_buffers:
                # Views: a caller reshaping what it was handed leaves the ring's arrays be.
                slot = self._ring_slot()
                windows, labels = slot["input_ids"][:count], slot["labels"][:count]
            else:
                windows, labels = self._fresh.take(count)
            if options.targets == "next":
                self._fill(windows_index, windows, labels)
            else:
                self._fill(windows_index, windows, None, labels)
            batch = windows, labels
        # One assignment once the batch is made: an interrupt or a refused batch moves neither.
        self._cursor, self._ring_next = order.after(cursor), self._ring_after
        if self._cursor.epoch >= options.epochs and self._fill.residency is not None:
            # The run's last batch: its fetch thread and connections end now, not at close()
            # (a seek or a loaded state starts them again).
            self._fill.residency.close()
        return batch

    def _ring_slot(self) -> dict[str, np.ndarray]:
        """The next buffers of the ring (``options.ring_size`` of them), allocated on first use.

        Growing the ring as batches are made, rather than allocating all of it up front, keeps a
        large ``reuse_buffers`` (or a stream that yields nothing) from allocating buffers no batch
        will ever fill: ``reuse_buffers=2**40`` would otherwise never finish being made. The ring
        position is rewound with the cursor when prefetched batches are discarded.
        """
        index = self._ring_next
        if index == len(self._ring):
            self._ring.append(_batch.new_buffers(self._options, self._order.max_rows))
        self._ring_after = (index + 1) % self._options.ring_size
        return self._ring[index]

    def close(self) -> None:
        """Stop the stream: every later ``next()`` raises StopIteration, as a closed generator.

        The epoch's order is freed; :meth:`state_dict` still reports where the stream stopped.
        """
        with self._deliver_lock:
            with self._lock:
                self._closed = True  # first: an interrupt below still leaves it closed
            self._discard_prefetcher()
            with self._lock:
                self._drop_caches()

    def _drop_caches(self) -> None:
        """Free the epoch's order, the fresh buffers and the read-ahead plan (under the lock)."""
        self._order.release()
        self._fresh.clear()
        if self._fill.residency is not None:  # no fetch in flight, no thread, no connection
            self._fill.residency.close()
        if self._readahead is not None:
            self._readahead.reset()

    def __repr__(self) -> str:
        o, cursor = self._options, self._cursor
        return (
            f"TokenStream(block={o.block}, batch_size={o.batch_size}, epochs={o.epochs}, "
            f"shuffle={o.shuffle}, rank={o.rank}/{o.world_size}, "
            f"epoch={cursor.epoch}, position={cursor.position}, windows={self.num_windows})"
        )

    # ------------------------------------------------------------------ resumable cursor

    @functools.cached_property
    def _fingerprint(self) -> dict[str, Any]:
        # Made on first use: within documents it hashes O(documents) arrays, a cost a stream
        # that never saves or loads a state should not pay.
        return {
            **_state.fingerprint(self._corpus, self._options, self._space),
            **self._order.fingerprint(),
        }

    def state_dict(self) -> dict[str, Any]:
        """The cursor as a small JSON-serialisable dict (about 5 KB, no corpus data).

        A fingerprint of everything that decides the global window sequence, the epoch and the
        order position (all ranks together), and the epoch's ``RandomState`` for a materialized
        shuffle (:mod:`tokstream._state`). Loading it into a stream built with the same
        arguments continues exactly where this one stands; into one of any other
        ``world_size`` and ``batch_size`` (a batch-size ramp, a smaller or larger job), the
        ranks continue from the first order position not yet consumed, the global sequence
        unchanged (:mod:`tokstream._order`). ``epochs`` and ``targets`` are not part of it, so
        a finished run can be extended. A loaded state with no batch left under this shape is
        reported as loaded until a batch is handed out, so saving it again loses no position.
        """
        with self._lock:
            cursor = self._delivered_cursor()
            if self._moved is not None and cursor is self._moved[1]:
                cursor = self._moved[0]
            return _state.encode(cursor, dict(self._fingerprint), self._options)

    def seek(self, step: Any) -> None:
        """Move the cursor to the start of this rank's step ``step`` (0-based from the run's start).

        The next batch is the one the stream yields as its ``step``-th from the start, found
        without making the batches before it: O(1) arithmetic on the cursor, for every window
        policy and permutation but one: a drawn (``permutation="materialized"``) order needs
        the generator at the start of the target epoch, so each epoch between the cursor's and
        the target's (or, seeking back, from the first) has its order drawn once. A step at or
        past ``len(stream)`` leaves nothing to yield. Skipping the batches after a loss spike is
        ``stream.seek(step + k)``. Like :meth:`load_state_dict`, it stops a prefetch thread and
        reopens a closed stream; steps are counted in this stream's shape (a stream resumed from
        another shape counts from the start as if it had had this one).

        Raises
        ------
        TypeError
            ``step`` is not an int.
        ValueError
            ``step`` is negative.
        """
        step = _validate.nonnegative_int(step, "step")
        per_epoch = self.batches_per_epoch
        last = self._options.epochs * per_epoch
        epoch, batch = divmod(min(step, last), per_epoch) if per_epoch else (0, 0)
        with self._deliver_lock:
            self._discard_prefetcher()
            with self._lock:
                known = self._cursor
                cursor = self._order.cursor_at(epoch, batch * self.global_batch_size, known)
                self._drop_caches()
                self._cursor, self._closed, self._delivered = cursor, False, None

    def load_state_dict(self, state: Any) -> None:
        """Move the cursor to ``state`` (from :meth:`state_dict`); the next batch follows it.

        A closed stream is reopened. Everything is checked before anything about the stream
        changes, so a rejected state leaves the stream exactly as it was.

        Raises
        ------
        ValueError
            The state was saved by a stream of another configuration (the message names the
            first setting that differs), or a field holds an impossible value.
        TypeError
            The state, or one of its fields, is the wrong kind of thing.
        """
        cursor = _state.decode(
            state,
            self._fingerprint,
            self._options,
            self._order.num_windows,
            self._order.draws_orders,
        )
        with self._deliver_lock:
            self._discard_prefetcher()
            with self._lock:
                self._drop_caches()
                self._moved = None
                if not self._order.rows_at(cursor) and self.batches_per_epoch:
                    # No batch left at the saved position under this stream's tail rule (the
                    # end of an epoch, another shape): the run continues with the next epoch.
                    self._moved = cursor, self._order.next_epoch(cursor)
                    cursor = self._moved[1]
                self._cursor, self._closed, self._delivered = cursor, False, None


def stream_source(
    token_ids: Any, block: Any, batch_size: Any, **options: Any
) -> tuple[Corpus | Mixture, StreamOptions]:
    """The token source of a stream call and its validated options.

    A :func:`tokstream.mix` mixture is its own source; anything else becomes a
    :class:`~tokstream.Corpus` (checked first, as the reference generator checks its array
    first). The options are checked against the source: its token dtype (``eos``) and whether
    it is a mixture (``samples``, the ``"source"`` extra, the implicit order).
    """
    if isinstance(token_ids, Mixture):
        source: Corpus | Mixture = token_ids
        corpus, mixture = token_ids.corpus, True
    else:
        source = corpus = Corpus.from_tokens(token_ids)
        mixture = False
    stream_options = StreamOptions.create(
        block,
        batch_size,
        mixture=mixture,
        token_dtype=corpus.dtype,
        reference_input=not isinstance(token_ids, (Corpus, Mixture)),
        **options,
    )
    if (
        options.get("permutation") is None
        and stream_options.shuffle
        and stream_options.permutation == "materialized"
    ):
        # The drawn order chosen by default: the caller who did not ask for it is told when it
        # takes seconds to draw (one who asked for it, as the benchmark does, knows).
        warn_if_slow_draw(corpus.num_windows(stream_options.block))
    return source, stream_options


def stream_token_source(token_ids: Any, block: int, batch_size: int, **options: Any) -> TokenStream:
    """Stream ``(windows, targets)`` micro-batches out of a token array, never stacking windows.

    Parameters
    ----------
    token_ids
        A 1-D integer array (read in place, in its own dtype, when C-contiguous), an exact-integer
        float array or sequence (converted once to int64), a :class:`tokstream.Corpus`, or a
        :func:`tokstream.mix` mixture.
    block
        Context length: each window holds ``block`` tokens, followed by its target.
    batch_size
        Windows per batch on this rank; the last batch of an epoch may be smaller.
    epochs
        Passes over the corpus; 0 yields nothing.
    shuffle
        Random window order per epoch (True) or corpus order (False).
    seed
        Seed of the epoch orders, in ``[0, 2**32)``.
    targets
        ``"next"`` yields the ``(b,)`` next tokens, as the reference generator does;
        ``"shifted"`` yields the ``(b, block)`` windows shifted by one token, as language-model
        training uses.
    rank, world_size
        This process' share of each epoch (see the module docstring).
    drop_last
        Drop each epoch's final partial batch.
    permutation
        ``"materialized"``: the reference's ``RandomState`` permutation (exact parity; one
        O(windows) int64 array per epoch). ``"implicit"``: a keyed pseudo-random bijection
        evaluated per position, no O(windows) memory; a different order from the reference's.
        ``None`` (default): materialized for an array or sequence (what the reference takes)
        in the reference's windows (``stride=1``, ``windows="cross"``, no ``eos``), implicit
        otherwise (a :class:`~tokstream.Corpus`, e.g. from :func:`~tokstream.open_tokens`, or
        a mixture). A materialized order of ``2**22`` windows or more that ``None`` chose warns
        when the stream is made: it takes about a second or more to draw, every epoch (asked
        for by name, it does not).
    prefetch
        Batches a background thread assembles ahead of the caller (0: none, the default).
    reuse_buffers
        0 (default): every batch is fresh memory the caller owns. ``k >= 1``: the stream
        cycles through preallocated batches, and a batch stays intact until the caller has
        received ``k`` more (saves the page faults of a fresh multi-MB buffer per batch). With
        ``prefetch=p`` that takes ``k + p + 1`` buffers, since up to ``p + 1`` batches are
        assembled ahead of the caller.
    stride
        Window starts ``0, stride, 2 * stride, ...`` in each shard (or document) while
        ``start + block < len``. ``stride=block`` gives non-overlapping samples of ``block + 1``
        tokens that share one boundary token, so each token is a target once per epoch.
    eos
        A token id that ends a document (the token itself is the document's last).
    windows
        ``"cross"`` (default): windows may span documents. ``"within"``: only windows whose
        ``block + 1`` tokens lie inside one document, at ``document_start + k * stride``:
        shorter documents are dropped (``Corpus.tokens_in_windows`` counts the tokens kept).
    extras
        ``"position_ids"``, ``"loss_mask"``, ``"cu_seqlens"``, ``"document_ids"`` (each token's
        piece within its row), ``"origin"`` (each row's shard and first token in it), ``"source"``
        (a mixture's): each batch is a dict of ``"input_ids"``, ``"labels"`` and these.
    samples
        A mixture's samples per epoch (default: its sources' windows together).
    out_dtype
        ``"int64"`` (default) or ``"int32"``: the dtype of windows, targets and position ids,
        written by the copy itself; a batch holding a token int32 cannot hold raises ValueError.
    instance_filter
        OLMo-core's repetition filter: ``True`` (its defaults, ``min_period=1, max_period=13,
        max_count=32``) or a dict of some of them. A row holding a unit of a period in
        ``[min_period, max_period]`` repeated ``max_count`` times in a row (in its window and
        the target after it; in packed rows, in one of its documents' pieces) keeps its place
        with its loss mask all False, and the batch's ``"instance_mask"`` is False for it;
        :meth:`TokenStream.stats` counts such rows.
    labels_ignore_index
        Written into ``"labels"`` wherever the loss mask is False (``-100``: what a Hugging
        Face causal LM's loss ignores), so that a batch goes into ``model(**batch)`` as it is;
        the batch carries ``"loss_mask"`` too. None (default): labels are tokens.

    Returns
    -------
    TokenStream
        An iterator of batches with ``len()``, ``state_dict()`` and ``load_state_dict()``.

    Raises
    ------
    TypeError, ValueError
        When called, for any invalid argument, before any batch is produced.

    Examples
    --------
    >>> import numpy as np
    >>> from tokstream import stream_token_source
    >>> stream = stream_token_source(np.arange(10, 16), block=3, batch_size=2, shuffle=False)
    >>> len(stream)
    2
    >>> windows, next_tokens = next(stream)
    >>> windows.tolist(), next_tokens.tolist()
    ([[10, 11, 12], [11, 12, 13]], [13, 14])
    """
    return TokenStream(token_ids, block, batch_size, **options)


stream_token_source.__signature__ = stream_signature("token_ids")  # type: ignore[attr-defined]
