"""Stubs for the compiled packed rows' copy ``tokstream._kernels.packed_copy``."""

import numpy as np
import numpy.typing as npt

#: A batch buffer: the stream's out_dtype (``out_t``: int64 or int32).
Out = npt.NDArray[np.int64] | npt.NDArray[np.int32]

def fill_packed(
    anchor: npt.NDArray[np.integer],  # const token_t[::1]
    addresses: npt.NDArray[np.uint64],  # const uint64_t[::1]
    lengths: npt.NDArray[np.int64],  # const int64_t[::1]
    row_offsets: npt.NDArray[np.int64],  # const int64_t[::1]
    rows: npt.NDArray[np.int64],  # const int64_t[::1]
    row_base: int,  # int64_t
    first_row: int,  # Py_ssize_t
    block: int,  # Py_ssize_t
    pad: int,  # int64_t
    input_ids: Out,  # out_t[:, ::1]
    labels: Out,  # out_t[:, ::1]
    label_continues: npt.NDArray[np.uint8] | None,  # uint8_t[:, ::1]
    position_ids: Out | None,  # out_t[:, ::1]
    document_ids: npt.NDArray[np.int32] | None,  # int32_t[:, ::1]
    cache_ahead: int = 0,  # Py_ssize_t
    piece_starts: npt.NDArray[np.int32] | None = None,  # int32_t[::1]
) -> tuple[bool, int, int]: ...  # (False: a token does not fit the output dtype, pieces, longest)
def piece_addresses(
    starts: npt.NDArray[np.int64],  # const int64_t[::1]
    lengths: npt.NDArray[np.int64],  # const int64_t[::1]
    row_offsets: npt.NDArray[np.int64],  # const int64_t[::1]
    row_slots: int,  # Py_ssize_t
    shard_starts: npt.NDArray[np.int64],  # const int64_t[::1]
    shard_ends: npt.NDArray[np.int64],  # const int64_t[::1]
    shard_bases: npt.NDArray[np.uint64],  # const uint64_t[::1]
    itemsize: int,  # Py_ssize_t
    addresses: npt.NDArray[np.uint64],  # uint64_t[::1], as long as starts
) -> int: ...  # 0: checked; i + 1: piece i outside its shard; -(k + 1): row k breaks its rule
