"""The compiled kernel: that it is the extension module, and which build it is."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import KERNEL_DTYPES
from tokstream import _windows


def test_loaded_kernel_is_the_compiled_extension():
    assert _windows.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert isinstance(_windows.__loader__, importlib.machinery.ExtensionFileLoader)


def test_build_kind_is_the_one_ci_asked_for():
    expect_debug = os.environ.get("TOKSTREAM_EXPECT_DEBUG", "0") == "1"
    assert _windows.DEBUG_BUILD is expect_debug


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


def test_kernel_reads_strided_starts_and_writes_through_rows():
    tokens = np.arange(100, dtype=np.uint16)
    starts = np.arange(0, 80, 10, dtype=np.int64)[::2]  # 0, 20, 40, 60 (strided view)
    rows = np.array([3, 2, 1, 0], dtype=np.int64)
    windows = np.empty((4, 3), np.int64)
    next_tokens = np.empty(4, np.int64)
    _windows.gather_windows(tokens, starts, windows, next_tokens, None, rows)
    assert windows[:, 0].tolist() == [60, 40, 20, 0]
    assert next_tokens.tolist() == [63, 43, 23, 3]


def test_kernel_accepts_read_only_corpora():
    tokens = np.arange(50, dtype=np.int32)
    tokens.flags.writeable = False
    windows = np.empty((1, 4), np.int64)
    next_tokens = np.empty(1, np.int64)
    _windows.gather_windows(tokens, np.array([10], np.int64), windows, next_tokens)
    assert windows.tolist() == [[10, 11, 12, 13]] and next_tokens.tolist() == [14]


@pytest.mark.skipif(not _windows.DEBUG_BUILD, reason="release builds run without bounds checks")
def test_debug_build_catches_an_out_of_range_window():
    tokens = np.arange(10, dtype=np.int64)
    windows = np.empty((1, 4), np.int64)
    with pytest.raises(IndexError):
        _windows.gather_windows(tokens, np.array([7], np.int64), windows, np.empty(1, np.int64))
