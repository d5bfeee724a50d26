"""Every path of :mod:`tokstream.baselines` on every shape, order and corpus dtype.

One pytest-benchmark group per (corpus dtype, order, shape), so tokstream and its baselines are
side by side. Each benchmark starts its path, draws the first batch untimed (it carries the
one-off epoch permutation) and asserts it identical to the reference's first batch before a
single round is timed; a round then draws the next ``BATCHES`` batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tokstream import baselines

SHAPES = [(8, 4096), (128, 512), (1024, 64), (1024, 512), (2048, 16)]
DTYPES = ["int64", "uint16"]
ORDERS = [True, False]


def _group(dtype: str, shuffle: bool, block: int, batch_size: int) -> str:
    return f"{dtype} {'shuffled' if shuffle else 'sequential'} block={block} batch={batch_size}"


_expected: dict[tuple[str, bool, int, int], tuple[np.ndarray, np.ndarray]] = {}


def _reference_first_batch(
    ids: np.ndarray, dtype: str, shuffle: bool, block: int, batch_size: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The spec's first batch for this case, computed once and shared by the group."""
    key = (dtype, shuffle, block, batch_size)
    if key not in _expected:
        reference = baselines.reference(ids, block, batch_size, shuffle=shuffle, seed=seed)
        _expected[key] = next(reference)
    return _expected[key]


def _as_numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else value


def _assert_first_batch(path: str, batch: tuple[Any, ...], expected: tuple[np.ndarray, ...]):
    windows, next_tokens = expected
    if path in baselines.LOADERS:
        got_windows, got_next = (_as_numpy(part) for part in batch)
        assert got_windows.dtype == np.int64 and got_next.dtype == np.int64
        np.testing.assert_array_equal(got_windows, windows)
        np.testing.assert_array_equal(got_next, next_tokens)
    elif path == "gather_limit":
        np.testing.assert_array_equal(batch[0], windows[:, 0])
    else:
        assert batch[0].shape == windows.shape


@pytest.mark.parametrize("path", list(baselines.PATHS))
@pytest.mark.parametrize("shuffle", ORDERS, ids=["shuffled", "sequential"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{n}" for b, n in SHAPES])
def test_throughput(benchmark, settings, corpora, results, shape, dtype, shuffle, path) -> None:
    if path == "nanogpt" and not baselines.torch_available():
        pytest.skip("PyTorch is not installed")
    block, batch_size = shape
    ids = corpora[dtype]
    group = _group(dtype, shuffle, block, batch_size)
    benchmark.group = group
    needed = 1 + settings.rounds * settings.batches
    epochs = baselines.epochs_for(ids.shape[0], block, batch_size, needed)
    batches = baselines.PATHS[path](
        ids, block, batch_size, epochs=epochs, shuffle=shuffle, seed=settings.seed
    )
    first = next(batches)
    expected = _reference_first_batch(ids, dtype, shuffle, block, batch_size, settings.seed)
    _assert_first_batch(path, first, expected)
    del first

    windows_per_round = benchmark.pedantic(
        baselines.consume, args=(batches, settings.batches), rounds=settings.rounds, iterations=1
    )
    per_window = 1 if path == "gather_limit" else block
    unit = "Mwindows/s" if path == "gather_limit" else "Mtok/s"
    benchmark.extra_info["units_per_round"] = windows_per_round * per_window
    benchmark.extra_info["unit"] = unit
    if benchmark.stats is not None:  # None under --benchmark-disable
        rate = windows_per_round * per_window / benchmark.stats.stats.median / 1e6
        benchmark.extra_info[f"median {unit}"] = rate
        results.add(group, path, rate)
