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

TARGETS = ("next", "shifted")
PERMUTATIONS = ("materialized", "implicit")
STATE_VERSION = 1

_MASK64 = (1 << 64) - 1
_FEISTEL_ROUNDS = 6


class TokenStream(Iterator[tuple[np.ndarray, np.ndarray]]):
    """An iterator of ``(windows, targets)`` micro-batches with a resumable cursor.

    Built by :func:`stream_token_source`, which documents the arguments. Each batch is fresh
    memory the caller owns: ``windows`` is a C-contiguous, writeable ``(b, block)`` int64 array
    and the targets are ``(b,)`` int64 next tokens (``targets="next"``) or the ``(b, block)``
    windows shifted by one token (``targets="shifted"``).

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

        self._gather = WindowGather(self.corpus, self.block)
        self.corpus.advise(self.shuffle)
        self.num_windows = self._gather.num_windows
        self.global_batch_size = self.world_size * self.batch_size
        self._lock = threading.Lock()
        self._rng = np.random.RandomState(self.seed)
        self._epoch = 0
        self._position = 0  # order positions consumed this epoch, by all ranks together
        self._order: np.ndarray | None = None
        self._epoch_rng_state: tuple | None = None
        self._closed = False
        self._plan_epoch()

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
        if self._closed or self._epoch >= self.epochs:
            return 0
        done = self._position // self.global_batch_size
        return (self.epochs - self._epoch) * self.batches_per_epoch - done

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            if self._closed or self._epoch >= self.epochs or self.batches_per_epoch == 0:
                raise StopIteration
            base = self._position
            count = min(self.batch_size, (self.positions_per_epoch - base) // self.world_size)
            starts = self._starts(base + self.rank, count)
            windows = np.empty((count, self.block), dtype=np.int64)
            if self.targets == "next":
                targets = np.empty(count, dtype=np.int64)
                self._gather(starts, windows, next_tokens=targets)
            else:
                targets = np.empty((count, self.block), dtype=np.int64)
                self._gather(starts, windows, targets=targets)
            self._advance()
            return windows, targets

    def _advance(self) -> None:
        self._position += self.global_batch_size
        if self._position // self.global_batch_size >= self.batches_per_epoch:
            self._epoch += 1
            self._position = 0
            self._order = None
            self._epoch_rng_state = None

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
            low_bits, high_size = implicit_domain(self.num_windows)
            keys = implicit_round_keys(self.seed, self._epoch, _FEISTEL_ROUNDS)
            permuted_positions(starts, first, stride, self.num_windows, low_bits, high_size, keys)
            return starts
        if self._order is None:
            self._epoch_rng_state = self._rng.get_state()
            self._order = self._rng.permutation(self.num_windows)
        return self._order[first : first + stride * count : stride]

    def close(self) -> None:
        """Stop the stream: every later ``next()`` raises StopIteration, as a closed generator."""
        with self._lock:
            self._closed = True
            self._order = None

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
        """The cursor as a small JSON-serialisable dict (a few KB, no corpus data).

        Loading it into a stream built with the same arguments (or, elastically, with another
        ``world_size`` and ``batch_size`` of the same product) continues exactly where this one
        stands.
        """
        with self._lock:
            rng_state = None
            if self.shuffle and self.permutation == "materialized":
                state = self._epoch_rng_state if self._order is not None else None
                rng_state = _encode_rng_state(state or self._rng.get_state())
            return {
                "version": STATE_VERSION,
                "config": self._config(),
                "epoch": self._epoch,
                "position": self._position,
                "rng_state": rng_state,
                "rank": self.rank,
                "world_size": self.world_size,
                "batch_size": self.batch_size,
            }

    def load_state_dict(self, state: Any) -> None:
        """Move the cursor to ``state`` (from :meth:`state_dict`); the next batch follows it.

        Raises ValueError naming the first setting that differs from this stream's, and
        TypeError/ValueError for a malformed state, before anything about the stream changes.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
        missing = {"version", "config", "epoch", "position", "rng_state"} - state.keys()
        if missing:
            raise ValueError(f"state is missing {sorted(missing)}")
        if state["version"] != STATE_VERSION:
            raise ValueError(f"state version {state['version']!r} is not {STATE_VERSION}")
        saved = state["config"]
        if not isinstance(saved, dict):
            raise TypeError(f"state['config'] must be a dict, got {type(saved).__name__}")
        for key, here in self._config().items():
            if key not in saved:
                raise ValueError(f"state['config'] is missing {key!r}")
            if saved[key] != here or type(saved[key]) is not type(here):
                if key == "global_batch_size":
                    raise ValueError(
                        f"state was saved with world_size * batch_size = {saved[key]!r}, this "
                        f"stream has {self.world_size} * {self.batch_size} = {here}; an elastic "
                        "resume must keep the global batch size"
                    )
                raise ValueError(
                    f"state was saved with {key}={saved[key]!r}, this stream has {here!r}"
                )
        epoch = _validate.nonnegative_int(state["epoch"], "state['epoch']")
        position = _validate.nonnegative_int(state["position"], "state['position']")
        if position % self.global_batch_size:
            raise ValueError(
                f"state['position'] = {position} is not a multiple of the global batch size "
                f"{self.global_batch_size}"
            )
        steps_done = position // self.global_batch_size
        if steps_done > self.batches_per_epoch:
            raise ValueError(
                f"state['position'] = {position} is past the end of an epoch of "
                f"{self.batches_per_epoch} global batches of {self.global_batch_size}"
            )
        rng_state = None
        if self.shuffle and self.permutation == "materialized":
            rng_state = _decode_rng_state(state["rng_state"])
        elif state["rng_state"] is not None:
            raise ValueError("state['rng_state'] must be None for a stream without a random order")
        with self._lock:
            if rng_state is not None:
                self._rng.set_state(rng_state)
            self._epoch = epoch
            self._position = position
            self._order = None
            self._epoch_rng_state = None
            self._closed = False
            if steps_done == self.batches_per_epoch and position:
                # Only an elastic resume gets here: the saved world size cut the epoch's tail
                # later than this one does, so this epoch is already over.
                if rng_state is not None:
                    self._rng.permutation(self.num_windows)
                self._epoch += 1
                self._position = 0


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
    if not isinstance(encoded, dict):
        raise TypeError(f"state['rng_state'] must be a dict, got {type(encoded).__name__}")
    try:
        name = encoded["bit_generator"]
        key_hex = encoded["key"]
        pos = _validate.nonnegative_int(encoded["pos"], "state['rng_state']['pos']")
        has_gauss = _validate.nonnegative_int(
            encoded["has_gauss"], "state['rng_state']['has_gauss']"
        )
        cached = encoded["cached_gaussian"]
    except KeyError as exc:
        raise ValueError(f"state['rng_state'] is missing {exc.args[0]!r}") from None
    if name != "MT19937":
        raise ValueError(f"state['rng_state']['bit_generator'] must be 'MT19937', got {name!r}")
    if not isinstance(key_hex, str) or len(key_hex) != 624 * 8:
        raise ValueError("state['rng_state']['key'] must be 624 words as 4992 hex digits")
    try:
        keys = np.frombuffer(bytes.fromhex(key_hex), dtype="<u4").astype(np.uint32)
    except ValueError:
        raise ValueError("state['rng_state']['key'] is not a hex string") from None
    if pos > 624:
        raise ValueError(f"state['rng_state']['pos'] must be at most 624, got {pos}")
    if has_gauss not in (0, 1) or not isinstance(cached, float):
        raise ValueError("state['rng_state'] has a malformed gaussian cache")
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
    )
