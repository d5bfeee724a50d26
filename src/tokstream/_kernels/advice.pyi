"""Stubs for the compiled read-ahead advice ``tokstream._kernels.advice`` (see ``advice.pyx``)."""

import numpy as np
import numpy.typing as npt

AVAILABLE: bool

def advise_windows(
    tokens: npt.NDArray[np.integer],  # const token_t[::1], any of the 8 fixed-width int dtypes
    starts: npt.NDArray[np.int64],  # const int64_t[:]
    span: int,  # Py_ssize_t, tokens per window
    sample: int,  # Py_ssize_t, windows checked with mincore first; 0: advise without checking
) -> int: ...
def resident_fraction(
    tokens: npt.NDArray[np.integer],  # const token_t[::1]
) -> float: ...
