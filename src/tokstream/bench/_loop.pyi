"""Stubs for the plain C window-copy loop ``tokstream.bench._loop`` (see ``_loop.pyx``)."""

import numpy as np
import numpy.typing as npt

def copy_windows(
    tokens: npt.NDArray[np.integer],  # const token_t[::1], any of the 8 fixed-width int dtypes
    starts: npt.NDArray[np.int64],  # const int64_t[:]
    windows: npt.NDArray[np.int64],  # int64_t[:, ::1], shape (>= len(starts), block)
    next_tokens: npt.NDArray[np.int64],  # int64_t[::1]
    distance: int,  # Py_ssize_t, windows ahead to prefetch; 0: none
) -> None: ...
