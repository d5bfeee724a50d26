"""Megatron-LM's indexed datasets: ``PREFIX.bin`` (the tokens) and ``PREFIX.idx`` (the index).

The index, all little-endian: the magic ``MMIDIDX\\x00\\x00``, a uint64 version (1), a uint8
dtype code, a uint64 sequence count ``S``, a uint64 count ``D`` of document indices; then ``S``
int32 sequence lengths (in tokens), ``S`` int64 sequence pointers (byte offsets into the
``.bin``) and ``D`` int64 document indices (the sequence each document starts at, ending with
``S``, so ``D`` is one more than the number of documents). Multimodal datasets append ``S`` int8
sequence modes; they hold no plain token stream and are refused.

The ``.bin`` is the sequences back to back. tokstream maps it whole as one shard and turns the
document indices into document offsets; every count, length and pointer is checked against the
two files' sizes before anything is mapped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tokstream import _validate
from tokstream.formats.common import Shard, map_tokens, read_header

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
#: Bytes before the sequence lengths: magic, version, dtype code, the two counts.
HEADER_BYTES = len(MAGIC) + 8 + 1 + 8 + 8
#: Megatron's dtype codes of integer types (its codes 6 and 7 are float64 and float32).
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype("<u1"),
    2: np.dtype("<i1"),
    3: np.dtype("<i2"),
    4: np.dtype("<i4"),
    5: np.dtype("<i8"),
    8: np.dtype("<u2"),
}
_FLOAT_CODES = {6: "float64", 7: "float32"}
#: Sequence lengths are int32: a longer document is written as several sequences.
MAX_SEQUENCE = int(np.iinfo(np.int32).max)


def prefix(path: os.PathLike[str] | str) -> Path:
    """The dataset prefix of a prefix, a ``.bin`` or an ``.idx`` path."""
    text = os.fspath(path)
    return Path(text[:-4] if text.endswith((".bin", ".idx")) else text)


def paths(path: os.PathLike[str] | str) -> tuple[Path, Path]:
    """``(PREFIX.idx, PREFIX.bin)`` for a prefix, a ``.bin`` or an ``.idx`` path."""
    text = os.fspath(prefix(path))
    return Path(text + ".idx"), Path(text + ".bin")


def is_index(path: Path) -> bool:
    """Whether ``path`` is a file that starts with the index magic."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def code_for(dtype: np.dtype) -> int:
    """Megatron's code for an integer ``dtype``; ValueError when it has none (uint32, uint64)."""
    for code, stored in DTYPE_CODES.items():
        if stored.newbyteorder("=") == dtype.newbyteorder("="):
            return code
    raise ValueError(
        f"Megatron's index has no dtype code for {dtype}; it stores "
        f"{', '.join(d.name for d in DTYPE_CODES.values())}"
    )


def read(path: os.PathLike[str] | str) -> Shard:
    """Map the dataset named by ``path`` (its prefix, ``.bin`` or ``.idx``) as one shard."""
    idx_path, bin_path = paths(path)
    for part in (idx_path, bin_path):
        if not part.is_file():
            raise FileNotFoundError(2, "Megatron dataset file not found", os.fspath(part))
    where = f"token file {idx_path}"
    read_header(idx_path, HEADER_BYTES, "Megatron index", where)
    dtype, total, offsets = parse_index(np.memmap(idx_path, dtype=np.uint8, mode="r"), where)
    bin_size = bin_path.stat().st_size
    check_tokens_size(bin_size, total, dtype, str(bin_path), idx_path.name)
    tokens = map_tokens(bin_path, dtype, 0, total)
    return Shard(tokens, offsets, str(bin_path))


def parse_index(index: np.ndarray, where: str) -> tuple[np.dtype, int, np.ndarray]:
    """``(dtype, tokens, document offsets)`` from a whole index (a uint8 array of its bytes).

    Every count, length and pointer is checked (ValueError naming ``where``): the sequences
    must lie back to back from byte 0; the ``.bin``'s size is :func:`check_tokens_size`'s.
    """
    size = index.shape[0]
    if size < HEADER_BYTES:
        raise ValueError(
            f"{where}: truncated Megatron index: {size} bytes, its header alone needs "
            f"{HEADER_BYTES}"
        )
    head = bytes(index[:HEADER_BYTES])
    if head[: len(MAGIC)] != MAGIC:
        raise ValueError(
            f"{where}: bad magic {head[: len(MAGIC)]!r}, Megatron indexes start with {MAGIC!r}"
        )
    version = int.from_bytes(head[9:17], "little")
    code = head[17]
    sequences = int.from_bytes(head[18:26], "little")
    document_indices = int.from_bytes(head[26:34], "little")
    if version != VERSION:
        raise ValueError(f"{where}: unknown Megatron index version {version}, expected {VERSION}")
    if code in _FLOAT_CODES:
        raise ValueError(f"{where}: the dataset holds {_FLOAT_CODES[code]} values, not token ids")
    if code not in DTYPE_CODES:
        raise ValueError(
            f"{where}: unknown dtype code {code}; Megatron's integer codes are "
            f"{sorted(DTYPE_CODES)}"
        )
    dtype = DTYPE_CODES[code]
    expected = HEADER_BYTES + 12 * sequences + 8 * document_indices
    if size == expected + sequences and sequences:
        raise ValueError(
            f"{where}: a multimodal Megatron index (sequence modes after the document indices); "
            "tokstream reads token datasets"
        )
    if size != expected:
        raise ValueError(
            f"{where}: its header counts {sequences} sequences and {document_indices} document "
            f"indices ({expected} bytes in all), the file has {size} bytes"
            + (" (truncated)" if size < expected else "")
        )
    if document_indices == 0:
        raise ValueError(f"{where}: no document indices (a Megatron index has at least [0])")
    lengths = np.frombuffer(index, dtype="<i4", count=sequences, offset=HEADER_BYTES)
    pointers = np.frombuffer(
        index, dtype="<i8", count=sequences, offset=HEADER_BYTES + 4 * sequences
    )
    starts = np.frombuffer(
        index, dtype="<i8", count=document_indices, offset=HEADER_BYTES + 12 * sequences
    )
    total = _check_pointers(lengths, pointers, dtype.itemsize, where)
    if starts[0] != 0 or starts[-1] != sequences:
        raise ValueError(
            f"{where}: document indices run from {int(starts[0])} to {int(starts[-1])}; they "
            f"must run from 0 to the sequence count {sequences}"
        )
    if np.any(starts[1:] < starts[:-1]):
        raise ValueError(f"{where}: document indices decrease; they must never fall")
    # A document starts at its first sequence's pointer, or at the end when no sequence is
    # left (trailing empty documents). In chunks: the index's arrays are unaligned, and NumPy
    # would copy them whole to index them at once.
    offsets = np.empty(document_indices, dtype=np.int64)
    for first in range(0, document_indices, _validate.SCAN_CHUNK):
        chunk = starts[first : first + _validate.SCAN_CHUNK]
        found = offsets[first : first + chunk.shape[0]]
        if sequences:
            np.floor_divide(pointers[np.minimum(chunk, sequences - 1)], dtype.itemsize, out=found)
        found[chunk == sequences] = total
    return dtype, total, offsets


def check_tokens_size(size: int, total: int, dtype: np.dtype, name: str, index_name: str) -> None:
    """The ``.bin`` named ``name`` must be ``total`` tokens of ``dtype``, as its index says."""
    if size != total * dtype.itemsize:
        raise ValueError(
            f"token file {name}: its index {index_name} counts {total} {dtype.name} "
            f"tokens ({total * dtype.itemsize} bytes), the file has {size} bytes"
            + (" (truncated)" if size < total * dtype.itemsize else "")
        )


def _check_pointers(lengths: np.ndarray, pointers: np.ndarray, itemsize: int, where: str) -> int:
    """Check that the sequences lie back to back from byte 0; return the total token count."""
    total = 0
    for start in range(0, lengths.shape[0], _validate.SCAN_CHUNK):
        chunk = lengths[start : start + _validate.SCAN_CHUNK].astype(np.int64)
        if np.any(chunk < 0):
            bad = start + int(np.argmax(chunk < 0))
            raise ValueError(f"{where}: sequence {bad} has a negative length {int(lengths[bad])}")
        ends = np.cumsum(chunk)
        expected = (total + ends - chunk) * itemsize
        found = pointers[start : start + chunk.shape[0]]
        if not np.array_equal(found, expected):
            bad = start + int(np.argmax(found != expected))
            raise ValueError(
                f"{where}: sequence {bad} points at byte {int(pointers[bad])}, but the lengths "
                f"before it put it at byte {int(expected[bad - start])}; tokstream reads "
                "sequences stored back to back"
            )
        total += int(ends[-1]) if ends.shape[0] else 0
    return total


def write_index(f: BinaryIO, document_offsets: np.ndarray, dtype: np.dtype) -> None:
    """Write the index of tokens ``dtype`` whose documents are ``document_offsets``.

    One sequence per document, except that a document longer than int32 allows is split into
    several sequences of the same document.
    """
    code = code_for(dtype)
    document_lengths = np.diff(document_offsets)
    pieces = np.maximum(1, -(-document_lengths // MAX_SEQUENCE))
    if np.all(pieces == 1):
        lengths = document_lengths
        starts = np.arange(document_lengths.shape[0] + 1, dtype=np.int64)
    else:
        lengths = np.concatenate([_split(int(n)) for n in document_lengths])
        starts = np.zeros(document_lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(pieces, out=starts[1:])
    pointers = np.zeros(lengths.shape[0], dtype=np.int64)
    np.cumsum(lengths[:-1], out=pointers[1:])
    pointers *= dtype.itemsize
    f.write(MAGIC)
    f.write(VERSION.to_bytes(8, "little"))
    f.write(bytes([code]))
    f.write(lengths.shape[0].to_bytes(8, "little"))
    f.write(starts.shape[0].to_bytes(8, "little"))
    f.write(lengths.astype("<i4").tobytes())
    f.write(pointers.astype("<i8").tobytes())
    f.write(starts.astype("<i8").tobytes())


def _split(length: int) -> np.ndarray:
    full, rest = divmod(length, MAX_SEQUENCE)
    return np.array([MAX_SEQUENCE] * full + ([rest] if rest or not full else []), dtype=np.int64)
