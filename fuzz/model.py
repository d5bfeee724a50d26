"""The fuzz harness' model: which calls are valid, and what they yield.

It shares no code with tokstream's validation or kernel: it converts token ids with Python
integers, slices windows with NumPy, evaluates the implicit permutation's Feistel network in
Python, and reads token files with ``np.load``/``np.frombuffer``. A call the model rejects raises
:class:`Rejected`, naming the error type and the argument the message must name.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from fuzz.schedule import StagedSchedule, mixture_stages
from tokstream._order import implicit_round_keys

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
    "stride",
    "eos",
    "windows",
    "extras",
    "out_dtype",
    "instance_filter",
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
    "stride": 1,
    "eos": None,
    "windows": "cross",
    "extras": (),
    "out_dtype": "int64",
    "instance_filter": None,
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


class DocumentList(ShardList):
    """Fuzzed recorded documents (arrays of one dtype): the call wraps them in
    ``Corpus.from_documents``; the model sees one shard, a document starting at each array."""

    def __init__(self, documents: list[np.ndarray]) -> None:
        super().__init__([np.concatenate(documents)])
        self.documents = documents
        #: The token index of each document's first token, past the first.
        self.starts = set(np.cumsum([len(d) for d in documents])[:-1].tolist())

    def __repr__(self) -> str:
        return f"DocumentList({self.documents!r})"


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
        (dtype,) = stored
    else:
        shards = [model_tokens(tokens, "token_ids")]
        kind = tokens.dtype.kind if isinstance(tokens, np.ndarray) else "f"
        dtype = tokens.dtype.newbyteorder("=") if kind in "iu" else np.dtype("i8")
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
    # Windows start every stride tokens of each shard, while start + block stays inside it.
    controls["stride"] = model_ranged(args["stride"], "stride", 1)
    # A document ends after every token equal to eos; "within" keeps the windows inside one.
    controls["eos"] = None if args["eos"] is None else model_int(args["eos"], "eos")
    controls["windows"] = model_choice(args["windows"], "windows", ("cross", "within"))
    controls["extras"] = model_extras(args["extras"])
    # cu_seqlens are int32 offsets into a flattened batch of batch_size * block positions.
    if "cu_seqlens" in controls["extras"] and controls["batch_size"] * controls["block"] >= 2**31:
        raise Rejected(ValueError, "extras")
    # Recorded document starts, per shard: the tokens the eos rule does not find.
    controls["recorded"] = [tokens.starts if isinstance(tokens, DocumentList) else set()] * len(
        shards
    )
    # Unset, the reference's order where it is at stake: what the reference takes (an array or
    # a sequence, not a corpus of shards or documents) streamed in its windows (the harness
    # passes no mixture); else the implicit one.
    reference_windows = (controls["stride"], controls["eos"], controls["windows"]) == (
        1,
        None,
        "cross",
    )
    permutation = kwargs.get("permutation")
    if permutation is None:
        reference_input = not isinstance(tokens, ShardList)
        permutation = "materialized" if reference_windows and reference_input else "implicit"
    controls["permutation"] = model_choice(permutation, "permutation", ("materialized", "implicit"))
    # A background thread assembling batches ahead changes nothing about them.
    controls["prefetch"] = model_ranged(args["prefetch"], "prefetch", 0)
    # Nor does a ring of reused buffers, but for when a batch is overwritten: never before the
    # caller has received reuse_buffers more, whatever prefetch is (checked by the runner).
    controls["reuse_buffers"] = model_ranged(args["reuse_buffers"], "reuse_buffers", 0)
    # Checked against the corpus once the options are: a token id of its dtype.
    if controls["eos"] is not None:
        # ... and an int64 value, as every token id is (uint64 ids past 2**63 - 1 are refused).
        info = np.iinfo(dtype)
        low, high = max(int(info.min), INT64_MIN), min(int(info.max), INT64_MAX)
        if not low <= controls["eos"] <= high:
            raise Rejected(ValueError, "eos")
    # The batches' dtype: position ids below block must fit it.
    controls["out_dtype"] = model_out_dtype(args["out_dtype"])
    if controls["out_dtype"] == "int32" and controls["block"] > 2**31:
        raise Rejected(ValueError, "out_dtype")
    # The repetition filter: a row's loss mask is cleared, so the batch carries one.
    controls["instance_filter"] = model_instance_filter(args["instance_filter"])
    if controls["instance_filter"] is not None and "loss_mask" not in controls["extras"]:
        controls["extras"] = ("loss_mask", *controls["extras"])
    return shards, controls


def model_instance_filter(value: Any) -> tuple[int, int, int] | None:
    """``(min_period, max_period, max_count)``: True gives OLMo-core's (1, 13, 32), a dict
    some of them (each an int in [1, 2**31]), None and False no filter."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return (1, 13, 32) if value else None
    if not isinstance(value, dict):
        raise Rejected(TypeError, "instance_filter")
    names = ("min_period", "max_period", "max_count")
    if any(key not in names for key in value):
        raise Rejected(ValueError, "instance_filter")
    settings = dict(zip(names, (1, 13, 32), strict=True))
    for name in names:
        if name in value:
            settings[name] = model_ranged(value[name], f"instance_filter[{name!r}]", 1, 2**31)
    if settings["max_period"] < settings["min_period"]:
        raise Rejected(ValueError, "instance_filter")
    return settings["min_period"], settings["max_period"], settings["max_count"]


def model_repeats(tokens: list[int], settings: tuple[int, int, int]) -> bool:
    """Whether some ``p`` in ``[min_period, max_period]`` has a unit of ``p`` tokens repeated
    ``max(max_count, 3)`` times in a row in ``tokens`` (OLMo-core reports no run of fewer than
    three), looked for start by start."""
    low, high, count = settings
    times = max(count, 3)
    for p in range(low, high + 1):
        for start in range(len(tokens) - times * p + 1):
            if all(tokens[start + j] == tokens[start + j % p] for j in range(times * p)):
                return True
    return False


def filtered(batch: dict[str, Any], windows, after, c: dict[str, Any]) -> dict[str, Any]:
    """A window batch with the repetition filter: rows whose window and target hold a run keep
    their place, their loss mask cleared and their ``"instance_mask"`` False."""
    last = after if after.ndim == 1 else after[:, -1]
    kept = np.array(
        [
            not model_repeats([*map(int, row), int(end)], c["instance_filter"])
            for row, end in zip(windows, last, strict=True)
        ],
        dtype=bool,
    ).reshape(-1)
    mask = batch["loss_mask"].copy()
    mask[~kept] = False
    return {**batch, "loss_mask": mask, "instance_mask": kept}


def model_out_dtype(value: Any) -> str:
    """``"int64"`` or ``"int32"``, spelled as a str or an ``np.dtype`` of native byte order
    (not a scalar type such as ``np.int32``), or Rejected."""
    if not isinstance(value, (str, np.dtype)):
        raise Rejected(TypeError, "out_dtype")
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise Rejected(ValueError, "out_dtype") from None
    if dtype.isnative and dtype in (np.dtype(np.int64), np.dtype(np.int32)):
        return dtype.name
    raise Rejected(ValueError, "out_dtype")


class Refused:
    """A batch the stream must refuse whole: a token of it does not fit ``out_dtype="int32"``
    (a ValueError naming out_dtype, the stream not moved)."""

    def __repr__(self) -> str:
        return "Refused()"


#: The model's verdict for such a batch.
REFUSED = Refused()


def in_out_dtype(batch: Any, c: dict[str, Any]) -> Any:
    """An int64 model batch as the stream writes it in ``c["out_dtype"]``: tokens and position
    ids cast to int32, or :data:`REFUSED` when a token does not fit (the other extras keep
    their dtypes)."""
    if c.get("out_dtype", "int64") == "int64":
        return batch
    tokens = (batch["input_ids"], batch["labels"]) if isinstance(batch, dict) else batch
    if any(t.size and not (-(2**31) <= t.min() and t.max() < 2**31) for t in tokens):
        return REFUSED
    if not isinstance(batch, dict):
        return tuple(t.astype(np.int32) for t in batch)
    narrow = ("input_ids", "labels", "position_ids")
    return {k: v.astype(np.int32) if k in narrow else v for k, v in batch.items()}


#: The batch extras of a stream over a corpus, and the one only a mixture gives.
DOCUMENT_EXTRAS = ("position_ids", "loss_mask", "cu_seqlens")


def model_extras(value: Any) -> tuple[str, ...]:
    """A tuple or list of distinct extra names (a lone string is not one)."""
    if not isinstance(value, (list, tuple)):
        raise Rejected(TypeError, "extras")
    names = tuple(
        model_choice(item, f"extras[{i}]", (*DOCUMENT_EXTRAS, "source"))
        for i, item in enumerate(value)
    )
    if len(set(names)) != len(names) or "source" in names:
        raise Rejected(ValueError, "extras")
    return names


def with_extras(windows, after, ends, c) -> dict[str, Any]:
    """The dict batch of ``extras``: ``ends[r, j]`` says token j of row r (of ``block + 1``)
    is the last of its document."""
    block = c["block"]
    batch: dict[str, Any] = {"input_ids": windows, "labels": after}
    positions = np.zeros((len(ends), block), np.int64)
    for r in range(len(ends)):
        for j in range(1, block):
            positions[r, j] = 0 if ends[r, j - 1] else positions[r, j - 1] + 1
    if "position_ids" in c["extras"]:
        batch["position_ids"] = positions
    if "loss_mask" in c["extras"]:
        # A label starts another document when the token it is predicted from ends one.
        mask = ~ends[:, :block]
        batch["loss_mask"] = mask if c["targets"] == "shifted" else mask[:, block - 1]
    if "cu_seqlens" in c["extras"]:
        starts = np.flatnonzero(positions.reshape(-1) == 0)
        cuts = np.append(starts, positions.size)
        batch["cu_seqlens"] = cuts.astype(np.int32)
        batch["max_seqlen"] = int(np.diff(cuts).max())
    return batch


def segments_of(shards: list[np.ndarray], c: dict[str, Any]) -> list[tuple[int, int, int]]:
    """``(shard, first token, length)`` of the pieces windows stay inside: the shards, or with
    ``windows="within"`` the documents (cut after every eos token)."""
    pieces = []
    for index, tokens in enumerate(shards):
        cuts = [0, len(tokens)]
        if c["windows"] == "within":
            inner = set(c["recorded"][index])
            if c["eos"] is not None:
                inner |= {i + 1 for i in np.flatnonzero(tokens == c["eos"]).tolist()}
            cuts[1:1] = sorted(inner - {0, len(tokens)})
        pieces += [(index, a, b - a) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
    return pieces


def _mix64(z: int) -> int:
    mask = (1 << 64) - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def implicit_order(n: int, seed: int, epoch: int, stream: int = 0):
    """The implicit permutation of ``[0, n)``, in Python integers (``stream`` ``s + 1`` for
    source ``s`` of a mixture).

    An alternating Feistel network on ``[0, high_size * 2**low_bits)`` (``2**low_bits`` about
    ``sqrt(n)``), restricted to ``[0, n)`` by cycle walking; see ``tokstream._kernels.order``.
    """
    low_bits = ((n - 1).bit_length() + 1) // 2
    high_size = -(-n // (1 << low_bits))
    low_mask = (1 << low_bits) - 1
    keys = [int(k) for k in implicit_round_keys(seed, epoch, IMPLICIT_ROUNDS, stream)]

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
    space = _window_space(shards, c)
    shape = [(c["world_size"], c["batch_size"], None)]
    for _, order, first, rows, world in model_global_steps(shards, c, shape, cursor):
        starts = [int(order(first + c["rank"] + world * i)) for i in range(rows)]
        yield _model_windows(*space, c, starts)


def _window_space(shards, c):
    segments = segments_of(shards, c)
    per_segment = [windows_in(length, c["block"], c["stride"]) for _, _, length in segments]
    offsets = np.concatenate([[0], np.cumsum(per_segment)]).astype(np.int64)
    return shards, segments, offsets


def model_rows(n: int, position: int, world: int, batch_size: int, drop_last: bool) -> int:
    """Rows of each rank's batch at order ``position`` of an epoch of ``n``: the positions
    left are shared round-robin, fewer than ``world`` left over are skipped, and with
    ``drop_last`` so is a batch of fewer than ``batch_size`` rows."""
    rows = min(batch_size, max(0, n - position) // world)
    return 0 if drop_last and rows < batch_size else rows


def model_positions(n: int, c: dict[str, Any], shapes, cursor: tuple | None = None):
    """``(epoch, first position, rows, world)`` per global step of a run
    whose shape changes: ``shapes`` is ``[(world_size, batch_size, steps), ...]``, each
    streaming ``steps`` global steps (None: to the end) from the position where the one
    before stopped; a cursor with no batch left under the new shape starts the next epoch when
    the shape takes a step (a shape that takes none leaves it where it was).
    Rank ``r`` of a step takes positions ``first + r + k * world``, ``k < rows``."""
    epoch, position = (0, 0) if cursor is None else cursor[:2]
    for world, batch_size, steps in shapes:
        if model_rows(n, 0, world, batch_size, c["drop_last"]) == 0:
            continue  # no epoch has a batch: nothing streamed, the cursor stays
        taken = 0
        while steps is None or taken < steps:
            rows = model_rows(n, position, world, batch_size, c["drop_last"])
            at_epoch, at = (epoch, position) if rows else (epoch + 1, 0)
            if at_epoch >= c["epochs"]:
                break
            epoch, position = at_epoch, at
            rows = model_rows(n, position, world, batch_size, c["drop_last"])
            yield epoch, position, rows, world
            taken += 1
            position += world * batch_size
            if model_rows(n, position, world, batch_size, c["drop_last"]) == 0:
                epoch, position = epoch + 1, 0


def model_global_steps(shards, c: dict[str, Any], shapes, cursor: tuple | None = None):
    """:func:`model_positions` over the windows of ``shards``, each step with its epoch's
    order (position -> window index): ``(epoch, order, first, rows, world)``."""
    n = int(_window_space(shards, c)[2][-1])
    rng = np.random.RandomState(c["seed"])
    if cursor is not None and cursor[2] is not None:
        rng.set_state(cursor[2])
    first_epoch = 0 if cursor is None else cursor[0]
    drawn: dict[int, Any] = {}

    def order_of(epoch: int):
        if not c["shuffle"]:
            return range(n).__getitem__
        if c["permutation"] == "implicit":
            return implicit_order(n, c["seed"], epoch)
        while epoch not in drawn:  # drawn epoch after epoch from one generator
            drawn[first_epoch + len(drawn)] = rng.permutation(n).__getitem__
        return drawn[epoch]

    for epoch, first, rows, world in model_positions(n, c, shapes, cursor):
        yield epoch, order_of(epoch), first, rows, world


def model_reshaped_run(shards, c: dict[str, Any], shapes) -> list[tuple[np.ndarray, np.ndarray]]:
    """The global steps of a run whose ``(world_size, batch_size)`` changes (``shapes`` as for
    :func:`model_positions`), each step's rows in order-position order (all ranks together)."""
    space = _window_space(shards, c)
    steps = []
    for _, order, first, rows, world in model_global_steps(shards, c, shapes):
        starts = [int(order(first + i)) for i in range(rows * world)]
        steps.append(_model_windows(*space, c, starts))
    return steps


def windows_in(length: int, block: int, stride: int) -> int:
    """Window starts 0, stride, 2 stride, ... with start + block < length."""
    return (length - block - 1) // stride + 1 if length > block else 0


def _model_windows(shards, segments, offsets, c, indices):
    block, eos, windows, after, ends = c["block"], c["eos"], [], [], []
    for index in indices:
        segment = int(np.searchsorted(offsets, index, side="right")) - 1
        shard, first, _ = segments[segment]
        local = first + (index - int(offsets[segment])) * c["stride"]
        tokens = shards[shard]
        windows.append(tokens[local : local + block])
        recorded = c["recorded"][shard]
        ends.append(
            [
                (eos is not None and int(tokens[local + j]) == eos) or local + j + 1 in recorded
                for j in range(block + 1)
            ]
        )
        if c["targets"] == "next":
            after.append(tokens[local + block])
        else:
            after.append(tokens[local + 1 : local + block + 1])
    batch = np.array(windows, dtype=np.int64), np.array(after, dtype=np.int64)
    if not c["extras"]:
        return in_out_dtype(batch, c)
    extras = with_extras(*batch, np.array(ends, bool).reshape(-1, block + 1), c)
    if c.get("instance_filter") is not None:
        extras = filtered(extras, *batch, c)
    return in_out_dtype(extras, c)


def model_length(shards, c) -> int:
    per_shard = sum(windows_in(n, c["block"], c["stride"]) for _, _, n in segments_of(shards, c))
    used = per_shard // c["world_size"] * c["world_size"]
    full, rest = divmod(used, c["world_size"] * c["batch_size"])
    return c["epochs"] * (full + (1 if rest and not c["drop_last"] else 0))


# ---------------------------------------------------------------------------------------------
# Mixtures: the schedule by its definition, in fractions


def model_mixture(
    sources: dict[str, np.ndarray], weights: Any, kwargs: dict[str, Any]
) -> tuple[list[np.ndarray], list[tuple[int, list[int]]], dict[str, Any]]:
    """A valid mixture call's sources (int64), stages and controls, or Rejected. The
    harness draws valid names, weights and controls, so only what depends on the draw is
    judged: empty sources, the materialized order, sources without a window."""
    for name, tokens in sources.items():
        if len(tokens) == 0:
            raise Rejected(ValueError, f"sources[{name!r}]")
    if kwargs.get("permutation") == "materialized":
        raise Rejected(ValueError, "permutation")
    arrays = [np.asarray(t).astype(np.int64) for t in sources.values()]
    controls = {**DEFAULTS, "permutation": "implicit", **kwargs}
    for name, tokens in zip(sources, arrays, strict=True):
        if windows_in(len(tokens), controls["block"], controls["stride"]) == 0:
            raise Rejected(ValueError, f"sources[{name!r}]")
    return arrays, mixture_stages(weights, list(sources)), controls


def model_mixture_batches(
    sources: list[np.ndarray],
    stages: list[tuple[int, list[int]]],
    c: dict[str, Any],
    cursor: tuple | None = None,
    shapes=None,
    ranks=None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Global sample ``e N + p`` is local sample ``j`` of source ``s`` by the schedule of
    ``stages``: position ``j mod n_s`` of that source's epoch ``j div n_s``, through its own
    implicit permutation.

    ``cursor`` is ``(epoch, position, None)`` to start from instead of the beginning; ``shapes``
    (see :func:`model_positions`) a run whose shape changes; ``ranks="all"``: each global step
    holds every rank's rows in order-position order (rank 0's row 0, rank 1's row 0, ...),
    else the step is rank ``c["rank"]``'s batch.
    """
    schedule = StagedSchedule(stages)
    counts = [windows_in(len(t), c["block"], c["stride"]) for t in sources]
    n = mixture_epoch(counts, c)
    orders: dict[tuple[int, int], Any] = {}
    shapes = shapes or [(c["world_size"], c["batch_size"], None)]
    for epoch, base, rows, world in model_positions(n, c, shapes, cursor):
        windows, after, row_sources = [], [], []
        samples = [
            base + rank + world * i
            for i in range(rows)
            for rank in (range(world) if ranks == "all" else [c["rank"]])
        ]
        for sample in samples:
            source, local = schedule.sample(epoch * n + sample)
            row_sources.append(source)
            source_epoch, position = divmod(local, counts[source])
            if c["shuffle"]:
                key = (source, source_epoch)
                if key not in orders:
                    orders[key] = implicit_order(
                        counts[source], c["seed"], source_epoch, source + 1
                    )
                position = orders[key](position)
            start = position * c["stride"]
            tokens = sources[source]
            windows.append(tokens[start : start + c["block"]])
            if c["targets"] == "next":
                after.append(tokens[start + c["block"]])
            else:
                after.append(tokens[start + 1 : start + c["block"] + 1])
        x, y = np.array(windows, dtype=np.int64), np.array(after, dtype=np.int64)
        if "source" in c["extras"]:
            yield {"input_ids": x, "labels": y, "source": np.array(row_sources, np.int64)}
        else:
            yield x, y


def mixture_epoch(counts: list[int], c: dict[str, Any]) -> int:
    """Samples in an epoch: ``samples=``, else every window of every source once."""
    return sum(counts) if c.get("samples") is None else c["samples"]


def model_mixture_length(sources: list[np.ndarray], c: dict[str, Any]) -> int:
    n = mixture_epoch([windows_in(len(t), c["block"], c["stride"]) for t in sources], c)
    used = n // c["world_size"] * c["world_size"]
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
#: llm.c (magic, version) -> token dtype: GPT-2 shards and llama-3 shards.
LLMC_KINDS = {(20240520, 1): "<u2", (20240801, 7): "<u4"}
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPES = {1: "<u1", 2: "<i1", 3: "<i2", 4: "<i4", 5: "<i8", 8: "<u2"}
FORMATS = ("npy", "bin", "llmc", "megatron", "arrow")


class TokenFile:
    """A fuzzed token file: its bytes, its name, the arguments ``open_tokens`` gets, and the
    files written beside it (a Megatron ``.idx``)."""

    def __init__(
        self, name: str, data: bytes, kwargs: dict[str, Any], beside: dict[str, bytes] | None = None
    ) -> None:
        self.name, self.data, self.kwargs = name, data, kwargs
        self.beside = beside or {}

    def names(self) -> list[str]:
        """The file opened and the files beside it: an error may name any of them."""
        return [self.name, *self.beside]

    def __repr__(self) -> str:
        beside = {name: data[:64] for name, data in self.beside.items()}
        return (
            f"TokenFile({self.name!r}, {len(self.data)} bytes {self.data[:96]!r}..., "
            f"{self.kwargs!r}, beside={beside!r})"
        )


def file_verdict(path, data: bytes, kwargs: dict[str, Any]) -> np.ndarray | type[Exception]:
    """What ``open_tokens(path, **kwargs)`` must give: the tokens, or the error type it raises.

    Arguments are checked first (a TypeError for a non-integer dtype or a non-string format,
    a ValueError for an unknown format); anything wrong with the file is a ValueError.
    """
    fmt, want = kwargs.get("format"), kwargs.get("dtype")
    if fmt is not None and not isinstance(fmt, str):
        return TypeError
    if fmt is not None and fmt not in FORMATS:
        return ValueError
    if want is not None:
        try:
            if np.dtype(want).kind not in "iu":
                return TypeError
        except TypeError:
            return TypeError
    read = independent_read(path, data, kwargs)
    return ValueError if read is None else read[0]


def _looks_like_another_kind(data: bytes) -> bool:
    """Archives, compressed files, Parquet, Feather v1 and JSON, as the files docs list them."""
    head = data[:256]
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")) and b"PK\x05\x06" in data[-65557:]:
        return True
    if head.startswith((b"\x1f\x8b\x08", b"\x28\xb5\x2f\xfd", b"FEA1")):
        return True
    if head.startswith(b"PAR1") and data.endswith(b"PAR1"):
        return True
    if any(byte < 32 and byte not in (9, 10, 13) for byte in head):
        return False
    text = head.lstrip(b" \t\r\n")
    if len(text) < 2 or text[:1] not in (b"{", b"["):
        return False
    if text[1:].lstrip(b" \t\r\n")[:1] not in [bytes([c]) for c in b'"{}[]-0123456789tfn']:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3 and len(head) == 256
    return True


def detect(path, data: bytes) -> str | None:
    """The format the content says, or None for a file that must be refused."""
    if data.startswith(NPY_MAGIC):
        return "npy"
    if data.startswith(MEGATRON_MAGIC):
        return "megatron"
    if data.startswith(b"ARROW1"):
        return "arrow"
    if data.startswith(b"\xff\xff\xff\xff") and len(data) >= 8:
        if 0 < int.from_bytes(data[4:8], "little", signed=True) <= len(data) - 8:
            return "arrow"
    magic = int.from_bytes(data[:4], "little") if len(data) >= 4 else None
    if magic in (20240520, 20240801):
        return "llmc"
    if magic == 20240522 or _looks_like_another_kind(data):
        return None
    if str(path).endswith(".npy"):
        return None
    index = str(path)[:-4] + ".idx"
    if str(path).endswith(".bin") and os.path.exists(index):
        with open(index, "rb") as f:
            if f.read(9) == MEGATRON_MAGIC:
                return "megatron"
    return "bin"


def independent_read(
    path, data: bytes, kwargs: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """What the file holds, read without tokstream: its tokens and the document offsets it
    records (None without documents), or None if it is not a valid token file."""
    fmt = kwargs.get("format")
    if fmt != "bin":
        detected = detect(path, data)
        if detected is None or (fmt is not None and fmt != detected):
            return None
        fmt = detected
    want = kwargs.get("dtype")
    offsets = None
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
        dtype = LLMC_KINDS.get((magic, version))
        if dtype is None or count < 0:
            return None
        if LLMC_HEADER_BYTES + np.dtype(dtype).itemsize * count != len(data):
            return None
        tokens = np.frombuffer(data[LLMC_HEADER_BYTES:], dtype=dtype)
    elif fmt == "megatron":
        if data.startswith(MEGATRON_MAGIC) and not str(path).endswith(".idx"):
            return None  # an index must be named PREFIX.idx
        tokens, offsets = _megatron_read(str(path))
    elif fmt == "arrow":
        tokens, offsets = _arrow_read(data)
    else:
        dtype = np.dtype(np.uint16 if want is None else want)
        if len(data) % dtype.itemsize:
            return None
        tokens = np.frombuffer(data, dtype=dtype)
    if tokens is None:
        return None
    if want is not None and tokens.dtype.newbyteorder("=") != np.dtype(want).newbyteorder("="):
        return None
    if tokens.dtype.kind == "u" and tokens.size and int(tokens.max()) > INT64_MAX:
        return None
    return tokens, offsets


def recorded_offsets(path, data: bytes, kwargs: dict[str, Any]) -> np.ndarray | None:
    """The document offsets a file the model accepts records (Megatron's document indices as
    token offsets, an Arrow list column's offsets), read without tokstream; None for the
    formats without documents (and an Arrow file without a record batch)."""
    _, offsets = independent_read(path, data, kwargs)
    return offsets


def _megatron_read(path: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Megatron-LM's index read with struct-level care, every field checked by hand: the
    tokens and the documents' token offsets, or None for both."""
    prefix = path[:-4] if path.endswith((".bin", ".idx")) else path
    try:
        with open(prefix + ".idx", "rb") as f:
            index = f.read()
        with open(prefix + ".bin", "rb") as f:
            tokens_bytes = f.read()
    except OSError:
        return None, None
    if len(index) < 34 or not index.startswith(MEGATRON_MAGIC):
        return None, None
    version = int.from_bytes(index[9:17], "little")
    code = index[17]
    sequences = int.from_bytes(index[18:26], "little")
    documents = int.from_bytes(index[26:34], "little")
    if version != 1 or code not in MEGATRON_DTYPES or documents == 0:
        return None, None
    if len(index) != 34 + 12 * sequences + 8 * documents:
        return None, None
    dtype = np.dtype(MEGATRON_DTYPES[code])
    lengths = np.frombuffer(index, "<i4", sequences, 34).astype(np.int64)
    pointers = np.frombuffer(index, "<i8", sequences, 34 + 4 * sequences)
    starts = np.frombuffer(index, "<i8", documents, 34 + 12 * sequences)
    if np.any(lengths < 0):
        return None, None
    expected = 0
    for length, pointer in zip(lengths.tolist(), pointers.tolist(), strict=True):
        if pointer != expected * dtype.itemsize:
            return None, None
        expected += length
    if len(tokens_bytes) != expected * dtype.itemsize:
        return None, None
    if starts[0] != 0 or starts[-1] != sequences or np.any(np.diff(starts) < 0):
        return None, None
    offsets = np.concatenate([[0], np.cumsum(lengths)])[starts]
    return np.frombuffer(tokens_bytes, dtype=dtype), offsets


def _arrow_read(data: bytes) -> tuple[np.ndarray | None, np.ndarray | None]:
    """pyarrow's own reading of the one record batch's ``input_ids`` lists, fully validated:
    the tokens and the lists' offsets (None without a batch), or None for both."""
    try:
        import pyarrow as pa
    except ImportError:
        return None, None
    try:
        source = pa.BufferReader(data)
        if data.startswith(b"ARROW1"):
            reader = pa.ipc.open_file(source)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        else:
            reader = pa.ipc.open_stream(source)
            batches = list(reader)
        for batch in batches:
            batch.validate(full=True)
        schema = reader.schema
        names = schema.names  # undecodable field names raise here
    except Exception:
        return None, None
    if len(batches) > 1 or "input_ids" not in names:
        return None, None
    kind = schema.field("input_ids").type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return None, None
    if not pa.types.is_integer(kind.value_type):
        return None, None
    if not batches:
        return np.zeros(0, dtype=kind.value_type.to_pandas_dtype()), None
    column = batches[0].column("input_ids")
    if column.null_count:
        return None, None
    values = column.flatten()
    if values.null_count:
        return None, None
    offsets = np.asarray(column.offsets, np.int64)
    tokens = np.asarray(values.to_numpy(zero_copy_only=False), dtype=values.type.to_pandas_dtype())
    return tokens, offsets - offsets[0]
