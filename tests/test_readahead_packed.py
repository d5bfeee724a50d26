"""Read-ahead of packed rows: the pieces of the next batches' rows are advised to the OS.

A shuffled packed stream reads whole documents in a random order, so over a memory-mapped
corpus not in the page cache each piece is a page fault of its own, as random windows are.
The same read-ahead advises them (``PackedSpace.advise``); the batches never change.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from tests.conftest import evict
from tokstream import Corpus, open_tokens, stream_token_source, write_tokens
from tokstream._kernels.advice import resident_fraction
from tokstream._readahead import WINDOWS_AHEAD

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="eviction with posix_fadvise is Linux-only"
)


def megatron_files(tmp_path, files: int, tokens: int) -> tuple[list, list]:
    """Megatron datasets (their documents recorded in the index) of lognormal documents:
    ``(prefixes, every document in order)``."""
    rng = np.random.default_rng(files)
    prefixes, every = [], []
    for i in range(files):
        lengths = np.maximum(1, rng.lognormal(6, 1, tokens // 300).astype(np.int64))
        ids = rng.integers(10, 50000, int(lengths.sum())).astype(np.uint16)
        documents = np.split(ids, np.cumsum(lengths)[:-1])
        corpus = Corpus.from_documents(documents)
        prefixes.append(write_tokens(tmp_path / f"part-{i:02d}", corpus, "megatron"))
        every.extend(documents)
    return prefixes, every


def evicted(prefixes) -> Corpus:
    """The datasets opened as one corpus after their tokens are dropped from the page cache."""
    evict(*[f"{prefix}.bin" for prefix in prefixes])
    corpus = open_tokens(list(prefixes))
    if max(resident_fraction(shard) for shard in corpus.shards) > 0.5:
        pytest.skip("this file system keeps files in memory (tmpfs?)")
    return corpus


def same_batches(actual, expected) -> None:
    actual, expected = list(actual), list(expected)
    assert len(actual) == len(expected)
    for batch, want in zip(actual, expected, strict=True):
        assert batch.keys() == want.keys()
        for name in want:
            assert np.array_equal(batch[name], want[name]), name


@linux_only
@pytest.mark.parametrize("prefetch", [0, 2])
def test_packed_batches_over_evicted_files_are_those_of_the_same_tokens_in_ram(tmp_path, prefetch):
    prefixes, documents = megatron_files(tmp_path, 3, 100_000)
    options = dict(windows="packed", pad=0, epochs=2, seed=3, prefetch=prefetch)
    options["extras"] = ("document_ids", "position_ids")
    mapped = stream_token_source(evicted(prefixes), 256, 24, **options)
    expected = stream_token_source(Corpus.from_documents(documents), 256, 24, **options)
    assert expected._readahead is None and mapped._readahead is not None
    same_batches(mapped, expected)


@linux_only
def test_the_next_rows_pieces_are_read_before_they_are_copied(tmp_path):
    block, batch_size = 512, 8
    # Files of 10 MB, so that a batch whose sampled pieces are resident (and which is then not
    # advised) is one that is in memory, not one whose pages neighbours brought in.
    prefixes, _ = megatron_files(tmp_path, 2, 5_000_000)
    corpus = evicted(prefixes)
    stream = stream_token_source(corpus, block, batch_size, windows="packed", pad=0)
    next(stream)
    space = stream._space
    # The rows of the batches after the first, as the order gives them.
    upcoming = np.arange(batch_size, batch_size + WINDOWS_AHEAD, dtype=np.int64)
    pieces = space.packing.rows(0, upcoming)
    shard_starts = corpus.shard_starts
    ranges = []
    for start, length in zip(pieces.starts.tolist(), pieces.lengths.tolist(), strict=True):
        shard = int(np.searchsorted(shard_starts, start, side="right")) - 1
        local = start - int(shard_starts[shard])
        ranges.append(corpus.shards[shard][local : local + length])

    def all_resident() -> bool:
        return all(resident_fraction(piece) == 1.0 for piece in ranges)

    deadline = time.monotonic() + 10
    while not all_resident() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all_resident()  # every piece read ahead is in memory, none of them copied
    assert max(resident_fraction(shard) for shard in corpus.shards) < 0.5


def test_unshuffled_packed_rows_are_left_to_the_os(tmp_path):
    prefixes, _ = megatron_files(tmp_path, 1, 20_000)
    mapped = open_tokens(prefixes)
    assert stream_token_source(mapped, 64, 4, windows="packed", pad=0)._readahead is not None
    stream = stream_token_source(mapped, 64, 4, windows="packed", pad=0, shuffle=False)
    assert stream._readahead is None
