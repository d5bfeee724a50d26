"""Every path of :mod:`tokstream.bench.baselines` on every shape, order and corpus dtype.

One pytest-benchmark group per (corpus dtype, order, shape), so tokstream and its baselines are
side by side. Each benchmark starts its path, draws the first batch untimed (it carries the
one-off epoch permutation) and asserts it identical to the reference's first batch before a
single round is timed; a round then draws the next ``BATCHES`` batches.
"""

from __future__ import annotations

import numpy as np
import pytest

from tokstream import bench
from tokstream.bench import baselines, harness

SHAPES = list(bench.SHAPES)
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
    epochs = bench.epochs_for(ids.shape[0], block, batch_size, needed)
    batches = baselines.PATHS[path](
        ids, block, batch_size, epochs=epochs, shuffle=shuffle, seed=settings.seed
    )
    first = next(batches)
    expected = _reference_first_batch(ids, dtype, shuffle, block, batch_size, settings.seed)
    harness.check_identical({"reference": expected, path: first}, block, against="reference")
    del first

    windows_per_round = benchmark.pedantic(
        bench.consume, args=(batches, settings.batches), rounds=settings.rounds, iterations=1
    )
    per_window = 1 if path == "gather_limit" else block
    unit = "Mwindows/s" if path == "gather_limit" else "Mtok/s"
    benchmark.extra_info["units_per_round"] = windows_per_round * per_window
    benchmark.extra_info["unit"] = unit
    if benchmark.stats is not None:  # None under --benchmark-disable
        rate = windows_per_round * per_window / benchmark.stats.stats.median / 1e6
        benchmark.extra_info[f"median {unit}"] = rate
        results.add(group, path, rate)
