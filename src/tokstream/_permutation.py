"""The implicit permutation's domain and round keys: one definition for every keyed order.

A keyed Feistel network over ``[0, n)`` (the compiled ``tokstream._kernels.order``) orders an
epoch's windows (:mod:`tokstream.plan.order`), a packed epoch's groups and rows
(:mod:`tokstream.packing`) and each source-epoch of a mixture (:mod:`tokstream.plan.schedule`);
they all take its domain and keys from here.
"""

from __future__ import annotations

import numpy as np

from tokstream._kernels.order import round_keys

MASK64 = (1 << 64) - 1
FEISTEL_ROUNDS = 6


def implicit_domain(n: int) -> tuple[int, int]:
    """``(low_bits, high_size)`` of the implicit permutation's domain for ``n >= 1`` windows.

    The domain ``high_size * 2**low_bits`` is the smallest multiple of ``2**low_bits`` that is
    ``>= n``, with ``2**low_bits`` about ``sqrt(n)``: it overshoots n by less than ``2**low_bits``.
    """
    low_bits = ((n - 1).bit_length() + 1) // 2
    high_size = -(-n // (1 << low_bits))
    return low_bits, high_size


def implicit_round_keys(
    seed: int, epoch: int, rounds: int = FEISTEL_ROUNDS, stream: int = 0
) -> np.ndarray:
    """Round keys of the implicit permutation of ``epoch``: splitmix64 seeded by both.

    ``stream`` keeps apart permutations of one seed and epoch (a mixture's sources); 0 is a
    single corpus.
    """
    keys = np.empty(rounds, dtype=np.uint64)
    round_keys(keys, seed, epoch & MASK64, stream)
    return keys
