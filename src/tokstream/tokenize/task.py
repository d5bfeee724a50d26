"""The unit of a tokenize job: a range of the inputs in, one shard with its documents out.

:func:`plan` cuts the inputs, in order, into ranges of about ``shard_bytes`` input bytes from
their sizes alone (and a Parquet file's row count): an uncompressed file of a document per
line is cut at any byte (a line belongs to the range its first byte is in), a Parquet file at
any row, and any other file (``.gz``, a document per file) is never cut. Each range becomes
one shard: :func:`run` reads the range's documents, encodes them, writes the shard and its
document offsets under their final names (each put in place whole), and returns the shard's
manifest entry. It depends on nothing but its :class:`Task`, so every engine, worker and node
makes the same bytes for the same range, in any order, and a range whose shard was recorded
never needs to be made again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokstream import writing
from tokstream.formats import tokenized
from tokstream.formats.common import atomic_writer
from tokstream.formats.writer import TokenFileWriter
from tokstream.tokenize.chat import BadConversation, ChatEncoder, ChatSpec
from tokstream.tokenize.encoders import PARALLELISM, Encoder
from tokstream.tokenize.inputs import (
    MESSAGES,
    Conversation,
    input_kind,
    line_start,
    parquet_rows,
    read_span,
    splittable,
)

#: Documents encoded at a time, and at most this many characters of them.
BATCH_DOCUMENTS = 1000
BATCH_CHARS = 4 << 20

#: A span of one input: [input index, start, end], bytes (or Parquet rows) from start to end.
Span = list[int]

#: Told, after each batch a task has written, its documents, tokens and input bytes so far.
Report = Callable[[int, int, int], None]


@dataclass(frozen=True)
class Task:
    """Everything one shard depends on; small, picklable, the same on every node."""

    index: int
    spans: tuple[tuple[int, int, int], ...]
    #: The input bytes the range covers (for progress only).
    size: int
    #: The inputs the spans read, by input index (only those: a task stays small however many
    #: inputs the job has).
    paths: tuple[tuple[int, str], ...]
    directory: str
    tokenizer: str
    eos: int | None
    format: str
    dtype: str
    text_field: str
    document_per_file: bool
    #: The run's token (:class:`tokstream.tokenize.output.Output`): the task writes only while
    #: its directory is that run's.
    run: str = ""
    #: For ``--chat``: the template and tokenizer conversations are encoded with (the shard
    #: gets a loss mask beside it), and whether a bad conversation is skipped or an error.
    chat: ChatSpec | None = None
    skip_bad: bool = False


def plan(
    paths: list[Path],
    shard_bytes: int,
    text_field: str,
    document_per_file: bool,
    chat: bool = False,
) -> list[tuple[list[Span], int]]:
    """The ranges of ``paths``, in input order: each a list of spans and its size in bytes.

    A range closes once it holds ``shard_bytes``; a file that is never cut starts a range of
    its own when it does not fit in the current one, and so does a line (a file of a document
    per line is cut only where a line begins): a line longer than ``shard_bytes`` is one range
    of its own, never one per ``shard_bytes`` of it. So every range holds a document's first
    byte (or row). Empty files hold no span.
    """
    ranges: list[tuple[list[Span], int]] = []
    spans: list[Span] = []
    size = 0

    def close() -> None:
        nonlocal spans, size
        if spans:
            ranges.append((spans, size))
        spans, size = [], 0

    for index, path in enumerate(paths):
        file_bytes = path.stat().st_size
        field = MESSAGES if chat else text_field
        rows = parquet_rows(path, field, chat) if input_kind(path) == "parquet" else None
        if rows is None and not splittable(path, document_per_file):
            if spans and size + file_bytes > shard_bytes:
                close()
            if file_bytes:
                spans.append([index, 0, file_bytes])
                size += file_bytes
            if size >= shard_bytes:
                close()
            continue
        # Bytes, or rows each weighed file_bytes / rows.
        units = file_bytes if rows is None else rows
        start = 0
        while start < units:
            room = shard_bytes - size
            if rows is None:
                first_line = line_start(path, start + 1)
                if spans and first_line - start > room:
                    close()  # the line does not fit beside the range's documents
                    continue
                end = min(start + room, units)
                end = max(first_line, line_start(path, end) if end < units else end)
            else:
                end = min(start + max(room * rows // max(file_bytes, 1), 1), units)
            spans.append([index, start, end])
            size += end - start if rows is None else (end - start) * file_bytes // rows
            start = end
            if size >= shard_bytes or end < units:
                close()
    close()
    return ranges


def run(
    task: Task, encoder: Encoder | ChatEncoder | None = None, report: Report | None = None
) -> dict[str, Any]:
    """Make the shard of ``task``'s range; its manifest entry.

    ``encoder`` is the task's tokenizer already loaded in this process; without it a worker
    loads it once (:func:`load`) and keeps it for its next tasks. ``report`` is told how far
    the task has got after each batch of documents (never per document).

    The shard and its ``.documents.npy`` are each written under a temporary name and renamed
    into place, so a killed run leaves either nothing or a whole file (written again, the same,
    when its range is run again). A ``--chat`` task writes the shard's loss mask the same way
    (:func:`tokstream.formats.tokenized.loss_mask_file`), and its entry counts the tokens
    trained and the conversations skipped.
    """
    encoder = encoder or load(task.chat or task.tokenizer)
    directory = Path(task.directory)
    dtype = np.dtype(task.dtype)
    largest = np.iinfo(dtype).max
    lengths: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    skipped = 0
    path = directory / tokenized.shard_file(task.index, task.format)
    with TokenFileWriter(path, task.format, dtype) as writer:
        documents = tokens = 0
        for texts, done in batches(task):
            if isinstance(encoder, ChatEncoder):
                flat, batch_lengths, mask, bad = encode_chat(encoder, texts, task.skip_bad)
                masks.append(mask)
                skipped += bad
            else:
                flat, batch_lengths = encode(encoder, texts, task.eos)
            if flat.shape[0] and (int(flat.min()) < 0 or int(flat.max()) > largest):
                raise ValueError(f"the tokenizer produced ids outside {dtype}")
            writer.write(flat)
            lengths.append(batch_lengths)
            documents += batch_lengths.shape[0]
            tokens += flat.shape[0]
            if report is not None:
                report(documents, tokens, done)
        offsets = np.zeros(sum(len(x) for x in lengths) + 1, dtype=np.int64)
        if lengths:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        writer.document_offsets = offsets
    if task.format != "megatron":
        writing.write_tokens(
            directory / tokenized.documents_file(task.index), offsets, format="npy", dtype=np.int64
        )
    entry = {
        "tokens": int(offsets[-1]),
        "documents": int(offsets.shape[0] - 1),
        "input": [list(span) for span in task.spans],
    }
    if task.chat is not None:
        mask = np.concatenate(masks) if masks else np.zeros(0, np.uint8)
        with atomic_writer(directory / tokenized.loss_mask_file(task.index)) as f:
            np.lib.format.write_array(f, mask, version=(1, 0), allow_pickle=False)
        entry["trained"] = int(np.count_nonzero(mask))
        entry["skipped"] = skipped
    return entry


def encode_chat(
    encoder: ChatEncoder, conversations: list[Conversation], skip_bad: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """All ids of the conversations back to back, each one's length, the uint8 loss mask of
    the ids, and how many bad conversations were skipped (``skip_bad``; else a ValueError
    naming the first one's file and line)."""
    ids: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    skipped = 0
    for conversation in conversations:
        try:
            encoded = encoder.encode(conversation.record)
        except BadConversation as exc:
            if not skip_bad:
                raise ValueError(
                    f"{conversation.where()}: {exc} (--skip-bad counts and skips such records)"
                ) from None
            skipped += 1
            continue
        ids.append(encoded.ids)
        masks.append(encoded.mask)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    if not ids:
        return np.zeros(0, np.int64), lengths, np.zeros(0, np.uint8), skipped
    return np.concatenate(ids), lengths, np.concatenate(masks).astype(np.uint8), skipped


def batches(task: Task) -> Iterator[tuple[list[Any], int]]:
    """The range's document texts (for ``--chat``, conversations) in batches of
    :data:`BATCH_DOCUMENTS` or :data:`BATCH_CHARS`, each with the range's input bytes read so
    far (at most ``task.size``)."""
    texts: list[Any] = []
    chars = 0
    paths = dict(task.paths)
    spans_done = done = 0  # the bytes of the spans read whole; of the range
    for index, start, end in task.spans:
        path = Path(paths[index])
        read = 0
        for text, read in read_span(
            path, start, end, task.text_field, task.document_per_file, task.chat is not None
        ):
            texts.append(text)
            chars += len(text) if isinstance(text, str) else 0
            done = min(spans_done + read, task.size)
            if len(texts) >= BATCH_DOCUMENTS or chars >= BATCH_CHARS:
                yield texts, done
                texts, chars = [], 0
        spans_done += read
    if texts:
        yield texts, done


def encode(encoder: Encoder, texts: list[str], eos: int | None) -> tuple[np.ndarray, np.ndarray]:
    """All ids of ``texts`` back to back (each followed by ``eos``) and each document's length."""
    return pack(encoder.encode(texts), eos)


def pack(encoded: list[list[int]], eos: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The documents' ids back to back (each followed by ``eos``) and each one's length."""
    flat: list[int] = []
    lengths = np.empty(len(encoded), dtype=np.int64)
    for i, ids in enumerate(encoded):
        flat += ids
        if eos is not None:
            flat.append(eos)
        lengths[i] = len(ids) + (eos is not None)
    return np.array(flat, dtype=np.int64), lengths


_encoders: dict[str | ChatSpec, Encoder | ChatEncoder] = {}


def load(spec: str | ChatSpec) -> Encoder | ChatEncoder:
    """The tokenizer (or chat template) ``spec`` loaded once per process (an engine's worker
    runs many tasks)."""
    if spec not in _encoders:
        # One process per core already: the tokenizer's own thread pool would oversubscribe.
        os.environ[PARALLELISM] = "false"
        _encoders[spec] = ChatEncoder(spec) if isinstance(spec, ChatSpec) else Encoder(spec)
    return _encoders[spec]
