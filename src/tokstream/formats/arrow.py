"""Apache Arrow: IPC files and streams, Hugging Face ``save_to_disk`` directories, tables.

The token stream is a column of integer lists (``input_ids`` by default): each row is a document,
the list values are the tokens, the list offsets the document boundaries. A column of plain
integers is read as tokens without documents. Each record batch is a separate region of the
file, so it becomes one shard (``datasets`` writes 1,000 rows per batch by default): the values
are mapped where they lie, never copied.

Both IPC forms are read: the file form (Feather version 2; it starts with ``ARROW1``) and the
stream form that ``datasets`` writes into its ``.arrow`` files (it starts with the continuation
marker ``0xFFFFFFFF``). ``pyarrow`` is needed (the ``arrow`` extra) and imported only here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tokstream._extras import install_hint
from tokstream.formats.common import Shard, check_offsets, map_tokens

FILE_MAGIC = b"ARROW1"
STREAM_MAGIC = b"\xff\xff\xff\xff"
DEFAULT_COLUMN = "input_ids"
#: What ``Dataset.save_to_disk`` writes beside its ``.arrow`` files.
STATE_FILE = "state.json"
DATASET_DICT_FILE = "dataset_dict.json"
_INT32_MAX = int(np.iinfo(np.int32).max)


def require() -> Any:
    """The ``pyarrow`` module, or an ImportError that names the extra to install."""
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
    except ImportError:
        raise ImportError(
            f"reading or writing Arrow data needs pyarrow: {install_hint('arrow')}"
        ) from None
    return pyarrow


# ---------------------------------------------------------------------------------------------
# Reading


def read_file(path: Path, column: str) -> list[Shard]:
    """One shard per record batch of the Arrow IPC file or stream at ``path``."""
    pa = require()
    where = f"token file {path}"
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(len(FILE_MAGIC))
    try:
        with pa.memory_map(os.fspath(path), "r") as source:
            base = source.read_buffer().address if size else 0
            source.seek(0)
            if head.startswith(FILE_MAGIC):
                reader = pa.ipc.open_file(source)
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            else:
                reader = pa.ipc.open_stream(source)
                batches = list(reader)
            for batch in batches:
                batch.validate()
            schema = reader.schema
            schema.names  # noqa: B018 - field names that are not UTF-8 raise here, not later
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"{where}: unreadable Arrow data ({exc}); if it holds raw tokens, pass format='bin'"
        ) from None

    def locate(buffer: Any, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
        start = buffer.address - base + offset * dtype.itemsize
        if count and not (0 <= start and start + count * dtype.itemsize <= size):
            raise ValueError(
                f"{where}: the token values of column {column!r} are not stored in the file "
                "as they are read (a compressed or byte-swapped Arrow file?); tokstream maps "
                "tokens without copying them, so write the file uncompressed"
            )
        return map_tokens(path, dtype, start, count)

    return _batches_to_shards(schema, batches, column, where, locate)


def read_directory(path: Path, column: str) -> list[Shard]:
    """The shards of a directory written by ``datasets.Dataset.save_to_disk``, in its order."""
    if (path / DATASET_DICT_FILE).is_file():
        splits = _json(path / DATASET_DICT_FILE).get("splits", [])
        raise ValueError(
            f"token file {path} is a DatasetDict with the splits {', '.join(map(str, splits))}; "
            f"open one split's directory, e.g. '{path / str(splits[0] if splits else 'train')}'"
        )
    state_path = path / STATE_FILE
    state = _json(state_path)
    files = state.get("_data_files")
    if not isinstance(files, list) or not files:
        raise ValueError(f"token file {state_path}: no '_data_files' list of Arrow files")
    if state.get("_indices_data_files"):
        raise ValueError(
            f"token file {state_path}: the dataset keeps an indices mapping; save it again "
            "after Dataset.flatten_indices()"
        )
    shards: list[Shard] = []
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise ValueError(
                f"token file {state_path}: bad entry {entry!r} in '_data_files' (a file name in "
                "the directory is expected)"
            )
        data_path = path / name
        if not data_path.is_file():
            raise FileNotFoundError(2, "Arrow file listed in state.json not found", str(data_path))
        shards.extend(read_file(data_path, column))
    return shards


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"token file {path}: unreadable JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"token file {path}: a JSON object was expected")
    return value


def is_arrow_object(value: Any) -> bool:
    """Whether ``value`` is a pyarrow Table or RecordBatch or a ``datasets.Dataset``.

    Decided without importing either library, so plain arrays never pay for it.
    """
    module = type(value).__module__ or ""
    if module.startswith("pyarrow"):
        return type(value).__name__ in ("Table", "RecordBatch")
    return module.startswith("datasets") and hasattr(value, "data") and hasattr(value, "_indices")


def read_object(value: Any, column: str) -> list[Shard]:
    """One shard per chunk of ``column`` of an in-memory Table, RecordBatch or Dataset.

    The arrays are views of the Arrow buffers (a ``datasets.Dataset`` loaded from disk keeps its
    cache files mapped), never copies.
    """
    pa = require()
    where = type(value).__name__
    if not type(value).__module__.startswith("pyarrow"):
        if value._indices is not None:
            raise ValueError(
                f"the {where} has an indices mapping (from shuffle, select, sort or a split); "
                "call dataset.flatten_indices() first so that its rows are stored in order"
            )
        value = value.data.table
    batches = value.to_batches() if isinstance(value, pa.Table) else [value]
    schema = value.schema

    def view(buffer: Any, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
        if count == 0:
            return map_tokens(Path(), dtype, 0, 0)
        array = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset * dtype.itemsize)
        array.flags.writeable = False
        return array

    return _batches_to_shards(schema, batches, column, where, view)


def _batches_to_shards(
    schema: Any, batches: list[Any], column: str, where: str, locate: Any
) -> list[Shard]:
    """Check the column's type once, then make one shard per batch (an empty one if none)."""
    token_type = _token_type(schema, column, where)
    shards = [
        _column_shard(batch, column, f"{where} (record batch {i})", locate)
        for i, batch in enumerate(batches)
    ]
    if not shards:
        # No rows: no tokens, and for a column of lists no documents either.
        empty = map_tokens(Path(), np.dtype(token_type.to_pandas_dtype()), 0, 0)
        lists = not require().types.is_integer(schema.field(column).type)
        return [Shard(empty, np.zeros(1, np.int64) if lists else None, where)]
    return shards


def _token_type(schema: Any, column: str, where: str) -> Any:
    """The integer type of the tokens of ``column``; ValueError naming ``where`` otherwise."""
    pa = require()
    if column not in schema.names:
        raise ValueError(
            f"{where} has no column {column!r} (its columns: {', '.join(schema.names) or 'none'}); "
            "choose one with column="
        )
    kind = schema.field(column).type
    if pa.types.is_integer(kind):
        return kind
    if not _is_list(pa, kind):
        raise ValueError(f"{where}: column {column!r} is {kind}, not a list of integer token ids")
    if not pa.types.is_integer(kind.value_type):
        what = "nested lists" if _is_list(pa, kind.value_type) else f"lists of {kind.value_type}"
        raise ValueError(f"{where}: column {column!r} holds {what}, not lists of integer token ids")
    return kind.value_type


def _column_shard(batch: Any, column: str, where: str, locate: Any) -> Shard:
    pa = require()
    array = batch.column(batch.schema.names.index(column))
    kind = array.type
    if array.null_count:
        raise ValueError(f"{where}: column {column!r} has {array.null_count} null rows")
    if pa.types.is_integer(kind):
        tokens = _values(array, 0, len(array), column, where, locate)
        return Shard(tokens, None, where)
    child = array.values
    if pa.types.is_fixed_size_list(kind):
        offsets = (np.arange(len(array) + 1, dtype=np.int64) + array.offset) * kind.list_size
    else:
        offsets = np.asarray(array.offsets, dtype=np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    if not 0 <= first <= last <= len(child):
        raise ValueError(
            f"{where}: column {column!r} has list offsets from {first} to {last} outside its "
            f"{len(child)} values"
        )
    offsets = check_offsets(offsets - first, last - first, f"{where}: column {column!r}")
    if child.slice(first, last - first).null_count:
        raise ValueError(f"{where}: column {column!r} holds null token ids")
    tokens = _values(child, first, last - first, column, where, locate)
    return Shard(tokens, offsets, where)


def _is_list(pa: Any, kind: Any) -> bool:
    return bool(
        pa.types.is_list(kind)
        or pa.types.is_large_list(kind)
        or (pa.types.is_fixed_size_list(kind))
    )


def _values(array: Any, start: int, count: int, column: str, where: str, locate: Any) -> np.ndarray:
    """``count`` values of the primitive ``array`` from ``start``, located without a copy."""
    dtype = np.dtype(array.type.to_pandas_dtype())
    if count == 0:
        return map_tokens(Path(), dtype, 0, 0)
    data = array.buffers()[1]
    tokens: np.ndarray = locate(data, dtype, array.offset + start, count)
    return tokens


# ---------------------------------------------------------------------------------------------
# Writing


def write(
    f: BinaryIO, tokens: np.ndarray, document_offsets: np.ndarray | None, dtype: np.dtype
) -> None:
    """Write an Arrow IPC stream (the form ``datasets`` uses) with one ``input_ids`` column.

    One row per document (one row in all without documents), in one record batch so that the
    file reads back as one shard; large lists (int64 offsets) when the tokens outnumber int32.
    """
    pa = require()
    count = tokens.shape[0]
    offsets = (
        np.array([0, count], dtype=np.int64) if document_offsets is None else (document_offsets)
    )
    values = pa.array(np.ascontiguousarray(tokens, dtype=dtype.newbyteorder("=")))
    if count > _INT32_MAX:
        lists = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)
    else:
        lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32), pa.int32()), values)
    batch = pa.record_batch([lists], names=[DEFAULT_COLUMN])
    with pa.ipc.new_stream(f, batch.schema) as writer:
        writer.write_batch(batch)
