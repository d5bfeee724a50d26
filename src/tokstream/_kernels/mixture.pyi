"""Stubs for the compiled mixture kernel ``tokstream._kernels.mixture`` (see ``mixture.pyx``)."""

import numpy as np
import numpy.typing as npt

def schedule_samples(
    nodes: npt.NDArray[np.void],  # const Node[::1], tokstream._schedule.NODE records
    root: int,  # int64_t
    first: int,  # uint64_t
    step: int,  # uint64_t
    out: npt.NDArray[np.int64],  # int64_t[:, ::1], (count, 2): source, local index
) -> None: ...

class MixtureTables:
    def __init__(
        self,
        nodes: npt.NDArray[np.void],  # const Node[::1]
        root: int,  # int64_t
        period: npt.NDArray[np.void],  # const Row[::1], empty: walk the tree
        period_magic: int,  # uint64_t
        period_shift: int,  # uint64_t
        sources: npt.NDArray[np.void],  # const Source[::1]
        seed: int,  # uint64_t
        shuffle: bool,  # bint
        keys: npt.NDArray[np.uint64],  # uint64_t[:, ::1], (sources, rounds)
        caches: npt.NDArray[np.void],  # SourceCache[::1], one per source
    ) -> None: ...
    def fill(
        self,
        windows_index: npt.NDArray[np.int64],  # int64_t[::1]
        first: int,  # uint64_t
        step: int,  # uint64_t
        samples: npt.NDArray[np.void],  # Sample[::1], scratch, at least len(windows_index)
        places: npt.NDArray[np.int64],  # int64_t[::1], scratch, at least len(windows_index)
    ) -> None: ...
