"""NumPy's ``.npy`` (magic ``\\x93NUMPY``): a 1-D integer array of any dtype the kernel reads."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tokstream.formats.common import check_size, map_tokens

MAGIC = b"\x93NUMPY"
#: A version 1.0 header of a 1-D array, padded to this size whatever its length and dtype.
HEADER_BYTES = 128


def read(path: Path) -> np.ndarray:
    """Map the tokens of the ``.npy`` file at ``path``; ValueError naming it when it is bad."""
    with open(path, "rb") as f:
        dtype, count, offset = parse_header(f, f"token file {path}")
    check_size(path, offset, count, dtype, "its .npy header")
    return map_tokens(path, dtype, offset, count)


def parse_header(f: BinaryIO, where: str) -> tuple[np.dtype, int, int]:
    """``(dtype, count, offset of the first token)`` from the header ``f`` starts with.

    ValueError starting with ``where`` when the header is not that of a 1-D integer array.
    """
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except (ValueError, SyntaxError, TypeError, tokenize.TokenError) as exc:
        # NumPy parses the header with tokenize and ast.literal_eval, whose errors leak out.
        raise ValueError(f"{where}: unreadable .npy header: {exc}") from None
    offset = f.tell()
    if any(isinstance(length, bool) for length in shape):
        # NumPy's header check takes a bool for an int: (True,) would map 1 token, (False,) none.
        raise ValueError(f"{where}: unreadable .npy header: shape {shape} is not ints")
    if len(shape) != 1:
        raise ValueError(f"{where}: a .npy token file must be 1-D, it has shape {shape}")
    # Kinds, not np.issubdtype: NumPy files timedelta64 under np.integer.
    if dtype.kind not in "iu":
        raise ValueError(f"{where}: a .npy token file must hold integers, it holds {dtype}")
    return dtype, shape[0], offset


def header(count: int, dtype: np.dtype) -> bytes:
    """The version 1.0 header of a 1-D array of ``count`` items of ``dtype``."""
    buffer = io.BytesIO()
    fields = {
        "descr": np.lib.format.dtype_to_descr(dtype),
        "fortran_order": False,
        "shape": (count,),
    }
    np.lib.format.write_array_header_1_0(buffer, fields)
    return buffer.getvalue()
