"""Read-ahead advice: it reads the windows it is told to, skips what is resident, harms nothing."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

from tests.conftest import evict
from tokstream._kernels import advice

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="eviction with posix_fadvise is Linux-only"
)


def _evicted_map(path, num_tokens: int) -> np.memmap:
    """A uint16 file of ``num_tokens`` tokens, written, flushed and dropped from the page cache."""
    np.random.default_rng(0).integers(0, 50000, num_tokens, dtype=np.uint16).tofile(path)
    evict(path)
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    if advice.resident_fraction(tokens) > 0.5:
        pytest.skip("this file system keeps the file in memory (tmpfs?)")
    return tokens


def _addresses(tokens: np.ndarray, starts) -> np.ndarray:
    """The addresses of ``tokens[starts]``, as the gather's lookup finds them."""
    return tokens.ctypes.data + np.asarray(starts, np.uint64) * np.uint64(tokens.itemsize)


def _wait_resident(tokens: np.ndarray, seconds: float = 10.0) -> float:
    deadline = time.monotonic() + seconds
    while (fraction := advice.resident_fraction(tokens)) < 1.0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return fraction


def test_available_where_madvise_exists():
    assert advice.AVAILABLE is (sys.platform != "win32")


@linux_only
def test_advice_reads_the_advised_windows_pages_and_no_others(tmp_path):
    tokens = _evicted_map(tmp_path / "tokens.bin", 64 * PAGE)  # 128 pages of uint16
    tokens_per_page = PAGE // 2
    # Windows that start on pages 3, 40 and 100 and span two pages each.
    starts = np.array([3, 40, 100], np.int64) * tokens_per_page + tokens_per_page - 4
    assert advice.advise_at(_addresses(tokens, starts), 20, 4) == 3
    for page in [3, 4, 40, 41, 100, 101]:
        view = tokens[page * tokens_per_page : (page + 1) * tokens_per_page]
        assert _wait_resident(view) == 1.0, page
    assert advice.resident_fraction(tokens) < 0.5
    assert advice.resident_fraction(tokens[50 * tokens_per_page : 90 * tokens_per_page]) == 0.0


@linux_only
def test_resident_windows_are_not_advised_again(tmp_path):
    tokens = _evicted_map(tmp_path / "tokens.bin", 16 * PAGE)
    starts = np.arange(0, tokens.shape[0] - 100, 997, dtype=np.int64)
    assert advice.advise_at(_addresses(tokens, starts), 200, 4) == starts.shape[0]
    for start in starts:
        assert _wait_resident(tokens[start : start + 100]) == 1.0
    assert advice.advise_at(_addresses(tokens, starts), 200, 4) == 0
    # Without a sample, everything is advised again (cheap for resident pages).
    assert advice.advise_at(_addresses(tokens, starts), 200, 0) == starts.shape[0]


@pytest.mark.parametrize("dtype", ["u1", "i2", "u4", "i8"])
def test_arrays_in_ram_are_resident_and_never_advised_after_a_sample(dtype):
    tokens = np.arange(100_000).astype(dtype)
    starts = np.array([0, 500, 99_000], np.int64)
    assert advice.resident_fraction(tokens) == 1.0
    assert advice.advise_at(_addresses(tokens, starts), 1000 * tokens.itemsize, 4) == 0


def test_nothing_to_advise_is_zero_and_an_empty_array_is_resident():
    empty = np.empty(0, np.uint16)
    assert advice.advise_at(np.empty(0, np.uint64), 10, 4) == 0
    assert advice.advise_at(_addresses(np.arange(10), [2]), 0, 0) == 0
    assert advice.resident_fraction(empty) == 1.0


def test_a_sample_larger_than_the_batch_checks_each_window_once():
    tokens = np.arange(1000, dtype=np.int64)
    assert advice.advise_at(_addresses(tokens, [1, 2]), 24, 1000) == 0


@linux_only
def test_ranges_of_their_own_lengths_are_advised_each_to_its_end(tmp_path):
    """A packed row's pieces: ``lengths[i]`` bytes from ``addresses[i]`` (0: nothing)."""
    tokens = _evicted_map(tmp_path / "tokens.bin", 64 * PAGE)  # 128 pages of uint16
    tokens_per_page = PAGE // 2
    # Pieces from pages 2 (three pages long), 30 (one token) and 90 (empty: nothing advised).
    starts = np.array([2, 30, 90], np.int64) * tokens_per_page
    lengths = np.array([3 * PAGE, 2, 0], np.int64)
    assert advice.advise_at(_addresses(tokens, starts), 0, 4, lengths) == 2
    for page in [2, 3, 4, 30]:
        view = tokens[page * tokens_per_page : (page + 1) * tokens_per_page]
        assert _wait_resident(view) == 1.0, page
    assert advice.resident_fraction(tokens[90 * tokens_per_page : 128 * tokens_per_page]) == 0.0
    assert advice.resident_fraction(tokens[10 * tokens_per_page : 28 * tokens_per_page]) == 0.0


def test_ranges_need_a_length_each():
    tokens = np.zeros(100, np.uint16)
    with pytest.raises(ValueError, match="an entry per address"):
        advice.advise_at(_addresses(tokens, [0, 10]), 0, 0, np.array([4], np.int64))
