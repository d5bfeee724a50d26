"""Stubs for the compiled packing kernel ``tokstream._kernels.pack`` (see ``pack.pyx``)."""

import numpy as np
import numpy.typing as npt

def best_fit(
    lengths: npt.NDArray[np.int64],  # const int64_t[::1]
    capacity: int,  # int64_t
    rows: npt.NDArray[np.int64],  # int64_t[::1]
    stack_heads: npt.NDArray[np.int64],  # int64_t[::1]
    nonempty: npt.NDArray[np.uint64],  # uint64_t[::1]
    stack_next: npt.NDArray[np.int64],  # int64_t[::1]
) -> int: ...
def canonical_rows(
    boundaries: npt.NDArray[np.int64],  # const int64_t[::1]
    documents: npt.NDArray[np.int64],  # const int64_t[::1]
    group_documents: int,  # int64_t
    block: int,  # int64_t
    rows: npt.NDArray[np.int64],  # int64_t[::1]
    items: npt.NDArray[np.int64],  # int64_t[::1]
    fulls: npt.NDArray[np.int64],  # int64_t[::1]
    counts: npt.NDArray[np.int64],  # int64_t[::1]
    stack_heads: npt.NDArray[np.int64],  # int64_t[::1]
    nonempty: npt.NDArray[np.uint64],  # uint64_t[::1]
    stack_next: npt.NDArray[np.int64],  # int64_t[::1]
) -> None: ...
def group_pieces(
    boundaries: npt.NDArray[np.int64],  # const int64_t[::1]
    documents: npt.NDArray[np.int64],  # const int64_t[::1]
    block: int,  # int64_t
    starts: npt.NDArray[np.int64],  # int64_t[::1]
    full: npt.NDArray[np.int64],  # int64_t[::1]
    short: npt.NDArray[np.int64],  # int64_t[::1]
) -> tuple[int, int]: ...
def pack_group(
    starts: npt.NDArray[np.int64],  # const int64_t[::1]
    full: npt.NDArray[np.int64],  # const int64_t[::1]
    short: npt.NDArray[np.int64],  # const int64_t[::1]
    block: int,  # int64_t
    piece_order: npt.NDArray[np.int64],  # const int64_t[::1]
    quantum: int,  # int64_t
    row_order: npt.NDArray[np.int64],  # const int64_t[::1]
    row_offsets: npt.NDArray[np.int64],  # int64_t[::1]
    piece_starts: npt.NDArray[np.int64],  # int64_t[::1]
    piece_lengths: npt.NDArray[np.int64],  # int64_t[::1]
    items: npt.NDArray[np.int64],  # int64_t[::1]
    placed: npt.NDArray[np.int64],  # int64_t[::1]
    rows: npt.NDArray[np.int64],  # int64_t[::1]
    by_row: npt.NDArray[np.int64],  # int64_t[::1]
    row_firsts: npt.NDArray[np.int64],  # int64_t[::1]
    full_starts: npt.NDArray[np.int64],  # int64_t[::1]
    counts: npt.NDArray[np.int64],  # int64_t[::1]
    stack_heads: npt.NDArray[np.int64],  # int64_t[::1]
    nonempty: npt.NDArray[np.uint64],  # uint64_t[::1]
    stack_next: npt.NDArray[np.int64],  # int64_t[::1]
) -> int: ...
