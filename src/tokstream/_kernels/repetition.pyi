"""Stubs for the compiled repetition filter ``tokstream._kernels.repetition``."""

import numpy as np
import numpy.typing as npt

#: A batch buffer: the stream's out_dtype (``out_t``: int64 or int32).
Out = npt.NDArray[np.int64] | npt.NDArray[np.int32]

def filter_repeated(
    input_ids: Out,  # const out_t[:, ::1], shape (b, block)
    last_tokens: Out,  # const out_t[:], shape (b,): each row's target after its window
    loss_mask: npt.NDArray[np.uint8] | None,  # uint8_t[:, ::1], (b, block) or (b, 1); zeroed rows
    pieces: bool,  # bint, split rows where loss_mask is 0 (packed rows)
    min_period: int,  # Py_ssize_t
    max_period: int,  # Py_ssize_t
    max_count: int,  # Py_ssize_t, runs repeated at least max(max_count, 3) times
    instance_mask: npt.NDArray[np.uint8],  # uint8_t[::1], out: 1 kept, 0 filtered
) -> int: ...  # rows filtered
