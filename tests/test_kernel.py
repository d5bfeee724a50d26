"""The compiled kernel: that it is the extension module, and which build it is."""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import KERNEL_DTYPES
from tokstream import Corpus, _windows, stream_token_source
from tokstream._space import CACHE_AHEAD_BYTES, CACHE_AHEAD_MAX_WINDOWS, cache_ahead, rows_ahead
from tokstream._windows import DEBUG_BUILD


def test_loaded_kernel_is_the_compiled_extension():
    assert _windows.__name__ == "tokstream._windows"
    assert _windows.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert isinstance(_windows.__loader__, importlib.machinery.ExtensionFileLoader)


class _Recorded:
    """A fused kernel whose specialisations count their calls before running the real ones."""

    def __init__(self, kernel: Any, calls: list[str]) -> None:
        def recorded(name: str, specialised: Any) -> Any:
            def call(*args: Any) -> Any:
                calls.append(name)
                return specialised(*args)

            return call

        self.__signatures__ = {
            key: recorded(kernel.__name__, specialised)
            for key, specialised in kernel.__signatures__.items()
        }


@pytest.mark.parametrize(
    ("shards", "kernel"), [(1, "gather_windows"), (3, "gather_at")], ids=["one shard", "shards"]
)
def test_the_window_kernel_fills_every_batch(monkeypatch, shards, kernel):
    corpus = Corpus(np.array_split(np.arange(600, dtype=np.uint16), shards))
    expected = [tuple(map(np.copy, batch)) for batch in stream_token_source(corpus, 8, 4, seed=1)]
    calls: list[str] = []
    for name in ("gather_windows", "gather_at"):
        monkeypatch.setattr(_windows, name, _Recorded(getattr(_windows, name), calls))
    for (windows, next_tokens), (want_windows, want_next) in zip(
        stream_token_source(corpus, 8, 4, seed=1), expected, strict=True
    ):
        np.testing.assert_array_equal(windows, want_windows)
        np.testing.assert_array_equal(next_tokens, want_next)
    assert calls == [kernel] * len(expected)


def test_build_kind_is_the_one_ci_asked_for():
    expect_debug = os.environ.get("TOKSTREAM_EXPECT_DEBUG", "0") == "1"
    assert DEBUG_BUILD is expect_debug


def test_missing_extension_is_a_clear_import_error_not_a_slow_path():
    code = (
        "import sys; sys.modules['tokstream._windows'] = None\n"
        "try:\n    import tokstream\n"
        "except ImportError as e:\n    print('IMPORTERROR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "IMPORTERROR" in out.stdout and "compiled kernel" in out.stdout


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_kernel_gathers_windows_next_tokens_and_shifted_targets(dtype):
    tokens = (np.arange(40) % 100).astype(dtype)
    starts = np.array([5, 0, 30, 7], dtype=np.int64)
    windows = np.empty((4, 6), np.int64)
    next_tokens = np.empty(4, np.int64)
    _windows.gather_windows(tokens, starts, windows, next_tokens)
    assert windows.tolist() == [list(range(s, s + 6)) for s in starts]
    assert next_tokens.tolist() == [s + 6 for s in starts]
    targets = np.empty((4, 6), np.int64)
    _windows.gather_windows(tokens, starts, windows, None, targets)
    assert targets.tolist() == [list(range(s + 1, s + 7)) for s in starts]


def test_kernel_reads_strided_starts():
    tokens = np.arange(100, dtype=np.uint16)
    starts = np.arange(0, 80, 10, dtype=np.int64)[::2]  # 0, 20, 40, 60 (strided view)
    windows = np.empty((4, 3), np.int64)
    next_tokens = np.empty(4, np.int64)
    _windows.gather_windows(tokens, starts, windows, next_tokens)
    assert windows[:, 0].tolist() == [0, 20, 40, 60]
    assert next_tokens.tolist() == [3, 23, 43, 63]


def test_kernel_accepts_read_only_corpora():
    tokens = np.arange(50, dtype=np.int32)
    tokens.flags.writeable = False
    windows = np.empty((1, 4), np.int64)
    next_tokens = np.empty(1, np.int64)
    _windows.gather_windows(tokens, np.array([10], np.int64), windows, next_tokens)
    assert windows.tolist() == [[10, 11, 12, 13]] and next_tokens.tolist() == [14]


@pytest.mark.skipif(not DEBUG_BUILD, reason="release builds run without bounds checks")
def test_debug_build_catches_an_out_of_range_window():
    tokens = np.arange(10, dtype=np.int64)
    windows = np.empty((1, 4), np.int64)
    with pytest.raises(IndexError):
        _windows.gather_windows(tokens, np.array([7], np.int64), windows, np.empty(1, np.int64))


def segment_arguments(shards, block, stride, shift=0):
    """``lookup_windows``' description of ``shards`` as segments (those holding a window),
    with buckets of ``2**shift`` windows (shift 0: one bucket per window): ``(kept shards,
    offsets, first tokens in the shards laid end to end, addresses, lengths, buckets)``."""
    counts = [max(0, (len(s) - block - 1) // stride + 1) for s in shards]
    kept = [k for k, n in enumerate(counts) if n]
    offsets = np.concatenate([[0], np.cumsum([counts[k] for k in kept])]).astype(np.int64)
    shard_starts = np.concatenate([[0], np.cumsum([len(s) for s in shards])]).astype(np.int64)
    addresses = np.array([shards[k].ctypes.data for k in kept], np.uint64)
    lengths = np.array([len(shards[k]) for k in kept], np.int64)
    firsts = np.arange(((offsets[-1] - 1) >> shift) + 1) << shift
    buckets = np.searchsorted(offsets[:-1], firsts, side="right") - 1
    buckets = np.append(buckets, len(kept) - 1).astype(np.int64)
    return kept, offsets, shard_starts[kept], addresses, lengths, buckets


def looked_up(shards, index, block, stride, shift, probes):
    """``(starts, addresses)`` of windows ``index`` by ``lookup_windows``."""
    _, offsets, firsts, addresses, lengths, buckets = segment_arguments(
        shards, block, stride, shift
    )
    starts, found = np.empty(len(index), np.int64), np.empty(len(index), np.uint64)
    _windows.lookup_windows(
        index, offsets, firsts, addresses, lengths, buckets, shift, probes, stride,
        shards[0].itemsize, block, starts, found,
    )  # fmt: skip
    return starts, found


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("cache_ahead", [0, 3])
@pytest.mark.parametrize("stride", [1, 4])
# Any bucket width, and any number of fixed search steps (too few: the search finishes anyway).
@pytest.mark.parametrize(("shift", "probes"), [(0, 0), (2, 1), (3, 2), (10, 3), (10, 0), (4, 9)])
def test_looked_up_windows_are_gathered_each_from_its_own_segment(
    dtype, cache_ahead, stride, shift, probes
):
    rng = np.random.default_rng(4)
    shards = [rng.integers(0, 100, n).astype(dtype) for n in (30, 0, 12, 50, 5, 9)]
    block = 6
    kept, offsets, firsts, *_ = segment_arguments(shards, block, stride, shift)
    expected_rows = [
        shards[k][j * stride :][: block + 1].astype(np.int64)
        for k, n in zip(kept, np.diff(offsets), strict=True)
        for j in range(n)
    ]
    expected_starts = [
        first + j * stride
        for first, n in zip(firsts, np.diff(offsets), strict=True)
        for j in range(n)
    ]
    index = rng.integers(0, offsets[-1], 40).astype(np.int64)
    starts, addresses = looked_up(shards, index, block, stride, shift, probes)
    assert starts.tolist() == [expected_starts[w] for w in index]
    windows, targets = np.empty((40, block), np.int64), np.empty((40, block), np.int64)
    next_tokens = np.empty(40, np.int64)
    _windows.gather_at(shards[0], addresses, windows, next_tokens, None, cache_ahead)
    expected = np.stack([expected_rows[w] for w in index])
    np.testing.assert_array_equal(windows, expected[:, :-1])
    np.testing.assert_array_equal(next_tokens, expected[:, -1])
    _windows.gather_at(shards[0], addresses, windows, None, targets, cache_ahead)
    np.testing.assert_array_equal(targets, expected[:, 1:])


def test_the_lookup_reads_a_strided_index_and_an_empty_one():
    # A rank's slice of a materialized order is a strided view: the segment lookup reads it
    # by its byte stride. No window: nothing is read or written.
    shards = [np.arange(30), np.arange(100, 112), np.arange(200, 250)]
    _, offsets, firsts, addresses, lengths, buckets = segment_arguments(shards, 6, 1, 2)
    strided = np.arange(offsets[-1], dtype=np.int64)[::-1].copy()[::3]
    shard = np.searchsorted(offsets, strided, side="right") - 1
    starts, found = looked_up(shards, strided, 6, 1, 2, 2)
    assert starts.tolist() == (firsts[shard] + strided - offsets[shard]).tolist()
    windows, next_tokens = np.empty((len(strided), 6), np.int64), np.empty(len(strided), np.int64)
    _windows.gather_at(shards[0], found, windows, next_tokens)
    assert (
        windows[:, 0].tolist()
        == (np.array([0, 100, 200])[shard] + strided - offsets[shard]).tolist()
    )
    starts_only = np.empty(len(strided), np.int64)
    described = (offsets, firsts, addresses, lengths, buckets, 2, 2, 1, 8, 6)
    _windows.lookup_windows(strided, *described, starts_only)
    assert starts_only.tolist() == starts.tolist()
    empty = np.empty(0, np.int64)
    _windows.lookup_windows(empty, *described, empty, np.empty(0, np.uint64))
    _windows.gather_at(shards[0], np.empty(0, np.uint64), np.empty((0, 6), np.int64), empty)


@pytest.mark.skipif(not DEBUG_BUILD, reason="release builds run without bounds checks")
def test_debug_build_catches_a_window_past_its_segment():
    shards = [np.arange(10), np.arange(10)]
    _, offsets, firsts, addresses, lengths, buckets = segment_arguments(shards, 4, 1)
    with pytest.raises(IndexError, match="inside its segment"):
        _windows.lookup_windows(
            np.array([5], np.int64),
            offsets,
            firsts,
            addresses,
            lengths - 1,  # a description that claims one token fewer than the windows need
            buckets,
            0,
            0,
            1,
            8,
            4,
            np.empty(1, np.int64),
        )


@pytest.mark.parametrize("dtype", ["u2", "i8"])
@pytest.mark.parametrize("ahead", [0, 1, 3, 64, 2**62, -5])
def test_the_cache_ahead_distance_never_changes_the_windows(dtype, ahead):
    tokens = np.random.default_rng(0).integers(0, 1000, 500).astype(dtype)
    starts = np.random.default_rng(1).integers(0, 500 - 17, 50)
    windows = np.empty((50, 16), np.int64)
    next_tokens = np.empty(50, np.int64)
    _windows.gather_windows(tokens, starts, windows, next_tokens, None, ahead)
    want = np.stack([tokens[s : s + 16] for s in starts]).astype(np.int64)
    np.testing.assert_array_equal(windows, want)
    np.testing.assert_array_equal(next_tokens, tokens[starts + 16])


@pytest.mark.parametrize("dtype", ["int64", "uint16", "uint8", "int32"])
def test_cache_ahead_keeps_about_2_kib_ahead_and_skips_long_windows(dtype):
    dtype = np.dtype(dtype)
    for block in [1, 8, 64, 128, 1024, 4096, 2**40]:
        distance = cache_ahead(block, dtype)
        window_bytes = (block + 1) * dtype.itemsize
        assert 0 <= distance <= CACHE_AHEAD_MAX_WINDOWS
        if distance:
            assert distance == 1 or distance * window_bytes <= CACHE_AHEAD_BYTES
    assert cache_ahead(8, np.dtype("int64")) == 28
    assert cache_ahead(128, np.dtype("uint16")) == 7
    assert cache_ahead(1024, np.dtype("uint16")) == 1
    assert cache_ahead(128, np.dtype("int64")) == 1
    assert cache_ahead(256, np.dtype("int64")) == 1
    assert cache_ahead(264, np.dtype("int64")) == 0
    assert cache_ahead(128, np.dtype("int32")) == 3


def test_packed_rows_are_requested_ahead_by_about_4_kib_and_long_rows_not():
    assert rows_ahead(128, np.dtype("int64")) == 3
    assert rows_ahead(1024, np.dtype("uint16")) == 1
    assert rows_ahead(1024, np.dtype("int64")) == 0
    assert rows_ahead(8, np.dtype("uint8")) == CACHE_AHEAD_MAX_WINDOWS
    for block in (1, 7, 100, 2047, 2048, 4096):
        for dtype in ("uint8", "uint16", "int32", "int64"):
            rows = rows_ahead(block, np.dtype(dtype))
            assert 0 <= rows <= CACHE_AHEAD_MAX_WINDOWS
            assert (
                rows == 0
                or rows == 1
                or rows * (block + 1) * np.dtype(dtype).itemsize <= 2 * CACHE_AHEAD_BYTES
            )


PORTABLE_H = Path(__file__).resolve().parents[1] / "src" / "tokstream" / "_kernels" / "portable.h"


def run_portable_c(tmp_path, main: str, defines: list[str], text: str) -> str:
    """Compile ``main`` (a C program including ``portable.h``) with ``defines``, feed it
    ``text`` and return what it prints; skip without a C compiler or the source tree."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None or not PORTABLE_H.is_file():
        pytest.skip("needs a C compiler and the source tree")
    source, program = tmp_path / "main.c", tmp_path / "main"
    source.write_text(main)
    flags = ["-O2", "-std=c99", "-Wall", "-Werror", f"-I{PORTABLE_H.parent}", *defines]
    subprocess.run([compiler, *flags, str(source), "-o", str(program)], check=True)
    return subprocess.run(
        [str(program)], input=text, capture_output=True, text=True, check=True
    ).stdout


MULHI_MAIN = r"""
#include <stdio.h>
#include <inttypes.h>
#include "portable.h"
int main(void) {
    uint64_t a, b;
    while (scanf("%" SCNu64 " %" SCNu64, &a, &b) == 2)
        printf("%" PRIu64 "\n", tokstream_mulhi64(a, b));
    return 0;
}
"""


@pytest.mark.parametrize(
    "defines", [[], ["-DTOKSTREAM_PORTABLE_MULHI"]], ids=["native", "portable"]
)
def test_mulhi_matches_the_exact_product_with_and_without_128_bit_integers(tmp_path, defines):
    """The plain-C multiply (what MSVC on 32-bit and exotic compilers get) equals the exact one."""
    rng = np.random.default_rng(0)
    edges = [0, 1, 2**32 - 1, 2**32, 2**32 + 1, 2**63, 2**64 - 1]
    pairs = [(a, b) for a in edges for b in edges]
    pairs += [tuple(int(v) for v in rng.integers(0, 2**64, 2, dtype=np.uint64)) for _ in range(500)]
    out = run_portable_c(tmp_path, MULHI_MAIN, defines, "".join(f"{a} {b}\n" for a, b in pairs))
    assert [int(v) for v in out.split()] == [(a * b) >> 64 for a, b in pairs]


SEARCH_MAIN = r"""
#include <stdio.h>
#include <inttypes.h>
#include "portable.h"
int main(void) {
    /* Each line: low high value n v[0] ... v[n-1]; prints first64 first16 last16 first32. */
    int64_t low, high, value, n, i, v64[512];
    uint16_t v16[512];
    int32_t v32[512];
    while (scanf("%" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64, &low, &high, &value, &n) == 4) {
        for (i = 0; i < n; i++) {
            if (scanf("%" SCNd64, &v64[i]) != 1) return 1;
            v16[i] = (uint16_t)v64[i];
            v32[i] = (int32_t)(uint32_t)v64[i];
        }
        printf("%" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 "\n",
               tokstream_first_equal64(v64, low, high, value),
               tokstream_first_equal16(v16, low, high, (uint16_t)value),
               tokstream_last_equal16(v16, low, high, (uint16_t)value),
               tokstream_first_equal32(v32, low, high, (int32_t)(uint32_t)value));
    }
    return 0;
}
"""


@pytest.mark.parametrize(
    "defines", [[], ["-DTOKSTREAM_PORTABLE_SCAN"]], ids=["sse2-where-present", "portable"]
)
def test_equality_searches_find_the_first_and_last_match_in_range(tmp_path, defines):
    """The eos searches of the document kernel, vectorised and plain C, against NumPy (the
    32-bit one over the low 32 bits: a row written with out_dtype="int32")."""
    rng = np.random.default_rng(0)
    cases = []
    for _ in range(400):
        n = int(rng.integers(0, 100))
        value = int(rng.choice([3, 2**33 + 3, 65535, 2**31 - 1]))
        # Ids equal to the value in one 32-bit half only, or in other bits than the low 16.
        values = rng.choice([value ^ 2**40, value ^ 1, value ^ 2**17, value ^ 2**31, 7], n)
        values[rng.random(n) < rng.choice([0.0, 0.01, 0.1, 0.5])] = value
        low = int(rng.integers(0, n + 1))
        cases.append((low, int(rng.integers(low, n + 1)), value, values.astype(np.int64)))
    text = "".join(
        f"{low} {high} {value} {len(v)} {' '.join(map(str, v.tolist()))}\n"
        for low, high, value, v in cases
    )
    out = run_portable_c(tmp_path, SEARCH_MAIN, defines, text)
    for line, (low, high, value, v) in zip(out.splitlines(), cases, strict=True):
        hits64 = low + np.flatnonzero(v[low:high] == value)
        hits16 = low + np.flatnonzero(v[low:high].astype(np.uint16) == np.uint16(value % 2**16))
        hits32 = low + np.flatnonzero(v[low:high].astype(np.uint32) == np.uint32(value % 2**32))
        want = (
            int(hits64[0]) if len(hits64) else high,
            int(hits16[0]) if len(hits16) else high,
            int(hits16[-1]) if len(hits16) else low - 1,
            int(hits32[0]) if len(hits32) else high,
        )
        assert tuple(int(x) for x in line.split()) == want, (low, high, value, v)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize(("stride", "offset"), [(1, 0), (3, 5), (7, 0)])
@pytest.mark.parametrize("shifted", [False, True])
def test_kernel_maps_window_indices_to_first_tokens_by_stride_and_offset(
    dtype, stride, offset, shifted
):
    tokens = np.random.default_rng(2).integers(0, 100, 90).astype(dtype)
    block = 5
    indices = np.array([0, 9, 3, 3, 11], np.int64)  # offset + stride * 11 + block < 90
    expected = np.stack([tokens[offset + stride * w :][: block + 1] for w in indices])
    windows = np.empty((5, block), np.int64)
    targets, next_tokens = (
        (np.empty((5, block), np.int64), None) if shifted else (None, np.empty(5, np.int64))
    )
    _windows.gather_windows(tokens, indices, windows, next_tokens, targets, 2, stride, offset)
    np.testing.assert_array_equal(windows, expected[:, :-1])
    if shifted:
        np.testing.assert_array_equal(targets, expected[:, 1:])
    else:
        np.testing.assert_array_equal(next_tokens, expected[:, -1])
