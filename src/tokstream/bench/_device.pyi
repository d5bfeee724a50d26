"""Stubs for the device-rate loop ``tokstream.bench._device`` (see ``_device.pyx``)."""

import numpy as np
import numpy.typing as npt

def read_at(
    fd: int,  # int
    offsets: npt.NDArray[np.int64],  # const int64_t[:]
    buffer: bytearray | npt.NDArray[np.int8],  # char[::1], len(buffer) bytes per read
) -> int: ...
