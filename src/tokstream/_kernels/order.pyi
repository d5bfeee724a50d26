"""Stubs for the compiled order kernel ``tokstream._kernels.order`` (see ``order.pyx``)."""

import numpy as np
import numpy.typing as npt

def permuted_positions(
    out: npt.NDArray[np.int64],  # int64_t[::1]
    first: int,  # int64_t
    stride: int,  # int64_t
    n: int,  # int64_t
    low_bits: int,  # int
    high_size: int,  # int64_t
    keys: npt.NDArray[np.uint64],  # const uint64_t[::1]
) -> None: ...
def round_keys(
    keys: npt.NDArray[np.uint64],  # uint64_t[::1]
    seed: int,  # uint64_t
    epoch: int,  # uint64_t
    stream: int = ...,  # uint64_t
) -> None: ...
