"""The implicit permutation: a keyed bijection of the windows, with no O(windows) array.

Exactness is checked by enumerating whole epochs for many window counts; shuffling quality by
statistics whose values for a truly random permutation are known, measured beside a
``RandomState`` permutation of the same size.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from tokstream import stream_token_source
from tokstream._kernels.order import permuted_positions
from tokstream._permutation import FEISTEL_ROUNDS as _FEISTEL_ROUNDS
from tokstream._permutation import implicit_domain, implicit_round_keys

PRIMES = [2, 3, 5, 7, 13, 31, 127, 8191, 65521, 100003]
POWERS = [2**k + d for k in (1, 2, 3, 4, 5, 8, 10, 12, 16, 20) for d in (-1, 0, 1)]
ODD_SIZES = [1, 6, 10, 100, 999, 1000, 1001, 123457, 10**6]


def implicit_order(
    n: int,
    seed: int,
    epoch: int,
    first: int = 0,
    count: int | None = None,
    stride: int = 1,
    rounds: int = _FEISTEL_ROUNDS,
) -> np.ndarray:
    count = n if count is None else count
    out = np.empty(count, dtype=np.int64)
    low_bits, high_size = implicit_domain(n)
    keys = implicit_round_keys(seed, epoch, rounds)
    permuted_positions(out, first, stride, n, low_bits, high_size, keys)
    return out


@pytest.mark.parametrize("n", sorted(set(PRIMES + POWERS + ODD_SIZES) - {0}))
def test_every_window_exactly_once_per_epoch(n):
    order = implicit_order(n, seed=7, epoch=0)
    assert np.array_equal(np.sort(order), np.arange(n))


def test_large_domain_stays_in_range_and_injective_on_a_stretch():
    n = 10**12 + 39
    stretch = implicit_order(n, seed=1, epoch=3, first=n - 200_000, count=200_000)
    assert stretch.min() >= 0 and stretch.max() < n
    assert np.unique(stretch).shape[0] == stretch.shape[0]


@pytest.mark.parametrize("n", [1, 2, 5, 2**32 + 17, 2**62])
def test_domain_covers_n_and_overshoots_by_less_than_its_low_part(n):
    low_bits, high_size = implicit_domain(n)
    domain = high_size << low_bits
    assert n <= domain < n + (1 << low_bits)
    assert low_bits <= 32 and high_size <= 2**32


def test_positions_can_be_evaluated_anywhere_and_strided():
    n = 5000
    whole = implicit_order(n, seed=3, epoch=1)
    assert np.array_equal(implicit_order(n, 3, 1, first=1234, count=100), whole[1234:1334])
    assert np.array_equal(implicit_order(n, 3, 1, first=2, count=50, stride=7), whole[2:352:7])


def test_order_differs_per_epoch_and_per_seed():
    n = 100_000
    base = implicit_order(n, seed=0, epoch=0)
    others = (implicit_order(n, 0, 1), implicit_order(n, 1, 0), implicit_order(n, 2**32 - 1, 0))
    for other in others:
        assert np.mean(base == other) < 0.001
        assert abs(np.corrcoef(base, other)[0, 1]) < 0.02


def _serial(values: np.ndarray) -> float:
    return float(np.corrcoef(values[:-1], values[1:])[0, 1])


def _shuffle_statistics(order: np.ndarray) -> dict[str, float]:
    n = order.shape[0]
    positions = np.arange(n)
    step = np.abs(np.diff(order))
    decile_counts = np.bincount(order[:2000] * 10 // n, minlength=10)
    low_bits, _ = implicit_domain(n)
    return {
        # The network's two halves and its lowest bit, each uncorrelated between neighbours.
        "serial_low_bit": _serial(order & 1),
        "serial_low_half": _serial(order & ((1 << low_bits) - 1)),
        "serial_high_half": _serial(order >> low_bits),
        # Mean |pi(i) - i| / n is 1/3 for a random permutation.
        "displacement": float(np.mean(np.abs(order - positions)) / n),
        # Consecutive starts (what one batch holds) are uncorrelated.
        "serial_correlation": float(np.corrcoef(order[:-1], order[1:])[0, 1]),
        "position_correlation": float(np.corrcoef(positions, order)[0, 1]),
        # P(|U1 - U2| < 0.01) = 0.0199 for independent uniforms: no clustering of neighbours.
        "close_neighbours": float(np.mean(step < n / 100)),
        # The first 2000 starts spread evenly over the corpus (chi-square, 9 degrees of freedom).
        "first_batch_chi2": float(np.sum((decile_counts - 200.0) ** 2 / 200.0)),
    }


@pytest.mark.parametrize("n", [100_003, 2**17, 2**17 + 1, 1_000_000])
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_implicit_order_is_statistically_like_a_true_permutation(n, seed):
    implicit = _shuffle_statistics(implicit_order(n, seed=seed, epoch=0))
    true = _shuffle_statistics(np.random.RandomState(seed).permutation(n))
    for stats in (implicit, true):
        assert _looks_shuffled(stats, n), stats


def _looks_shuffled(stats: dict[str, float], n: int) -> bool:
    tolerance = 5 / np.sqrt(n)
    correlations = (
        "serial_low_bit",
        "serial_low_half",
        "serial_high_half",
        "serial_correlation",
        "position_correlation",
    )
    return (
        abs(stats["displacement"] - 1 / 3) < tolerance
        and all(abs(stats[name]) < tolerance for name in correlations)
        and abs(stats["close_neighbours"] - 0.0199) < 0.003
        and stats["first_batch_chi2"] < 33.7  # p = 0.0001 for 9 degrees of freedom
    )


def test_the_statistics_catch_a_network_with_too_few_rounds():
    n = 2**17 + 1
    weak = _shuffle_statistics(implicit_order(n, seed=0, epoch=0, rounds=2))
    assert not _looks_shuffled(weak, n)


@pytest.mark.parametrize("shuffle_epochs", [1, 3])
def test_stream_with_implicit_permutation_yields_every_window_once_per_epoch(shuffle_epochs):
    ids = np.arange(10_007, dtype=np.int64)  # a window's first token is its start
    block, batch_size = 5, 64
    stream = stream_token_source(
        ids, block, batch_size, epochs=shuffle_epochs, seed=9, permutation="implicit"
    )
    starts = np.concatenate([windows[:, 0] for windows, _ in stream])
    n = ids.shape[0] - block
    epochs = starts.reshape(shuffle_epochs, n)
    for epoch_starts in epochs:
        assert np.array_equal(np.sort(epoch_starts), np.arange(n))
    if shuffle_epochs > 1:
        assert not np.array_equal(epochs[0], epochs[1])


def test_implicit_permutation_needs_no_per_epoch_array():
    ids = np.zeros(1_000_008, dtype=np.uint8)
    peaks = {}
    for permutation in ("materialized", "implicit"):
        stream = stream_token_source(ids, 8, 256, permutation=permutation)
        tracemalloc.start()
        for _ in range(10):
            next(stream)
        peaks[permutation] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    batch_bytes = 256 * 8 * 8 + 256 * 8
    assert peaks["materialized"] >= 8 * 1_000_000  # the int64 permutation of the windows
    assert peaks["implicit"] < 4 * batch_bytes + 64 * 1024


@pytest.mark.parametrize("n", [1, 7, 9, 100, 1001, 123457])
def test_positions_encrypted_side_by_side_equal_those_encrypted_one_at_a_time(n):
    # Batches of 8 or more go through the kernel's side-by-side lanes, single positions never.
    for first, count, stride in [(0, min(n, 64), 1), (n // 3, min(n - n // 3, 29), 1), (1, 9, 2)]:
        if first + stride * (count - 1) >= n:
            continue
        together = implicit_order(n, seed=3, epoch=2, first=first, count=count, stride=stride)
        alone = [
            implicit_order(n, seed=3, epoch=2, first=first + stride * i, count=1)[0]
            for i in range(count)
        ]
        assert together.tolist() == alone
