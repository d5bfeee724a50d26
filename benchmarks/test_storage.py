"""Token files: a cold page cache against the device, start-up over many shards, and memory.

- ``test_cold_cache`` (``--bench-large``: a 2.2 GB file of real tokens): a shuffled stream
  (implicit permutation) over ``open_tokens(FILE)`` from a cold page cache (the file's pages
  evicted with ``posix_fadvise(POSIX_FADV_DONTNEED)`` before each round), with its read-ahead
  and without it, against the device's rate: reads of one window's bytes at random offsets by 64
  threads of ``pread`` (64 in flight). Windows (reads) per second; target 0.7 of the device's.
  ``packed``: a Megatron dataset of lognormal documents and shuffled ``windows="packed"`` rows
  (``pad=0``) with the read-ahead of each batch's pieces and without it, rows per second.
- ``test_warm_readahead``: the same streams over the same file in the page cache, every shape:
  read-ahead must cost nothing there.
- ``test_manifest_open``: ``open_tokens`` of a manifest over many small ``.npy`` shards
  (100,000 with ``--bench-large``) and its first shuffled batch, and a glob against a manifest
  of the same subset of shards; ``test_processes_at_once``: 16 processes each importing
  tokstream, opening the manifest and taking its first batch (a rank each), the slowest one's
  seconds.
- ``test_epoch_memory``: an epoch of a uint16 token file (block 8, batch 65,536, in order)
  against the reference's first 20 batches; noted: the peak traced allocation of each.
- ``test_resident_memory`` (``--bench-large``): ``RssAnon`` / ``RssFile`` and the bytes read
  from disk of a fresh process along a long shuffled run on a 1 GB file, from a cold cache with
  the stream's own advice (``MADV_RANDOM``) and with the kernel's default put back
  (``MADV_NORMAL``), and warm, without and with ``MADV_DONTNEED`` every 1,000 batches. Linux only.

Every stream's first batches are checked identical to the same stream over the tokens in RAM
(or, for the manifest, over the glob) before timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tokstream import Corpus, bench, open_tokens, stream_token_source, write_tokens
from tokstream import reference as ref
from tokstream._kernels.advice import resident_fraction
from tokstream.bench._device import read_at
from tokstream.formats import npy
from tokstream.manifest import write_manifest

pytestmark = pytest.mark.skipif(
    not hasattr(os, "posix_fadvise"), reason="page-cache eviction needs posix_fadvise (Linux)"
)

COLD_SHAPES = [(1024, 64), (128, 512)]
THREADS = 64


# ---------------------------------------------------------------------------------------------
# Files


def write_random_tokens(path: Path, count: int) -> Path:
    """``count`` seeded random uint16 tokens as ``.npy``, written piecewise (real, not sparse)."""
    tokens = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint16, shape=(count,))
    rng = np.random.default_rng(0)
    step = 1 << 26
    for start in range(0, count, step):
        stop = min(start + step, count)
        tokens[start:stop] = rng.integers(0, 50257, stop - start, dtype=np.uint16)
    tokens.flush()
    del tokens
    return path


@pytest.fixture(scope="module")
def token_file(settings, tmp_path_factory) -> Path:
    """2.2 GB of tokens (a smoke run: 4 MB), in a directory that is not tmpfs if we can."""
    count = settings.size(int(2.2e9) // 2, 2_000_000)
    directory = Path(os.environ.get("TOKSTREAM_BENCH_DIR") or tmp_path_factory.mktemp("cold"))
    path = directory / f"tokens_{count}.npy"
    if not path.exists() or path.stat().st_size < 2 * count:
        write_random_tokens(path, count)
    return path


@pytest.fixture(scope="module")
def packed_file(settings, lognormal_lengths, tmp_path_factory) -> str:
    """A Megatron dataset of seeded random tokens in documents of lognormal lengths (4 GB; a
    smoke run: 4 MB): its prefix."""
    count = settings.size(int(4e9) // 2, 2_000_000)
    directory = Path(os.environ.get("TOKSTREAM_BENCH_DIR") or tmp_path_factory.mktemp("cold"))
    prefix = directory / f"packed_{count}"
    if not Path(f"{prefix}.idx").exists():
        tokens = np.random.default_rng(0).integers(0, 50257, count, dtype=np.uint16)
        cuts = np.cumsum(lognormal_lengths(2 * count // 900 + 16, 0))
        corpus = Corpus.from_documents(np.split(tokens, cuts[cuts < count]))
        del tokens
        write_tokens(prefix, corpus, format="megatron")
    return str(prefix)


def evict(path: str) -> None:
    """Drop the file's pages from the page cache; skip where they stay (tmpfs)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    tokens = np.memmap(path, dtype=np.uint8, mode="r")
    left = resident_fraction(tokens)
    del tokens
    if left > 0.01:
        pytest.skip(
            f"{left:.0%} of {path} stays in memory after eviction (tmpfs?): set "
            "TOKSTREAM_BENCH_DIR to a directory on a disk"
        )


# ---------------------------------------------------------------------------------------------
# The device and the stream


def device_reads(path: str, window_bytes: int, reads: int) -> int:
    """``reads`` random reads of ``window_bytes`` by :data:`THREADS` threads of ``pread``."""
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead: the bytes asked for
    size = os.fstat(fd).st_size
    per_thread = -(-reads // THREADS)
    done = [0] * THREADS

    def run(index: int) -> None:
        rng = np.random.default_rng(index)
        buffer = bytearray(window_bytes)
        while done[index] < per_thread:
            offsets = rng.integers(0, size - window_bytes, 16, dtype=np.int64)
            done[index] += read_at(fd, offsets, buffer)  # without the GIL

    workers = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    os.close(fd)
    return sum(done)


def shuffled_stream(corpus: Any, block: int, batch_size: int, packed: bool, readahead: bool):
    """A shuffled stream (implicit permutation; packed rows: the packing's own shuffle), its
    read-ahead switched off for comparison when ``readahead`` is False."""
    layout: dict[str, Any] = (
        {"windows": "packed", "pad": 0} if packed else {"permutation": "implicit"}
    )
    stream = stream_token_source(
        corpus, block, batch_size, seed=time.monotonic_ns() % 2**32, epochs=1000, **layout
    )
    if not readahead:
        stream._readahead = None  # the stream without its read-ahead, for comparison only
    return stream


def take_windows(stream: Any, batches: int, packed: bool) -> int:
    windows = 0
    for _ in range(batches):
        batch = next(stream)
        windows += len(batch["input_ids"] if packed else batch[0])
    stream.close()
    return windows


def check_stream_over_file(path: str, block: int, batch_size: int, packed: bool) -> None:
    """The stream over the file yields the batches of the same stream over its tokens in RAM."""
    mapped = open_tokens(path)
    in_ram = (
        Corpus.from_documents(
            np.split(np.asarray(mapped.shards[0]), mapped.document_boundaries[1:-1])
        )
        if packed
        else np.asarray(mapped.shards[0])
    )
    options: dict[str, Any] = (
        {"windows": "packed", "pad": 0} if packed else {"permutation": "implicit"}
    )
    far = stream_token_source(mapped, block, batch_size, seed=3, **options)
    near = stream_token_source(in_ram, block, batch_size, seed=3, **options)
    a, b = next(far), next(near)
    pairs = [(a[k], b[k]) for k in b] if isinstance(b, dict) else list(zip(a, b, strict=True))
    assert all(np.array_equal(x, y) for x, y in pairs)


@pytest.mark.large
@pytest.mark.parametrize("side", ["device", "read-ahead", "no read-ahead"])
@pytest.mark.parametrize("packed", [False, True], ids=["windows", "packed"])
@pytest.mark.parametrize("shape", COLD_SHAPES, ids=[f"{b}x{n}" for b, n in COLD_SHAPES])
def test_cold_cache(measure, settings, token_file, packed_file, shape, packed, side) -> None:
    block, batch_size = shape
    path = packed_file if packed else str(token_file)
    data = f"{path}.bin" if packed else path
    itemsize = 2
    reads = settings.size(32_768, 512)
    batches = max(1, reads // batch_size)
    if side == "device":
        check_stream_over_file(path, block, batch_size, packed)
    group = f"cold cache {'packed rows' if packed else 'windows'} block={block} batch={batch_size}"
    if side == "device":
        measure(
            device_reads,
            setup=lambda: (evict(data), ((data, (block + 1) * itemsize, reads), {}))[1],
            group=group,
            side=side,
            subject="read-ahead",
            units=lambda done: done,
            unit="reads/s",
            scale=1,
        )
    else:

        def cold_stream() -> tuple[tuple[Any, ...], dict[str, Any]]:
            evict(data)
            stream = shuffled_stream(
                open_tokens(path), block, batch_size, packed, side == "read-ahead"
            )
            return (stream, batches, packed), {}

        measure(
            take_windows,
            setup=cold_stream,
            group=group,
            side=side,
            subject="read-ahead",
            units=lambda windows: windows,
            unit="reads/s",
            scale=1,
        )


@pytest.mark.parametrize("side", ["read-ahead", "no read-ahead"])
@pytest.mark.parametrize("shape", list(bench.SHAPES), ids=[f"{b}x{n}" for b, n in bench.SHAPES])
def test_warm_readahead(measure, settings, corpus_uint16, tmp_path_factory, shape, side) -> None:
    block, batch_size = shape
    path = tmp_path_factory.getbasetemp() / "warm_tokens.npy"
    if not path.exists():
        np.save(path, corpus_uint16)
    check_stream_over_file(str(path), block, batch_size, packed=False)
    corpus = open_tokens(str(path))
    measure(
        lambda: take_windows(
            shuffled_stream(corpus, block, batch_size, False, side == "read-ahead"),
            settings.batches,
            False,
        ),
        group=f"warm cache uint16 file shuffled block={block} batch={batch_size}",
        side=side,
        subject="read-ahead",
        units=lambda windows: windows * block,
    )


# ---------------------------------------------------------------------------------------------
# Start-up over many shards

CHILD = """
import sys, time, json
start = time.perf_counter()
import tokstream
imported = time.perf_counter()
path, rank, world, block, batch = sys.argv[1], *map(int, sys.argv[2:6])
corpus = tokstream.open_tokens(path)
stream = tokstream.TokenStream(corpus, block, batch, shuffle=True, seed=rank % 2,
                               rank=rank, world_size=world)
next(stream)
print(json.dumps({"import": imported - start, "first_batch": time.perf_counter() - start}))
"""


@pytest.fixture(scope="module")
def shards(settings, tmp_path_factory) -> dict[str, Any]:
    """Many ``.npy`` shards of 2,048 uint16 tokens, their manifest, and a subset of them with
    a manifest of its own (10,000 shards; ``--bench-large``: 100,000; a smoke run: 50)."""
    count = 100_000 if settings.large and not settings.tiny else settings.size(10_000, 50)
    subset = min(count, settings.size(5_000, 20))
    directory = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    header = npy.header(2048, np.dtype(np.uint16))
    paths = []
    for i in range(count):
        path = directory / "shards" / f"shard_{i:06d}.npy"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(header + rng.integers(0, 50257, 2048, np.uint16).tobytes())
        paths.append(str(path))
    manifest = directory / "all.manifest.json"
    write_manifest([str(directory / "shards" / "*.npy")], manifest)
    subset_manifest = directory / "subset.manifest.json"
    write_manifest(paths[:subset], subset_manifest)
    return {
        "count": count,
        "manifest": str(manifest),
        "subset": paths[:subset],
        "subset manifest": str(subset_manifest),
    }


def first_shuffled_batch(source: Any, block: int = 1024, batch_size: int = 16) -> Any:
    return next(stream_token_source(open_tokens(source), block, batch_size, seed=0))


@pytest.mark.parametrize("opened", ["manifest", "glob"])
def test_subset_open(measure, settings, shards, opened) -> None:
    """A glob over the subset's shards against a manifest of them: the same corpus."""
    ours = stream_token_source(open_tokens(shards["subset manifest"]), 1024, 64, seed=1)
    theirs = stream_token_source(open_tokens(shards["subset"]), 1024, 64, seed=1)
    for _, mine, want in zip(range(5), ours, theirs, strict=False):
        assert all(np.array_equal(a, b) for a, b in zip(mine, want, strict=True))
    source = shards["subset manifest"] if opened == "manifest" else shards["subset"]
    measure(
        open_tokens,
        args=(source,),
        group=f"open {len(shards['subset']):,} shards",
        side=opened,
        subject="manifest",
        units=1,
        unit="s",
    )


@pytest.mark.parametrize("what", ["open", "open + first batch"])
def test_manifest_open(measure, settings, shards, what) -> None:
    """``open_tokens(manifest)`` of every shard (target: < 0.5 s at 100,000), and with a
    shuffled stream's first batch (block 1024, batch 16; target: < 1 s)."""
    function = open_tokens if what == "open" else first_shuffled_batch
    measure(
        function,
        args=(shards["manifest"],),
        group=f"manifest of {shards['count']:,} shards",
        side=what,
        subject=None,
        units=1,
        unit="s",
    )


def processes_at_once(manifest: str, processes: int) -> list[dict[str, float]]:
    argv = [sys.executable, "-c", CHILD, manifest]
    children = [
        subprocess.Popen([*argv, str(rank), str(processes), "1024", "16"], stdout=subprocess.PIPE)
        for rank in range(processes)
    ]
    return [json.loads(child.communicate()[0]) for child in children]


def test_processes_at_once(measure, settings, shards) -> None:
    """Processes started at once, each importing tokstream, opening the manifest and taking its
    first shuffled batch (one rank each): until the last one's first batch."""
    processes = settings.size(16, 2)
    group = f"manifest of {shards['count']:,} shards: {processes} processes at once"
    reported = measure(
        processes_at_once,
        args=(shards["manifest"], processes),
        group=group,
        side="all first batches",
        subject=None,
        units=1,
        unit="s",
        rounds=settings.size(3, 1),
    )
    slowest = max(r["first_batch"] for r in reported)
    imports = max(r["import"] for r in reported)
    measure.note(
        group,
        f"slowest process: first batch {slowest:.2f} s from its start, of which "
        f"`import tokstream` {imports:.2f} s (the last round)",
    )


# ---------------------------------------------------------------------------------------------
# Memory


def epoch_peak(path: Path, block: int, batch_size: int, batches: int | None) -> tuple[int, int]:
    """(batches, peak traced bytes) of tokstream's stream in order over the file (``batches``
    None: the whole epoch) or of the reference's first ``batches``."""
    tracemalloc.start()
    try:
        if batches is None:
            stream: Any = stream_token_source(open_tokens(path), block, batch_size, shuffle=False)
        else:
            mapped = open_tokens(path).shards[0]
            stream = ref.stream_token_source(mapped, block, batch_size, shuffle=False)
        taken = 0
        for _ in stream if batches is None else zip(range(batches), stream, strict=False):
            taken += 1
        return taken, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("path", ["tokstream", "reference"])
def test_epoch_memory(measure, settings, tmp_path_factory, path) -> None:
    """Peak allocation of an epoch of a uint16 token file, in order (50,000,000 tokens with
    ``--bench-large``; the settings' corpus otherwise): tokstream's whole epoch, the reference's
    first 20 batches (its peak is set before the first, by the int64 copy and the order)."""
    block, batch_size = 8, settings.size(1 << 16, 1024)
    count = 50_000_000 if settings.large and not settings.tiny else settings.num_tokens
    file = tmp_path_factory.getbasetemp() / f"memory_{count}.bin"
    if not file.exists():
        pattern = np.random.default_rng(0).integers(0, 50257, 1 << 16).astype(np.uint16)
        write_tokens(file, np.resize(pattern, count), format="bin")
    mine = next(stream_token_source(open_tokens(file), block, batch_size, shuffle=False))
    theirs = next(
        ref.stream_token_source(open_tokens(file).shards[0], block, batch_size, shuffle=False)
    )
    assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))
    batches, peak = measure(
        epoch_peak,
        args=(file, block, batch_size, None if path == "tokstream" else 20),
        group=f"memory: {count:,}-token uint16 file, block {block}, batch {batch_size}, in order",
        side=path,
        subject=None,  # the reference's first batch carries its int64 copy and order
        units=lambda taken: taken[0] * block * batch_size,
        rounds=1,
    )
    buffers = 2 * batch_size * (block + 1) * 8
    measure.note(
        measure.benchmark.group,
        f"{path}, {batches} batches: peak {peak / 2**20:.2f} MiB traced (a batch's buffers "
        f"{buffers / 2**20:.2f} MiB)",
    )


RSS_CHILD = """
import json, mmap, os, sys
from tokstream import open_tokens, stream_token_source

def fields(path, *names):
    values = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in names:
                values[key] = int(rest.split()[0])
    return values

path, batches, cold, advice, drop_every = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", \
    sys.argv[4], int(sys.argv[5])
if cold:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
corpus = open_tokens(path)
stream = stream_token_source(corpus, 128, 64, shuffle=True, seed=0, permutation="implicit")
maps = list(corpus.memory_maps())
if advice == "normal":
    for m in maps:
        m.madvise(mmap.MADV_NORMAL)
read0 = fields("/proc/self/io", "read_bytes")["read_bytes"]
marks = []
for done in range(1, batches + 1):
    next(stream)
    if drop_every and done % drop_every == 0:
        for m in maps:
            m.madvise(mmap.MADV_DONTNEED)
    if done in (batches // 100, batches):
        status = fields("/proc/self/status", "RssAnon", "RssFile")
        read = fields("/proc/self/io", "read_bytes")["read_bytes"] - read0
        marks.append([done, status["RssAnon"] / 1024, status["RssFile"] / 1024, read / 2**20])
print(json.dumps(marks))
"""

#: The runs of ``test_resident_memory``: (cold cache, advice, drop every K batches).
RSS_RUNS = {
    "cold, MADV_RANDOM (the stream's)": (True, "auto", 0),
    "cold, MADV_NORMAL (the kernel's default)": (True, "normal", 0),
    "warm, MADV_RANDOM": (False, "auto", 0),
    "warm, MADV_RANDOM + MADV_DONTNEED every 1,000 batches": (False, "auto", 1000),
}


@pytest.mark.large
@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("run", list(RSS_RUNS))
def test_resident_memory(measure, settings, tmp_path_factory, run) -> None:
    """RssAnon / RssFile and the bytes read from disk of a fresh process along a long shuffled
    run (block 128, batch 64, implicit permutation): after a hundredth of the batches and at
    the end."""
    count = settings.size(500_000_000, 2_000_000)
    directory = Path(os.environ.get("TOKSTREAM_BENCH_DIR") or tmp_path_factory.getbasetemp())
    path = directory / f"tokens_{count}.npy"
    if not path.exists():
        write_random_tokens(path, count)
    cold, advice, drop_every = RSS_RUNS[run]
    batches = settings.size(20_000, 200)
    drop_every = settings.size(drop_every, drop_every // 100)
    if cold:
        evict(str(path))  # skips where the file cannot leave the page cache
    else:
        np.load(path, mmap_mode="r").max()  # into the page cache
    argv = [sys.executable, "-c", RSS_CHILD, str(path), str(batches), "1" if cold else "0",
            advice, str(drop_every)]  # fmt: skip
    group = f"resident memory: {count:,}-token uint16 file, 128 x 64, shuffled, {batches} batches"
    marks = measure(
        lambda: json.loads(subprocess.run(argv, check=True, capture_output=True).stdout),
        group=group,
        side=run,
        subject=None,
        units=batches * 64 * 128,
        rounds=1,
    )
    measure.note(
        group,
        f"{run}: "
        + "; ".join(
            f"after {done:,} batches RssAnon {anon:.0f} MiB, RssFile {file:.0f} MiB, read "
            f"{read:.0f} MiB"
            for done, anon, file, read in marks
        ),
    )
