"""Read-only maps of token files that keep no file descriptor open.

A mapping outlives the descriptor it was made from, so each map is made from a descriptor that is
closed at once: a corpus of thousands of shards holds no descriptor at all, where ``np.memmap``
holds one per shard (its ``mmap.mmap`` keeps a duplicate for ``size()`` and ``resize()``) and
runs out under the common ``ulimit -n 1024``. Python 3.13's ``mmap.mmap(..., trackfd=False)``
maps without keeping one; before 3.13 the C library's ``mmap`` is called through ctypes. Where
neither applies (Windows, whose handles are not scarce), ``mmap.mmap`` keeps its duplicate.

A map also remembers where it came from (file, offset, dtype, count and the file's identity), so
a corpus pickled for a spawned DataLoader worker sends that instead of the tokens, and the worker
maps the same file again.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import os
import sys
import weakref
from typing import Any

import numpy as np

# The file as it was mapped: a file replaced or rewritten since (write_tokens renames a new file
# into place) has another identity, and mapping it again would stream other tokens.
Identity = tuple[int, int, int, int]


def _identity(stat: os.stat_result) -> Identity:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _load_libc() -> Any:
    """The C library's mmap/munmap/madvise, or None where they cannot be called safely."""
    if os.name != "posix" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None  # off_t is 64 bits on every 64-bit POSIX ABI; elsewhere, do not guess
    try:
        # dlopen(NULL): the running program's symbols, the C library's among them.
        libc = ctypes.CDLL(None, use_errno=True)
        functions = libc.mmap, libc.munmap, libc.madvise
    except (OSError, AttributeError):
        return None
    mmap_, munmap, madvise = functions
    mmap_.restype = ctypes.c_void_p
    mmap_.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int64,
    ]
    munmap.restype = madvise.restype = ctypes.c_int
    munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


_TRACKFD = sys.version_info >= (3, 13) and os.name == "posix"
_LIBC = None if _TRACKFD else _load_libc()
_MAP_FAILED = ctypes.c_void_p(-1).value


class FileMap:
    """``count`` items of ``dtype`` at byte ``offset`` of the file at ``path``, mapped read-only.

    ``np.asarray(file_map)`` is the read-only 1-D array of those items (through
    ``__array_interface__``), and the array keeps the map alive: the mapping is released when
    the map and every array over it are gone, never before. ``count`` must be at least 1 and
    the file must hold the bytes (the callers in :mod:`tokstream.files` check both, naming the
    file). ``identity`` given: the file must still be the one it names, else ValueError.
    """

    def __init__(
        self, path: str, offset: int, dtype: np.dtype, count: int, identity: Identity | None = None
    ) -> None:
        self.path, self.offset, self.dtype, self.count = os.fspath(path), offset, dtype, count
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        span = offset - start + count * dtype.itemsize
        flags = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.path, flags)
        try:
            self.identity = _identity(os.fstat(fd))
            if identity is not None and tuple(identity) != self.identity:
                raise ValueError(
                    f"token file {self.path} is no longer the file that was opened (it was "
                    "replaced or modified since), so it cannot be mapped again"
                )
            if self.identity[2] < offset + count * dtype.itemsize:
                raise ValueError(f"token file {self.path} is shorter than the tokens it maps")
            self._mmap: mmap.mmap | None = None
            if _LIBC is not None:
                base = _LIBC.mmap(None, span, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
                if base is None or base == _MAP_FAILED:
                    error = ctypes.get_errno()
                    raise OSError(error, f"cannot map token file: {os.strerror(error)}", self.path)
                self._base, self._span = base, span
                # Not at interpreter exit: a daemon prefetch thread may still be reading it.
                weakref.finalize(self, _LIBC.munmap, base, span).atexit = False
            else:
                options = {"trackfd": False} if _TRACKFD else {}
                self._mmap = mmap.mmap(fd, span, access=mmap.ACCESS_READ, offset=start, **options)
                # A buffer export pins the mapping: mmap.close() raises while it exists.
                self._pin = np.frombuffer(self._mmap, np.uint8)
                base = self._pin.ctypes.data
        finally:
            os.close(fd)
        self.__array_interface__ = {
            "shape": (count,),
            "typestr": dtype.str,
            "data": (base + offset - start, True),
            "version": 3,
        }

    @property
    def closed(self) -> bool:
        """Always False: the mapping lives as long as the map (as ``mmap.mmap.closed``)."""
        return False

    def madvise(self, advice: int) -> None:
        """Advise the kernel how the mapping will be read (``mmap.MADV_*``); OSError if refused."""
        if self._mmap is not None:
            self._mmap.madvise(advice)
            return
        assert _LIBC is not None  # a map not made by mmap.mmap was made through the C library
        if _LIBC.madvise(self._base, self._span, advice) != 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error), self.path)

    def __reduce__(self) -> tuple[Any, ...]:
        # Where the tokens are, not the tokens: unpickling maps the same file again.
        return (FileMap, (self.path, self.offset, self.dtype, self.count, self.identity))

    def __repr__(self) -> str:
        return (
            f"FileMap({self.path!r}, offset={self.offset}, dtype={self.dtype}, count={self.count})"
        )


def map_tokens(path: str, offset: int, dtype: np.dtype, count: int) -> np.ndarray:
    """The read-only array of ``count >= 1`` tokens of ``dtype`` at ``offset`` in ``path``."""
    return np.asarray(FileMap(path, offset, dtype, count))


def file_map_of(array: np.ndarray) -> FileMap | None:
    """The :class:`FileMap` ``array`` is exactly (not a slice or view of it), else None."""
    base: object = array.base  # a FileMap for a mapped file (NumPy types it an array)
    if isinstance(base, FileMap) and array.shape == (base.count,) and array.dtype == base.dtype:
        if array.ctypes.data == base.__array_interface__["data"][0]:
            return base
    return None


class _Remap:
    """Pickles as the :class:`FileMap` of a region of a file, without mapping it here."""

    def __init__(self, path: str, offset: int, dtype: np.dtype, count: int, identity: Identity):
        self.args = (path, offset, dtype, count, identity)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FileMap, self.args)


def _proc_maps() -> list[tuple[int, int, str, int, int, int, str]]:
    """This process' mappings (Linux ``/proc/self/maps``), sorted by address:
    ``(start, end, permissions, file offset, device, inode, path)``."""
    regions = []
    with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.rstrip("\n").split(maxsplit=5)
            if len(fields) < 6 or fields[4] == "0":
                continue  # anonymous memory
            start, end = (int(address, 16) for address in fields[0].split("-"))
            major, minor = (int(number, 16) for number in fields[3].split(":"))
            device = os.makedev(major, minor)
            regions.append(
                (start, end, fields[1], int(fields[2], 16), device, int(fields[4]), fields[5])
            )
    return regions


class MappedFiles:
    """Finds the file region an array's memory maps, to pickle it by file and offset.

    For the arrays :class:`FileMap` did not make: ``np.memmap`` (nanoGPT's idiom),
    ``np.load(..., mmap_mode="r")``, pyarrow's memory-mapped buffers (a ``datasets.Dataset``
    loaded from disk). Read from ``/proc/self/maps`` on first use, so on Linux only; elsewhere
    :meth:`region` finds nothing and such arrays pickle by value, as NumPy pickles them.
    """

    def __init__(self) -> None:
        self._regions: list[tuple[int, int, str, int, int, int, str]] | None = None

    def region(self, array: np.ndarray) -> _Remap | None:
        """A picklable stand-in mapping ``array``'s bytes again from their file, or None.

        Only where that yields the same tokens: a C-contiguous array wholly inside one mapping
        of a regular file that is still the file under that name (same device and inode), a
        mapping that is shared or read-only (a private writable one may hold edits the file does
        not). The stand-in carries the file's identity now, so the unpickling side refuses a
        file changed in between (:class:`FileMap`).
        """
        if not array.flags.c_contiguous or array.nbytes == 0 or not _maps_memory(array):
            return None
        if self._regions is None:
            self._regions = _proc_maps() if sys.platform.startswith("linux") else []
        address = array.ctypes.data
        starts = [region[0] for region in self._regions]
        i = bisect.bisect_right(starts, address) - 1
        if i < 0:
            return None
        start, end, permissions, offset, device, inode, path = self._regions[i]
        if address + array.nbytes > end or not path.startswith("/"):
            return None  # beyond the mapping, or a pseudo-file ([vdso], a deleted file)
        if "w" in permissions and "s" not in permissions:
            return None
        try:
            stat = os.stat(path)
        except OSError:
            return None
        if not os.path.isfile(path) or (stat.st_dev, stat.st_ino) != (device, inode):
            return None  # replaced since it was mapped (or a name with " (deleted)")
        return _Remap(path, offset + address - start, array.dtype, array.shape[0], _identity(stat))


def _maps_memory(array: np.ndarray) -> bool:
    """Whether ``array``'s memory belongs to an object other than a NumPy array (a map, a
    buffer): an array that owns its memory, or views one that does, is in RAM."""
    base: Any = array
    while isinstance(base, np.ndarray):
        if base.base is None:
            return False
        base = base.base
    return True
