"""Stubs for the compiled window kernel ``tokstream._kernels.gather`` (see ``gather.pyx``)."""

import numpy as np
import numpy.typing as npt

DEBUG_BUILD: bool

def gather_windows(
    tokens: npt.NDArray[np.integer],  # const token_t[::1], any of the 8 fixed-width int dtypes
    starts: npt.NDArray[np.int64],  # const int64_t[:]
    windows: npt.NDArray[np.int64],  # int64_t[:, ::1], shape (b, block)
    next_tokens: npt.NDArray[np.int64] | None = ...,  # int64_t[::1], shape (b,)
    targets: npt.NDArray[np.int64] | None = ...,  # int64_t[:, ::1], shape (b, block)
    rows: npt.NDArray[np.int64] | None = ...,  # const int64_t[:]
    prefetch: int = ...,  # Py_ssize_t, windows ahead; 0: none
    stride: int = ...,  # int64_t, window i starts at offset + stride * starts[i]
    offset: int = ...,  # int64_t
) -> None: ...
def gather_segments(
    anchor: npt.NDArray[np.integer],  # const token_t[::1], any shard (selects the dtype)
    windows_index: npt.NDArray[np.int64],  # const int64_t[:]
    offsets: npt.NDArray[np.int64],  # const int64_t[::1], cumulative windows per segment
    segment_addresses: npt.NDArray[np.uint64],  # const uint64_t[::1], each segment's first token
    segment_lengths: npt.NDArray[np.int64],  # const int64_t[::1], tokens per segment
    bucket_segments: npt.NDArray[np.int64],  # const int64_t[::1], segment of window b << shift
    shift: int,  # int
    probes: int,  # int, search steps enough for the widest bucket
    stride: int,  # int64_t
    sources: npt.NDArray[np.int64],  # int64_t[::1], scratch
    windows: npt.NDArray[np.int64],  # int64_t[:, ::1], shape (b, block)
    next_tokens: npt.NDArray[np.int64] | None = ...,  # int64_t[::1], shape (b,)
    targets: npt.NDArray[np.int64] | None = ...,  # int64_t[:, ::1], shape (b, block)
    prefetch: int = ...,  # Py_ssize_t, windows ahead; 0: none
) -> None: ...
