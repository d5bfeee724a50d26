"""Stubs for the compiled document kernel ``tokstream._kernels.documents`` (documents.pyx)."""

import numpy as np
import numpy.typing as npt

def gather_documents(
    tokens: npt.NDArray[np.integer],  # const token_t[::1], any of the 8 fixed-width int dtypes
    starts: npt.NDArray[np.int64],  # const int64_t[:]
    windows: npt.NDArray[np.int64],  # int64_t[:, ::1], shape (b, block)
    next_tokens: npt.NDArray[np.int64] | None,  # int64_t[::1], shape (b,)
    targets: npt.NDArray[np.int64] | None,  # int64_t[:, ::1], shape (b, block)
    rows: npt.NDArray[np.int64] | None,  # const int64_t[:]
    prefetch: int,  # Py_ssize_t, windows ahead; 0: none
    document_starts: npt.NDArray[np.int64],  # const int64_t[::1], sorted, local to tokens
    document_buckets: npt.NDArray[np.int64],  # const int64_t[::1], starts <= k << shift
    bucket_shift: int,  # int
    eos: int,  # int64_t
    use_eos: bool,  # bint
    position_ids: npt.NDArray[np.int64] | None,  # int64_t[:, ::1], shape (b, block)
    label_continues: npt.NDArray[np.uint8] | None,  # uint8_t[:, ::1], (b, block) or (b, 1)
    window_scratch: npt.NDArray[np.int64],  # int64_t[:, ::1], at least (len(starts), 3)
) -> None: ...
def document_pieces(
    position_ids: npt.NDArray[np.int64],  # const int64_t[:, ::1], shape (b, block)
    piece_starts: npt.NDArray[np.int32],  # int32_t[::1], at most this many starts written
) -> tuple[int, int]: ...  # (pieces, longest piece)
def segment_token_starts(
    windows_index: npt.NDArray[np.int64],  # const int64_t[:]
    offsets: npt.NDArray[np.int64],  # const int64_t[::1], cumulative windows per segment
    segment_starts: npt.NDArray[np.int64],  # const int64_t[::1]
    stride: int,  # int64_t
    bucket_segments: npt.NDArray[np.int64],  # const int64_t[::1], segment of window b << shift
    shift: int,  # int
    probes: int,  # int, search steps enough for the widest bucket
    out: npt.NDArray[np.int64],  # int64_t[::1]
) -> None: ...
