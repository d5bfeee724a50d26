"""Token files: the three formats, their detection, every bad file, shards and zero-copy reads."""

from __future__ import annotations

import mmap
import os
import pickle
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tokstream
from tests.conftest import KERNEL_DTYPES, assert_same_batches, sharded_oracle_batches
from tokstream import Corpus, open_tokens, stream_token_source, write_tokens
from tokstream import reference as ref
from tokstream.files import detect_format
from tokstream.shards.filemap import FileMap

LLMC_MAGIC = 20240520  # llm.c GPT-2 shards: version 1, uint16 tokens

FORMATS = ["npy", "bin", "llmc"]


def sample_ids(dtype, n: int = 1000, seed: int = 0) -> np.ndarray:
    """``n`` ids spread over ``dtype``'s range (capped at int64's), negatives included if signed."""
    info = np.iinfo(dtype)
    low = max(int(info.min), -(2**63))
    high = min(int(info.max), 2**63 - 1)
    values = np.random.default_rng(seed).integers(low, high, n, endpoint=True, dtype=np.int64)
    values[:2] = [low, high][:n]
    return values.astype(dtype)


def batches(stream) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(w.copy(), t.copy()) for w, t in stream]


def file_map_of(array: np.ndarray) -> FileMap | None:
    """The file mapping an array is a view of, following ``.base``."""
    base = array
    while base is not None and not isinstance(base, FileMap):
        base = base.base
    return base


def write_llmc_bytes(path: Path, header_values, tokens=(), header_ints: int = 256) -> Path:
    header = np.zeros(header_ints, dtype="<i4")
    header[: len(header_values)] = header_values
    path.write_bytes(header.tobytes() + np.asarray(tokens, dtype="<u2").tobytes())
    return path


# ---------------------------------------------------------------------------------------------
# Formats round-trip


@pytest.mark.parametrize("format", FORMATS)
def test_each_format_round_trips_uint16_ids_and_is_detected(tmp_path, format):
    ids = np.arange(5000) % 50257
    path = write_tokens(tmp_path / f"tokens.{format}", ids, format=format)
    assert path == tmp_path / f"tokens.{format}"
    assert detect_format(path) == format
    corpus = open_tokens(path)
    assert isinstance(corpus, Corpus)
    assert corpus.dtype == np.uint16
    assert np.array_equal(corpus.shards[0], ids)


@pytest.mark.parametrize("format", ["npy", "bin"])
def test_ids_beyond_uint16_are_written_as_uint32(tmp_path, format):
    ids = np.array([0, 65535, 65536, 2**32 - 1])
    path = write_tokens(tmp_path / "big", ids, format=format)
    corpus = open_tokens(path, dtype=np.uint32)
    assert corpus.dtype == np.uint32
    assert np.array_equal(corpus.shards[0], ids)
    if format == "bin":
        assert path.stat().st_size == 4 * ids.size


def test_ids_that_fit_uint16_are_written_as_uint16(tmp_path):
    path = write_tokens(tmp_path / "t.bin", np.array([0, 65535], dtype=np.int64), format="bin")
    assert path.stat().st_size == 4
    assert open_tokens(path).dtype == np.uint16


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_npy_and_bin_round_trip_every_kernel_dtype(tmp_path, dtype):
    ids = sample_ids(dtype)
    npy = write_tokens(tmp_path / "t.npy", ids, dtype=dtype)
    raw = write_tokens(tmp_path / "t.bin", ids, format="bin", dtype=dtype)
    for corpus in (open_tokens(npy), open_tokens(raw, dtype=dtype)):
        assert corpus.dtype == dtype
        assert corpus.shards[0].tobytes() == ids.tobytes()


def test_npy_files_are_readable_by_numpy_and_llmc_files_match_llmc_layout(tmp_path):
    ids = np.arange(300, dtype=np.int64)
    assert np.array_equal(np.load(write_tokens(tmp_path / "a.npy", ids)), ids)
    raw = write_tokens(tmp_path / "a.llmc", ids, format="llmc").read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[:3].tolist() == [20240520, 1, 300]
    assert not header[3:].any()
    assert np.array_equal(np.frombuffer(raw[1024:], dtype="<u2"), ids)


@pytest.mark.parametrize("format", FORMATS)
def test_an_empty_file_is_an_empty_read_only_shard(tmp_path, format):
    path = write_tokens(tmp_path / f"empty.{format}", np.array([], dtype=np.int64), format=format)
    corpus = open_tokens(path)
    assert corpus.num_tokens == 0 and corpus.dtype == np.uint16
    assert not corpus.shards[0].flags.writeable
    assert list(stream_token_source(corpus, 1, 1)) == []


def test_write_tokens_accepts_sequences_and_memory_maps(tmp_path):
    listed = write_tokens(tmp_path / "list.npy", [3, 1, 4, 1, 5])
    again = write_tokens(tmp_path / "copy.bin", open_tokens(listed).shards[0], format="bin")
    assert open_tokens(again).shards[0].tolist() == [3, 1, 4, 1, 5]


def test_write_tokens_replaces_a_file_atomically_and_leaves_no_temporary(tmp_path):
    path = write_tokens(tmp_path / "t.npy", np.arange(100))
    mapped = open_tokens(path)
    write_tokens(path, np.arange(100, 300))
    assert [p.name for p in tmp_path.iterdir()] == ["t.npy"]
    assert np.array_equal(mapped.shards[0], np.arange(100)), "an open map keeps the old tokens"
    assert np.array_equal(open_tokens(path).shards[0], np.arange(100, 300))


def test_a_failed_write_leaves_neither_the_file_nor_a_temporary(tmp_path, monkeypatch):
    def failing_write_header(f, header):
        raise OSError("disk full")

    monkeypatch.setattr(np.lib.format, "write_array_header_1_0", failing_write_header)
    with pytest.raises(OSError, match="disk full"):
        write_tokens(tmp_path / "t.npy", np.arange(10))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", ["", ".", "..", "sub", "sub/"])
def test_write_tokens_refuses_a_path_that_names_no_file_before_writing(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    with pytest.raises(ValueError, match="name a file|is a directory"):
        write_tokens(path, np.arange(10))
    assert [p.name for p in tmp_path.iterdir()] == ["sub"] and not any((tmp_path / "sub").iterdir())


def test_write_tokens_with_a_path_that_is_not_a_path_is_a_type_error():
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got int"):
        write_tokens(3, np.arange(10))


def test_a_failed_rename_removes_the_temporary_and_names_the_file(tmp_path, monkeypatch):
    # The destination becomes a directory between the check and the rename (another process),
    # so the operating system itself refuses the rename.
    target = tmp_path / "t.npy"
    real_replace = os.replace

    def racing_replace(source, destination):
        Path(destination).mkdir()
        return real_replace(source, destination)

    monkeypatch.setattr(os, "replace", racing_replace)
    with pytest.raises(OSError) as raised:
        write_tokens(target, np.arange(1000))
    assert raised.value.filename == str(target)
    assert ".tmp" not in str(raised.value)
    assert [p.name for p in tmp_path.iterdir()] == ["t.npy"] and target.is_dir()


def test_a_file_that_cannot_be_created_is_named_not_its_temporary(tmp_path):
    target = tmp_path / "missing_directory" / "t.npy"
    with pytest.raises(FileNotFoundError) as raised:
        write_tokens(target, np.arange(10))
    assert raised.value.filename == str(target) and ".tmp" not in str(raised.value)


def test_a_name_at_the_length_limit_is_written_and_one_beyond_it_is_a_value_error(tmp_path):
    longest = "t" * 251 + ".npy"  # 255 bytes: valid, though its temporary name could not be
    path = write_tokens(tmp_path / longest, np.arange(10))
    assert open_tokens(path).shards[0].tolist() == list(range(10))
    assert [p.name for p in tmp_path.iterdir()] == [longest]
    with pytest.raises(ValueError, match="longer than the file system allows") as raised:
        write_tokens(tmp_path / ("t" + longest), np.arange(10))
    assert "t" + longest in str(raised.value)
    assert [p.name for p in tmp_path.iterdir()] == [longest]


# ---------------------------------------------------------------------------------------------
# Detection by magic, not by name


def test_formats_are_detected_by_magic_whatever_the_extension(tmp_path):
    ids = np.arange(50)
    llmc = write_tokens(tmp_path / "fineweb_train_000001.bin", ids, format="llmc")
    npy = write_tokens(tmp_path / "tokens.bin", ids, format="npy")
    raw = write_tokens(tmp_path / "tokens.llmc", ids, format="bin")
    assert [detect_format(p) for p in (llmc, npy, raw)] == ["llmc", "npy", "bin"]
    for path in (llmc, npy, raw):
        assert open_tokens(path).shards[0].tolist() == ids.tolist()


def test_a_raw_file_that_starts_like_an_llmc_shard_reads_raw_with_format_bin(tmp_path):
    magic_as_tokens = np.frombuffer(np.int32(LLMC_MAGIC).astype("<i4").tobytes(), dtype="<u2")
    ids = np.concatenate([magic_as_tokens, np.arange(20, dtype=np.uint16)])
    path = write_tokens(tmp_path / "raw.bin", ids, format="bin")
    assert detect_format(path) == "llmc"
    with pytest.raises(ValueError, match="raw.bin"):
        open_tokens(path)
    assert open_tokens(path, format="bin").shards[0].tolist() == ids.tolist()


def test_format_names_what_a_file_must_be(tmp_path):
    path = write_tokens(tmp_path / "t.npy", np.arange(10))
    assert open_tokens(path, format="npy").num_tokens == 10
    with pytest.raises(ValueError, match=r"bad magic.*'llmc'"):
        open_tokens(path, format="llmc")


# ---------------------------------------------------------------------------------------------
# Bad files: a ValueError naming the file and what is wrong


def _npy_bytes(ids) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, ids)
    return buffer.getvalue()


BAD_FILES = {
    # name: (file name, bytes or writer, open_tokens kwargs, what the message says)
    "llmc bad magic": (
        "shard.bin",
        lambda p: write_llmc_bytes(p, [20240519, 1, 3], [1, 2, 3]),
        {"format": "llmc"},
        "bad magic",
    ),
    "llmc unknown version": (
        "shard.bin",
        lambda p: write_llmc_bytes(p, [LLMC_MAGIC, 2, 3], [1, 2, 3]),
        {},
        "unknown llm.c version 2",
    ),
    "llmc truncated header": (
        "shard.bin",
        lambda p: write_llmc_bytes(p, [LLMC_MAGIC, 1, 0], header_ints=100),
        {},
        "truncated llm.c header",
    ),
    "llmc truncated tokens": (
        "shard.bin",
        lambda p: write_llmc_bytes(p, [LLMC_MAGIC, 1, 100], range(50)),
        {},
        "truncated",
    ),
    "llmc count mismatch": (
        "shard.bin",
        lambda p: write_llmc_bytes(p, [LLMC_MAGIC, 1, 10], range(20)),
        {},
        "count mismatch",
    ),
    "llmc odd byte after tokens": (
        "shard.bin",
        lambda p: p.write_bytes(
            write_llmc_bytes(p, [LLMC_MAGIC, 1, 2], [7, 8]).read_bytes() + b"\0"
        ),
        {},
        "count mismatch",
    ),
    "llmc negative count": (
        "shard.bin",
        lambda p: write_llmc_bytes(p, [LLMC_MAGIC, 1, -5]),
        {},
        "negative token count",
    ),
    "llmc version 1 under the llama-3 magic": (
        "shard.bin",
        lambda p: write_llmc_bytes(p, [20240801, 1, 0]),
        {},
        "unknown llm.c version 1 for magic 20240801",
    ),
    "llmc asked of a wrong dtype": (
        "shard.bin",
        lambda p: write_llmc_bytes(p, [LLMC_MAGIC, 1, 2], [7, 8]),
        {"dtype": np.uint32},
        "dtype=uint32",
    ),
    "npy truncated": (
        "t.npy",
        lambda p: p.write_bytes(_npy_bytes(np.arange(100, dtype=np.uint16))[:-10]),
        {},
        "truncated",
    ),
    "npy trailing bytes": (
        "t.npy",
        lambda p: p.write_bytes(_npy_bytes(np.arange(100, dtype=np.uint16)) + b"xx"),
        {},
        "count mismatch",
    ),
    "npy bad magic": ("t.npy", lambda p: p.write_bytes(b"\x93NUMPI" + bytes(100)), {}, "bad magic"),
    "npy corrupt header": (
        "t.npy",
        lambda p: p.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': 'garb\n" + bytes(8)),
        {},
        "unreadable .npy header",
    ),
    "npy unknown version": (
        "t.npy",
        lambda p: p.write_bytes(b"\x93NUMPY\x07\x00" + bytes(100)),
        {},
        "unreadable .npy header",
    ),
    "npy 2-D": ("t.npy", lambda p: np.save(p, np.zeros((3, 4), np.uint16)), {}, "1-D"),
    "npy floats": ("t.npy", lambda p: np.save(p, np.zeros(4)), {}, "must hold integers"),
    "npy of another dtype than asked": (
        "t.npy",
        lambda p: np.save(p, np.zeros(4, np.uint16)),
        {"dtype": "int32"},
        "dtype=int32",
    ),
    "npy uint64 beyond int64": (
        "t.npy",
        lambda p: np.save(p, np.array([1, 2**63], dtype=np.uint64)),
        {},
        "int64 range",
    ),
    "raw size not a multiple of uint16": (
        "t.bin",
        lambda p: p.write_bytes(b"abc"),
        {},
        "not a multiple of uint16",
    ),
    "raw size not a multiple of uint32": (
        "t.bin",
        lambda p: p.write_bytes(bytes(10)),
        {"dtype": np.uint32},
        "not a multiple of uint32",
    ),
    "raw asked to be npy": (
        "t.bin",
        lambda p: p.write_bytes(bytes(10)),
        {"format": "npy"},
        "bad magic",
    ),
    "a directory": ("data", lambda p: p.mkdir(), {}, "is a directory"),
    "npy shape (True,)": (
        "t.npy",
        lambda p: _npy_with_shape(p, (True,), 2),
        {},
        "unreadable .npy header",
    ),
    "npy shape (False,)": (
        "t.npy",
        lambda p: _npy_with_shape(p, (False,), 0),
        {},
        "unreadable .npy header",
    ),
}


def _npy_with_shape(path: Path, shape: tuple, data_bytes: int) -> None:
    """A .npy file of uint16 whose header says ``shape`` (NumPy's writer checks nothing)."""
    import io

    buffer = io.BytesIO()
    header = {"descr": "<u2", "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buffer, header)
    path.write_bytes(buffer.getvalue() + bytes(data_bytes))


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_is_a_value_error_naming_the_file_and_the_fault(tmp_path, case):
    name, write, kwargs, fault = BAD_FILES[case]
    path = tmp_path / name
    write(path)
    with pytest.raises(ValueError) as raised:
        open_tokens(path, **kwargs)
    message = str(raised.value)
    assert str(path) in message
    assert fault in message


def test_a_bad_shard_among_good_ones_is_named(tmp_path):
    good = write_tokens(tmp_path / "a.bin", np.arange(10), format="llmc")
    bad = write_llmc_bytes(tmp_path / "b.bin", [LLMC_MAGIC, 1, 99], range(10))
    with pytest.raises(ValueError, match=r"b\.bin: truncated"):
        open_tokens([good, bad])


def test_a_missing_file_is_file_not_found_naming_it(tmp_path):
    missing = tmp_path / "nope.bin"
    for call in (
        lambda: open_tokens(missing),
        lambda: detect_format(missing),
        lambda: open_tokens([missing]),
        lambda: open_tokens(missing, format="bin"),
    ):
        with pytest.raises(FileNotFoundError) as raised:
            call()
        assert raised.value.filename == str(missing)
        assert str(missing) in str(raised.value)


def test_a_pattern_that_matches_nothing_is_a_value_error_naming_it(tmp_path):
    pattern = str(tmp_path / "shard_*.bin")
    with pytest.raises(ValueError, match="matched no files") as raised:
        open_tokens(pattern)
    assert pattern in str(raised.value)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda d: open_tokens([]), ValueError, "empty list"),
        (lambda d: open_tokens(42), TypeError, "int"),
        (lambda d: open_tokens([d / "a.bin", 42]), TypeError, r"paths\[1\]"),
        (lambda d: open_tokens(d / "a.bin", dtype=np.float32), TypeError, "float32"),
        (lambda d: open_tokens(d / "a.bin", dtype="no such dtype"), TypeError, "no such dtype"),
        (lambda d: open_tokens(d / "a.bin", format="zip"), ValueError, "'zip'"),
        (lambda d: open_tokens(d / "a.bin", format=1), TypeError, "format"),
        (lambda d: detect_format(3), TypeError, "int"),
        (lambda d: open_tokens(d / "a.bin", dtype="m8"), TypeError, "timedelta64"),
        (lambda d: open_tokens(d / "a.bin", dtype=("i4", "x")), TypeError, "dtype"),
        (lambda d: open_tokens(d / "a.bin", dtype=("i4", 2)), TypeError, "dtype"),
        (lambda d: open_tokens(d / ("x" * 300)), ValueError, "longer than the file system"),
        (lambda d: open_tokens([d / "a.bin", d / ("x" * 300)]), ValueError, "x" * 200),
    ],
)
def test_wrong_arguments_to_open_tokens_are_rejected(tmp_path, call, error, message):
    write_tokens(tmp_path / "a.bin", np.arange(4), format="bin")
    with pytest.raises(error, match=message):
        call(tmp_path)


@pytest.mark.parametrize(
    "ids, kwargs, error, message",
    [
        (np.array([0, 2**32]), {"format": "llmc"}, ValueError, "llm.c stores nothing wider"),
        (np.array([0, 5]), {"format": "llmc", "dtype": np.int32}, ValueError, "uint16 or uint32"),
        (np.array([-1, 5]), {}, ValueError, r"\[-1, 5\].*neither uint16 nor uint32"),
        (np.array([0, 2**32]), {"format": "bin"}, ValueError, "neither uint16 nor uint32"),
        (np.array([0, 300]), {"dtype": np.uint8}, ValueError, r"\[0, 300\].*uint8"),
        (np.array([-3, 3]), {"dtype": np.uint32}, ValueError, "uint32"),
        (np.array([0, 1]), {"dtype": np.float64}, TypeError, "float64"),
        (np.array([0, 1]), {"format": "zip"}, ValueError, "'zip'"),
        (np.array([0, 1]), {"format": None}, TypeError, "format"),
        (np.array([0.5]), {}, ValueError, "fractional"),
        (np.array([True]), {}, TypeError, "bool"),
        (np.array([0, 1]), {"dtype": "m8"}, TypeError, "timedelta64"),
        (np.array([0, 1]), {"dtype": ("i4", "x")}, TypeError, "dtype"),
        ("0123", {}, TypeError, "ids must be a sequence or array"),
        ([1, 10**5000], {}, ValueError, r"ids\[1\] = an int of 16610 bits"),
    ],
)
def test_write_tokens_rejects_ids_that_do_not_fit_and_bad_arguments(
    tmp_path, ids, kwargs, error, message
):
    with pytest.raises(error, match=message):
        write_tokens(tmp_path / "out", ids, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_write_tokens_stores_negative_ids_with_an_explicit_signed_dtype(tmp_path):
    ids = np.array([-5, 0, 7])
    assert open_tokens(write_tokens(tmp_path / "s.npy", ids, dtype=np.int16)).shards[
        0
    ].tolist() == [-5, 0, 7]


# ---------------------------------------------------------------------------------------------
# Shards, lists and globs


def test_a_list_of_paths_is_one_corpus_with_a_shard_per_file_in_the_given_order(tmp_path):
    a = write_tokens(tmp_path / "a.npy", np.arange(10))
    b = write_tokens(tmp_path / "b.bin", np.arange(100, 105), format="llmc")
    corpus = open_tokens([b, str(a)])
    assert corpus.lengths.tolist() == [5, 10]
    assert corpus.shards[0].tolist() == list(range(100, 105))
    assert corpus.num_windows(block=6) == 0 + 4


def test_a_glob_opens_its_matches_in_sorted_order(tmp_path):
    for i in (2, 0, 1):
        write_tokens(tmp_path / f"shard_{i:06d}.bin", np.full(8, i), format="llmc")
    write_tokens(tmp_path / "other.bin", np.arange(3), format="llmc")
    corpus = open_tokens(tmp_path / "shard_*.bin")
    assert [int(s[0]) for s in corpus.shards] == [0, 1, 2]


def test_an_existing_path_with_glob_characters_is_a_path(tmp_path):
    odd = write_tokens(tmp_path / "weird[1].npy", np.arange(4))
    write_tokens(tmp_path / "weird1.npy", np.arange(9))
    assert open_tokens(odd).num_tokens == 4


def test_shards_of_different_dtypes_are_rejected_naming_them(tmp_path):
    small = write_tokens(tmp_path / "small.npy", np.arange(10))
    big = write_tokens(tmp_path / "big.npy", np.array([70000, 1]))
    with pytest.raises(ValueError, match="mix token dtypes") as raised:
        open_tokens([small, big])
    assert str(small) in str(raised.value) and str(big) in str(raised.value)


@pytest.mark.parametrize("shuffle", [False, True])
def test_sharded_files_from_a_glob_stream_like_the_oracle(tmp_path, shuffle):
    lengths = [30, 3, 0, 17, 4, 25]  # 3, 0 and 4 tokens hold no window of block 4
    shards = [np.random.default_rng(j).integers(0, 50257, n) for j, n in enumerate(lengths)]
    for j, shard in enumerate(shards):
        format = FORMATS[j % 3]
        write_tokens(
            tmp_path / f"shard_{j:02d}.{'npy' if format == 'npy' else 'bin'}", shard, format=format
        )
    corpus = open_tokens(tmp_path / "shard_*")
    assert corpus.lengths.tolist() == lengths
    assert corpus.num_windows(4) == 26 + 13 + 21
    actual = batches(
        stream_token_source(
            corpus, 4, 7, epochs=2, shuffle=shuffle, seed=5, permutation="materialized"
        )
    )
    assert_same_batches(actual, sharded_oracle_batches(shards, 4, 7, 2, shuffle, 5))


@pytest.mark.parametrize("format", FORMATS)
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_single_file_streams_exactly_like_the_reference_on_its_array(tmp_path, format, shuffle):
    ids = np.random.default_rng(1).integers(0, 50257, 3000)
    corpus = open_tokens(write_tokens(tmp_path / "t", ids, format=format))
    actual = batches(
        stream_token_source(
            corpus, 16, 50, epochs=2, shuffle=shuffle, seed=9, permutation="materialized"
        )
    )
    expected = batches(ref.stream_token_source(ids, 16, 50, epochs=2, shuffle=shuffle, seed=9))
    assert_same_batches(actual, expected)


# ---------------------------------------------------------------------------------------------
# Zero copies: read-only arrays and memory maps of every kernel dtype


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_a_memory_mapped_file_of_every_dtype_is_read_in_place(tmp_path, dtype):
    ids = sample_ids(dtype, 2000)
    path = write_tokens(tmp_path / "t.npy", ids, dtype=dtype)
    corpus = open_tokens(path)
    shard = corpus.shards[0]
    mapped = file_map_of(shard)
    assert mapped is not None and Path(mapped.path) == path
    assert np.shares_memory(shard, np.asarray(mapped))
    assert shard.dtype == dtype and not shard.flags.writeable
    stream = stream_token_source(corpus, 7, 64, shuffle=True, seed=3, permutation="materialized")
    assert stream.corpus.shards[0] is shard
    for shuffle in (False, True):
        assert_same_batches(
            batches(
                stream_token_source(
                    corpus, 7, 64, epochs=2, shuffle=shuffle, seed=3, permutation="materialized"
                )
            ),
            batches(ref.stream_token_source(ids, 7, 64, epochs=2, shuffle=shuffle, seed=3)),
        )


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_opening_and_streaming_a_file_allocates_nothing_the_size_of_the_file(tmp_path, dtype):
    n = 1 << 20
    path = write_tokens(tmp_path / "t.npy", np.arange(n) % 100, dtype=dtype)
    next(stream_token_source(open_tokens(path), 16, 32, shuffle=False))  # warm imports, caches
    tracemalloc.start()
    try:
        stream = stream_token_source(open_tokens(path), 16, 32, shuffle=False)
        next(stream)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A copy would be n * itemsize (the smallest, uint8, is 1 MiB) or n * 8 as int64.
    assert peak < n // 8


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_a_user_made_read_only_memmap_streams_without_a_copy(tmp_path, dtype):
    ids = sample_ids(dtype, 500, seed=2)
    ids.tofile(tmp_path / "raw")
    mapped = np.memmap(tmp_path / "raw", dtype=dtype, mode="r")
    stream = stream_token_source(mapped, 5, 33, shuffle=True, seed=4)
    assert np.shares_memory(stream.corpus.shards[0], mapped)
    assert_same_batches(batches(stream), batches(ref.stream_token_source(ids, 5, 33, seed=4)))


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(KERNEL_DTYPES),
    n=st.integers(0, 200),
    block=st.integers(1, 12),
    batch_size=st.integers(1, 40),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    data_seed=st.integers(0, 2**16),
)
def test_read_only_arrays_of_every_dtype_stream_in_place_like_the_reference(
    dtype, n, block, batch_size, shuffle, seed, data_seed
):
    ids = sample_ids(dtype, n, seed=data_seed)
    ids.flags.writeable = False
    stream = stream_token_source(ids, block, batch_size, epochs=2, shuffle=shuffle, seed=seed)
    assert stream.corpus.shards[0] is ids
    assert_same_batches(
        batches(stream),
        batches(
            ref.stream_token_source(ids, block, batch_size, epochs=2, shuffle=shuffle, seed=seed)
        ),
    )


def test_a_non_native_byte_order_file_is_copied_into_native_order(tmp_path):
    ids = np.arange(100, dtype=">u2")
    np.save(tmp_path / "be.npy", ids)
    corpus = open_tokens(tmp_path / "be.npy")
    shard = corpus.shards[0]
    assert shard.dtype == np.uint16 and shard.dtype.isnative
    assert list(corpus.memory_maps()) == []
    assert shard.tolist() == list(range(100))


# ---------------------------------------------------------------------------------------------
# No file descriptor per shard

OPEN_UNDER_LOW_ULIMIT = """
import os, resource, sys
import numpy as np
from tokstream import open_tokens, stream_token_source
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), hard))
before = len(os.listdir("/dev/fd"))
corpus = open_tokens(os.path.join(sys.argv[1], "shard_*"))
held = len(os.listdir("/dev/fd")) - before
windows = sum(len(w) for w, _ in stream_token_source(corpus, 3, 64, shuffle=True))
print(len(corpus.shards), held, windows, corpus.advise(random=True))
"""


@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_NOFILE is POSIX")
def test_thousands_of_shards_open_and_stream_under_ulimit_n_1024_holding_no_descriptor(tmp_path):
    shards = 3000
    for j in range(shards):
        (np.arange(j % 7 + 4, dtype=np.uint16) + j).tofile(tmp_path / f"shard_{j:05d}.bin")
    expected_windows = sum(j % 7 + 1 for j in range(shards))
    result = subprocess.run(
        [sys.executable, "-c", OPEN_UNDER_LOW_ULIMIT, str(tmp_path), "1024"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(shards), "0", str(expected_windows), str(shards)]


def test_a_pickled_file_corpus_carries_file_names_and_maps_them_again(tmp_path):
    paths = [write_tokens(tmp_path / f"s{j}.npy", np.arange(200_000) % (j + 7)) for j in range(3)]
    in_ram = np.arange(50, dtype=np.uint16)
    corpus = open_tokens(paths)
    data = pickle.dumps(corpus)
    assert len(data) < 4000  # the tokens alone are 1.2 MB
    again = pickle.loads(data)
    assert [file_map_of(shard).path for shard in again.shards] == [str(p) for p in paths]
    assert all(not a.flags.writeable for a in (*again.shards, again.lengths))
    assert_same_batches(
        batches(stream_token_source(again, 6, 64, seed=1)),
        batches(stream_token_source(corpus, 6, 64, seed=1)),
    )
    mixed = pickle.loads(pickle.dumps(Corpus([in_ram, in_ram[:10]])))
    assert [s.tolist() for s in mixed.shards] == [in_ram.tolist(), in_ram[:10].tolist()]
    assert all(not a.flags.writeable for a in (*mixed.shards, mixed.lengths))


def test_a_pickled_file_corpus_whose_file_was_replaced_is_refused_naming_it(tmp_path):
    path = write_tokens(tmp_path / "t.npy", np.arange(100))
    data = pickle.dumps(open_tokens(path))
    write_tokens(path, np.arange(100, 200))
    with pytest.raises(ValueError, match="no longer the file that was opened") as raised:
        pickle.loads(data)
    assert str(path) in str(raised.value)


def test_a_mapped_file_stays_readable_after_its_name_is_gone(tmp_path):
    path = write_tokens(tmp_path / "t.npy", np.arange(1000))
    corpus = open_tokens(path)
    path.unlink()
    assert corpus.shards[0].tolist() == list(range(1000))


# ---------------------------------------------------------------------------------------------
# madvise


def vm_flags(path: Path) -> set[str]:
    """The VmFlags of this process's mapping of ``path`` (Linux' /proc/self/smaps)."""
    target = str(path.resolve())
    flags: set[str] = set()
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
                inside = len(fields) >= 6 and fields[5] == target
            elif inside and line.startswith("VmFlags:"):
                flags |= set(fields[1:])
    return flags


@pytest.mark.skipif(sys.platform != "linux", reason="reads Linux' /proc/self/smaps")
def test_streams_advise_the_kernel_random_when_shuffled_and_sequential_otherwise(tmp_path):
    path = write_tokens(tmp_path / "t.npy", np.arange(100_000))
    corpus = open_tokens(path)
    stream_token_source(corpus, 8, 4, shuffle=True)
    assert "rr" in vm_flags(path) and "sr" not in vm_flags(path)
    stream_token_source(corpus, 8, 4, shuffle=False)
    assert "sr" in vm_flags(path) and "rr" not in vm_flags(path)


def test_advise_counts_the_mappings_it_advised(tmp_path):
    paths = [write_tokens(tmp_path / f"{i}.bin", np.arange(100), format="llmc") for i in range(3)]
    empty = write_tokens(tmp_path / "empty.bin", [], format="llmc")
    assert open_tokens([*paths, empty]).advise(random=True) == 3
    assert Corpus([np.arange(10)]).advise(random=False) == 0


def test_without_madvise_advise_is_a_no_op_and_streams_still_work(tmp_path, monkeypatch):
    monkeypatch.delattr(mmap, "MADV_RANDOM", raising=False)
    monkeypatch.delattr(mmap, "MADV_SEQUENTIAL", raising=False)
    corpus = open_tokens(write_tokens(tmp_path / "t.npy", np.arange(50)))
    assert corpus.advise(random=True) == 0
    assert len(batches(stream_token_source(corpus, 4, 8))) == 6


def test_the_file_api_is_exported():
    assert {"open_tokens", "write_tokens"} <= set(tokstream.__all__)
    assert tokstream.open_tokens is open_tokens and tokstream.write_tokens is write_tokens
