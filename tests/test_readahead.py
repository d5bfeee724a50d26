"""The stream's read-ahead: same batches with or without it, real advice on evicted files.

Read-ahead only decides what the OS reads and when, so every check of batches compares a stream
over an evicted (or cached) file with a stream over the same tokens in RAM, which has none.
"""

from __future__ import annotations

import itertools
import sys
import time

import numpy as np
import pytest

from tests.conftest import assert_same_batches, evict
from tokstream import Corpus, open_tokens, stream_token_source, write_tokens
from tokstream._kernels.advice import resident_fraction
from tokstream._readahead import WARM_AFTER, WINDOWS_AHEAD

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="eviction with posix_fadvise is Linux-only"
)


def token_file(path, count: int, seed: int = 0, dtype: str = "uint16"):
    tokens = np.random.default_rng(seed).integers(0, 50000, count).astype(dtype)
    write_tokens(path, tokens)
    return tokens


def evicted_corpus(*paths) -> Corpus:
    evict(*paths)
    corpus = open_tokens(list(paths))
    if max(resident_fraction(shard) for shard in corpus.shards) > 0.5:
        pytest.skip("this file system keeps files in memory (tmpfs?)")
    return corpus


def windows_come_resident(shard: np.ndarray, starts: np.ndarray, block: int) -> bool:
    """Whether every window starting at ``starts`` is in memory within 10 s (read ahead)."""

    def all_resident() -> bool:
        return all(resident_fraction(shard[s : s + block + 1]) == 1.0 for s in starts)

    deadline = time.monotonic() + 10
    while not all_resident() and time.monotonic() < deadline:
        time.sleep(0.01)
    return all_resident()


@linux_only
@pytest.mark.parametrize("permutation", ["implicit", "materialized"])
@pytest.mark.parametrize(
    ("targets", "world_size", "prefetch"), [("next", 1, 0), ("shifted", 2, 0), ("next", 1, 2)]
)
def test_batches_over_an_evicted_file_are_those_of_the_same_tokens_in_ram(
    tmp_path, permutation, targets, world_size, prefetch
):
    tokens = token_file(tmp_path / "tokens.npy", 300_000)
    options = dict(
        epochs=2,
        permutation=permutation,
        targets=targets,
        world_size=world_size,
        rank=world_size - 1,
        prefetch=prefetch,
        seed=5,
    )
    in_ram = stream_token_source(tokens, 64, 96, **options)
    mapped = stream_token_source(evicted_corpus(tmp_path / "tokens.npy"), 64, 96, **options)
    assert in_ram._readahead is None and mapped._readahead is not None
    assert_same_batches(mapped, in_ram)


@linux_only
def test_shards_are_read_ahead_each_in_its_own_file(tmp_path):
    paths = [tmp_path / f"shard{i}.npy" for i in range(3)]
    shards = [token_file(path, 40_000 + 7_000 * i, seed=i) for i, path in enumerate(paths)]
    expected = stream_token_source(Corpus(shards), 32, 50, permutation="implicit", epochs=2)
    assert_same_batches(
        stream_token_source(evicted_corpus(*paths), 32, 50, permutation="implicit", epochs=2),
        expected,
    )


@linux_only
def test_a_resumed_stream_drops_what_it_read_ahead(tmp_path):
    tokens = token_file(tmp_path / "tokens.npy", 100_000)
    reference = stream_token_source(tokens, 16, 32, epochs=2, seed=1)
    states, batches = [], []
    for batch in reference:
        states.append(reference.state_dict())
        batches.append(batch)
    mapped = stream_token_source(
        evicted_corpus(tmp_path / "tokens.npy"),
        16,
        32,
        epochs=2,
        seed=1,
        permutation="materialized",
    )
    for _ in range(5):
        next(mapped)  # reads batches 5.. ahead
    for index in [40, 2, len(states) - 2]:  # back, forward and near the end: all must match
        mapped.load_state_dict(states[index])
        assert_same_batches(itertools.islice(mapped, 3), batches[index + 1 : index + 4])


@linux_only
def test_the_next_batches_pages_are_read_before_they_are_gathered(tmp_path):
    block, batch_size = 1024, 16
    # Token i is i, so a window's first token is its start; 16 MB: 4096 pages, ~500 advised.
    write_tokens(tmp_path / "tokens.npy", np.arange(4_000_000, dtype=np.uint32))
    corpus = evicted_corpus(tmp_path / "tokens.npy")
    stream = stream_token_source(corpus, block, batch_size, permutation="implicit")
    in_ram = stream_token_source(
        np.arange(4_000_000, dtype=np.uint32), block, batch_size, permutation="implicit"
    )
    next(stream)
    next(in_ram)
    upcoming = np.concatenate([next(in_ram)[0][:, 0] for _ in range(WINDOWS_AHEAD // batch_size)])
    shard = corpus.shards[0]
    assert windows_come_resident(shard, upcoming, block)  # read ahead, none of them touched
    assert resident_fraction(shard) < 0.5  # and not the whole file


@linux_only
def test_the_next_epochs_first_batches_are_read_ahead_before_the_epoch_ends(tmp_path):
    block, batch_size = 1024, 16
    write_tokens(tmp_path / "tokens.npy", np.arange(4_000_000, dtype=np.uint32))
    corpus = evicted_corpus(tmp_path / "tokens.npy")
    options = dict(permutation="implicit", epochs=2, seed=8)
    stream = stream_token_source(corpus, block, batch_size, **options)
    in_ram = stream_token_source(
        np.arange(4_000_000, dtype=np.uint32), block, batch_size, **options
    )
    last = stream.batches_per_epoch - 1
    stream.seek(last)
    in_ram.seek(last + 1)
    next(stream)  # the first epoch's last batch
    upcoming = np.concatenate([next(in_ram)[0][:, 0] for _ in range(WINDOWS_AHEAD // batch_size)])
    shard = corpus.shards[0]
    assert windows_come_resident(shard, upcoming, block)  # the second epoch's, none touched
    assert resident_fraction(shard) < 0.5


@linux_only
@pytest.mark.parametrize("shards", [2, 5])
def test_the_next_batches_pages_are_read_ahead_in_whichever_shard_they_lie(tmp_path, shards):
    block, batch_size, length = 512, 16, 1_000_000
    # Token i of shard j is j * length + i, so a window's first token says where it lies.
    in_ram_shards = [
        np.arange(j * length, (j + 1) * length, dtype=np.uint32) for j in range(shards)
    ]
    paths = [tmp_path / f"shard{j}.npy" for j in range(shards)]
    for path, tokens in zip(paths, in_ram_shards, strict=True):
        write_tokens(path, tokens)
    corpus = evicted_corpus(*paths)
    stream = stream_token_source(corpus, block, batch_size, permutation="implicit")
    in_ram = stream_token_source(Corpus(in_ram_shards), block, batch_size, permutation="implicit")
    assert in_ram._readahead is None
    next(stream)
    next(in_ram)
    upcoming = np.concatenate([next(in_ram)[0][:, 0] for _ in range(WINDOWS_AHEAD // batch_size)])
    assert len(np.unique(upcoming // length)) == shards  # the batches reach every shard

    def all_resident() -> bool:
        return all(
            resident_fraction(corpus.shards[s // length][s % length :][: block + 1]) == 1.0
            for s in upcoming
        )

    deadline = time.monotonic() + 10
    while not all_resident() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all_resident()  # every window read ahead is in memory, none of them touched
    assert max(resident_fraction(shard) for shard in corpus.shards) < 0.5


@linux_only
def test_a_file_in_the_page_cache_stops_the_look_ahead(tmp_path):
    tokens = token_file(tmp_path / "tokens.npy", 200_000)
    corpus = open_tokens(tmp_path / "tokens.npy")
    np.asarray(corpus.shards[0]).max()  # every page in memory
    stream = stream_token_source(corpus, 8, 64, permutation="implicit")
    expected = stream_token_source(tokens, 8, 64, permutation="implicit")
    assert_same_batches(
        [next(stream) for _ in range(WARM_AFTER + 2)],
        [next(expected) for _ in range(WARM_AFTER + 2)],
    )
    assert stream._readahead.warm
    assert_same_batches(stream, expected)


def test_no_read_ahead_for_arrays_in_ram_or_sequential_streams(tmp_path):
    tokens = token_file(tmp_path / "tokens.npy", 10_000)
    assert stream_token_source(tokens, 8, 4)._readahead is None
    mapped = open_tokens(tmp_path / "tokens.npy")
    assert stream_token_source(mapped, 8, 4, shuffle=False)._readahead is None
    assert_same_batches(
        stream_token_source(mapped, 8, 4, shuffle=False),
        stream_token_source(tokens, 8, 4, shuffle=False),
    )
