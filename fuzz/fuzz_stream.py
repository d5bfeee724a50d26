"""Fuzz ``stream_token_source``, ``load_state_dict`` and ``open_tokens`` against independent models.

Every generated call must end in exactly one of two ways:

* the batches this module's model predicts (and, with the spec's own options on a plain array,
  the reference path's batches byte for byte), or
* the TypeError/ValueError the model predicts, whose message names the offending argument.

Anything else fails: another exception type, a warning (they are errors here), a wrong, missing or
extra batch, or a hang (a watchdog kills the process with a traceback). The model shares no code
with tokstream's validation or kernel: it converts token ids with Python integers, slices windows
with NumPy, and evaluates the implicit permutation's Feistel network in Python.

Run by hand for longer (the ``-X faulthandler`` is optional)::

    python fuzz/fuzz_stream.py --seconds 600

The pytest suite runs the same properties for a fixed, small number of examples
(``tests/test_fuzz.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import faulthandler
import io
import itertools
import json
import math
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tokstream import Corpus, open_tokens, reference, stream_token_source
from tokstream._order import implicit_round_keys

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SPEC_ARGS = ("block", "batch_size", "epochs", "shuffle", "seed")
EXTRA_ARGS = (
    "targets", "rank", "world_size", "drop_last", "permutation", "prefetch", "reuse_buffers",
)
DEFAULTS = {
    "epochs": 1, "shuffle": True, "seed": 0, "targets": "next", "rank": 0, "world_size": 1,
    "drop_last": False, "permutation": "materialized", "prefetch": 0, "reuse_buffers": 0,
}
# Batches compared per call: epochs may be 2**70.
MAX_BATCHES = 30
# Rounds of the implicit permutation's network (tokstream.stream).
IMPLICIT_ROUNDS = 6
# A call that has not finished after this long is a hang.
HANG_SECONDS = 120


class Rejected(Exception):
    """The model's verdict: the call must raise ``error`` with ``name`` in its message."""

    def __init__(self, error: type[Exception], name: str) -> None:
        super().__init__(error, name)
        self.error, self.name = error, name


# ---------------------------------------------------------------------------------------------
# The model: which calls are valid, and what they yield


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
        stored = {np.dtype("i8") if s.dtype.kind == "f" else s.dtype.newbyteorder("=")
                  for s in tokens.shards}
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


# ---------------------------------------------------------------------------------------------
# Checks


class ShardList:
    """A fuzzed multi-shard input: the call wraps it in ``Corpus(shards)``."""

    def __init__(self, shards: list[Any]) -> None:
        self.shards = shards

    def __repr__(self) -> str:
        return f"ShardList({self.shards!r})"


def build_stream(tokens: Any, kwargs: dict[str, Any]):
    source = Corpus(tokens.shards) if isinstance(tokens, ShardList) else tokens
    return stream_token_source(source, **kwargs)


def assert_batches_equal(got, expected, what: str) -> int:
    """Compare batch by batch, as they arrive: with ``reuse_buffers`` a batch held on to is
    overwritten later, so nothing is kept."""
    missing = object()
    count = 0
    for i, (batch, want_batch) in enumerate(
        itertools.zip_longest(got, expected, fillvalue=missing)
    ):
        assert batch is not missing, f"{what}: {i} batches, expected more"
        assert want_batch is not missing, f"{what}: more than the {i} batches expected"
        for array, want in zip(batch, want_batch, strict=True):
            assert array.dtype == np.int64 and array.flags.c_contiguous, f"{what} batch {i}"
            assert array.shape == want.shape, f"{what} batch {i}: {array.shape} != {want.shape}"
            assert np.array_equal(array, want), f"{what} batch {i} differs"
        count += 1
    return count


def check_call(tokens: Any, kwargs: dict[str, Any]) -> str:
    """Run one call against the model (and the reference); return the outcome's kind."""
    try:
        shards, controls = model_call(tokens, kwargs)
    except Rejected as verdict:
        expected = verdict
    else:
        expected = None

    try:
        stream = build_stream(tokens, kwargs)
    except (TypeError, ValueError) as exc:
        assert expected is not None, f"valid call raised {exc!r}"
        assert type(exc) is expected.error, f"{exc!r}: expected {expected.error.__name__}"
        assert expected.name in str(exc), f"{exc!r} does not name {expected.name}"
        outcome = f"{type(exc).__name__}:{expected.name.split('[')[0]}"
    else:
        assert expected is None, f"expected {expected.error.__name__} for {expected.name}"
        check_stream(stream, shards, controls)
        outcome = "batches"

    if not isinstance(tokens, ShardList):
        check_reference(tokens, kwargs, expected)
    return outcome


def check_stream(stream, shards, controls) -> None:
    try:
        count = model_length(shards, controls)
        if count <= sys.maxsize:
            assert len(stream) == count, f"len {len(stream)} != {count}"
        head = itertools.islice(stream, MAX_BATCHES)
        assert_batches_equal(
            head, itertools.islice(model_batches(shards, controls), MAX_BATCHES), "stream"
        )
    finally:
        stream.close()
    assert_no_prefetch_thread()


def assert_no_prefetch_thread() -> None:
    """close() stops a prefetching stream's thread and waits for it."""
    alive = [t for t in threading.enumerate() if t.name.startswith("tokstream")]
    assert not alive, f"threads left running: {alive}"


def uses_spec_options_only(kwargs: dict[str, Any]) -> bool:
    """No tokstream option (targets, sharding, ...) differs from its default."""
    return all(
        type(kwargs[name]) is type(DEFAULTS[name]) and kwargs[name] == DEFAULTS[name]
        for name in EXTRA_ARGS if name in kwargs
    )


def check_reference(tokens: Any, kwargs: dict[str, Any], expected: Rejected | None) -> None:
    """The reference path raises what the fast path raises on the spec's own arguments."""
    spec_kwargs = {k: v for k, v in kwargs.items() if k in SPEC_ARGS}
    extras_only = expected is not None and expected.name in EXTRA_ARGS
    try:
        ref = reference.stream_token_source(tokens, **spec_kwargs)
    except (TypeError, ValueError) as exc:
        assert expected is not None and not extras_only, f"reference raised {exc!r}"
        assert type(exc) is expected.error and expected.name in str(exc), repr(exc)
        return
    assert expected is None or extras_only, "reference accepted an invalid call"
    if expected is not None or not uses_spec_options_only(kwargs):
        return
    fast = build_stream(tokens, kwargs)
    assert_batches_equal(
        itertools.islice(fast, MAX_BATCHES), itertools.islice(ref, MAX_BATCHES), "reference"
    )


# ---------------------------------------------------------------------------------------------
# Resumable state, edited by hand


def decode_key(hex_key: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(hex_key), dtype="<u4").astype(np.uint32)


def cursor_of(state: dict[str, Any]) -> tuple:
    rng = state["rng_state"]
    rng_state = None
    if rng is not None:
        rng_state = ("MT19937", decode_key(rng["key"]), rng["pos"], rng["has_gauss"],
                     rng["cached_gaussian"])
    return state["epoch"], state["position"], rng_state


def leaf_paths(state: dict[str, Any]) -> list[tuple[str, ...]]:
    paths = []
    for key, value in state.items():
        if isinstance(value, dict):
            paths.extend((key, *sub) for sub in leaf_paths(value))
        paths.append((key,))
    return paths


def check_state_edit(tokens, kwargs, steps: int, edit) -> str:
    """Take a state after ``steps`` batches, edit it, load it into a fresh stream.

    The load either raises TypeError/ValueError and leaves the stream where it was, or the
    stream then yields exactly the model's batches from the cursor it reports.
    """
    shards, controls = model_call(tokens, kwargs)
    source = build_stream(tokens, kwargs)
    target = build_stream(tokens, kwargs)
    try:
        outcome = _load_edited_state(source, target, shards, controls, steps, edit)
    finally:
        source.close()
        target.close()
    assert_no_prefetch_thread()
    return outcome


def _load_edited_state(source, target, shards, controls, steps, edit) -> str:
    for _ in itertools.islice(source, steps):
        pass
    state = json.loads(json.dumps(source.state_dict()))
    edited, must_reject = edit(copy.deepcopy(state))
    try:
        target.load_state_dict(edited)
    except (TypeError, ValueError) as exc:
        assert "state" in str(exc), f"{exc!r} does not name the state"
        assert_batches_equal(
            itertools.islice(target, 3), itertools.islice(model_batches(shards, controls), 3),
            "stream after a refused state",
        )
        return "refused"
    assert not must_reject, f"accepted a state whose config or version was edited: {edited!r}"
    loaded = target.state_dict()
    assert loaded["config"] == state["config"]
    global_batch = controls["world_size"] * controls["batch_size"]
    assert loaded["position"] % global_batch == 0
    if edited == state:
        # An unedited state resumes right after the batches the source consumed.
        expected = itertools.islice(model_batches(shards, controls), steps, steps + MAX_BATCHES)
    else:
        expected = itertools.islice(
            model_batches(shards, controls, cursor_of(loaded)), MAX_BATCHES
        )
    assert_batches_equal(
        itertools.islice(target, MAX_BATCHES), expected, "stream after an accepted state"
    )
    return "accepted"


# ---------------------------------------------------------------------------------------------
# Token files: corrupt, truncated and lying


NPY_MAGIC = b"\x93NUMPY"
LLMC_MAGIC, LLMC_HEADER_BYTES = 20240520, 1024


class TokenFile:
    """A fuzzed token file: its bytes, its name, and the arguments ``open_tokens`` gets."""

    def __init__(self, name: str, data: bytes, kwargs: dict[str, Any]) -> None:
        self.name, self.data, self.kwargs = name, data, kwargs

    def __repr__(self) -> str:
        return (f"TokenFile({self.name!r}, {len(self.data)} bytes {self.data[:96]!r}..., "
                f"{self.kwargs!r})")


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
        LLMC_MAGIC, 20240801, 20240522
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


def check_token_file(directory, token_file: TokenFile) -> str:
    """open_tokens gives exactly the file's tokens, or a ValueError/TypeError naming the file;
    a stream over what it gives yields the model's batches, read in bounds (debug build)."""
    path = directory / token_file.name
    path.write_bytes(token_file.data)
    try:
        expected = file_verdict(path, token_file.data, token_file.kwargs)
        try:
            corpus = open_tokens(path, **token_file.kwargs)
        except (TypeError, ValueError) as exc:
            assert isinstance(expected, type), f"a valid file raised {exc!r}"
            assert type(exc) is expected, f"{exc!r}: expected {expected.__name__}"
            names_argument = any(k in str(exc) for k in ("dtype", "format"))
            assert str(path) in str(exc) or names_argument, f"{exc!r} does not name the file"
            return f"file {type(exc).__name__}"
        assert not isinstance(expected, type), f"expected {expected.__name__}, got {corpus}"
        (shard,) = corpus.shards
        assert shard.dtype == expected.dtype.newbyteorder("=")
        assert np.array_equal(shard, expected), "the corpus differs from the file's tokens"
        assert not shard.flags.writeable
        controls = {**DEFAULTS, "block": 3, "batch_size": 5, "epochs": 1, "shuffle": True,
                    "seed": 1}
        stream = stream_token_source(corpus, 3, 5, seed=1)
        try:
            assert_batches_equal(
                itertools.islice(stream, MAX_BATCHES),
                itertools.islice(
                    model_batches([expected.astype(np.int64)], controls), MAX_BATCHES
                ),
                "stream over a token file",
            )
        finally:
            stream.close()
            del stream, corpus, shard
        return "file accepted"
    finally:
        path.unlink()


def cli_flags(kwargs: dict[str, Any], prefix: str = "") -> list[str] | None:
    """The ``open_tokens`` arguments as command-line flags, or None if they have no spelling."""
    flags = []
    for name in ("format", "dtype"):
        value = kwargs.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            return None
        flags += [f"--{prefix}{name}", value]
    return flags


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    from tokstream import cli

    stdout, stderr = io.StringIO(), io.StringIO()
    # argparse writes its usage errors to sys.stderr itself, not to main()'s stderr.
    with contextlib.redirect_stderr(stderr):
        code = cli.main(argv, stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


def check_cli_file(directory, token_file: TokenFile) -> str:
    """``tokstream inspect`` and ``convert`` on any file: the file's true contents and exit
    code 0, or exit code 1 (2 for a flag argparse refuses) with one line of error naming the
    file on stderr: never a traceback, never a half-written output."""
    inspect_flags = cli_flags(token_file.kwargs)
    if inspect_flags is None:
        return "cli skipped"
    path = directory / token_file.name
    output = directory / "converted.npy"
    path.write_bytes(token_file.data)
    try:
        expected = file_verdict(path, token_file.data, token_file.kwargs)
        code, out, err = run_cli(["inspect", "--json", "--quiet", str(path), *inspect_flags])
        assert "Traceback" not in err, err
        if isinstance(expected, type):
            assert code in (1, 2), f"inspect exited {code} on a bad file: {out!r} {err!r}"
            if code == 1:
                assert err.count("\n") == 1 and str(path) in err, err
            return f"cli exit {code}"
        assert code == 0, f"inspect exited {code} on a valid file: {err!r}"
        (summary,) = json.loads(out)
        assert summary["tokens"] == expected.shape[0]
        if expected.size:
            assert summary["min_id"] == int(expected.min())
            assert summary["max_id"] == int(expected.max())
        code, out, err = run_cli(["convert", "--quiet", str(path), str(output),
                                  *cli_flags(token_file.kwargs, "in-")])
        assert code == 0, f"convert exited {code} on a valid file: {err!r}"
        (shard,) = open_tokens(output).shards
        assert np.array_equal(shard, expected), "convert changed the tokens"
        del shard
        return "cli exit 0"
    finally:
        path.unlink()
        output.unlink(missing_ok=True)


NPY_DESCRS = ["'<u2'", "'>u2'", "'|u1'", "'<i8'", "'>i4'", "'<u8'", "'<f8'", "'|b1'",
              "'<m8[s]'", "'O'", "'<U2'", "[('a', '<i4')]", "'<u9'", "'garbage'", "5", "None"]


@st.composite
def token_files(draw) -> TokenFile:
    kind = draw(st.sampled_from(["npy", "llmc", "bin"]))
    count = draw(st.integers(0, 300))
    kwargs: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:
        kwargs["format"] = draw(st.sampled_from(["npy", "llmc", "bin", "zip", None, 3]))
    if draw(st.integers(0, 2)) == 0:
        kwargs["dtype"] = draw(st.sampled_from(
            ["u1", "u2", "<u2", ">u2", "i4", "u8", "f8", "?", "garbage", None, 7, np.int64]
        ))
    pristine = draw(st.integers(0, 2)) == 0  # a well-formed file, else a damaged one
    if kind == "npy":
        dtype = np.dtype(draw(st.sampled_from(["<u2", ">u2", "|u1", "<i4", ">i8", "<u8"])))
        values = draw(hnp.arrays(dtype, count))
        descr, shape = repr(dtype.str), f"({count},)"
        payload = values.tobytes()
        if not pristine:
            descr = draw(st.sampled_from([descr] * 3 + NPY_DESCRS))
            shape = draw(st.sampled_from([
                shape, shape, f"({count + 1},)", f"({count - 1},)", f"({-count - 1},)",
                "(2**62,)", f"({2**62},)", f"({count}, 1)", "()", "(1, 2, 3)", "[3]", "'x'",
                f"({count}.0,)", "((((((((", "{}",
            ]))
        text = f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}"
        text = text + " " * (63 - (len(text) + 10) % 64) + "\n"
        header = NPY_MAGIC + bytes([1, 0]) + len(text).to_bytes(2, "little") + text.encode()
        data, name = header + payload, "tokens.npy"
    elif kind == "llmc":
        values = draw(hnp.arrays(np.dtype("<u2"), count))
        header = np.zeros(256, dtype="<i4")
        header[:3] = (LLMC_MAGIC, 1, count)
        if not pristine:
            header[0] = draw(st.sampled_from([LLMC_MAGIC] * 4 + [20240801, 20240522, 0, -1]))
            header[1] = draw(st.sampled_from([1, 1, 1, 0, 2, -1]))
            header[2] = draw(st.sampled_from([
                count, count, count + 1, count - 1, -1, -(2**31), 2**31 - 1, 2**30,
            ]))
        data, name = header.tobytes() + values.tobytes(), "shard.bin"
    else:
        data = draw(st.binary(max_size=600))
        name = draw(st.sampled_from(["tokens.bin", "tokens.npy", "tokens"]))
    if not pristine:
        edit = draw(st.sampled_from(["none", "truncate", "append", "overwrite"]))
        cut = draw(st.integers(0, max(len(data), 1)))
        if edit == "truncate":
            data = data[:cut]
        elif edit == "append":
            data = data + draw(st.binary(min_size=1, max_size=9))
        elif edit == "overwrite" and data:
            patch = draw(st.binary(min_size=1, max_size=4))
            cut = min(cut, len(data) - 1)
            data = data[:cut] + patch + data[cut + len(patch):]
    return TokenFile(name, data, kwargs)


# ---------------------------------------------------------------------------------------------
# Strategies

INT_DTYPES = [f"{o}{k}{s}" for o in "<>" for k in "iu" for s in (1, 2, 4, 8)]
FLOAT_DTYPES = [f"{o}f{s}" for o in "<>" for s in (2, 4, 8)] + [np.longdouble]
OTHER_DTYPES = ["?", "c8", "c16", "O", "U3", "S3", "M8[D]", "m8[s]", "V4", [("a", "<i4")]]
SPECIAL_FLOATS = [
    0.0, -0.0, 0.5, -1.5, 1.0, 2.0**24 + 1, 2.0**53, 2.0**53 + 2, 2.0**62, 2.0**63, -(2.0**63),
    2.0**64, 1e19, 1e300, 5e-324, math.nan, math.inf, -math.inf, 65504.0,
]


@st.composite
def float_arrays(draw, length: int) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(FLOAT_DTYPES)))
    exact = st.integers(-(2**11), 2**11).map(float)  # exact in every float dtype
    # Half the arrays are valid (exact small integers); one bad element spoils the rest.
    elements = exact if draw(st.booleans()) else st.one_of(
        exact,
        st.integers(INT64_MIN, 2**64).map(float),
        st.sampled_from(SPECIAL_FLOATS),
        st.floats(allow_nan=True, allow_infinity=True),
    )
    values = draw(st.lists(elements, min_size=length, max_size=length))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        array = np.array(values, dtype=dtype)
    if dtype == np.longdouble and draw(st.booleans()):
        # Odd integers above 2**53 are exact in longdouble, not in float64.
        array[: length // 2] += np.longdouble(1)
    return array


@st.composite
def arrays_1d(draw, max_length: int = 300) -> np.ndarray:
    length = draw(st.integers(0, max_length))
    kind = draw(st.sampled_from(["int", "int", "int", "float", "float", "other"]))
    if kind == "int":
        dtype = np.dtype(draw(st.sampled_from(INT_DTYPES)))
        if draw(st.integers(0, 2)):
            # Small values keep windows distinct enough for a wrong window to show.
            info = np.iinfo(dtype)
            low = max(int(info.min), -1000)
            elements = st.integers(low, min(int(info.max), low + 3000))
        else:
            elements = hnp.from_dtype(dtype)
        return draw(hnp.arrays(dtype, length, elements=elements))
    if kind == "float":
        return draw(float_arrays(length))
    dtype = draw(st.sampled_from(OTHER_DTYPES))
    return np.zeros(length, dtype=dtype)


@st.composite
def token_inputs(draw):
    """Arrays of every dtype and layout, Python sequences, odd shapes and multi-shard corpora."""
    shape = draw(st.sampled_from(["1d"] * 8 + ["0d", "2d", "empty2d", "sequence", "shards"]))
    if shape == "0d":
        return np.array(draw(st.integers(0, 5)), dtype=draw(st.sampled_from(INT_DTYPES + ["f8"])))
    if shape == "2d":
        array = draw(arrays_1d(60))
        return array[: len(array) // 2 * 2].reshape(-1, 2)
    if shape == "empty2d":
        return np.zeros((0, draw(st.integers(0, 3))), dtype=draw(st.sampled_from(INT_DTYPES)))
    if shape == "sequence":
        values = st.one_of(
            st.integers(-1000, 1000), st.integers(INT64_MIN - 10, 2**64 + 10),
            st.sampled_from(SPECIAL_FLOATS), st.booleans(), st.none(), st.text(max_size=2),
            st.sampled_from([np.int8(3), np.uint64(2**64 - 1), np.float16(7), np.float32(0.5),
                             np.longdouble(3), np.timedelta64(2, "s"), np.True_, 1j]),
        )
        # Mostly clean sequences, so that valid ones get streamed too.
        clean = st.lists(st.integers(-1000, 1000), max_size=200)
        items = draw(st.one_of(clean, clean, st.lists(values, max_size=40)))
        return tuple(items) if draw(st.booleans()) else items
    if shape == "shards":
        dtype = np.dtype(draw(st.sampled_from(INT_DTYPES)))
        count = draw(st.integers(0, 4))
        shards = [np.arange(draw(st.integers(0, 80)), dtype=np.int64).astype(dtype) * 3 + i
                  for i in range(count)]
        if count and draw(st.integers(0, 5)) == 0:
            shards[-1] = shards[-1].astype(draw(st.sampled_from(INT_DTYPES + ["f8"])))
        return ShardList(shards)
    array = draw(arrays_1d())
    layout = draw(st.sampled_from(
        ["contiguous"] * 4 + ["strided", "reversed", "readonly", "byteswapped", "list"]
    ))
    if layout == "strided":
        doubled = np.empty(2 * len(array), dtype=array.dtype)
        doubled[::2] = array
        return doubled[::2]
    if layout == "reversed":
        return array[::-1]
    if layout == "readonly":
        array.flags.writeable = False
    elif layout == "byteswapped" and array.dtype.kind in "iuf":
        return array.astype(array.dtype.newbyteorder("S"))
    elif layout == "list" and array.dtype.kind in "iuf":
        return list(array)
    return array


GARBAGE = st.one_of(
    st.integers(-3, 0), st.integers(2**62, 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(), st.text(max_size=3),
    st.sampled_from([
        np.int32(3), np.uint8(2), np.float32(2.0), np.float64(2.5), np.longdouble(3),
        np.timedelta64(2, "s"), np.True_, 3 + 0j, "4", b"4", [4], np.array(4), np.array([4]),
        2**32, -(2**63),
    ]),
)


def control(valid):
    """Mostly valid, so that most calls get as far as streaming."""
    return st.sampled_from([True] * 7 + [False]).flatmap(lambda ok: valid if ok else GARBAGE)


@st.composite
def call_kwargs(draw) -> dict[str, Any]:
    kwargs = {
        "block": draw(control(st.integers(1, 40))),
        "batch_size": draw(control(st.integers(1, 50))),
    }
    optional = {
        "epochs": control(st.integers(0, 3)),
        "shuffle": control(st.booleans()),
        "seed": control(st.integers(0, 2**32 - 1)),
        "targets": control(st.sampled_from(["next", "shifted"])),
        "world_size": control(st.integers(1, 4)),
        "rank": control(st.integers(0, 3)),
        "drop_last": control(st.booleans()),
        "permutation": control(st.sampled_from(["materialized", "implicit"])),
        "prefetch": control(st.integers(0, 3)),
        "reuse_buffers": control(st.integers(0, 6)),
    }
    for name, strategy in optional.items():
        if draw(st.booleans()):
            kwargs[name] = draw(strategy)
    if "world_size" in kwargs and "rank" in kwargs and draw(st.booleans()):
        # Keep most multi-rank calls valid.
        try:
            kwargs["rank"] = model_int(kwargs["rank"], "rank") % max(
                model_int(kwargs["world_size"], "world_size"), 1)
        except Rejected:
            pass
    return kwargs


STATE_GARBAGE = st.one_of(
    GARBAGE, st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3),
                                                                  st.integers(), max_size=2),
)


@st.composite
def state_edits(draw):
    """A function editing a state dict, returning it and whether it must be refused."""
    action = draw(st.sampled_from(["nothing", "replace", "replace", "delete", "nudge", "key",
                                   "whole"]))
    choose = draw(st.randoms(use_true_random=False))
    garbage = draw(STATE_GARBAGE)
    nudge = draw(st.sampled_from([1, -1, 2, 7, 2**31, 2**32, 2**63, -(2**63)]))
    key_edit = draw(st.sampled_from(["flip", "truncate", "space", "nonhex", "zeros", "upper"]))

    def edit(state):
        if action == "nothing":
            return state, False
        if action == "whole":
            return garbage, True
        path = choose.choice(leaf_paths(state))
        parent = state
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        before = parent[last]
        if action == "key" and state.get("rng_state"):
            path, parent, last = ("rng_state", "key"), state["rng_state"], "key"
            before, text = parent[last], parent[last]
            position = choose.randrange(len(text))
            parent[last] = {
                "flip": text[:position] + ("0" if text[position] != "0" else "1")
                + text[position + 1:],
                "truncate": text[:position],
                "space": text[:position] + " " + text[position + 1:],
                "nonhex": text[:position] + "g" + text[position + 1:],
                "zeros": "0" * len(text),
                "upper": text.upper(),
            }[key_edit]
        elif action == "delete":
            del parent[last]
            return state, path[0] in ("version", "config", "epoch", "position", "rng_state")
        elif action == "nudge" and isinstance(before, int) and not isinstance(before, bool):
            parent[last] = before + nudge
        else:
            parent[last] = garbage
        changed = type(parent[last]) is not type(before) or parent[last] != before
        return state, changed and path[0] in ("version", "config")

    return edit


@st.composite
def resumable_calls(draw):
    """Valid calls on a small corpus, for the state edits."""
    length = draw(st.integers(1, 200))
    tokens = np.arange(length, dtype=draw(st.sampled_from(["u2", "i4", "i8"]))) * 7 % 1009
    world_size = draw(st.integers(1, 3))
    kwargs = {
        "block": draw(st.integers(1, 12)), "batch_size": draw(st.integers(1, 20)),
        "epochs": draw(st.integers(1, 3)), "shuffle": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)), "world_size": world_size,
        "rank": draw(st.integers(0, world_size - 1)),
        "drop_last": draw(st.booleans()),
        "permutation": draw(st.sampled_from(["materialized", "implicit"])),
        "prefetch": draw(st.sampled_from([0, 0, 1, 3])),
        "reuse_buffers": draw(st.sampled_from([0, 0, 5])),
    }
    return tokens, kwargs, draw(st.integers(0, 25))


# ---------------------------------------------------------------------------------------------
# Running


class Tally:
    """What the fuzzer tried, for the report."""

    def __init__(self) -> None:
        self.executions = 0
        self.outcomes: dict[str, int] = {}

    def add(self, outcome: str) -> None:
        self.executions += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


def guarded(function, *args):
    """Run one example with warnings as errors and a watchdog against hangs."""
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return function(*args)
    finally:
        faulthandler.cancel_dump_traceback_later()


def run(seconds: float, examples: int, seed: int | None) -> Tally:
    """Alternate the two properties in rounds of ``examples`` until ``seconds`` have passed."""
    tally = Tally()
    common = settings(
        deadline=None, database=None, max_examples=examples,
        suppress_health_check=list(HealthCheck),
    )

    @common
    @given(tokens=token_inputs(), kwargs=call_kwargs())
    def calls(tokens, kwargs):
        tally.add("call " + guarded(check_call, tokens, kwargs))

    @common
    @given(call=resumable_calls(), edit=state_edits())
    def states(call, edit):
        tokens, kwargs, steps = call
        tally.add("state " + guarded(check_state_edit, tokens, kwargs, steps, edit))

    directory = Path(tempfile.mkdtemp(prefix="fuzz_stream_"))

    @common
    @given(token_file=token_files())
    def files(token_file):
        tally.add(guarded(check_token_file, directory, token_file))
        tally.add(guarded(check_cli_file, directory, token_file))

    stop = time.monotonic() + seconds
    try:
        for round_number in itertools.count():
            for test in (calls, states, files):
                (test if seed is None else hypothesis.seed(seed + round_number)(test))()
            if time.monotonic() >= stop:
                return tally
    finally:
        shutil.rmtree(directory)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="stop after this long")
    parser.add_argument("--examples", type=int, default=200,
                        help="examples per round of each property")
    parser.add_argument("--seed", type=int, default=None, help="reproduce a run")
    args = parser.parse_args(argv)
    started = time.monotonic()
    tally = run(args.seconds, args.examples, args.seed)
    elapsed = time.monotonic() - started
    print(f"fuzz_stream: {tally.executions} executions in {elapsed:.1f} s "
          f"({tally.executions / max(elapsed, 1e-9):.0f}/s)")
    for outcome, count in sorted(tally.outcomes.items(), key=lambda kv: -kv[1]):
        print(f"  {count:8d}  {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
