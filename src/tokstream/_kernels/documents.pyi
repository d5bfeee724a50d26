"""Stubs for the compiled document kernel ``tokstream._kernels.documents`` (documents.pyx)."""

import numpy as np
import numpy.typing as npt

#: A batch buffer: the stream's out_dtype (``out_t``: int64 or int32).
Out = npt.NDArray[np.int64] | npt.NDArray[np.int32]

def gather_documents(
    anchor: npt.NDArray[np.integer],  # const token_t[::1], any token array (selects the dtype)
    addresses: npt.NDArray[np.uint64],  # const uint64_t[::1], each window's first token
    starts: npt.NDArray[np.int64],  # const int64_t[::1], its position in the shards
    input_ids: Out,  # out_t[:, ::1], shape (b, block)
    next_tokens: Out | None,  # out_t[::1], shape (b,)
    targets: Out | None,  # out_t[:, ::1], shape (b, block)
    cache_ahead: int,  # Py_ssize_t, windows prefetched ahead into the cache; 0: none
    document_starts: npt.NDArray[np.int64],  # const int64_t[::1], sorted positions
    document_buckets: npt.NDArray[np.int64],  # const int64_t[::1], starts <= k << shift
    bucket_shift: int,  # int
    eos: int,  # int64_t
    use_eos: bool,  # bint
    position_ids: Out | None,  # out_t[:, ::1], shape (b, block)
    label_continues: npt.NDArray[np.uint8] | None,  # uint8_t[:, ::1], (b, block) or (b, 1)
    document_ids: npt.NDArray[np.int32] | None,  # int32_t[:, ::1], shape (b, block)
    window_scratch: npt.NDArray[np.int64],  # int64_t[:, ::1], at least (len(starts), 3)
) -> bool: ...  # False: a token does not fit the output dtype
def document_pieces(
    position_ids: Out,  # const out_t[:, ::1], shape (b, block)
    piece_starts: npt.NDArray[np.int32],  # int32_t[::1], at most this many starts written
) -> tuple[int, int]: ...  # (pieces, longest piece)
