"""The documents ``tokstream tokenize`` reads: text files, JSON Lines and Parquet.

A text file holds a document per nonempty line (or is one document); a JSON Lines record or a
Parquet row holds one in a text field. One rule for every kind: a document with no characters
(an empty line, file, field or row) is skipped, never written as an eos-only document.
``.gz`` files are read through gzip. Every error names the file and, where there is one, the line.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from tokstream import files
from tokstream.formats import arrow

#: Parquet rows read at a time.
PARQUET_BATCH_ROWS = 1000


def expand_inputs(inputs: Sequence[str | os.PathLike]) -> list[Path]:
    """Each input as a file, or a pattern's sorted matches, in the order given."""
    if isinstance(inputs, (str, os.PathLike)) or not inputs:
        raise TypeError("inputs must be a nonempty list of paths or patterns")
    paths = [path for item in inputs for path in files.expand_pattern(item)]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(2, "input file not found", os.fspath(path))
    return paths


def input_kind(path: Path) -> str:
    """``"jsonl"``, ``"parquet"`` or ``"text"``, by the name (``.gz`` looked through)."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes = suffixes[:-1]
    if suffixes[-1:] in ([".jsonl"], [".json"]):
        return "jsonl"
    if suffixes[-1:] == [".parquet"]:
        return "parquet"
    return "text"


def read_documents(
    path: Path, text_field: str, document_per_file: bool
) -> Iterator[tuple[str, int]]:
    """The documents of one input, each with the bytes of the file read so far."""
    kind = input_kind(path)
    if kind == "parquet":
        yield from _parquet_documents(path, text_field)
        return
    try:
        yield from _text_documents(path, kind, text_field, document_per_file)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        # gzip reports a truncated stream as EOFError and a corrupt one as zlib.error or
        # BadGzipFile (an OSError): none of them names the file.
        raise ValueError(f"input {path}: truncated or corrupt gzip data: {exc}") from None


def _text_documents(
    path: Path, kind: str, text_field: str, document_per_file: bool
) -> Iterator[tuple[str, int]]:
    with open(path, "rb") as raw:
        compressed = path.suffix.lower() == ".gz"
        f: IO[bytes] = gzip.GzipFile(fileobj=raw) if compressed else raw
        with f:
            if kind == "text" and document_per_file:
                text = _decode(f.read(), path, 1)
                if text:
                    yield text, raw.tell()
                return
            done = 0
            for number, line in enumerate(f, start=1):
                # The bytes of the file read so far: a .gz file's compressed bytes.
                done = raw.tell() if compressed else done + len(line)
                text = _decode(line, path, number).rstrip("\r\n")
                if kind == "jsonl":  # a blank line holds no record
                    text = _json_text(text, path, number, text_field) if text.strip() else ""
                if text:
                    yield text, done


def _decode(data: bytes, path: Path, line: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"input {path}, line {line}: not UTF-8 text: {exc}") from None


def _json_text(line: str, path: Path, number: int, field: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"input {path}, line {number}: not JSON: {exc}") from None
    if not isinstance(record, dict) or field not in record:
        raise ValueError(f"input {path}, line {number}: no {field!r} field (--text-field)")
    if not isinstance(record[field], str):
        raise ValueError(
            f"input {path}, line {number}: field {field!r} is "
            f"{type(record[field]).__name__}, not text"
        )
    return record[field]


def _parquet_documents(path: Path, field: str) -> Iterator[tuple[str, int]]:
    pa = arrow.require()
    import pyarrow.parquet as pq

    try:
        table_file = pq.ParquetFile(path)
    except pa.ArrowException as exc:
        raise ValueError(f"input {path}: unreadable Parquet: {exc}") from None
    schema = table_file.schema_arrow
    if field not in schema.names:
        raise ValueError(
            f"input {path}: no column {field!r} (its columns: {', '.join(schema.names)}); "
            "choose one with --text-field"
        )
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ValueError(f"input {path}: column {field!r} is {kind}, not text")
    rows = max(table_file.metadata.num_rows, 1)
    size = path.stat().st_size
    done = 0
    for batch in table_file.iter_batches(columns=[field], batch_size=PARQUET_BATCH_ROWS):
        column = batch.column(0)
        if column.null_count:
            raise ValueError(f"input {path}: column {field!r} has null rows")
        for text in column.to_pylist():
            done += 1
            if text:
                yield text, size * done // rows
