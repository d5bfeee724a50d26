"""Memory: a memory-mapped corpus is never copied, and a long run does not grow.

tracemalloc sees every allocation NumPy makes for array data (and Python's own), but not the
pages of a memory map, which belong to the OS page cache: so a traced peak far below the file's
size proves that no step, from opening the file to the last batch, copies the corpus.
"""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tokstream import _validate, open_tokens, stream_token_source, write_tokens
from tokstream.formats import megatron
from tokstream.manifest import write_manifest

MB = 1 << 20


def traced_peak(action: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``action`` under tracemalloc; return its result and the peak traced bytes."""
    tracemalloc.start()
    try:
        result = action()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def proc_status_kb(field: str) -> int:
    """A ``/proc/self/status`` field such as ``RssAnon``, in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)


def test_an_epoch_of_a_50m_token_memmap_peaks_below_16_mb_beyond_the_batch_buffers(tmp_path):
    n, block, batch_size = 50_000_000, 8, 1 << 16
    pattern = np.random.default_rng(0).integers(0, 50257, 1 << 16).astype(np.uint16)
    path = write_tokens(tmp_path / "tokens.bin", np.resize(pattern, n), format="bin")
    assert path.stat().st_size == 2 * n

    def one_epoch() -> tuple[int, int, np.ndarray]:
        stream = stream_token_source(open_tokens(path), block, batch_size, shuffle=False)
        windows_seen = batches_seen = 0
        last_windows = None
        for windows, next_tokens in stream:
            windows_seen += next_tokens.shape[0]
            batches_seen += 1
            last_windows = windows
        return windows_seen, batches_seen, last_windows

    (windows_seen, batches_seen, last_windows), peak = traced_peak(one_epoch)
    assert windows_seen == n - block
    assert batches_seen == -(-(n - block) // batch_size)
    # Token i is pattern[i % len(pattern)]: the last batch holds the windows it should.
    last_start = (batches_seen - 1) * batch_size
    last_positions = np.arange(last_start, n - block)[:, None] + np.arange(block)
    assert np.array_equal(last_windows, pattern[last_positions % pattern.shape[0]])
    # While the stream fills a batch, the loop still holds the previous one: two batches of
    # int64 windows and next tokens are the buffers; everything else must fit in 16 MB (the
    # corpus alone is 100 MB as uint16, 400 MB as int64).
    batch_buffers = 2 * batch_size * (block + 1) * 8
    assert peak - batch_buffers < 16 * MB, f"peak {peak / MB:.1f} MiB"


def test_validating_a_uint64_memmap_scans_it_in_chunks_without_copying(tmp_path):
    n = 8 * _validate.SCAN_CHUNK  # 64 MB of uint64, 8 chunks
    ids = np.arange(n, dtype=np.uint64)
    path = write_tokens(tmp_path / "wide.npy", ids, dtype=np.uint64)
    corpus, peak = traced_peak(lambda: open_tokens(path))
    assert corpus.dtype == np.uint64 and corpus.num_tokens == n
    assert peak < 2 * _validate.SCAN_CHUNK * 8 < path.stat().st_size // 4

    # The scan reaches the last chunk: one id beyond int64 at the very end is found.
    ids[-1] = 2**63
    np.save(path, ids)
    with pytest.raises(ValueError, match="int64 range") as raised:
        open_tokens(path)
    assert str(path) in str(raised.value)


def test_a_megatron_index_becomes_its_document_offsets_and_nothing_else_its_size(
    tmp_path, monkeypatch
):
    """The index's arrays are unaligned in the file: indexing them at once would copy them
    whole (twice the documents' offsets at 10^7 documents); read in chunks, the offsets are
    the one array of the documents' size."""
    monkeypatch.setattr(_validate, "SCAN_CHUNK", 1 << 12)
    offsets = megatron_documents(tmp_path, 1 << 20)
    shard, peak = traced_peak(lambda: megatron.read(tmp_path / "d"))
    assert np.array_equal(shard.document_offsets, offsets)
    assert peak < 1.25 * offsets.nbytes, f"peak {peak / MB:.1f} MiB"


def megatron_documents(directory, documents: int) -> np.ndarray:
    """A Megatron dataset ``directory/d`` of ``documents`` documents of 3 tokens; its offsets."""
    offsets = np.arange(documents + 1, dtype=np.int64) * 3
    with open(directory / "d.idx", "wb") as f:
        megatron.write_index(f, offsets, np.dtype(np.uint16))
    np.arange(3 * documents, dtype=np.uint16).tofile(directory / "d.bin")
    return offsets


def first_packed_batch(spec) -> tuple[Any, dict[str, np.ndarray]]:
    corpus = open_tokens(spec)
    stream = stream_token_source(corpus, 64, 4, windows="packed", pad=0, shuffle=True)
    return corpus, next(iter(stream))


@pytest.mark.parametrize(
    "through, bound",
    [
        # The dataset's own offsets, the corpus's boundaries and their frozen copy.
        ("the dataset", 3.25),
        # The corpus's boundaries (read once, shared with the manifest's check of each shard)
        # and, while the shard is first read, its dataset's own offsets.
        ("a manifest", 2.5),
    ],
)
def test_the_first_packed_batch_holds_a_few_arrays_of_the_documents_size_at_once(
    tmp_path, monkeypatch, through, bound
):
    monkeypatch.setattr(_validate, "SCAN_CHUNK", 1 << 12)
    offsets = megatron_documents(tmp_path, 1 << 20)
    spec = tmp_path / "d"
    if through == "a manifest":
        spec = write_manifest(spec, tmp_path / "manifest.json")
    (corpus, batch), peak = traced_peak(lambda: first_packed_batch(spec))
    assert batch["input_ids"].shape == (4, 64)
    assert np.array_equal(corpus.document_boundaries, offsets)
    assert peak < bound * offsets.nbytes, f"peak {peak / MB:.1f} MiB"


def test_writing_from_a_memmap_converts_in_chunks_without_copying(tmp_path):
    n = 8 * _validate.SCAN_CHUNK
    source = write_tokens(tmp_path / "wide.npy", np.arange(n) % 50257, dtype=np.int64)
    mapped = open_tokens(source).shards[0]
    target = tmp_path / "narrow.bin"
    _, peak = traced_peak(lambda: write_tokens(target, mapped, format="bin"))
    assert open_tokens(target).num_tokens == n
    assert peak < 4 * _validate.SCAN_CHUNK * 8 < source.stat().st_size // 2


@pytest.mark.skipif(sys.platform != "linux", reason="reads Linux' /proc/self/status")
def test_anonymous_memory_stays_flat_over_a_long_shuffled_run_on_a_memmap(tmp_path):
    ids = np.random.default_rng(1).integers(0, 50257, 8_000_000).astype(np.uint16)
    path = write_tokens(tmp_path / "tokens.npy", ids)
    del ids
    stream = stream_token_source(open_tokens(path), 64, 64, shuffle=True, seed=0)
    for _ in range(200):  # the epoch's permutation and the allocator's pools are in place
        next(stream)
    anon_before = proc_status_kb("RssAnon")
    for _ in range(5000):
        next(stream)
    growth_kb = proc_status_kb("RssAnon") - anon_before
    # The file's pages count as RssFile (page cache the OS can reclaim), never as RssAnon.
    assert growth_kb < 4 * 1024, (
        f"RssAnon grew {growth_kb} KiB over 5000 batches (RssFile {proc_status_kb('RssFile')} KiB)"
    )
