"""File maps: no descriptor held, the array keeps the mapping alive, pickled as file and offset."""

from __future__ import annotations

import gc
import mmap
import os
import pickle
import sys

import numpy as np
import pytest

from tokstream.shards.filemap import FileMap, file_map_of, map_tokens


def mapped_paths() -> set[str]:
    """Files this process maps (Linux' /proc/self/maps)."""
    with open("/proc/self/maps") as maps:
        return {line.split(maxsplit=5)[5].strip() for line in maps if len(line.split()) >= 6}


def write_raw(path, values, dtype=np.uint16, header: bytes = b"") -> str:
    path.write_bytes(header + np.asarray(values, dtype=dtype).tobytes())
    return str(path)


@pytest.mark.parametrize("offset", [0, 3, 128, mmap.ALLOCATIONGRANULARITY + 6])
@pytest.mark.parametrize("dtype", ["u1", "<u2", "<i4", "<u8"])
def test_the_array_is_the_tokens_at_the_offset_read_only(tmp_path, offset, dtype):
    values = np.arange(1000) % 200
    path = write_raw(tmp_path / "t", values, dtype, header=b"h" * offset)
    tokens = map_tokens(path, offset, np.dtype(dtype), 1000)
    assert tokens.dtype == np.dtype(dtype) and tokens.shape == (1000,)
    assert tokens.tolist() == values.tolist()
    assert not tokens.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        tokens[0] = 1
    assert file_map_of(tokens) is tokens.base
    assert file_map_of(tokens[1:]) is None  # a view is not the whole map


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="lists descriptors in /dev/fd")
def test_a_map_holds_no_file_descriptor(tmp_path):
    path = write_raw(tmp_path / "t", range(100))
    before = len(os.listdir("/dev/fd"))
    arrays = [map_tokens(path, 0, np.dtype(np.uint16), 100) for _ in range(200)]
    assert len(os.listdir("/dev/fd")) == before
    assert all(a.tolist() == list(range(100)) for a in arrays)


@pytest.mark.skipif(sys.platform != "linux", reason="reads Linux' /proc/self/maps")
def test_a_view_keeps_the_mapping_alive_and_the_last_reference_releases_it(tmp_path):
    path = write_raw(tmp_path / "t", range(5000))
    view = map_tokens(path, 0, np.dtype(np.uint16), 5000)[10:20]
    gc.collect()
    assert path in mapped_paths()
    assert view.tolist() == list(range(10, 20))
    del view
    gc.collect()
    assert path not in mapped_paths()


def test_pickling_sends_the_file_and_offset_not_the_tokens(tmp_path):
    path = write_raw(tmp_path / "t", range(100_000), np.uint32, header=b"x" * 64)
    file_map = FileMap(path, 64, np.dtype(np.uint32), 100_000)
    data = pickle.dumps(file_map)
    assert len(data) < 1000
    again = pickle.loads(data)
    assert (again.path, again.offset, again.dtype, again.count) == (path, 64, np.uint32, 100_000)
    assert np.array_equal(np.asarray(again), np.arange(100_000))


@pytest.mark.parametrize("change", ["replaced", "rewritten", "truncated"])
def test_a_file_changed_since_it_was_mapped_is_not_mapped_again(tmp_path, change):
    path = write_raw(tmp_path / "t", range(100))
    data = pickle.dumps(FileMap(path, 0, np.dtype(np.uint16), 100))
    if change == "replaced":
        os.replace(write_raw(tmp_path / "new", range(100, 200)), path)
    elif change == "rewritten":
        stat = os.stat(path)
        write_raw(tmp_path / "t", range(100, 200))
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    else:
        os.truncate(path, 50)
    with pytest.raises(ValueError, match="no longer the file that was opened") as raised:
        pickle.loads(data)
    assert path in str(raised.value)


def test_madvise_applies_and_closed_is_false(tmp_path):
    file_map = FileMap(write_raw(tmp_path / "t", range(10_000)), 0, np.dtype(np.uint16), 10_000)
    assert not file_map.closed
    for advice in ("MADV_RANDOM", "MADV_SEQUENTIAL"):
        if hasattr(mmap, advice):
            file_map.madvise(getattr(mmap, advice))
    assert "offset=0" in repr(file_map)
