"""Stubs for the compiled window kernel ``tokstream._windows`` (see ``_windows.pyx``)."""

import numpy as np
import numpy.typing as npt

#: A batch buffer: the stream's out_dtype (``out_t``: int64 or int32).
Out = npt.NDArray[np.int64] | npt.NDArray[np.int32]

DEBUG_BUILD: bool

def gather_windows(
    tokens: npt.NDArray[np.integer],  # const token_t[::1], any of the 8 fixed-width int dtypes
    starts: npt.NDArray[np.int64],  # const int64_t[:]
    input_ids: Out,  # out_t[:, ::1], shape (b, block)
    next_tokens: Out | None = ...,  # out_t[::1], shape (b,)
    targets: Out | None = ...,  # out_t[:, ::1], shape (b, block)
    cache_ahead: int = ...,  # Py_ssize_t, windows prefetched ahead into the cache; 0: none
    stride: int = ...,  # int64_t, window i starts at offset + stride * starts[i]
    offset: int = ...,  # int64_t
) -> bool: ...  # False: a token does not fit the output dtype
def lookup_windows(
    windows_index: npt.NDArray[np.int64],  # const int64_t[:]
    offsets: npt.NDArray[np.int64],  # const int64_t[::1], cumulative windows per segment
    segment_starts: npt.NDArray[np.int64],  # const int64_t[::1], each segment's first token
    segment_addresses: npt.NDArray[np.uint64],  # const uint64_t[::1], that token's address
    segment_lengths: npt.NDArray[np.int64],  # const int64_t[::1], tokens per segment
    bucket_segments: npt.NDArray[np.int64],  # const int64_t[::1], segment of window b << shift
    shift: int,  # int
    probes: int,  # int, search steps enough for the widest bucket
    stride: int,  # int64_t
    itemsize: int,  # Py_ssize_t, bytes per token
    block: int,  # Py_ssize_t, checked in the debug build
    starts: npt.NDArray[np.int64],  # int64_t[::1], out: first tokens
    addresses: npt.NDArray[np.uint64] | None = ...,  # uint64_t[::1], out: their addresses
) -> None: ...
def gather_at(
    anchor: npt.NDArray[np.integer],  # const token_t[::1], any token array (selects the dtype)
    addresses: npt.NDArray[np.uint64],  # const uint64_t[::1], each window's first token
    input_ids: Out,  # out_t[:, ::1], shape (b, block)
    next_tokens: Out | None = ...,  # out_t[::1], shape (b,)
    targets: Out | None = ...,  # out_t[:, ::1], shape (b, block)
    cache_ahead: int = ...,  # Py_ssize_t, windows prefetched ahead into the cache; 0: none
) -> bool: ...  # False: a token does not fit the output dtype
