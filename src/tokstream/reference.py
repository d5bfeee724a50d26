"""The reference path: the spec's pure-NumPy generator, one ``np.stack`` per batch.

It is what the fast path must match byte for byte and what the benchmarks measure it against.
It shares every input rule with the fast path (``tokstream._validate``), including the holes of
the spec that tokstream fixes, and otherwise does exactly what the spec does: the corpus is copied
to int64, one ``RandomState(seed)`` draws one ``permutation(n)`` per shuffled epoch, and each
batch is stacked from per-window slices.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from tokstream import _validate


def stream_token_source(
    token_ids: Any, block: int, batch_size: int, *, epochs: int = 1, shuffle: bool = True,
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
    ids: np.ndarray, block: int, batch_size: int, epochs: int, shuffle: bool,
    rng: np.random.RandomState,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    n = len(ids) - block
    if n <= 0:
        return
    for _ in range(epochs):
        order = rng.permutation(n) if shuffle else np.arange(n)
        for k in range(0, n, batch_size):
            idx = order[k : k + batch_size]
            windows = np.stack([ids[i : i + block] for i in idx])
            yield windows, ids[idx + block]
