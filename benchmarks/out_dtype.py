"""What ``out_dtype="int32"`` gains over the default int64 batches, as ratios in one process.

``python benchmarks/out_dtype.py [--tokens N] [--rounds R] [--batches K] [--cases A,B]
[--shapes 1024x64,128x512]``

The documents corpus of ``documents_ratios.py`` (10,000,000 seeded ids below 50257 as uint16
and as int64, cut into recorded documents of exponential lengths, mean 2,000). Every stream is
shuffled with the implicit permutation and yields ``targets="shifted"``; the two sides of each
ratio differ only in ``out_dtype``. Cases: the plain stream, and the stream with every document
extra (``position_ids``, ``loss_mask``, ``cu_seqlens``, ``document_ids``) under
``windows="cross"``, ``"within"`` and ``"packed"`` (``pad=0``). Target: int32 at least 1.3x the
int64 rate with every extra.

Beside each case, the *copy floor* of the same bytes (``--floor``, on by default): a plain C
loop (:func:`tokstream.bench._loop.copy_rows`, written apart from tokstream's kernels, built for
this CPU's vector width) that copies each row's window and shifted labels from a random start
into reused buffers of the output dtype in one pass, converting as it goes, and, with extras,
writes a ramp into the position ids, ones into the mask and 0 into the piece ids: what any
implementation writing those bytes must do, with no document logic, no range check and no
per-batch bookkeeping, at the best software-prefetch distance of
:func:`tokstream.bench.baselines.best_c_loop_distance`. Its int32/int64 ratio is what writing half
the bytes buys on this machine, the most the stream's ratio can reach: where the floor's ratio is
below 1.3, so is every implementation's.

Then ``us64`` and ``us32``: the stream's CPU microseconds a batch beyond its floor's, int64
and int32 batches: the work the floor does not do (the order, each row's window and documents,
the extras' logic, the Python around the kernel call). Where the two are equal, that work costs
the same in both dtypes, the stream copies as fast as its floor, and its ratio is the floor's
with that many microseconds added to both sides.

Last, for the cross and within cases, the *document floor* (``docs``, its int32/int64 ratio by
CPU time, then ``ud64`` and ``ud32``, the stream's microseconds a batch beyond it): the same
plain C loop doing the whole work of such a batch
(:func:`tokstream.bench._loop.copy_document_rows`): each row's documents found (a search from
a table of buckets, a step or two), the position ids, mask and piece numbers restarting at
every document start, and ``cu_seqlens``, in one call a batch, with no order to keep and
nothing to check. Its ratio is what halving the output bytes buys a plain implementation of
these batches on this machine; the stream's microseconds beyond it are its per-batch
bookkeeping (the keyed order, locating, the buffers and the dict).

Under each case with extras, a ``limits`` line (``--floor``) says what the floors allow a
stream that keeps its order and hands out a dict: ``book``, the stream's own per-batch work with
the copy left out (``next()`` with the filler replaced by one that writes nothing: the order,
the buffers, the dict, the cursor; int32 side), less the floors' own draw of random starts,
and the floor's ratio with ``book`` added to both sides (the document floor across and within,
the copy floor for packed rows). For packed rows also ``pack`` and ``kern``: the CPU
microseconds a batch that packing the rows costs (every group of one shuffled epoch packed as
the stream packs it on reaching it: the group's keyed orders, best fit and its checked table of
piece addresses, divided by the epoch's batches) and the part of it spent in the compiled
kernels, which the copy floor's ratio then carries too.

Rounds of all sides alternate, so drift on a shared machine hits them alike; each figure is the
median over ``--rounds`` rounds of ``--batches`` batches (first batches drawn untimed). Printed:
median Mtok/s of each side (wall clock) and the int32/int64 ratios by the wall clock and by the
process' CPU time: on a host whose cores other processes keep busy the CPU-time ratio leaves
out the time this process waited for a core (not the memory traffic the others cause).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from documents_ratios import DTYPES, SHAPES, documents_corpus, make_stream

from tokstream import Corpus, packing
from tokstream._kernels import pack as pack_kernels
from tokstream.bench import _loop
from tokstream.bench.baselines import best_c_loop_distance
from tokstream.plan import packed as _packed

EXTRAS = ("position_ids", "loss_mask", "cu_seqlens", "document_ids")
TARGET = 1.3
#: The cases :class:`DocumentFloor` does the work of.
DOCUMENT_FLOORS = ("cross+extras", "within+extras")

#: Each case: its name and the stream options both sides share.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("plain", {}),
    ("cross+extras", {"extras": EXTRAS}),
    ("within+extras", {"windows": "within", "extras": EXTRAS}),
    ("packed+extras", {"windows": "packed", "pad": 0, "extras": EXTRAS}),
]


class CopyFloor:
    """The bytes of a batch written by a plain C loop from random window starts (see the module
    doc)."""

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
    each row's documents found (a table-guided search), the extras restarting at every document
    start (across) or one piece a row (within), and ``cu_seqlens`` (see the module doc)."""

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


def beyond(cpu: dict[str, float], floor: str) -> str:
    """A floor's int32/int64 ratio by CPU time, then the stream's CPU microseconds a batch
    beyond that floor's, int64 and int32."""
    ratio = cpu[f"{floor} int64"] / cpu[f"{floor} int32"]
    more = [(cpu[out] - cpu[f"{floor} {out}"]) * 1e6 for out in ("int64", "int32")]
    return f" {ratio:5.2f} {more[0]:5.0f} {more[1]:5.0f}"


def bookkeeping(stream: Any, batches: int) -> float:
    """CPU microseconds a batch of ``stream``'s own work with the copy left out: ``next()``
    with the plan's fill (``into``) replaced by one that writes nothing and reports two
    pieces (so that no position ids are read back)."""
    pieces = (np.array([0, 1, stream.options.block], np.int32), stream.options.block - 1)
    fill = stream._fill
    fill.into = lambda *args: pieces
    try:
        start = time.process_time()
        for _ in range(batches):
            next(stream)
        return (time.process_time() - start) / batches * 1e6
    finally:
        del fill.into


def draw_cost(floor: CopyFloor, batches: int) -> float:
    """CPU microseconds a batch of the floors' own draw of random starts."""
    start = time.process_time()
    for _ in range(batches):
        floor.rng.integers(0, floor.starts_below, floor.batch_size)
    return (time.process_time() - start) / batches * 1e6


def with_added(cpu: dict[str, float], floor: str, microseconds: float) -> float:
    """A floor's int32/int64 ratio by CPU time with ``microseconds`` added to both sides."""
    sides = [cpu[f"{floor} {out}"] * 1e6 + microseconds for out in ("int64", "int32")]
    return sides[0] / sides[1]


def packing_cost(stream: Any, batch_size: int) -> tuple[float, float]:
    """CPU microseconds a batch of packing a packed ``stream``'s rows (see the module doc), and
    the part of it in the compiled kernels (each call timed by a wrapper put in place of the
    module's name for the measurement)."""
    space = stream._space
    epoch = 1
    order, _ = space.packing.epoch_offsets(epoch)
    kernels = [0.0]

    def timed(kernel: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            start = time.process_time()
            try:
                return kernel(*args)
            finally:
                kernels[0] += time.process_time() - start

        return call

    patched = [
        (packing, "permuted_positions"),
        (pack_kernels, "group_pieces"),
        (pack_kernels, "pack_group"),
        (_packed, "piece_addresses"),
    ]
    originals = [getattr(module, name) for module, name in patched]
    for (module, name), kernel in zip(patched, originals, strict=True):
        setattr(module, name, timed(kernel))
    try:
        start = time.process_time()
        for group in order.tolist():
            space._cached = space.packing._table = None  # packed again, as on reaching it
            space._table(group, epoch)
        total = time.process_time() - start
    finally:
        for (module, name), kernel in zip(patched, originals, strict=True):
            setattr(module, name, kernel)
    batches = space.num_windows / batch_size
    return total / batches * 1e6, kernels[0] / batches * 1e6


def measure(
    sides: dict[str, Callable[[], Any]], rounds: int, batches: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds a batch of each side by the wall clock and by CPU time, their rounds
    alternating."""
    wall: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, step in sides.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(batches):
                step()
            wall[name].append((time.perf_counter() - start) / batches)
            cpu[name].append((time.process_time() - start_cpu) / batches)
    median = statistics.median
    return {k: median(t) for k, t in wall.items()}, {k: median(t) for k, t in cpu.items()}


def flat_tokens(corpus: Corpus) -> np.ndarray:
    """The corpus' tokens as one array (the floor reads windows from it)."""
    return np.concatenate(list(corpus.shards))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--cases", default=",".join(name for name, _ in CASES))
    parser.add_argument("--no-floor", dest="floor", action="store_false")
    parser.add_argument(
        "--shapes",
        default=",".join(f"{block}x{batch}" for block, batch in SHAPES),
        help="block x batch size of each stream, comma-separated",
    )
    args = parser.parse_args(argv)
    try:
        shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    except ValueError:
        parser.error(f"--shapes takes BLOCKxBATCH pairs like 1024x64, got {args.shapes!r}")
    if any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
        parser.error(f"--shapes takes BLOCKxBATCH pairs of positive sizes, got {args.shapes!r}")
    wanted = args.cases.split(",")
    print(
        f"{args.tokens:,} tokens in documents of mean 2,000, shuffled, implicit, "
        f"targets='shifted'; median of {args.rounds} rounds x {args.batches} batches "
        "(Mtok/s by the wall clock; ratios int32/int64 by wall clock and by CPU time)"
    )
    print(
        f"{'dtype':6} {'block':>5} {'batch':>5} {'case':14} {'int64':>7} {'int32':>7} "
        f"{'wall':>5} {'cpu':>5} {'floor64':>8} {'floor32':>8} {'wall':>5} {'cpu':>5} "
        f"{'us64':>5} {'us32':>5} {'docs':>5} {'ud64':>5} {'ud32':>5}"
    )
    for dtype in DTYPES:
        corpus = documents_corpus(args.tokens, dtype)
        ids = flat_tokens(corpus) if args.floor else None
        for block, batch_size in shapes:
            distance = best_c_loop_distance(ids, block, batch_size) if ids is not None else 0
            for name, options in CASES:
                if name not in wanted:
                    continue
                streams = {
                    out: make_stream(corpus, block, batch_size, out_dtype=out, **options)
                    for out in ("int64", "int32")
                }
                sides: dict[str, Callable[[], Any]] = {
                    out: partial(next, stream) for out, stream in streams.items()
                }
                if ids is not None:
                    for out in ("int64", "int32"):
                        sides[f"floor {out}"] = CopyFloor(
                            ids, block, batch_size, out, "extras" in options, distance
                        )
                        if name in DOCUMENT_FLOORS:
                            sides[f"docs {out}"] = DocumentFloor(
                                ids,
                                corpus.document_lengths,
                                block,
                                batch_size,
                                out,
                                name == "within+extras",
                                distance,
                            )
                seconds, cpu = measure(sides, args.rounds, args.batches)
                rate = {k: batch_size * block / s / 1e6 for k, s in seconds.items()}
                ratio = seconds["int64"] / seconds["int32"]
                line = (
                    f"{dtype:6} {block:5} {batch_size:5} {name:14} {rate['int64']:7,.0f} "
                    f"{rate['int32']:7,.0f} {ratio:5.2f} {cpu['int64'] / cpu['int32']:5.2f}"
                )
                if ids is not None:
                    line += (
                        f" {rate['floor int64']:8,.0f} {rate['floor int32']:8,.0f} "
                        f"{seconds['floor int64'] / seconds['floor int32']:5.2f}"
                        + beyond(cpu, "floor")
                    )
                    if name in DOCUMENT_FLOORS:
                        line += beyond(cpu, "docs")
                if name != "plain" and ratio < TARGET:
                    line += "  below 1.3"
                print(line, flush=True)
                if ids is not None and name != "plain":
                    floor = sides["floor int32"]
                    assert isinstance(floor, CopyFloor)
                    book = bookkeeping(streams["int32"], args.batches) - draw_cost(
                        floor, args.batches
                    )
                    limits = f"{'':6} {'':5} {'':5} {'limits':14} book {book:4.1f} us"
                    if name in DOCUMENT_FLOORS:
                        limits += f": document floor with it {with_added(cpu, 'docs', book):.2f}"
                    else:
                        pack, kern = packing_cost(streams["int32"], batch_size)
                        limits += (
                            f"; packing {pack:4.1f} us a batch, {kern:4.1f} in its kernels: copy "
                            f"floor with them {with_added(cpu, 'floor', kern):.2f}, and with "
                            f"book {with_added(cpu, 'floor', kern + book):.2f}"
                        )
                    print(limits, flush=True)


if __name__ == "__main__":
    main()
