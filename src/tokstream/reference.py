"""The reference path: the pure-NumPy generator tokstream was specified from, one ``np.stack``
per batch.

It is what the fast path must match byte for byte and what the benchmarks measure it against.
It shares every input rule with the fast path (``tokstream._validate``), including the fixes of
the original's holes (docs/reference-differences.md), and otherwise does exactly what the
original does: the corpus is copied
to int64, one ``RandomState(seed)`` draws one ``permutation(n)`` per shuffled epoch, and each
batch is stacked from per-window slices.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from tokstream import _validate


def stream_token_source(
    token_ids: Any,
    block: int,
    batch_size: int,
    *,
    epochs: int = 1,
    shuffle: bool = True,
    seed: int = 0,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(context_windows (b, block) int64, next_tokens (b,) int64)`` micro-batches.

    Every argument is validated when this is called, before the returned generator runs.

    Examples
    --------
    >>> from tokstream.reference import stream_token_source
    >>> [ctx.tolist() for ctx, _ in stream_token_source([5, 6, 7, 8], 2, 2, shuffle=False)]
    [[[5, 6], [6, 7]]]
    """
    ids = _validate.token_array(token_ids).astype(np.int64)
    block, batch_size, epochs, shuffle, seed = _validate.stream_controls(
        block, batch_size, epochs, shuffle, seed
    )
    return _batches(ids, block, batch_size, epochs, shuffle, np.random.RandomState(seed))


def _batches(
    ids: np.ndarray,
    block: int,
    batch_size: int,
    epochs: int,
    shuffle: bool,
    rng: np.random.RandomState,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for starts in batch_starts(len(ids) - block, batch_size, epochs, shuffle, rng):
        windows = np.stack([ids[i : i + block] for i in starts])
        yield windows, ids[starts + block]


def batch_starts(
    num_windows: int, batch_size: int, epochs: int, shuffle: bool, rng: np.random.RandomState
) -> Iterator[np.ndarray]:
    """The window starts of each batch, epoch after epoch, in the reference's order.

    Each epoch draws ``rng.permutation(num_windows)`` (or takes ``arange`` unshuffled) when its
    first batch is requested, and cuts it into consecutive slices of ``batch_size`` (the last one
    shorter). Nothing is yielded when no window fits (``num_windows <= 0``). Every path that must
    match the reference batch for batch (the baselines) walks this one loop.

    >>> [s.tolist() for s in batch_starts(5, 2, 1, False, np.random.RandomState(0))]
    [[0, 1], [2, 3], [4]]
    """
    if num_windows <= 0:
        return
    for _ in range(epochs):
        order = rng.permutation(num_windows) if shuffle else np.arange(num_windows)
        for k in range(0, num_windows, batch_size):
            yield order[k : k + batch_size]
