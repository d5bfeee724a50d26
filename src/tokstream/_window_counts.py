"""Window arithmetic: how many windows of ``block + 1`` tokens, one every ``stride`` tokens,
segments of given lengths hold, and which tokens they cover.

One rule shared by :class:`~tokstream.corpus.Corpus` (its counts, ``inspect``'s shares) and the
window index space (:mod:`tokstream.plan.windows`), which lays the windows out.
"""

from __future__ import annotations

import numpy as np


def capped_stride(lengths: np.ndarray, stride: int) -> int:
    """``stride``, at most the longest of ``lengths``: beyond it a stride changes nothing (at
    most one window a segment), and so even one beyond int64 fits the kernels."""
    return min(stride, max(int(lengths.max(initial=0)), 1))


def windows_per_segment(lengths: np.ndarray, block: int, stride: int) -> np.ndarray:
    """Windows of ``block + 1`` tokens, one every ``stride`` tokens, in segments of ``lengths``."""
    # A block longer than every segment (even one beyond int64) leaves no windows at all.
    block, stride = min(block, int(lengths.max(initial=0))), capped_stride(lengths, stride)
    # lengths - block - 1 is the room left after the first window; a negative count is none.
    # (An integer division costs more than everything else here: stride 1 skips it.)
    counts = lengths.astype(np.int64) - block
    if stride != 1:
        counts -= 1
        counts //= stride
        counts += 1
    return np.maximum(counts, 0, out=counts)


def covered_tokens(lengths: np.ndarray, block: int, stride: int) -> int:
    """Tokens of segments of ``lengths`` inside some window of ``block + 1`` tokens, one
    every ``stride`` tokens from each segment's start (:meth:`Corpus.tokens_in_windows`)."""
    counts = windows_per_segment(lengths, block, stride)
    if not counts.any():
        return 0
    # A segment's windows overlap (or abut) when stride <= block + 1, else leave gaps.
    span, step = block + 1, min(capped_stride(lengths, stride), block + 1)
    kept = counts[counts > 0]
    return int(kept.shape[0] * span + (kept - 1).sum() * step)


def cumulative(counts: np.ndarray) -> np.ndarray:
    offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets
