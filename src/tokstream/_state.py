"""Where a stream stands: the cursor, and the state dict that carries it across processes.

A :class:`Cursor` is global: ``position`` counts the order positions consumed this epoch by all
ranks together, so every rank of a run holds the same cursor. The state dict is that cursor plus
a fingerprint (stored under the key ``"config"``) of everything that decides the global window
sequence; loading checks the fingerprint and every field before anything changes.
"""

from __future__ import annotations

import hashlib
import json
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
# A mixture's schedule: the first stage's integer weights (as JSON) and each later stage as
# "start:digest" (absent with one stage), compared only up to the state's position.
_SCHEDULE_KEYS = ("mixture_weights", "mixture_stages")


class Cursor(NamedTuple):
    """The next batch to make: ``epoch``, ``position`` in its order, the epoch's generator.

    ``rng_state`` is the ``RandomState.get_state()`` tuple at the start of ``epoch`` when the
    epoch orders are drawn from ``RandomState`` (materialized shuffle), else None.
    """

    epoch: int
    position: int
    rng_state: tuple[Any, ...] | None


def fingerprint(corpus: Any, options: Any, space: Any) -> dict[str, Any]:
    """The fingerprint of a stream's global window sequence, as JSON-friendly values.

    ``space`` is the stream's window index space (:class:`~tokstream._space.WindowSpace`, or
    :class:`~tokstream._packed.PackedSpace`): within documents or packed, where the documents
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


def schedule_fingerprint(stages: Any) -> dict[str, str]:
    """A mixture schedule's part of the fingerprint: the first stage's integer weights exactly,
    each later stage's start and a 64-bit digest of its weights (so a state's size grows by
    ~30 bytes a stage, whatever the number of sources)."""
    (_, first), *later = stages
    result = {"mixture_weights": json.dumps(list(first))}
    if later:
        result["mixture_stages"] = ",".join(
            f"{start}:{hashlib.sha256(json.dumps(list(weights)).encode()).hexdigest()[:16]}"
            for start, weights in later
        )
    return result


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
    if "mixture_weights" in fingerprint:
        _check_schedule(state["config"], fingerprint, epoch * fingerprint["samples"] + position)
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
    # Two mixtures' schedules are compared up to the saved position (_check_schedule).
    schedules = "mixture_weights" in saved and "mixture_weights" in here
    skipped = set(_RETIRED_KEYS) | (set(_SCHEDULE_KEYS) if schedules else set())
    for key, old in _LATER_KEYS.items():
        if key in saved and key not in here:
            raise ValueError(
                f"state was saved with {key}={saved[key]!r}, but this stream has {key}={old!r}"
            )
    for key in sorted(saved.keys() - here.keys() - skipped):
        # A mixture's keys, say, in the state of a stream over a plain corpus.
        raise ValueError(f"state was saved with {key}={saved[key]!r}, which this stream lacks")
    for key, value_here in here.items():
        if key in skipped:
            continue
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


def _check_schedule(saved: dict[str, Any], here: dict[str, Any], sample: int) -> None:
    """The stages of both schedules that start before global sample ``sample`` (the saved
    position) are the same; later ones may differ (a stage added to a running job)."""
    saved_stages, here_stages = _stages(saved, "state['config']"), _stages(here, "this stream")
    before = [
        [stage for stage in stages if stage[0] < sample] for stages in (saved_stages, here_stages)
    ]
    for i in range(max(len(before[0]), len(before[1]))):
        old, new = (stages[i] if i < len(stages) else None for stages in before)
        if old == new:
            continue
        where = f"before the saved position (global sample {sample})"
        if old is None or new is None:
            start = next(stages for stages in (old, new) if stages is not None)[0]
            whose, other = "this mixture's", "the state's"
            if new is None:
                whose, other = other, whose
            raise ValueError(
                f"mix(weights=...): stage {i} of {whose} schedule (from sample {start}) is not in "
                f"{other} schedule, {where}"
            )
        if i == 0:
            raise ValueError(
                f"state was saved with mixture_weights={old[1]} (stage 0), but this stream has "
                f"mixture_weights={new[1]}"
            )
        if old[0] != new[0]:
            raise ValueError(
                f"mix(weights=...): stage {i} starts at sample {old[0]} in the state's schedule "
                f"but at sample {new[0]} in this mixture's, {where}"
            )
        raise ValueError(
            f"mix(weights=...): stage {i} (from sample {old[0]}) has other weights in the "
            f"state's schedule than in this mixture's, {where}"
        )


def _stages(config: dict[str, Any], where: str) -> list[tuple[int, str]]:
    """``(start, weights or their digest)`` of each stage a fingerprint records."""
    weights, later = config["mixture_weights"], config.get("mixture_stages", "")
    for key, value in (("mixture_weights", weights), ("mixture_stages", later)):
        if not isinstance(value, str):
            raise TypeError(f"{where}[{key!r}] must be a str, got {type(value).__name__}")
    stages = [(0, weights)]
    for item in later.split(",") if later else []:
        start, _, digest = item.partition(":")
        if not (start.isascii() and start.isdigit() and len(digest) == 16):
            raise ValueError(f"{where}['mixture_stages'] holds {shown(item)}, not 'start:digest'")
        stages.append((int(start), digest))
    return stages


def _state_int(value: Any, name: str) -> int:
    """A nonnegative int64 field of a state; JSON keeps ints ints, so nothing else is accepted."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 0:
        raise ValueError(f"{name} must be nonnegative, got {shown(value)}")
    if value > INT64_MAX:
        raise ValueError(f"{name} must be at most 2**63 - 1, got a {value.bit_length()}-bit int")
    return value


def _encode_rng_state(state: tuple[Any, ...]) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached_gaussian = state
    return {
        "bit_generator": name,
        "key": np.asarray(keys, dtype="<u4").tobytes().hex(),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def _decode_rng_state(encoded: Any) -> tuple[Any, ...]:
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
