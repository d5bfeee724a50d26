"""Stubs for the compiled read-ahead advice ``tokstream._kernels.advice`` (see ``advice.pyx``)."""

import numpy as np
import numpy.typing as npt

AVAILABLE: bool

def advise_at(
    addresses: npt.NDArray[np.uint64],  # const uint64_t[::1], each window's first token
    window_bytes: int,  # Py_ssize_t, bytes from each address
    sample: int,  # Py_ssize_t, windows checked with mincore first; 0: advise without checking
    lengths: npt.NDArray[np.int64] | None = None,  # const int64_t[::1], bytes from each address
) -> int: ...
def resident_fraction(
    tokens: npt.NDArray[np.integer],  # const token_t[::1]
) -> float: ...
