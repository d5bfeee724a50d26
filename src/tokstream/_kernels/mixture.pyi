"""Type stubs of the compiled mixture kernel (src/tokstream/_kernels/mixture.pyx)."""

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

def divisor(d: int) -> tuple[int, int]: ...

class MixtureWindows:
    def __init__(
        self,
        root: int,  # int64_t
        nodes: npt.ArrayLike,  # (sources - 1, 4): p, q, left, right
        weights: Sequence[int],  # one per source
        sources: Sequence[Sequence[int]],  # (first window, n_s, low_bits, high_size) per source
        num_windows: int,  # int64_t
        seed: int,  # uint64_t
        shuffle: bool,  # bint
        rounds: int,  # Py_ssize_t, even
        period_limit: int,  # Py_ssize_t
    ) -> None: ...
    @property
    def period_length(self) -> int: ...
    def schedule(self, first: int, step: int, count: int) -> npt.NDArray[np.int64]: ...
    def fill(
        self,
        windows: npt.NDArray[np.int64],  # int64_t[::1]
        first: int,  # int64_t
        step: int,  # int64_t
    ) -> None: ...
