"""A slow oracle of the repetition filter, written from its definition.

A sample is filtered when some stretch of it is one unit of ``p`` tokens repeated ``T`` times
(``p`` in ``[min_period, max_period]``, ``T = max(max_count, 3)``): OLMo-core's
``find_periodic_sequences`` reports such a run, and only runs repeated more than twice. Checked
here by comparing every stretch of ``T * p`` tokens with its first ``p`` tokens tiled, nothing
shared with the kernel's stretch counting.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def repeats(tokens: np.ndarray, min_period: int, max_period: int, max_count: int) -> bool:
    """Whether ``tokens`` holds a unit of some period repeated at least ``max(max_count, 3)``
    times in a row."""
    times = max(max_count, 3)
    for period in range(min_period, max_period + 1):
        span = times * period
        if span > tokens.shape[0]:
            break
        stretches = sliding_window_view(tokens, span)
        units = np.tile(stretches[:, :period], times)
        if (stretches == units).all(axis=1).any():
            return True
    return False


def row_slots(input_ids: np.ndarray, last_tokens: np.ndarray) -> np.ndarray:
    """Each row's ``block + 1`` slots: its window, then the target after it."""
    return np.concatenate([input_ids, last_tokens.reshape(-1, 1)], axis=1)


def row_pieces(slots: np.ndarray, links: np.ndarray) -> list[np.ndarray]:
    """A row's pieces: slot ``j + 1`` continues slot ``j``'s piece where ``links[j]``."""
    cuts = np.flatnonzero(links == 0) + 1
    return np.split(slots, cuts)
