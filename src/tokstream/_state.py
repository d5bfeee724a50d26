"""Where a stream stands: the cursor, and the state dict that carries it across processes.

A :class:`Cursor` is global: ``position`` counts the order positions consumed this epoch by all
ranks together, so every rank of a run holds the same cursor. The state dict is that cursor plus
a fingerprint (stored under the key ``"config"``) of everything that decides the global window
sequence; loading checks the fingerprint and every field before anything changes.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np

from tokstream._validate import INT64_MAX, shown

STATE_VERSION = 1

_MT_WORDS = 624  # words of MT19937's state
_KIND = {int: "an int", bool: "a bool", str: "a str", float: "a float"}
# Settings that decide the window sequence, added to the fingerprint after its first version,
# with the value every earlier stream had.
_LATER_KEYS: dict[str, Any] = {"stride": 1, "eos": None, "windows": "cross"}
# Keys earlier fingerprints held that no longer decide the sequence: the global batch size (a
# cursor counts positions, so a state loads into any world size and batch size).
_RETIRED_KEYS = ("global_batch_size",)


class Cursor(NamedTuple):
    """The next batch to make: ``epoch``, ``position`` in its order, the epoch's generator.

    ``rng_state`` is the ``RandomState.get_state()`` tuple at the start of ``epoch`` when the
    epoch orders are drawn from ``RandomState`` (materialized shuffle), else None.
    """

    epoch: int
    position: int
    rng_state: tuple | None


def fingerprint(corpus: Any, options: Any, space: Any) -> dict[str, Any]:
    """The fingerprint of a stream's global window sequence, as JSON-friendly values.

    ``space`` is the stream's window index space (:class:`~tokstream._space.WindowSpace`, or
    :class:`~tokstream.packing.PackedSpace`): within documents or packed, where the documents
    decide the samples, it is hashed, since the same shard lengths and settings over other
    document boundaries lay out other windows.
    """
    lengths = np.ascontiguousarray(corpus.lengths, dtype="<i8").tobytes()
    within = (
        {"window_segments_sha256": space.segments_sha256()}
        if options.windows in ("within", "packed")
        else {}
    )
    return {
        "num_tokens": corpus.num_tokens,
        "num_shards": len(corpus.shards),
        "shard_lengths_sha256": hashlib.sha256(lengths).hexdigest(),
        "block": options.block,
        "seed": options.seed,
        "shuffle": options.shuffle,
        "permutation": options.permutation,
        "drop_last": options.drop_last,
        # Keys added after the first state version appear only when they differ from the
        # behaviour of that version, so its states still load.
        **{
            key: getattr(options, key)
            for key, old in _LATER_KEYS.items()
            if getattr(options, key) != old
        },
        **within,
    }


def encode(cursor: Cursor, fingerprint: dict[str, Any], options: Any) -> dict[str, Any]:
    """The state dict of ``cursor``: small, JSON-serialisable, no corpus data."""
    return {
        "version": STATE_VERSION,
        "config": fingerprint,
        "epoch": cursor.epoch,
        "position": cursor.position,
        "rng_state": None if cursor.rng_state is None else _encode_rng_state(cursor.rng_state),
        "rank": options.rank,
        "world_size": options.world_size,
        "batch_size": options.batch_size,
    }


def decode(
    state: Any,
    fingerprint: dict[str, Any],
    options: Any,
    positions: int,
    draws_orders: bool,
) -> Cursor:
    """Check ``state`` against a stream's ``fingerprint`` and return the cursor it holds.

    The position may be any order position up to ``positions`` (the epoch's order size), from
    a stream of any world size and batch size; the caller moves a cursor with no batch left in
    its epoch (under this stream's tail rule) to the next epoch.

    Raises
    ------
    TypeError
        The state, or one of its fields, is the wrong kind of thing.
    ValueError
        The state was saved by a stream of another configuration (the message names the first
        setting that differs), or a field holds an impossible value.
    """
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
    missing = {"version", "config", "epoch", "position", "rng_state"} - state.keys()
    if missing:
        raise ValueError(f"state is missing {sorted(missing)}")
    version = _state_int(state["version"], "state['version']")
    if version != STATE_VERSION:
        raise ValueError(f"state['version'] = {version} is not {STATE_VERSION}")
    _check_config(state["config"], fingerprint, options)
    epoch = _state_int(state["epoch"], "state['epoch']")
    position = _state_int(state["position"], "state['position']")
    if position > positions:
        raise ValueError(
            f"state['position'] = {position} is past the end of an epoch of {positions} "
            "order positions"
        )
    if draws_orders:
        return Cursor(epoch, position, _decode_rng_state(state["rng_state"]))
    if state["rng_state"] is not None:
        raise ValueError(
            "state['rng_state'] must be None for a stream without a random order drawn "
            f"from RandomState (shuffle={options.shuffle}, permutation={options.permutation!r})"
        )
    return Cursor(epoch, position, None)


def _check_config(saved: Any, here: dict[str, Any], options: Any) -> None:
    if not isinstance(saved, dict):
        raise TypeError(f"state['config'] must be a dict, got {type(saved).__name__}")
    for key, old in _LATER_KEYS.items():
        if key in saved and key not in here:
            raise ValueError(
                f"state was saved with {key}={saved[key]!r}, but this stream has {key}={old!r}"
            )
    for key in sorted(saved.keys() - here.keys() - set(_RETIRED_KEYS)):
        # A mixture's keys, say, in the state of a stream over a plain corpus.
        raise ValueError(f"state was saved with {key}={saved[key]!r}, which this stream lacks")
    for key, value_here in here.items():
        if key not in saved:
            raise ValueError(f"state['config'] is missing {key!r}")
        value = saved[key]
        if type(value) is not type(value_here):
            raise TypeError(
                f"state['config'][{key!r}] must be {_KIND[type(value_here)]}, got {value!r} "
                f"({type(value).__name__})"
            )
        if value == value_here:
            continue
        raise ValueError(
            f"state was saved with {key}={shown(value)}, but this stream has {key}={value_here!r}"
        )


def _state_int(value: Any, name: str) -> int:
    """A nonnegative int64 field of a state; JSON keeps ints ints, so nothing else is accepted."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"{name} must be nonnegative, got {shown(value)}")
    if value > INT64_MAX:
        raise ValueError(f"{name} must be at most 2**63 - 1, got a {value.bit_length()}-bit int")
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
