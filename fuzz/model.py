"""The fuzz harness' model: which calls are valid, and what they yield.

It shares no code with tokstream's validation or kernel: it converts token ids with Python
integers, slices windows with NumPy, evaluates the implicit permutation's Feistel network in
Python, and reads token files with ``np.load``/``np.frombuffer``. A call the model rejects raises
:class:`Rejected`, naming the error type and the argument the message must name.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from tokstream.stream import implicit_round_keys

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SPEC_ARGS = ("block", "batch_size", "epochs", "shuffle", "seed")
EXTRA_ARGS = (
    "targets",
    "rank",
    "world_size",
    "drop_last",
    "permutation",
    "prefetch",
    "reuse_buffers",
)
DEFAULTS = {
    "epochs": 1,
    "shuffle": True,
    "seed": 0,
    "targets": "next",
    "rank": 0,
    "world_size": 1,
    "drop_last": False,
    "permutation": "materialized",
    "prefetch": 0,
    "reuse_buffers": 0,
}
# Rounds of the implicit permutation's network (tokstream.stream).
IMPLICIT_ROUNDS = 6


class Rejected(Exception):
    """The model's verdict: the call must raise ``error`` with ``name`` in its message."""

    def __init__(self, error: type[Exception], name: str) -> None:
        super().__init__(error, name)
        self.error, self.name = error, name


class ShardList:
    """A fuzzed multi-shard input: the call wraps it in ``Corpus(shards)``."""

    def __init__(self, shards: list[Any]) -> None:
        self.shards = shards

    def __repr__(self) -> str:
        return f"ShardList({self.shards!r})"


# ---------------------------------------------------------------------------------------------
# Calls: validity and batches


def model_int(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_, np.timedelta64)):
        raise Rejected(TypeError, name)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            raise Rejected(ValueError, name)
        numerator, denominator = value.as_integer_ratio()
        if denominator != 1:
            raise Rejected(ValueError, name)
        return numerator
    raise Rejected(TypeError, name)


def model_ranged(value: Any, name: str, low: int, high: float = math.inf) -> int:
    as_int = model_int(value, name)
    if not low <= as_int <= high:
        raise Rejected(ValueError, name)
    return as_int


def model_bool(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise Rejected(TypeError, name)
    return bool(value)


def model_choice(value: Any, name: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise Rejected(TypeError, name)
    if value not in allowed:
        raise Rejected(ValueError, name)
    return value


def model_token(value: Any, name: str) -> int:
    """One token id as a Python int: exact integers in the int64 range only."""
    if isinstance(value, (bool, np.bool_, np.timedelta64)):
        raise Rejected(TypeError, name)
    if isinstance(value, (int, np.integer)):
        as_int = int(value)
    elif isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            raise Rejected(ValueError, name)
        as_int, denominator = value.as_integer_ratio()
        if denominator != 1:
            raise Rejected(ValueError, name)
    else:
        raise Rejected(TypeError, name)
    if not INT64_MIN <= as_int <= INT64_MAX:
        raise Rejected(ValueError, name)
    return as_int


def model_tokens(raw: Any, name: str) -> np.ndarray:
    """What a token input holds, as int64, or the error it must raise."""
    if isinstance(raw, np.ndarray):
        if raw.ndim != 1:
            raise Rejected(ValueError, name)
        if raw.dtype.kind not in "iuf":
            raise Rejected(TypeError, name)
        # An array is judged as a whole: every error it can raise is a ValueError.
        values = [model_token(v, name) for v in raw]
    elif isinstance(raw, (list, tuple)):
        # A sequence is judged element by element: the first bad element decides.
        values = [model_token(v, f"{name}[{i}]") for i, v in enumerate(raw)]
    else:
        raise AssertionError(f"the fuzzer made an input it cannot judge: {type(raw)}")
    return np.array(values, dtype=np.int64)


def model_call(tokens: Any, kwargs: dict[str, Any]) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Validate a call in the spec's order: the shards and the controls, or Rejected."""
    if isinstance(tokens, ShardList):
        if not tokens.shards:
            raise Rejected(ValueError, "shards")
        shards = [model_tokens(s, f"shards[{i}]") for i, s in enumerate(tokens.shards)]
        # Float shards are converted to int64, integer ones keep their (native) dtype.
        stored = {
            np.dtype("i8") if s.dtype.kind == "f" else s.dtype.newbyteorder("=")
            for s in tokens.shards
        }
        if len(stored) > 1:
            raise Rejected(ValueError, "shards")
    else:
        shards = [model_tokens(tokens, "token_ids")]
    args = {**DEFAULTS, **kwargs}
    controls = {
        "block": model_ranged(args["block"], "block", 1),
        "batch_size": model_ranged(args["batch_size"], "batch_size", 1),
        "epochs": model_ranged(args["epochs"], "epochs", 0),
        "shuffle": model_bool(args["shuffle"], "shuffle"),
        "seed": model_ranged(args["seed"], "seed", 0, 2**32 - 1),
        "targets": model_choice(args["targets"], "targets", ("next", "shifted")),
        "world_size": model_ranged(args["world_size"], "world_size", 1),
        "rank": model_ranged(args["rank"], "rank", 0),
    }
    if controls["rank"] >= controls["world_size"]:
        raise Rejected(ValueError, "rank")
    controls["drop_last"] = model_bool(args["drop_last"], "drop_last")
    controls["permutation"] = model_choice(
        args["permutation"], "permutation", ("materialized", "implicit")
    )
    # A background thread assembling batches ahead changes nothing about them.
    controls["prefetch"] = model_ranged(args["prefetch"], "prefetch", 0)
    # Nor does a ring of reused buffers, but for when a batch is overwritten.
    controls["reuse_buffers"] = model_ranged(args["reuse_buffers"], "reuse_buffers", 0)
    if 0 < controls["reuse_buffers"] < controls["prefetch"] + 2 and controls["prefetch"]:
        raise Rejected(ValueError, "reuse_buffers")
    return shards, controls


def _mix64(z: int) -> int:
    mask = (1 << 64) - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def implicit_order(n: int, seed: int, epoch: int):
    """The implicit permutation of ``[0, n)``, in Python integers.

    An alternating Feistel network on ``[0, high_size * 2**low_bits)`` (``2**low_bits`` about
    ``sqrt(n)``), restricted to ``[0, n)`` by cycle walking; see ``tokstream._windows``.
    """
    low_bits = ((n - 1).bit_length() + 1) // 2
    high_size = -(-n // (1 << low_bits))
    low_mask = (1 << low_bits) - 1
    keys = [int(k) for k in implicit_round_keys(seed, epoch, IMPLICIT_ROUNDS)]

    def encrypt(x: int) -> int:
        low, high = x & low_mask, x >> low_bits
        for r, key in enumerate(keys):
            if r % 2 == 0:
                low = (low + _mix64(high ^ key)) & low_mask
            else:
                high = (high + ((_mix64(low ^ key) * high_size) >> 64)) % high_size
        return (high << low_bits) | low

    def at(position: int) -> int:
        value = encrypt(position)
        while value >= n:
            value = encrypt(value)
        return value

    return at


def model_batches(
    shards: list[np.ndarray], c: dict[str, Any], cursor: tuple | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The batches of the stream described by the module docstring of ``tokstream.stream``.

    ``cursor`` is ``(epoch, position, rng_state)`` to start from instead of the beginning.
    """
    block, batch_size, world = c["block"], c["batch_size"], c["world_size"]
    per_shard = [max(len(s) - block, 0) for s in shards]
    offsets = np.concatenate([[0], np.cumsum(per_shard)]).astype(np.int64)
    n = int(offsets[-1])
    used = n // world * world
    global_batch = world * batch_size
    full, rest = divmod(used, global_batch)
    per_epoch = full + (1 if rest and not c["drop_last"] else 0)
    if per_epoch == 0:
        return
    rng = np.random.RandomState(c["seed"])
    epoch, position = 0, 0
    if cursor is not None:
        epoch, position, rng_state = cursor
        if rng_state is not None:
            rng.set_state(rng_state)
    while epoch < c["epochs"]:
        if not c["shuffle"]:
            order = range(n).__getitem__
        elif c["permutation"] == "implicit":
            order = implicit_order(n, c["seed"], epoch)
        else:
            order = rng.permutation(n).__getitem__
        for step in range(position // global_batch, per_epoch):
            base = step * global_batch
            count = min(batch_size, (used - base) // world)
            starts = [int(order(base + c["rank"] + world * i)) for i in range(count)]
            yield _model_windows(shards, offsets, block, c["targets"], starts)
        epoch, position = epoch + 1, 0


def _model_windows(shards, offsets, block, targets, starts):
    windows, after = [], []
    for start in starts:
        shard = int(np.searchsorted(offsets, start, side="right")) - 1
        local = start - int(offsets[shard])
        tokens = shards[shard]
        windows.append(tokens[local : local + block])
        if targets == "next":
            after.append(tokens[local + block])
        else:
            after.append(tokens[local + 1 : local + block + 1])
    return np.array(windows, dtype=np.int64), np.array(after, dtype=np.int64)


def model_length(shards, c) -> int:
    per_shard = sum(max(len(s) - c["block"], 0) for s in shards)
    used = per_shard // c["world_size"] * c["world_size"]
    full, rest = divmod(used, c["world_size"] * c["batch_size"])
    return c["epochs"] * (full + (1 if rest and not c["drop_last"] else 0))


def decode_key(hex_key: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(hex_key), dtype="<u4").astype(np.uint32)


def cursor_of(state: dict[str, Any]) -> tuple:
    rng = state["rng_state"]
    rng_state = None
    if rng is not None:
        rng_state = (
            "MT19937",
            decode_key(rng["key"]),
            rng["pos"],
            rng["has_gauss"],
            rng["cached_gaussian"],
        )
    return state["epoch"], state["position"], rng_state


# ---------------------------------------------------------------------------------------------
# Token files

NPY_MAGIC = b"\x93NUMPY"
LLMC_MAGIC, LLMC_HEADER_BYTES = 20240520, 1024


class TokenFile:
    """A fuzzed token file: its bytes, its name, and the arguments ``open_tokens`` gets."""

    def __init__(self, name: str, data: bytes, kwargs: dict[str, Any]) -> None:
        self.name, self.data, self.kwargs = name, data, kwargs

    def __repr__(self) -> str:
        return (
            f"TokenFile({self.name!r}, {len(self.data)} bytes {self.data[:96]!r}..., "
            f"{self.kwargs!r})"
        )


def file_verdict(path, data: bytes, kwargs: dict[str, Any]) -> np.ndarray | type[Exception]:
    """What ``open_tokens(path, **kwargs)`` must give: the tokens, or the error type it raises.

    Arguments are checked first (a TypeError for a non-integer dtype or a non-string format,
    a ValueError for an unknown format); anything wrong with the file is a ValueError.
    """
    fmt, want = kwargs.get("format"), kwargs.get("dtype")
    if fmt is not None and not isinstance(fmt, str):
        return TypeError
    if fmt is not None and fmt not in ("npy", "bin", "llmc"):
        return ValueError
    if want is not None:
        try:
            if np.dtype(want).kind not in "iu":
                return TypeError
        except TypeError:
            return TypeError
    tokens = independent_read(path, data, kwargs)
    return ValueError if tokens is None else tokens


def independent_read(path, data: bytes, kwargs: dict[str, Any]) -> np.ndarray | None:
    """What the file holds, read without tokstream, or None if it is not a valid token file."""
    detected = "bin"
    if data.startswith(NPY_MAGIC):
        detected = "npy"
    elif len(data) >= 4 and int.from_bytes(data[:4], "little", signed=True) in (
        LLMC_MAGIC,
        20240801,
        20240522,
    ):
        detected = "llmc"
    fmt = kwargs.get("format") or detected
    if fmt != "bin" and fmt != detected:
        return None
    if kwargs.get("format") is None and str(path).endswith(".npy") and detected != "npy":
        return None
    want = kwargs.get("dtype")
    if fmt == "npy":
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tokens = np.load(path, allow_pickle=False)
        except Exception:
            return None
        header_end = data.index(b"\n") + 1 if b"\n" in data else len(data)
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            return None
        if header_end + tokens.nbytes != len(data):
            return None
    elif fmt == "llmc":
        if len(data) < LLMC_HEADER_BYTES:
            return None
        magic, version, count = np.frombuffer(data[:12], dtype="<i4").tolist()
        if magic != LLMC_MAGIC or version != 1 or count < 0:
            return None
        if LLMC_HEADER_BYTES + 2 * count != len(data):
            return None
        tokens = np.frombuffer(data[LLMC_HEADER_BYTES:], dtype="<u2")
    else:
        dtype = np.dtype(np.uint16 if want is None else want)
        if len(data) % dtype.itemsize:
            return None
        tokens = np.frombuffer(data, dtype=dtype)
    if want is not None and tokens.dtype.newbyteorder("=") != np.dtype(want).newbyteorder("="):
        return None
    if tokens.dtype.kind == "u" and tokens.size and int(tokens.max()) > INT64_MAX:
        return None
    return tokens
