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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tokstream.formats import arrow, table
from tokstream.shards.remote import is_url

#: The JSON field and Parquet column a conversation's messages are in (``--chat``).
MESSAGES = "messages"


@dataclass(frozen=True)
class Conversation:
    """A ``--chat`` input record (a JSON object or a Parquet row), and where it is."""

    record: Any
    #: ``"input PATH, line N"`` (or ``row N``), computed only for a message.
    where: Callable[[], str]


def expand_inputs(inputs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Each input as a file, or a pattern's sorted matches, in the order given."""
    if isinstance(inputs, (str, os.PathLike)) or not inputs:
        raise TypeError("inputs must be a nonempty list of paths or patterns")
    for item in inputs:
        if is_url(item):
            raise ValueError(
                f"input {item!r}: tokenize reads local files (every worker opens its inputs by "
                "path), not object storage; copy the objects to a local or shared filesystem"
            )
    paths = [path for item in inputs for path in table.expand_pattern(item)]
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


def splittable(path: Path, document_per_file: bool) -> bool:
    """Whether ``path`` can be read from any byte: an uncompressed file of a document per line."""
    return (
        input_kind(path) != "parquet"
        and path.suffix.lower() != ".gz"
        and not (document_per_file and input_kind(path) == "text")
    )


def line_start(path: Path, offset: int) -> int:
    """The first byte at or after ``offset`` (at least 1) that begins a line of ``path``, or
    its size: where a range of whole lines may end. Reads only up to the next newline."""
    with open(path, "rb") as f:
        f.seek(offset - 1)
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return f.tell()
            at = chunk.find(b"\n")
            if at >= 0:
                return f.tell() - len(chunk) + at + 1


def check_chat_input(path: Path) -> None:
    """A ``--chat`` input must be JSON Lines or Parquet: a ValueError naming a text file."""
    if input_kind(path) == "text":
        raise ValueError(
            f"input {path}: --chat reads conversations from JSON Lines (.jsonl, .json) or "
            "Parquet files, each record holding a 'messages' list"
        )


def parquet_rows(path: Path, text_field: str, chat: bool = False) -> int:
    """The rows of a Parquet input, its text column (with ``chat``, its list column of
    messages) checked (its footer is all that is read)."""
    rows: int = _parquet_file(path, text_field, chat).metadata.num_rows
    return rows


def read_span(
    path: Path, start: int, end: int, text_field: str, document_per_file: bool, chat: bool = False
) -> Iterator[tuple[Any, int]]:
    """The documents of one input that begin in ``[start, end)``, each with the input bytes of
    the span read so far (for progress: the share of a file a ``.gz`` has read by its
    compressed bytes, a Parquet row weighed as the file's bytes over its rows).

    For a splittable file (:func:`splittable`) these are byte offsets, and a document (a line)
    belongs to the span its first byte is in, so spans that tile a file read each line once;
    for Parquet they are rows; any other file is read whole (``start`` 0).

    With ``chat`` each document is a :class:`Conversation` (a JSON object, or a Parquet row
    of the ``messages`` column), not text.
    """
    kind = input_kind(path)
    if kind == "parquet":
        yield from _parquet_documents(path, MESSAGES if chat else text_field, start, end, chat)
    elif splittable(path, document_per_file):
        yield from _line_documents(path, kind, text_field, start, end, chat)
    else:
        try:
            yield from _whole_file_documents(path, kind, text_field, document_per_file, chat)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            # gzip reports a truncated stream as EOFError and a corrupt one as zlib.error or
            # BadGzipFile (an OSError): none of them names the file.
            raise ValueError(f"input {path}: truncated or corrupt gzip data: {exc}") from None


def _line_documents(
    path: Path, kind: str, text_field: str, start: int, end: int, chat: bool
) -> Iterator[tuple[Any, int]]:
    with open(path, "rb") as f:
        position = 0
        if start > 0:
            # The line holding byte start - 1 began in an earlier span (or ends right there).
            f.seek(start - 1)
            position = start - 1 + len(f.readline())
        while position < end:
            line = f.readline()
            if not line:
                return
            text = _document(
                line, path, kind, text_field, partial(_line_number, path, position), chat
            )
            position += len(line)
            if text:
                yield text, min(position, end) - start


def _line_number(path: Path, offset: int) -> int:
    """The number of the line starting at byte ``offset``: counted only for an error message."""
    with open(path, "rb") as f:
        return f.read(offset).count(b"\n") + 1


def _whole_file_documents(
    path: Path, kind: str, text_field: str, document_per_file: bool, chat: bool
) -> Iterator[tuple[Any, int]]:
    with open(path, "rb") as raw:
        f = gzip.GzipFile(fileobj=raw) if path.suffix.lower() == ".gz" else raw
        with f:
            if kind == "text" and document_per_file:
                text = _decode(f.read(), path, 1)
                if text:
                    yield text, raw.tell()
                return
            for number, line in enumerate(f, start=1):
                # The line's number is known here: partial(int, number)() is number.
                text = _document(line, path, kind, text_field, partial(int, number), chat)
                if text:
                    # The file's own position: for a .gz, the compressed bytes read so far.
                    yield text, raw.tell()


def _document(
    line: bytes,
    path: Path,
    kind: str,
    text_field: str,
    number: Callable[[], int],
    chat: bool = False,
) -> Any:
    """The document of one line ("" for none); ``number`` gives its line number for errors."""
    try:
        text = line.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise ValueError(f"input {path}, line {number()}: not UTF-8 text: {exc}") from None
    if chat and text.strip():
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"input {path}, line {number()}: not JSON: {exc}") from None
        return Conversation(record, lambda: f"input {path}, line {number()}")
    if kind == "jsonl" and text.strip():  # a blank line holds no record
        return _json_text(text, path, number, text_field)
    return "" if kind == "jsonl" else text


def _decode(data: bytes, path: Path, line: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"input {path}, line {line}: not UTF-8 text: {exc}") from None


def _json_text(line: str, path: Path, number: Callable[[], int], field: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"input {path}, line {number()}: not JSON: {exc}") from None
    if not isinstance(record, dict) or field not in record:
        raise ValueError(f"input {path}, line {number()}: no {field!r} field (--text-field)")
    text = record[field]
    if not isinstance(text, str):
        raise ValueError(
            f"input {path}, line {number()}: field {field!r} is {type(text).__name__}, not text"
        )
    return text


def _parquet_file(path: Path, field: str, chat: bool = False) -> Any:
    pa = arrow.require()
    import pyarrow.parquet as pq

    try:
        table_file = pq.ParquetFile(path)
    except pa.ArrowException as exc:
        raise ValueError(f"input {path}: unreadable Parquet: {exc}") from None
    schema = table_file.schema_arrow
    if field not in schema.names:
        raise ValueError(
            f"input {path}: no column {field!r} (its columns: {', '.join(schema.names)})"
            + ("" if chat else "; choose one with --text-field")
        )
    kind = schema.field(field).type
    if chat:
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
            raise ValueError(f"input {path}: column {field!r} is {kind}, not a list of messages")
    elif not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ValueError(f"input {path}: column {field!r} is {kind}, not text")
    return table_file


def _parquet_documents(
    path: Path, field: str, start: int, end: int, chat: bool = False
) -> Iterator[tuple[Any, int]]:
    table_file = _parquet_file(path, field, chat)
    metadata = table_file.metadata
    row_bytes = path.stat().st_size / max(metadata.num_rows, 1)
    first = 0
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        if first < end and start < first + rows:
            column = table_file.read_row_group(group, columns=[field]).column(0)
            column = column.slice(max(start - first, 0), min(end, first + rows) - max(start, first))
            if column.null_count:
                raise ValueError(f"input {path}: column {field!r} has null rows")
            at = max(start, first)
            # Each row's share of the file as it is read, not the row group's at once.
            if chat:
                for i, messages in enumerate(column.to_pylist()):
                    where = partial(str, f"input {path}, row {at + i}")
                    done = int((at + i + 1 - start) * row_bytes)
                    yield Conversation({MESSAGES: messages}, where), done
            else:
                for i, text in enumerate(column.to_pylist()):
                    if text:
                        yield text, int((at + i + 1 - start) * row_bytes)
        first += rows
