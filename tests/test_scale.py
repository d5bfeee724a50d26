"""Window positions past 2**31 and 2**32, over a sparse token file of 6.4 billion tokens.

int32 index arithmetic is a recurring loader bug: every check here reads windows whose start
does not fit in 32 bits, from a raw uint8 file that costs no disk (``truncate`` leaves it a
hole) and of which only the few pages holding the expected windows are ever written or read.
The expected windows are computed with NumPy slicing of the file's bytes, and the shuffled
order with the harness' pure-Python model of the implicit permutation, never the kernel.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fuzz.model import implicit_order
from tokstream import Corpus, open_tokens, stream_token_source

TOKENS = 3 * 2**31 + 12_345  # about 6.4e9 uint8 tokens: a third of the windows start past 2**32
BLOCK = 16
BATCH = 8
TAIL = 4096  # the file's last TAIL tokens are written; everything before is a hole of zeros


def token_at(positions: np.ndarray) -> np.ndarray:
    """The known token stored at each written position: never 0, so a hole cannot pass for it."""
    positions = np.asarray(positions, dtype=np.uint64)
    return ((positions * np.uint64(2654435761)) >> np.uint64(13)) % np.uint64(251) + np.uint64(1)


def write_known(f, start: int, count: int) -> None:
    f.seek(start)
    f.write(token_at(np.arange(start, start + count)).astype(np.uint8).tobytes())


def expected_batch(starts):
    """Windows and next tokens of ``starts`` (file positions), from the known tokens."""
    starts = np.asarray(starts, dtype=np.int64)
    windows = np.stack([token_at(np.arange(s, s + BLOCK)) for s in starts]).astype(np.int64)
    return windows, token_at(starts + BLOCK).astype(np.int64)


@pytest.fixture(scope="module")
def sparse_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("scale") / "huge.bin"
    with open(path, "wb") as f:
        f.truncate(TOKENS)
        write_known(f, TOKENS - TAIL, TAIL)
    yield path
    path.unlink()


def resume_at(stream, position: int, epoch: int = 0):
    state = stream.state_dict()
    state["position"], state["epoch"] = position, epoch
    stream.load_state_dict(state)
    return stream


def assert_batch(batch, expected):
    windows, next_tokens = batch
    want_windows, want_next = expected
    assert windows.shape == want_windows.shape and windows.tolist() == want_windows.tolist()
    assert next_tokens.tolist() == want_next.tolist()


def test_the_corpus_really_is_past_two_pow_32_windows(sparse_file):
    corpus = open_tokens(sparse_file, np.uint8)
    assert corpus.num_tokens == TOKENS and corpus.num_windows(BLOCK) > 2**32 + 2**31
    assert corpus.dtype == np.uint8


def test_sequential_windows_at_the_far_end_and_the_partial_last_batch(sparse_file):
    stream = stream_token_source(open_tokens(sparse_file, np.uint8), BLOCK, BATCH, shuffle=False)
    windows = TOKENS - BLOCK
    last_full = (windows // BATCH - 1) * BATCH
    assert len(stream) == -(-windows // BATCH)
    resume_at(stream, last_full)
    assert_batch(next(stream), expected_batch(range(last_full, last_full + BATCH)))
    final = next(stream)
    assert_batch(final, expected_batch(range(last_full + BATCH, windows)))
    assert final[1][-1] == token_at(TOKENS - 1)  # the very last token of the file
    assert next(stream, None) is None


def test_a_state_taken_past_two_pow_32_resumes_exactly(sparse_file):
    corpus = open_tokens(sparse_file, np.uint8)
    stream = stream_token_source(corpus, BLOCK, BATCH, shuffle=False, epochs=2)
    windows = TOKENS - BLOCK
    resume_at(stream, (windows // BATCH - 3) * BATCH)
    next(stream)
    state = json.loads(json.dumps(stream.state_dict()))
    assert state["position"] > 2**32 + 2**31 and state["epoch"] == 0
    fresh = stream_token_source(corpus, BLOCK, BATCH, shuffle=False, epochs=2)
    fresh.load_state_dict(state)
    for _ in range(3):
        assert_batch(next(fresh), next(stream))
    # The epoch ended: the next batch is the start of the file, all holes.
    assert fresh.state_dict()["epoch"] == 1
    assert next(fresh)[0].tolist() == [[0] * BLOCK] * BATCH


def test_shuffled_windows_past_two_pow_32_match_the_permutation_model(tmp_path):
    seed, epoch, steps = 12345, 1, 4
    windows = TOKENS - BLOCK
    order = implicit_order(windows, seed, epoch)
    first = (windows // BATCH - steps) * BATCH  # the epoch's last full batches
    starts = [
        [order(p) for p in range(first + k * BATCH, first + (k + 1) * BATCH)] for k in range(steps)
    ]
    flat = [s for batch in starts for s in batch]
    assert max(flat) > 2**32 and any(2**31 < s < 2**32 for s in flat)
    path = tmp_path / "shuffled.bin"
    with open(path, "wb") as f:
        f.truncate(TOKENS)
        for start in flat:
            write_known(f, start, BLOCK + 1)
    stream = stream_token_source(
        open_tokens(path, np.uint8), BLOCK, BATCH, epochs=3, seed=seed, permutation="implicit"
    )
    resume_at(stream, first, epoch=epoch)
    for batch_starts in starts:
        assert_batch(next(stream), expected_batch(batch_starts))
    state = json.loads(json.dumps(stream.state_dict()))
    assert state["position"] == first + steps * BATCH and state["epoch"] == epoch


def test_two_shards_of_six_billion_tokens_keep_windows_inside_their_shard(sparse_file):
    corpus = open_tokens([sparse_file, sparse_file], np.uint8)
    per_shard = TOKENS - BLOCK
    assert corpus.num_windows(BLOCK) == 2 * per_shard > 2**33
    stream = stream_token_source(corpus, BLOCK, BATCH, shuffle=False)
    # A batch that straddles the boundary: the end of shard 0, then the start of shard 1.
    boundary_batch = per_shard // BATCH * BATCH
    resume_at(stream, boundary_batch)
    windows, next_tokens = next(stream)
    in_first = per_shard - boundary_batch
    want_windows, want_next = expected_batch(range(boundary_batch, per_shard))
    assert windows[:in_first].tolist() == want_windows.tolist()
    assert next_tokens[:in_first].tolist() == want_next.tolist()
    assert windows[in_first:].tolist() == [[0] * BLOCK] * (BATCH - in_first)
    # The far end of shard 1, past 2**33 in the global window index.
    last_full = (2 * per_shard // BATCH - 1) * BATCH
    resume_at(stream, last_full)
    local = last_full - per_shard
    assert_batch(next(stream), expected_batch(range(local, local + BATCH)))


def test_a_numpy_memmap_past_two_pow_32_streams_in_place(sparse_file):
    tokens = np.memmap(sparse_file, dtype=np.uint8, mode="r")
    stream = stream_token_source(Corpus([tokens]), BLOCK, BATCH, shuffle=False)
    assert stream.corpus.shards[0] is tokens or np.shares_memory(stream.corpus.shards[0], tokens)
    start = -(-(TOKENS - TAIL) // BATCH) * BATCH  # the first batch inside the written tail
    resume_at(stream, start)
    assert_batch(next(stream), expected_batch(range(start, start + BATCH)))
