"""The stream: which windows each batch holds, in which order, on which rank, and where it stands.

A :class:`TokenStream` owns the semantics (epochs, window order, sharding, the resumable cursor);
the compiled kernel only copies the windows it is told to. With the default arguments it yields
exactly the spec's batches: per shuffled epoch one ``RandomState(seed).permutation(n)`` drawn from
a single generator, batches of ``batch_size`` windows in that order, the last one partial.

Sharding follows ``torch.utils.data.DistributedSampler``: with ``world_size = W`` the epoch order
is cut to its first ``(n // W) * W`` positions (the at most ``W - 1`` left over are skipped that
epoch, so that every rank yields the same number of batches of the same sizes) and rank ``r``
takes positions ``r, r + W, r + 2W, ...``. Global step ``k`` (all ranks together) therefore
consumes positions ``[k * W * batch_size, (k + 1) * W * batch_size)`` of the order, which depends
only on ``W * batch_size``: that is what makes an elastic resume exact.

The tail: each epoch, the last ``n % W`` positions of that epoch's order are not streamed (a
shuffled order puts different windows there every epoch). ``drop_last=True`` also drops the
final partial global batch, so an epoch streams the first ``(n // (W * B)) * W * B``
positions. Every full global batch is therefore the same for any ``W`` of the same ``W * B``;
without ``drop_last`` the final partial one holds the positions up to ``(n // W) * W`` and so
depends on ``W``. An elastic resume continues exactly as a stream that ran with the new world
from the start: the same full global batches as the old world, the new world's partial one
(and a cursor that stands past the new world's shorter epoch starts the next epoch).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from tokstream import _validate
from tokstream._windows import permuted_positions
from tokstream.corpus import Corpus, WindowGather
from tokstream.prefetch import Prefetcher

TARGETS = ("next", "shifted")
PERMUTATIONS = ("materialized", "implicit")
STATE_VERSION = 1

_MASK64 = (1 << 64) - 1
_FEISTEL_ROUNDS = 6
_MT_WORDS = 624  # words of MT19937's state


class TokenStream(Iterator[tuple[np.ndarray, np.ndarray]]):
    """An iterator of ``(windows, targets)`` micro-batches with a resumable cursor.

    Built by :func:`stream_token_source`, which documents the arguments. Each batch is fresh
    memory the caller owns: ``windows`` is a C-contiguous, writeable ``(b, block)`` int64 array
    and the targets are ``(b,)`` int64 next tokens (``targets="next"``) or the ``(b, block)``
    windows shifted by one token (``targets="shifted"``).

    With ``reuse_buffers=k`` the stream instead cycles through ``k`` preallocated batches: the
    arrays it returns are overwritten ``k`` batches later, so a caller that keeps a batch longer
    copies it. With ``prefetch=p`` a background thread assembles up to ``p`` batches ahead (the
    kernel runs without the GIL); :meth:`state_dict` still reports the batches delivered, not
    the ones assembled, and :meth:`close` (or dropping the stream) stops the thread.

    One stream may be shared between threads: each ``next()`` is atomic, so the threads receive
    disjoint batches of the one sequence (in an order that depends on scheduling).
    """

    def __init__(
        self,
        token_ids: Any,
        block: Any,
        batch_size: Any,
        *,
        epochs: Any = 1,
        shuffle: Any = True,
        seed: Any = 0,
        targets: str = "next",
        rank: Any = 0,
        world_size: Any = 1,
        drop_last: Any = False,
        permutation: str = "materialized",
        prefetch: Any = 0,
        reuse_buffers: Any = 0,
    ) -> None:
        self.corpus = Corpus.from_tokens(token_ids)
        self.block, self.batch_size, self.epochs, self.shuffle, self.seed = (
            _validate.stream_controls(block, batch_size, epochs, shuffle, seed)
        )
        self.targets = _validate.choice(targets, "targets", TARGETS)
        self.world_size = _validate.positive_int(world_size, "world_size")
        self.rank = _validate.nonnegative_int(rank, "rank")
        if self.rank >= self.world_size:
            raise ValueError(f"rank must be below world_size={self.world_size}, got {self.rank}")
        self.drop_last = _validate.exact_bool(drop_last, "drop_last")
        self.permutation = _validate.choice(permutation, "permutation", PERMUTATIONS)
        self.prefetch = _validate.nonnegative_int(prefetch, "prefetch")
        self.reuse_buffers = _validate.nonnegative_int(reuse_buffers, "reuse_buffers")
        if self.reuse_buffers and self.prefetch and self.reuse_buffers < self.prefetch + 2:
            raise ValueError(
                f"reuse_buffers must be at least prefetch + 2 = {self.prefetch + 2} (the queued "
                "batches, the one being assembled and the one the caller holds), got "
                f"{self.reuse_buffers}"
            )

        self._gather = WindowGather(self.corpus, self.block, prefetch=self.shuffle)
        self.corpus.advise(self.shuffle)
        self.num_windows = self._gather.num_windows
        # The implicit permutation's domain, and its round keys with the epoch they are for.
        self._implicit_domain = implicit_domain(max(self.num_windows, 1))
        self._implicit_keys: tuple[int, np.ndarray | None] = (-1, None)
        self.global_batch_size = self.world_size * self.batch_size
        self._lock = threading.Lock()
        self._rng = np.random.RandomState(self.seed)
        self._epoch = 0
        self._position = 0  # order positions consumed this epoch, by all ranks together
        self._order: np.ndarray | None = None
        # The generator at the start of the current epoch, from which its order is drawn.
        self._epoch_rng_state = self._rng.get_state() if self._draws_orders else None
        self._closed = False
        self._plan_epoch()
        self._ring: list[tuple[np.ndarray, np.ndarray]] = []
        self._ring_next = 0
        self._prefetcher: Prefetcher | None = None
        self._deliver_lock = threading.Lock()
        # (epoch, position, epoch_rng_state) after the last batch handed out, while a prefetch
        # thread runs ahead of it; None when the live cursor is the delivered one.
        self._delivered: tuple | None = None

    @property
    def _draws_orders(self) -> bool:
        return self.shuffle and self.permutation == "materialized"

    def _ring_slot(self) -> tuple[np.ndarray, np.ndarray]:
        """The next buffers of the ``reuse_buffers`` ring, allocated the first time each is used.

        Growing the ring as batches are made, rather than allocating all of it up front, keeps a
        large ``reuse_buffers`` (or a stream that yields nothing) from allocating buffers no batch
        will ever fill: ``reuse_buffers=2**40`` would otherwise never finish being made.
        """
        if len(self._ring) < self.reuse_buffers:
            rows = min(self.batch_size, self.positions_per_epoch // self.world_size)
            target_shape = (rows,) if self.targets == "next" else (rows, self.block)
            self._ring.append(
                (np.empty((rows, self.block), np.int64), np.empty(target_shape, np.int64))
            )
            return self._ring[-1]
        slot = self._ring[self._ring_next]
        self._ring_next = (self._ring_next + 1) % self.reuse_buffers
        return slot

    # ------------------------------------------------------------------ sizes

    def _plan_epoch(self) -> None:
        # Positions of the order used per epoch: a multiple of world_size, so ranks stay equal.
        self.positions_per_epoch = (self.num_windows // self.world_size) * self.world_size
        full, rest = divmod(self.positions_per_epoch, self.global_batch_size)
        self.batches_per_epoch = full + (1 if rest and not self.drop_last else 0)

    def __len__(self) -> int:
        """Batches of the whole run on this rank, from the first epoch to the last."""
        return self.epochs * self.batches_per_epoch

    def __length_hint__(self) -> int:
        """Batches still to come from the current cursor."""
        epoch, position, _ = self._cursor()
        if self._closed or epoch >= self.epochs:
            return 0
        done = position // self.global_batch_size
        return (self.epochs - epoch) * self.batches_per_epoch - done

    def _cursor(self) -> tuple:
        """(epoch, position, epoch_rng_state) after the last batch the caller received."""
        if self._delivered is not None:
            return self._delivered
        return self._live_cursor()

    def _live_cursor(self) -> tuple:
        """(epoch, position, epoch_rng_state) of the next batch to be assembled."""
        return self._epoch, self._position, self._epoch_rng_state

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.prefetch:
            with self._lock:
                return self._produce()
        with self._deliver_lock:
            if self._closed:
                raise StopIteration
            if self._prefetcher is None:
                self._delivered = self._live_cursor()
                self._prefetcher = Prefetcher(self, TokenStream._produce_ahead, self.prefetch)
            windows, targets, self._delivered = self._prefetcher.get()
            return windows, targets

    def _produce_ahead(self) -> tuple[np.ndarray, np.ndarray, tuple]:
        with self._lock:
            windows, targets = self._produce()
            return windows, targets, self._live_cursor()

    def _produce(self) -> tuple[np.ndarray, np.ndarray]:
        """Assemble the batch at the live cursor and advance it; the caller holds the lock."""
        if self._closed or self._epoch >= self.epochs or self.batches_per_epoch == 0:
            raise StopIteration
        base = self._position
        count = min(self.batch_size, (self.positions_per_epoch - base) // self.world_size)
        starts = self._starts(base + self.rank, count)
        next_only = self.targets == "next"
        if self.reuse_buffers:
            windows, targets = self._ring_slot()
            windows, targets = windows[:count], targets[:count]
        else:
            windows = np.empty((count, self.block), dtype=np.int64)
            targets = np.empty((count,) if next_only else (count, self.block), dtype=np.int64)
        if next_only:
            self._gather(starts, windows, targets)
        else:
            self._gather(starts, windows, None, targets)
        self._advance()
        return windows, targets

    def _advance(self) -> None:
        # The cursor moves in one statement: a KeyboardInterrupt between two of them would leave
        # a position at the end of an epoch that has not ended, and the next batch empty.
        position = self._position + self.global_batch_size
        if position // self.global_batch_size >= self.batches_per_epoch:
            rng_state = self._rng.get_state() if self._draws_orders else self._epoch_rng_state
            self._epoch, self._position, self._order, self._epoch_rng_state = (
                self._epoch + 1, 0, None, rng_state
            )
        else:
            self._position = position

    def _starts(self, first: int, count: int) -> np.ndarray:
        """Window indices at order positions ``first, first + W, ...`` (``count`` of them).

        Every position is below ``positions_per_epoch <= num_windows`` and every order maps
        ``[0, num_windows)`` onto itself, so each index is a valid window for the kernel.
        """
        stride = self.world_size
        if not self.shuffle:
            return np.arange(first, first + stride * count, stride, dtype=np.int64)
        if self.permutation == "implicit":
            starts = np.empty(count, dtype=np.int64)
            if self._implicit_keys[0] != self._epoch:
                self._implicit_keys = (
                    self._epoch, implicit_round_keys(self.seed, self._epoch, _FEISTEL_ROUNDS)
                )
            low_bits, high_size = self._implicit_domain
            permuted_positions(
                starts, first, stride, self.num_windows, low_bits, high_size,
                self._implicit_keys[1],
            )
            return starts
        if self._order is None:
            try:
                self._order = self._rng.permutation(self.num_windows)
            except BaseException:
                # Ctrl-C during a long draw is delivered right after it returns: without this
                # the generator would stay advanced without the order, and the epoch would be
                # silently drawn again from the next state.
                self._rng.set_state(self._epoch_rng_state)
                raise
        return self._order[first : first + stride * count : stride]

    def close(self) -> None:
        """Stop the stream: every later ``next()`` raises StopIteration, as a closed generator.

        The epoch's order is freed; :meth:`state_dict` still reports where the stream stopped.
        """
        with self._deliver_lock:
            self._stop_prefetcher()
            with self._lock:
                self._closed = True
                self._order = None

    def _stop_prefetcher(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def __repr__(self) -> str:
        return (
            f"TokenStream(block={self.block}, batch_size={self.batch_size}, epochs={self.epochs}, "
            f"shuffle={self.shuffle}, rank={self.rank}/{self.world_size}, "
            f"epoch={self._epoch}, position={self._position}, windows={self.num_windows})"
        )

    # ------------------------------------------------------------------ resumable cursor

    def _config(self) -> dict[str, Any]:
        lengths = np.ascontiguousarray(self.corpus.lengths, dtype="<i8").tobytes()
        return {
            "num_tokens": self.corpus.num_tokens,
            "num_shards": len(self.corpus.shards),
            "shard_lengths_sha256": hashlib.sha256(lengths).hexdigest(),
            "block": self.block,
            "global_batch_size": self.global_batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "permutation": self.permutation,
            "drop_last": self.drop_last,
        }

    def state_dict(self) -> dict[str, Any]:
        """The cursor as a small JSON-serialisable dict (about 5 KB, no corpus data).

        ``config`` fingerprints everything that decides the global window sequence (corpus
        shard lengths, ``block``, ``world_size * batch_size``, ``seed``, ``shuffle``,
        ``permutation``, ``drop_last``); ``epoch`` and ``position`` (order positions consumed
        this epoch by all ranks together) locate the cursor; ``rng_state`` is the
        ``RandomState`` at the start of the current epoch (materialized shuffle only), from
        which the epoch's order is drawn again. The state is global: every rank of a run holds
        the same one, apart from the informational ``rank``, ``world_size`` and
        ``batch_size``. ``epochs`` and ``targets`` are not part of it, so a finished run can be
        extended with more epochs.

        Loading it into a stream built with the same arguments (or, elastically, with another
        ``world_size`` and ``batch_size`` of the same product) continues exactly where this one
        stands, also after :meth:`close`.
        """
        with self._lock:
            epoch, position, epoch_rng_state = self._cursor()
            return {
                "version": STATE_VERSION,
                "config": self._config(),
                "epoch": epoch,
                "position": position,
                "rng_state": (
                    None if epoch_rng_state is None else _encode_rng_state(epoch_rng_state)
                ),
                "rank": self.rank,
                "world_size": self.world_size,
                "batch_size": self.batch_size,
            }

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
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        missing = {"version", "config", "epoch", "position", "rng_state"} - state.keys()
        if missing:
            raise ValueError(f"state is missing {sorted(missing)}")
        version = _state_int(state["version"], "state['version']")
        if version != STATE_VERSION:
            raise ValueError(f"state['version'] = {version} is not {STATE_VERSION}")
        self._check_config(state["config"])
        epoch = _state_int(state["epoch"], "state['epoch']")
        position = _state_int(state["position"], "state['position']")
        if position % self.global_batch_size:
            raise ValueError(
                f"state['position'] = {position} is not a multiple of the global batch size "
                f"world_size * batch_size = {self.global_batch_size}"
            )
        steps_done = position // self.global_batch_size
        if steps_done > self.batches_per_epoch:
            raise ValueError(
                f"state['position'] = {position} is past the end of an epoch of "
                f"{self.batches_per_epoch} global batches of {self.global_batch_size}"
            )
        rng_state = None
        if self._draws_orders:
            rng_state = _decode_rng_state(state["rng_state"])
        elif state["rng_state"] is not None:
            raise ValueError(
                "state['rng_state'] must be None for a stream without a random order drawn "
                f"from RandomState (shuffle={self.shuffle}, permutation={self.permutation!r})"
            )
        with self._deliver_lock:
            self._stop_prefetcher()
            with self._lock:
                if rng_state is not None:
                    self._rng.set_state(rng_state)
                self._epoch = epoch
                self._position = position
                self._order = None
                self._closed = False
                self._delivered = None
                if steps_done == self.batches_per_epoch and position:
                    # Only an elastic resume gets here: the saved world size cut the epoch's
                    # tail later than this one does, so this epoch is already over.
                    if rng_state is not None:
                        self._rng.permutation(self.num_windows)
                    self._epoch += 1
                    self._position = 0
                self._epoch_rng_state = self._rng.get_state() if self._draws_orders else None

    def _check_config(self, saved: Any) -> None:
        if not isinstance(saved, dict):
            raise TypeError(f"state['config'] must be a dict, got {type(saved).__name__}")
        for key, here in self._config().items():
            if key not in saved:
                raise ValueError(f"state['config'] is missing {key!r}")
            value = saved[key]
            if type(value) is not type(here):
                raise TypeError(
                    f"state['config'][{key!r}] must be {_KIND[type(here)]}, got {value!r} "
                    f"({type(value).__name__})"
                )
            if value == here:
                continue
            if key == "global_batch_size":
                raise ValueError(
                    f"state was saved with world_size * batch_size = {value}, this stream has "
                    f"{self.world_size} * {self.batch_size} = {here}; a resume, elastic or "
                    "not, must keep the global batch size"
                )
            raise ValueError(
                f"state was saved with {key}={value!r}, but this stream has {key}={here!r}"
            )


_KIND = {int: "an int", bool: "a bool", str: "a str", float: "a float"}


def _state_int(value: Any, name: str) -> int:
    """A nonnegative int field of a state; JSON keeps ints ints, so nothing else is accepted."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"{name} must be nonnegative, got {value}")
    return value


def _encode_rng_state(state: tuple) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached_gaussian = state
    return {
        "bit_generator": name,
        "key": np.asarray(keys, dtype="<u4").tobytes().hex(),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def _decode_rng_state(encoded: Any) -> tuple:
    """The ``RandomState.get_state()`` tuple of an encoded state, every field checked."""
    where = "state['rng_state']"
    if not isinstance(encoded, dict):
        raise TypeError(f"{where} must be a dict, got {type(encoded).__name__}")
    fields = ("bit_generator", "key", "pos", "has_gauss", "cached_gaussian")
    missing = [field for field in fields if field not in encoded]
    if missing:
        raise ValueError(f"{where} is missing {missing[0]!r}")
    name, key_hex = encoded["bit_generator"], encoded["key"]
    if not isinstance(name, str) or name != "MT19937":
        raise ValueError(f"{where}['bit_generator'] must be 'MT19937', got {name!r}")
    if not isinstance(key_hex, str):
        raise TypeError(f"{where}['key'] must be a str, got {type(key_hex).__name__}")
    if len(key_hex) != _MT_WORDS * 8:
        raise ValueError(
            f"{where}['key'] must be {_MT_WORDS} words as {_MT_WORDS * 8} hex digits, "
            f"got {len(key_hex)} characters"
        )
    try:
        keys = np.frombuffer(bytes.fromhex(key_hex), dtype="<u4").astype(np.uint32)
    except ValueError:
        raise ValueError(f"{where}['key'] is not a hex string") from None
    if keys.shape[0] != _MT_WORDS:
        # bytes.fromhex skips whitespace: 4992 characters may hold fewer than 624 words.
        raise ValueError(f"{where}['key'] holds {keys.shape[0]} words, not {_MT_WORDS}")
    if not keys.any():
        # MT19937 never reaches the all-zero state; from it, it would draw zeros forever.
        raise ValueError(f"{where}['key'] is all zeros, which no MT19937 generator produces")
    pos = _state_int(encoded["pos"], f"{where}['pos']")
    if pos > _MT_WORDS:
        raise ValueError(f"{where}['pos'] must be at most {_MT_WORDS}, got {pos}")
    has_gauss = _state_int(encoded["has_gauss"], f"{where}['has_gauss']")
    if has_gauss > 1:
        raise ValueError(f"{where}['has_gauss'] must be 0 or 1, got {has_gauss}")
    cached = encoded["cached_gaussian"]
    if not isinstance(cached, float):
        raise TypeError(
            f"{where}['cached_gaussian'] must be a float, got {cached!r} ({type(cached).__name__})"
        )
    return ("MT19937", keys, pos, has_gauss, cached)


def implicit_domain(n: int) -> tuple[int, int]:
    """``(low_bits, high_size)`` of the implicit permutation's domain for ``n >= 1`` windows.

    The domain ``high_size * 2**low_bits`` is the smallest multiple of ``2**low_bits`` that is
    ``>= n``, with ``2**low_bits`` about ``sqrt(n)``: it overshoots n by less than ``2**low_bits``.
    """
    low_bits = ((n - 1).bit_length() + 1) // 2
    high_size = -(-n // (1 << low_bits))
    return low_bits, high_size


def implicit_round_keys(seed: int, epoch: int, rounds: int) -> np.ndarray:
    """Round keys of the implicit permutation of ``epoch``: splitmix64 seeded by both."""
    state = (seed * 0x9E3779B97F4A7C15 + (epoch & _MASK64) * 0xD1B54A32D192ED03) & _MASK64
    keys = np.empty(rounds, dtype=np.uint64)
    for r in range(rounds):
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        keys[r] = z ^ (z >> 31)
    return keys


def stream_token_source(
    token_ids: Any,
    block: int,
    batch_size: int,
    *,
    epochs: int = 1,
    shuffle: bool = True,
    seed: int = 0,
    targets: str = "next",
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
    permutation: str = "materialized",
    prefetch: int = 0,
    reuse_buffers: int = 0,
) -> TokenStream:
    """Stream ``(windows, targets)`` micro-batches out of a token array, never stacking windows.

    Parameters
    ----------
    token_ids
        A 1-D integer array (read in place, in its own dtype, when C-contiguous), an exact-integer
        float array or sequence (converted once to int64), or a :class:`tokstream.Corpus`.
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
        ``"next"`` yields the ``(b,)`` next tokens, as the spec does; ``"shifted"`` yields the
        ``(b, block)`` windows shifted by one token, as language-model training uses.
    rank, world_size
        This process' share of each epoch (see the module docstring).
    drop_last
        Drop each epoch's final partial batch.
    permutation
        ``"materialized"``: the reference's ``RandomState`` permutation (exact parity; one
        O(windows) int64 array per epoch). ``"implicit"``: a keyed pseudo-random bijection
        evaluated per position, no O(windows) memory; a different order from the reference's.
    prefetch
        Batches a background thread assembles ahead of the caller (0: none, the default).
    reuse_buffers
        0 (default): every batch is fresh memory the caller owns. ``k >= 1``: the stream
        cycles through ``k`` preallocated batches, so a batch is overwritten ``k`` batches
        later (saves the page faults of a fresh multi-MB buffer per batch). With prefetching it
        must be at least ``prefetch + 2``.

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
    return TokenStream(
        token_ids,
        block,
        batch_size,
        epochs=epochs,
        shuffle=shuffle,
        seed=seed,
        targets=targets,
        rank=rank,
        world_size=world_size,
        drop_last=drop_last,
        permutation=permutation,
        prefetch=prefetch,
        reuse_buffers=reuse_buffers,
    )
