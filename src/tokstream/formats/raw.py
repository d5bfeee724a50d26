"""Raw tokens without a header, as nanoGPT's prepare scripts write them with ``ndarray.tofile``.

The file cannot say its dtype, so the reader must (uint16 by default, in native byte order).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokstream.formats._common import map_tokens

DEFAULT_DTYPE = np.dtype(np.uint16)


def read(path: Path, dtype: np.dtype) -> np.ndarray:
    """Map the whole file as ``dtype`` tokens; its size must be a multiple of the item size."""
    size = path.stat().st_size
    count, extra = divmod(size, dtype.itemsize)
    if extra:
        raise ValueError(
            f"token file {path}: raw size {size} bytes is not a multiple of {dtype}'s "
            f"{dtype.itemsize} bytes ({extra} trailing bytes); wrong dtype or a truncated file?"
        )
    return map_tokens(path, dtype, 0, count)
