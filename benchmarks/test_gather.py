"""The warm gather: tokstream's stream against the reference, the best NumPy gather and the limits.

- ``test_paths``: every path of :mod:`tokstream.bench.baselines` (the reference, best NumPy,
  nanoGPT, tokstream's stream with fresh, two and one reused buffers, the copy, gather and C-loop
  limits) on every shape, order and corpus dtype of docs/benchmarks.md, one group per (dtype,
  order, shape), summarised as ``tokstream bench --full`` tabulates them;
- ``test_memory_map``: a uint16 memory-mapped file (page cache warm) against the same ids in RAM
  as int64 (the summary's ratio, RAM / memmap rate, is the memmap's time over RAM's);
- ``test_prefetch_overlap``: a consumer that works as long per batch as the gather takes, with
  and without ``prefetch=2``;
- ``test_batch_source``: the stream in the training process (``prefetch=0`` and ``2``) against
  PyTorch DataLoader workers (``workers=1``, ``2``) over ``TokenDataset`` (needs torch);
- ``test_output_buffers``: the bare window kernel writing into one buffer, two or three cycled,
  or a fresh one a batch;
- ``test_prefetch_sweep``: the window kernel and the plain C loop at each software-prefetch
  distance, on fresh random windows, with the distance the stream picks.

Every side's first batch is checked identical to its baseline's before a round is timed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tokstream import bench, open_tokens, stream_token_source, write_tokens
from tokstream._space import cache_ahead
from tokstream._windows import gather_windows
from tokstream.bench import baselines, harness
from tokstream.bench._loop import copy_windows

SHAPES = list(bench.SHAPES)
SHAPE_IDS = [f"{b}x{n}" for b, n in SHAPES]
DTYPES = ["int64", "uint16"]


def order_name(shuffle: bool) -> str:
    return "shuffled" if shuffle else "sequential"


# ---------------------------------------------------------------------------------------------
# Every path


_expected: dict[tuple[str, bool, int, int], tuple[np.ndarray, np.ndarray]] = {}


def reference_first_batch(
    ids: np.ndarray, dtype: str, shuffle: bool, block: int, batch_size: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The spec's first batch for this case, computed once and shared by the group."""
    key = (dtype, shuffle, block, batch_size)
    if key not in _expected:
        reference = baselines.reference(ids, block, batch_size, shuffle=shuffle, seed=seed)
        _expected[key] = next(reference)
    return _expected[key]


@pytest.mark.parametrize("path", list(baselines.PATHS))
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "sequential"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_paths(measure, settings, corpora, shape, dtype, shuffle, path) -> None:
    if path == "nanogpt" and not baselines.torch_available():
        pytest.skip("PyTorch is not installed")
    block, batch_size = shape
    ids = corpora[dtype]
    needed = 1 + settings.rounds * settings.batches
    epochs = bench.epochs_for(ids.shape[0], block, batch_size, needed)
    batches = baselines.PATHS[path](
        ids, block, batch_size, epochs=epochs, shuffle=shuffle, seed=settings.seed
    )
    first = next(batches)
    expected = reference_first_batch(ids, dtype, shuffle, block, batch_size, settings.seed)
    harness.check_identical({"reference": expected, path: first}, block, against="reference")
    del first
    per_window = 1 if path == "gather_limit" else block
    measure(
        bench.consume,
        args=(batches, settings.batches),
        group=f"paths {dtype} {order_name(shuffle)} block={block} batch={batch_size}",
        side=path,
        subject="fast",
        units=lambda windows: windows * per_window,
        unit="Mwindows/s" if path == "gather_limit" else "Mtok/s",
    )


# ---------------------------------------------------------------------------------------------
# A memory-mapped file against an array in RAM


@pytest.fixture(scope="module")
def mapped_sources(tmp_path_factory, corpus_int64) -> dict[str, Any]:
    path = write_tokens(tmp_path_factory.mktemp("mmap") / "tokens.bin", corpus_int64, format="bin")
    mapped = open_tokens(path)
    assert mapped.dtype == np.uint16
    return {"uint16 memmap": mapped, "int64 in RAM": corpus_int64}


@pytest.mark.parametrize("source", ["uint16 memmap", "int64 in RAM"])
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "sequential"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_memory_map(measure, settings, mapped_sources, shape, shuffle, source) -> None:
    block, batch_size = shape
    needed = 1 + settings.rounds * settings.batches
    epochs = bench.epochs_for(settings.num_tokens, block, batch_size, needed)

    def stream() -> Iterator[Any]:
        return stream_token_source(
            mapped_sources[source],
            block,
            batch_size,
            epochs=epochs,
            shuffle=shuffle,
            seed=0,
            permutation="implicit",
        )

    checked = stream()
    baseline = stream_token_source(
        mapped_sources["int64 in RAM"],
        block,
        batch_size,
        shuffle=shuffle,
        seed=0,
        permutation="implicit",
    )
    for _ in range(3):
        (w, t), (bw, bt) = next(checked), next(baseline)
        assert w.tobytes() == bw.tobytes() and t.tobytes() == bt.tobytes()
    timed = stream()
    next(timed)  # draws the epoch's order outside the timing
    measure(
        bench.consume,
        args=(timed, settings.batches),
        group=f"memory map {order_name(shuffle)} block={block} batch={batch_size}",
        side=source,
        subject="int64 in RAM",  # its ratio to the memmap: memmap time / RAM time
        units=lambda windows: windows * block,
    )


# ---------------------------------------------------------------------------------------------
# Prefetch overlap

OVERLAP_BLOCK, OVERLAP_BATCH = 1024, 1024


def primed_stream(corpus: np.ndarray, batch_size: int, prefetch: int) -> Iterator[Any]:
    """A stream past its first batch, so that set-up and thread start are not timed."""
    stream = stream_token_source(
        corpus,
        OVERLAP_BLOCK,
        batch_size,
        seed=1,
        epochs=10**6,
        permutation="implicit",
        prefetch=prefetch,
    )
    next(stream)
    return stream


def consume_working(stream: Any, batches: int, work_seconds: float) -> None:
    for _ in range(batches):
        next(stream)
        if work_seconds:
            time.sleep(work_seconds)  # as a training loop waiting on an accelerator does
    stream.close()


@pytest.fixture(scope="module")
def gather_seconds(settings, corpus_int64) -> float:
    """Seconds a batch of the plain stream takes here: the consumer's work per batch."""
    batch_size = settings.size(OVERLAP_BATCH, 64)
    stream = primed_stream(corpus_int64, batch_size, 0)
    start = time.perf_counter()
    for _ in range(settings.batches):
        next(stream)
    return (time.perf_counter() - start) / settings.batches


@pytest.mark.parametrize(
    "side", ["prefetch=2, working", "prefetch=0, working", "prefetch=0, not working"]
)
def test_prefetch_overlap(measure, settings, corpus_int64, gather_seconds, side) -> None:
    """Without prefetching a batch costs gather + work; with ``prefetch=2`` the background thread
    gathers the next batch while the consumer works: about max(gather, work), half as long."""
    batch_size = settings.size(OVERLAP_BATCH, 64)
    prefetch = 2 if side.startswith("prefetch=2") else 0
    work = 0.0 if side.endswith("not working") else gather_seconds
    with_thread, without = (
        primed_stream(corpus_int64, batch_size, 2),
        primed_stream(corpus_int64, batch_size, 0),
    )
    for _ in range(2):
        (w, t), (bw, bt) = next(with_thread), next(without)
        assert np.array_equal(w, bw) and np.array_equal(t, bt)
    with_thread.close()
    group = f"prefetch overlap block={OVERLAP_BLOCK} batch={batch_size}: work a batch = gather"
    measure(
        consume_working,
        setup=lambda: (
            (primed_stream(corpus_int64, batch_size, prefetch), settings.batches, work),
            {},
        ),
        group=group,
        side=side,
        subject="prefetch=2, working",
        units=settings.batches * batch_size * OVERLAP_BLOCK,
    )
    if side == "prefetch=0, working":
        measure.note(group, f"the consumer's work: {work * 1e3:.2f} ms a batch")


# ---------------------------------------------------------------------------------------------
# Where batches are made: the training process or DataLoader workers

SOURCE_BLOCK, SOURCE_BATCH = 1024, 64
SOURCE_WAYS = ["prefetch=0", "prefetch=2", "workers=1", "workers=2"]


@pytest.fixture(scope="module")
def batch_sources(corpus_int64, check_rows_in) -> Iterator[dict[str, Iterator[Any]]]:
    """Each way's batch iterator over the int64 corpus, its first batch drawn and checked: the
    stream's own batch in one process and one worker; rows of the corpus from two workers,
    which split the batches between them."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from tokstream.torch import TokenDataset

    options = {"epochs": 10**6, "permutation": "implicit", "seed": 0}
    made: dict[str, Any] = {
        f"prefetch={p}": stream_token_source(
            corpus_int64, SOURCE_BLOCK, SOURCE_BATCH, prefetch=p, **options
        )
        for p in (0, 2)
    }
    for workers in (1, 2):
        dataset = TokenDataset(corpus_int64, SOURCE_BLOCK, SOURCE_BATCH, **options)
        made[f"workers={workers}"] = iter(DataLoader(dataset, batch_size=None, num_workers=workers))
    first = {way: next(batches) for way, batches in made.items()}
    windows, next_tokens = first["prefetch=0"]
    for way, (w, t) in first.items():
        w, t = torch.as_tensor(w).numpy(), torch.as_tensor(t).numpy()
        if way == "workers=2":
            check_rows_in(corpus_int64, w, t)
        else:
            assert np.array_equal(w, windows) and np.array_equal(t, next_tokens), way
    yield made
    for way in ("prefetch=0", "prefetch=2"):
        made[way].close()
    made.clear()


def take(batches: Iterator[Any], count: int) -> None:
    for _ in range(count):
        next(batches)


@pytest.mark.parametrize("way", SOURCE_WAYS)
def test_batch_source(measure, settings, batch_sources, way) -> None:
    """Nothing is done to the batches: what each way costs to hand them over."""
    measure(
        take,
        args=(batch_sources[way], settings.batches),
        group=f"batch source int64 shuffled block={SOURCE_BLOCK} batch={SOURCE_BATCH}",
        side=way,
        subject="prefetch=0",
        units=settings.batches * SOURCE_BATCH * SOURCE_BLOCK,
    )


# ---------------------------------------------------------------------------------------------
# The bare kernel: output buffers and prefetch distances

KERNEL_SHAPES = [(128, 512), (1024, 64), (2048, 16)]
DISCIPLINES = ["1 buffer", "2 cycled", "3 cycled", "fresh"]


def fill_batches(
    kernel: Any, ids: np.ndarray, starts: np.ndarray, ring: list[Any], shape: tuple[int, int]
) -> None:
    """One batch of windows per row of ``starts``, into the ring's buffers in turn (a fresh
    pair a batch when the ring is empty)."""
    block, batch_size = shape
    for i, batch in enumerate(starts):
        if ring:
            windows, next_tokens = ring[i % len(ring)]
        else:
            windows = np.empty((batch_size, block), np.int64)
            next_tokens = np.empty(batch_size, np.int64)
        kernel(ids, batch, windows, next_tokens, None, 0)


@pytest.mark.parametrize("discipline", DISCIPLINES)
@pytest.mark.parametrize("shape", KERNEL_SHAPES, ids=[f"{b}x{n}" for b, n in KERNEL_SHAPES])
def test_output_buffers(measure, settings, corpus_int64, shape, discipline) -> None:
    """The C loop refills one buffer, which stays in the core's cache; a stream hands out a
    fresh one a batch, and a caller that holds a batch while the next is made needs two."""
    block, batch_size = shape
    kernel = gather_windows.__signatures__["int64_t|int64_t"]
    count = 0 if discipline == "fresh" else int(discipline[0])
    ring = [
        (np.empty((batch_size, block), np.int64), np.empty(batch_size, np.int64))
        for _ in range(count)
    ]
    rng = np.random.default_rng(len(discipline))
    high = corpus_int64.shape[0] - block - 1

    def fresh_starts() -> tuple[tuple[Any, ...], dict[str, Any]]:
        starts = rng.integers(0, high, (settings.batches, batch_size))
        return (kernel, corpus_int64, starts, ring, shape), {}

    (_, _, starts, _, _), _ = fresh_starts()
    windows, next_tokens = np.empty((batch_size, block), np.int64), np.empty(batch_size, np.int64)
    kernel(corpus_int64, starts[0], windows, next_tokens, None, 0)
    assert np.array_equal(windows, np.stack([corpus_int64[s : s + block] for s in starts[0]]))
    assert np.array_equal(next_tokens, corpus_int64[starts[0] + block])
    measure(
        fill_batches,
        setup=fresh_starts,
        group=f"output buffers int64 block={block} batch={batch_size}",
        side=discipline,
        subject="1 buffer",
        units=settings.batches * batch_size * block,
    )


@pytest.mark.parametrize("distance", baselines.C_LOOP_DISTANCES)
@pytest.mark.parametrize("loop", ["tokstream kernel", "C loop"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_prefetch_sweep(measure, settings, corpora, shape, dtype, loop, distance) -> None:
    """Both copy the same number of fresh random windows (about 2M tokens a round, one reused
    output buffer) at one software-prefetch distance (windows ahead; 0: none)."""
    block, batch_size = shape
    ids = corpora[dtype]
    kernel = gather_windows.__signatures__[f"{dtype}_t|int64_t"]
    plain = copy_windows.__signatures__[f"{dtype}_t"]
    windows = np.empty((batch_size, block), np.int64)
    next_tokens = np.empty(batch_size, np.int64)
    batches = settings.size(max(4, 2_000_000 // (batch_size * block)), 2)
    rng = np.random.default_rng(1)

    def fresh_starts() -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (rng.integers(0, ids.shape[0] - block - 1, (batches, batch_size)),), {}

    def copy(starts: np.ndarray) -> None:
        for batch in starts:
            if loop == "tokstream kernel":
                kernel(ids, batch, windows, next_tokens, None, distance)
            else:
                plain(ids, batch, windows, next_tokens, distance)

    (starts,), _ = fresh_starts()
    copy(starts[:1])
    assert np.array_equal(windows, np.stack([ids[s : s + block] for s in starts[0]]))
    assert np.array_equal(next_tokens, ids[starts[0] + block])
    group = f"prefetch sweep {dtype} block={block} batch={batch_size} distance={distance}"
    measure(
        copy,
        setup=fresh_starts,
        group=group,
        side=loop,
        subject="tokstream kernel",
        units=batches * batch_size * block,
    )
    if loop == "C loop" and distance == cache_ahead(block, ids.dtype):
        measure.note(group, "the distance the stream picks at this shape")
