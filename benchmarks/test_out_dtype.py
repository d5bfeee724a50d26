"""What ``out_dtype="int32"`` gains over the default int64 batches, against the floors of the bytes.

The documents corpus of conftest (as uint16 and as int64, recorded documents of mean 2,000
tokens). Every stream is shuffled with the implicit permutation and yields
``targets="shifted"``; the two sides of a ratio differ only in ``out_dtype``. Cases: the plain
stream, and the stream with every document extra (``position_ids``, ``loss_mask``,
``cu_seqlens``, ``document_ids``) under ``windows="cross"``, ``"within"`` and ``"packed"``
(``pad=0``). Target: int32 at least 1.3x the int64 rate with every extra. Groups, each with an
int32 and an int64 side (the summary prints int32 / int64, by the wall clock and CPU time):

- ``stream``: tokstream's stream;
- ``copy floor``: a plain C loop (:func:`tokstream.bench._loop.copy_rows`, written apart from
  tokstream's kernels) copying each row's window and shifted labels from a random start into
  reused buffers, converting as it goes, and with extras writing a ramp into the position ids,
  ones into the mask and 0 into the piece ids: what any implementation writing those bytes must
  do, at the best prefetch distance of :func:`tokstream.bench.baselines.best_c_loop_distance`.
  Where its ratio is below 1.3, so is every implementation's;
- ``document floor`` (cross and within): the same loop doing the whole work of such a batch
  (:func:`tokstream.bench._loop.copy_document_rows`): each row's documents found, the extras
  restarting at every document start, ``cu_seqlens``, in one call a batch, with no order to keep
  and nothing to check.

Last in each case with extras, ``test_limits`` notes what the floors allow a stream that keeps
its order and hands out a dict: ``book``, the stream's own per-batch CPU work with the copy
left out (``next()`` with the filler replaced by one that writes nothing; int32 side) less the
floors' own draw of random starts, and the floor's int32/int64 ratio by CPU time with ``book``
added to both sides (the document floor across and within); for packed rows also ``pack``, the
CPU microseconds a batch of packing an epoch's groups (best fit, keyed orders, the group's
table), and the copy floor's ratio with it and with ``book``; then the stream's CPU
microseconds a batch beyond each floor, int64 and int32 (measured earlier in the same run).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from tokstream import Corpus, stream_token_source
from tokstream.bench import _loop
from tokstream.bench.baselines import best_c_loop_distance
from tokstream.packing import Packing

SHAPES = [(1024, 64), (2048, 32), (4096, 16), (128, 512)]
DTYPES = ["uint16", "int64"]
EXTRAS = ("position_ids", "loss_mask", "cu_seqlens", "document_ids")
OUTS = ["int32", "int64"]
#: Each case: its name and the stream options both sides share.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("plain", {}),
    ("cross+extras", {"extras": EXTRAS}),
    ("within+extras", {"windows": "within", "extras": EXTRAS}),
    ("packed+extras", {"windows": "packed", "pad": 0, "extras": EXTRAS}),
]
CASE_IDS = [name for name, _ in CASES]
#: The cases the document floor does the work of.
DOCUMENT_FLOORS = ("cross+extras", "within+extras")


class CopyFloor:
    """The bytes of a batch written by a plain C loop from random window starts."""

    def __init__(
        self, ids: np.ndarray, block: int, batch_size: int, out: str, extras: bool, distance: int
    ) -> None:
        self.ids, self.distance = ids, distance
        self.rng = np.random.default_rng(0)
        self.starts_below = ids.shape[0] - block
        self.batch_size = batch_size
        self.inputs = np.empty((batch_size, block), out)
        self.labels = np.empty((batch_size, block), out)
        self.extras: tuple[np.ndarray | None, ...] = (
            (
                np.empty((batch_size, block), out),
                np.empty((batch_size, block), np.uint8),
                np.empty((batch_size, block), np.int32),
            )
            if extras
            else (None, None, None)
        )

    def __call__(self) -> None:
        starts = self.rng.integers(0, self.starts_below, self.batch_size)
        _loop.copy_rows(self.ids, starts, self.inputs, self.labels, *self.extras, self.distance)


class DocumentFloor(CopyFloor):
    """The whole batch of a document stream written by a plain C loop: :class:`CopyFloor` plus
    each row's documents found, the extras restarting at every document start (across) or one
    piece a row (within), and ``cu_seqlens``."""

    def __init__(
        self,
        ids: np.ndarray,
        lengths: np.ndarray,
        block: int,
        batch_size: int,
        out: str,
        within: bool,
        distance: int,
    ) -> None:
        super().__init__(ids, block, batch_size, out, True, distance)
        self.documents = _loop.Documents(ids, lengths, block, within)
        self.starts_below = self.documents.windows
        self.cu_seqlens = np.empty(batch_size * block + 1, np.int32)

    def __call__(self) -> None:
        starts = self.rng.integers(0, self.starts_below, self.batch_size)
        _loop.copy_document_rows(
            self.documents,
            starts,
            self.inputs,
            self.labels,
            *self.extras,
            self.cu_seqlens,
            self.distance,
        )


def make_stream(corpus: Corpus, block: int, batch_size: int, **options: Any) -> Iterator[Any]:
    return stream_token_source(
        corpus,
        block,
        batch_size,
        epochs=10**6,
        seed=0,
        permutation="implicit",
        targets="shifted",
        **options,
    )


_flat: dict[int, np.ndarray] = {}
_distances: dict[tuple[int, int, int], int] = {}


def flat_tokens(corpus: Corpus) -> np.ndarray:
    """The corpus' tokens as one array (the floors read windows from it)."""
    if id(corpus) not in _flat:
        _flat[id(corpus)] = np.concatenate(list(corpus.shards))
    return _flat[id(corpus)]


def distance_for(ids: np.ndarray, block: int, batch_size: int) -> int:
    key = (id(ids), block, batch_size)
    if key not in _distances:
        _distances[key] = best_c_loop_distance(ids, block, batch_size)
    return _distances[key]


def steps(step: Callable[[], Any], batches: int) -> None:
    for _ in range(batches):
        step()


def group_of(dtype: str, shape: tuple[int, int], case: str, what: str) -> str:
    return f"out_dtype {dtype} block={shape[0]} batch={shape[1]} {case}: {what}"


def check_int32_matches_int64(corpus: Corpus, shape: tuple[int, int], options: dict) -> None:
    """The int32 stream's first batch holds the int64 stream's values."""
    narrow = next(make_stream(corpus, *shape, out_dtype="int32", **options))
    wide = next(make_stream(corpus, *shape, out_dtype="int64", **options))
    if isinstance(wide, dict):
        assert wide.keys() == narrow.keys()
        pairs = [(narrow[key], wide[key]) for key in wide]
    else:
        pairs = list(zip(narrow, wide, strict=True))
    for a, b in pairs:
        assert np.array_equal(a, b)


@pytest.mark.parametrize("out", OUTS)
@pytest.mark.parametrize("what", ["stream", "copy floor", "document floor"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{n}" for b, n in SHAPES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_out_dtype(measure, settings, documents_corpus, dtype, shape, case, what, out) -> None:
    name, options = case
    if what == "document floor" and name not in DOCUMENT_FLOORS:
        pytest.skip("the document floor does the work of cross and within windows only")
    block, batch_size = shape
    corpus = documents_corpus(dtype)
    if what == "stream":
        if out == "int32":
            check_int32_matches_int64(corpus, shape, options)
        stream = make_stream(corpus, block, batch_size, out_dtype=out, **options)
        next(stream)
        step: Callable[[], Any] = stream.__next__
    else:
        ids = flat_tokens(corpus)
        distance = distance_for(ids, block, batch_size)
        if what == "copy floor":
            step = CopyFloor(ids, block, batch_size, out, "extras" in options, distance)
        else:
            within = name == "within+extras"
            lengths = corpus.document_lengths
            step = DocumentFloor(ids, lengths, block, batch_size, out, within, distance)
    measure(
        steps,
        args=(step, settings.batches),
        group=group_of(dtype, shape, name, what),
        side=out,
        subject="int32",
        units=settings.batches * batch_size * block,
    )


def bookkeeping(stream: Any, batches: int, monkeypatch: pytest.MonkeyPatch) -> float:
    """CPU microseconds a batch of ``stream``'s own work with the copy left out: ``next()``
    with the plan's fill replaced by one that writes nothing and reports two pieces (so that
    no position ids are read back)."""
    block = stream.options.block
    pieces = (np.array([0, 1, block], np.int32), block - 1)
    with monkeypatch.context() as patch:
        patch.setattr(stream._fill, "into", lambda *args: pieces)
        start = time.process_time()
        for _ in range(batches):
            next(stream)
        return (time.process_time() - start) / batches * 1e6


def draw_cost(floor: CopyFloor, batches: int) -> float:
    """CPU microseconds a batch of the floors' own draw of random starts."""
    start = time.process_time()
    for _ in range(batches):
        floor.rng.integers(0, floor.starts_below, floor.batch_size)
    return (time.process_time() - start) / batches * 1e6


def packing_cost(corpus: Corpus, block: int, batch_size: int) -> float:
    """CPU microseconds a batch of packing an epoch's groups as a shuffled packed stream packs
    each on reaching it (keyed orders, best fit, the group's table)."""
    packing = Packing(corpus.document_boundaries, block, shuffle=True, seed=0)
    order, _ = packing.epoch_offsets(1)
    start = time.process_time()
    for group in order.tolist():
        packing.group_table(group, 1)
    return (time.process_time() - start) / (packing.num_rows / batch_size) * 1e6


def measured_cpu_us(results: Any, dtype: str, shape: tuple[int, int], case: str) -> dict:
    """CPU microseconds a batch of each side of the case measured earlier in this run, by
    ``"what out"`` (``"copy floor int32"``, ...)."""
    tokens = shape[0] * shape[1]
    found = {}
    for what in ("stream", "copy floor", "document floor"):
        for out in OUTS:
            side = results.sides.get(group_of(dtype, shape, case, what), {}).get(out)
            if side is not None and side.cpu_rate:
                found[f"{what} {out}"] = tokens / side.cpu_rate
    return found


def with_added(cpu: dict[str, float], floor: str, microseconds: float) -> str:
    """A floor's int32/int64 ratio by CPU time with ``microseconds`` added to both sides."""
    sides = [cpu.get(f"{floor} {out}") for out in ("int64", "int32")]
    if sides[0] is None or sides[1] is None:
        return f"(the {floor} was not measured in this run)"
    return f"{(sides[0] + microseconds) / (sides[1] + microseconds):.2f}"


@pytest.mark.parametrize("case", CASES[1:], ids=CASE_IDS[1:])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{n}" for b, n in SHAPES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_limits(measure, settings, results, documents_corpus, monkeypatch, dtype, shape, case):
    name, options = case
    block, batch_size = shape
    corpus = documents_corpus(dtype)
    batches = settings.batches * settings.rounds
    stream = make_stream(corpus, block, batch_size, out_dtype="int32", **options)
    next(stream)
    floor = CopyFloor(flat_tokens(corpus), block, batch_size, "int32", True, 0)
    group = group_of(dtype, shape, name, "limits")
    # Timed: the stream's batches with the copy left out (the rate of its bookkeeping).
    book = measure(
        bookkeeping,
        args=(stream, batches, monkeypatch),
        group=group,
        side="next() without the copy",
        units=batches,
        unit="batches/s",
        scale=1,
        rounds=1,
    ) - draw_cost(floor, batches)
    cpu = measured_cpu_us(results, dtype, shape, name)
    text = f"book {book:.1f} us a batch"
    if name in DOCUMENT_FLOORS:
        text += f"; document floor with it {with_added(cpu, 'document floor', book)}"
    else:
        pack = packing_cost(corpus, block, batch_size)
        text += (
            f"; packing {pack:.1f} us a batch; copy floor with it "
            f"{with_added(cpu, 'copy floor', pack)}, and with book "
            f"{with_added(cpu, 'copy floor', pack + book)}"
        )
    for what in ("copy floor", "document floor"):
        beyond = [
            cpu[f"stream {out}"] - cpu[f"{what} {out}"]
            for out in ("int64", "int32")
            if f"stream {out}" in cpu and f"{what} {out}" in cpu
        ]
        if len(beyond) == 2:
            text += (
                f"; the stream beyond the {what}: {beyond[0]:.0f} us int64, {beyond[1]:.0f} int32"
            )
    measure.note(group, text)
