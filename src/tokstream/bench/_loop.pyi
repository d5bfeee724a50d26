"""Stubs for the plain C loops ``tokstream.bench._loop`` (see ``_loop.pyx``)."""

import numpy as np
import numpy.typing as npt

def copy_windows(
    tokens: npt.NDArray[np.integer],  # const token_t[::1], any of the 8 fixed-width int dtypes
    starts: npt.NDArray[np.int64],  # const int64_t[:]
    windows: npt.NDArray[np.int64],  # int64_t[:, ::1], shape (>= len(starts), block)
    next_tokens: npt.NDArray[np.int64],  # int64_t[::1]
    distance: int,  # Py_ssize_t, windows ahead to prefetch; 0: none
) -> None: ...
def copy_rows(
    tokens: npt.NDArray[np.integer],  # const token_t[::1], any of the 8 fixed-width int dtypes
    starts: npt.NDArray[np.int64],  # const int64_t[::1]
    inputs: npt.NDArray[np.int32 | np.int64],  # out_t[:, ::1], shape (len(starts), block)
    labels: npt.NDArray[np.int32 | np.int64],  # out_t[:, ::1], same shape and dtype
    positions: npt.NDArray[np.int32 | np.int64] | None,  # out_t[:, ::1]; None: no extras
    mask: npt.NDArray[np.uint8] | None,  # uint8_t[:, ::1]
    pieces: npt.NDArray[np.int32] | None,  # int32_t[:, ::1]
    distance: int,  # Py_ssize_t, rows ahead to prefetch; 0: none
) -> None: ...

class Documents:
    """Tokens cut into documents, their windows of one block numbered (see ``_loop.pyx``)."""

    @property
    def tokens(self) -> np.ndarray: ...
    @property
    def block(self) -> int: ...
    @property
    def windows(self) -> int: ...
    @property
    def within(self) -> bool: ...
    def __init__(
        self,
        tokens: npt.NDArray[np.integer],  # any of the 8 fixed-width int dtypes
        lengths: npt.ArrayLike,  # tokens per document, adding up to len(tokens)
        block: int,
        within: bool,
    ) -> None: ...

def copy_document_rows(
    documents: Documents,
    starts: npt.NDArray[np.int64],  # const int64_t[::1], window numbers below documents.windows
    inputs: npt.NDArray[np.int32 | np.int64],  # out_t[:, ::1], shape (len(starts), block)
    labels: npt.NDArray[np.int32 | np.int64],  # out_t[:, ::1], same shape and dtype
    positions: npt.NDArray[np.int32 | np.int64],  # out_t[:, ::1]
    mask: npt.NDArray[np.uint8],  # uint8_t[:, ::1]
    pieces: npt.NDArray[np.int32],  # int32_t[:, ::1]
    cu_seqlens: npt.NDArray[np.int32],  # int32_t[::1], at least len(starts) * block + 1
    distance: int,  # Py_ssize_t, rows ahead to prefetch; 0: none
) -> tuple[int, int]: ...
