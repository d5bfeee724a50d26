"""One wheel, every NumPy it allows: the same bytes under NumPy 1.26 and the newest 2.x.

The parity suite compares the fast path with the reference path under the NumPy installed; if
a NumPy release changed what both compute (the legacy ``RandomState`` stream, an integer cast),
they would still agree with each other. These digests pin the batches themselves, computed once
with NumPy 2.4 and checked under NumPy 1.26 and the newest 2.x in CI.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from tests.conftest import KERNEL_DTYPES
from tokstream import reference, stream_token_source
from tokstream._windows import gather_windows

TOKENS = (np.arange(5000, dtype=np.uint64) * 2654435761 % 50257).astype(np.uint16)


def digest(batches) -> str:
    h = hashlib.sha256()
    for windows, targets in batches:
        assert windows.dtype == np.int64 and targets.dtype == np.int64
        h.update(windows.tobytes())
        h.update(targets.tobytes())
    return h.hexdigest()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            {"shuffle": True, "seed": 0, "epochs": 2},
            "76f473d866e8062e5d031711e322c19c78e5451ce81ad9133bf190c6cd84a73c",
        ),
        (
            {"shuffle": True, "seed": 2**32 - 1},
            "a016b233687b68e4980317f1060a8e861872444ff5574b236709eabf5a04aea0",
        ),
        ({"shuffle": False}, "ce2794c96bcde2ffd2df93e8776072286b6ac049da850223552494fbafee35e2"),
    ],
)
def test_spec_batches_are_the_same_bytes_under_every_numpy(options, expected):
    assert digest(reference.stream_token_source(TOKENS, 32, 64, **options)) == expected
    assert digest(stream_token_source(TOKENS, 32, 64, **options)) == expected


def test_shifted_sharded_batches_are_the_same_bytes_under_every_numpy():
    stream = stream_token_source(TOKENS, 32, 64, seed=7, targets="shifted", world_size=3, rank=2)
    assert digest(stream) == "06213b038a3feaf123de5e975ed3cd7b99ecc9b30d6eb3dfc0f2334b9cab81c2"


def test_the_kernel_reads_every_dtype_under_the_installed_numpy():
    for dtype in KERNEL_DTYPES:
        tokens = np.arange(20).astype(dtype)
        windows = np.empty((2, 3), np.int64)
        next_tokens = np.empty(2, np.int64)
        gather_windows(tokens, np.array([0, 16], np.int64), windows, next_tokens)
        assert windows.tolist() == [[0, 1, 2], [16, 17, 18]] and next_tokens.tolist() == [3, 19]
