"""Raw tokens without a header, as nanoGPT's prepare scripts write them with ``ndarray.tofile``.

The file cannot say its dtype, so the reader must (uint16 by default, in native byte order).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokstream.formats.common import map_tokens

DEFAULT_DTYPE = np.dtype(np.uint16)


def read(path: Path, dtype: np.dtype) -> np.ndarray:
    """Map the whole file as ``dtype`` tokens; its size must be a multiple of the item size."""
    return map_tokens(path, dtype, 0, token_count(str(path), path.stat().st_size, dtype))


def token_count(path: str, size: int, dtype: np.dtype) -> int:
    """Tokens of ``dtype`` in ``size`` bytes; ValueError naming ``path`` when they do not fit."""
    count, extra = divmod(size, dtype.itemsize)
    if extra:
        raise ValueError(
            f"token file {path}: raw size {size} bytes is not a multiple of {dtype}'s "
            f"{dtype.itemsize} bytes ({extra} trailing bytes); wrong dtype or a truncated file?"
        )
    return count
