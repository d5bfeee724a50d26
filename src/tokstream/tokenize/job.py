"""The tokenize job: inputs in order, encoded in batches, written as shards with a manifest."""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokstream import _validate, files
from tokstream.formats import tokenized
from tokstream.formats.writer import STREAMED, TokenFileWriter
from tokstream.tokenize.encoders import Encoder, encode_batch, start_worker
from tokstream.tokenize.inputs import expand_inputs, read_documents

FORMATS = STREAMED
DEFAULT_EOS = "<|endoftext|>"
DEFAULT_SHARD_TOKENS = 100_000_000
#: Documents sent to a worker at a time, and at most this many characters of them.
BATCH_DOCUMENTS = 1000
BATCH_CHARS = 4 << 20

#: Called with a one-line status, and whether it marks a milestone (a shard written).
Progress = Callable[[str, bool], None]


# ---------------------------------------------------------------------------------------------
# The job


@dataclass
class Result:
    """What :func:`tokenize_files` wrote (``resumed_documents`` were already on disk)."""

    output: Path
    shards: int
    documents: int
    tokens: int
    resumed_documents: int
    dtype: str
    format: str

    def summary(self) -> str:
        """One line for people: what was written, and what an earlier run had already done."""
        kept = self.resumed_documents
        return (
            f"wrote {self.output}: {self.shards} {self.format} shards, {self.dtype}, "
            f"{self.tokens:,} tokens in {self.documents:,} documents"
            + (f" ({kept:,} documents kept from an earlier run)" if kept else "")
        )


def tokenize_files(
    inputs: Sequence[str | os.PathLike],
    tokenizer: str,
    output: str | os.PathLike,
    *,
    eos: int | str | None = DEFAULT_EOS,
    format: str = "npy",
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    workers: int = 1,
    text_field: str = "text",
    document_per_file: bool = False,
    dtype: Any = None,
    progress: Progress | None = None,
) -> Result:
    """Tokenize ``inputs`` into shards in the directory ``output``; see the module docstring.

    Parameters
    ----------
    inputs
        Text files (``.gz`` too), JSON Lines (``.jsonl``/``.json``) or Parquet files, or
        patterns of them; documents are taken in this order (a pattern's matches sorted).
    tokenizer
        A ``tokenizers`` JSON file, or a tiktoken encoding name whose file tiktoken has cached.
    eos
        Appended to every document: a token's text or an id; None appends nothing.
    format
        The shards' format: ``"npy"``, ``"bin"`` (raw; the manifest records the dtype),
        ``"llmc"`` or ``"megatron"``.
    shard_tokens
        The most tokens in one shard; a document is never split, so a longer one is a shard of
        its own.
    workers
        Processes that encode (1: in this process). The output does not depend on it.
    text_field
        The JSON field or Parquet column holding the text.
    document_per_file
        Each text file is one document (default: each nonempty line is one).
    dtype
        The shards' token dtype; by default uint16 when the tokenizer's largest id fits, else
        uint32 (int32 for Megatron). A dtype too narrow for that id is a ValueError.
    progress
        Called after each batch with a one-line status and whether a shard was just written.

    Raises
    ------
    ValueError
        A bad input (named with its line), an unknown tokenizer or eos, an output directory
        that holds another job's shards, a document longer than llm.c can count.
    ImportError
        ``tokenizers``, ``tiktoken`` or ``pyarrow`` (for Parquet) missing where needed.
    """
    _validate.choice(format, "format", FORMATS)
    shard_tokens = _validate.positive_int(shard_tokens, "shard_tokens")
    workers = _validate.positive_int(workers, "workers")
    paths = expand_inputs(inputs)
    encoder = Encoder(tokenizer)
    eos_id = encoder.eos_id(eos)
    try:
        dtype = files.stored_dtype(0, encoder.max_id, format, dtype)
    except ValueError as exc:
        raise ValueError(f"tokenizer {tokenizer}: {exc}") from None
    output = Path(output)
    job = {
        "inputs": [_input_identity(p) for p in paths],
        "tokenizer": encoder.fingerprint,
        "eos": eos_id,
        "format": format,
        "dtype": dtype.name,
        "shard_tokens": shard_tokens,
        "text_field": text_field,
        "document_per_file": document_per_file,
    }
    manifest = _start(output, job)
    resume = manifest["shards"][-1]["next"] if manifest["shards"] else [0, 0]
    resumed = sum(s["documents"] for s in manifest["shards"])
    if manifest["complete"]:
        return _result(output, manifest, resumed)
    total_bytes = sum(p.stat().st_size for p in paths)
    done_bytes = sum(p.stat().st_size for p in paths[: resume[0]])
    sink = _ShardSink(output, manifest, dtype)
    with contextlib.ExitStack() as stack:
        stack.callback(sink.abandon)
        batches = _batches(paths, text_field, document_per_file, resume)
        if workers == 1:
            encoded = (
                (encode_batch(texts, eos_id, encoder), end, read) for texts, end, read in batches
            )
        else:
            encoded = _in_workers(stack, tokenizer, workers, batches, eos_id)
        for (flat, lengths), end, read in encoded:
            shards_before = len(manifest["shards"])
            sink.add(flat, lengths, end, shard_tokens)
            if progress is not None:
                progress(
                    f"tokenize: {sink.documents:,} documents, {sink.tokens:,} tokens, "
                    f"{len(manifest['shards'])} shards done, "
                    f"{(done_bytes + read) / max(total_bytes, 1):.0%} of the input",
                    len(manifest["shards"]) > shards_before,
                )
        sink.finish()
    manifest["complete"] = True
    tokenized.save(output, manifest)
    return _result(output, manifest, resumed)


def _input_identity(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"path": os.fspath(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _start(output: Path, job: dict[str, Any]) -> dict[str, Any]:
    """The manifest to continue: a new one, or the one of an interrupted run of the same job."""
    if output.exists() and not output.is_dir():
        raise ValueError(f"output {output} exists and is not a directory")
    output.mkdir(parents=True, exist_ok=True)
    for stale in output.glob(".*.tmp"):  # left behind by a run that was killed
        stale.unlink()
    if tokenized.is_directory(output):
        manifest = tokenized.load(output)
        if manifest.get("job") != job:
            changed = sorted(k for k in job if (manifest.get("job") or {}).get(k) != job[k])
            raise ValueError(
                f"output {output} holds the shards of another tokenization (it differs in "
                f"{', '.join(changed) or 'its record'}); choose another --output or remove it"
            )
        return manifest
    if any(output.iterdir()):
        raise ValueError(f"output {output} is not empty; tokenize into a new directory")
    manifest = {
        "kind": tokenized.KIND,
        "version": tokenized.VERSION,
        "format": job["format"],
        "dtype": job["dtype"],
        "complete": False,
        "job": job,
        "shards": [],
    }
    tokenized.save(output, manifest)
    return manifest


def _result(output: Path, manifest: dict[str, Any], resumed: int) -> Result:
    shards = manifest["shards"]
    return Result(
        output=output,
        shards=len(shards),
        documents=sum(s["documents"] for s in shards),
        tokens=sum(s["tokens"] for s in shards),
        resumed_documents=resumed,
        dtype=manifest["dtype"],
        format=manifest["format"],
    )


def _batches(
    paths: list[Path], field: str, per_file: bool, resume: list[int]
) -> Iterator[tuple[list[str], list[int], int]]:
    """Batches of document texts from ``resume`` on: (texts, position after them, bytes read).

    A position is ``[input index, document index in that input]``.
    """
    texts: list[str] = []
    chars = 0
    for index in range(resume[0], len(paths)):
        skip = resume[1] if index == resume[0] else 0
        number = 0
        read = 0
        for number, (text, read) in enumerate(read_documents(paths[index], field, per_file), 1):
            if number <= skip:
                continue
            texts.append(text)
            chars += len(text)
            if len(texts) >= BATCH_DOCUMENTS or chars >= BATCH_CHARS:
                yield texts, [index, number], read
                texts, chars = [], 0
        if number < skip:
            raise ValueError(
                f"input {paths[index]} now holds {number} documents, the interrupted run had "
                f"written {skip} of them"
            )
        if texts:
            yield texts, [index, number], read
            texts, chars = [], 0


def _in_workers(
    stack: contextlib.ExitStack,
    spec: str,
    workers: int,
    batches: Iterator[tuple[list[str], list[int], int]],
    eos: int | None,
) -> Iterator[tuple[tuple[np.ndarray, np.ndarray], list[int], int]]:
    """Encode batches in ``workers`` processes, at most two each in flight, in input order."""
    pool = stack.enter_context(
        concurrent.futures.ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=start_worker,
            initargs=(spec,),
        )
    )
    pending: list[tuple[concurrent.futures.Future, list[int], int]] = []
    for texts, end, read in batches:
        pending.append((pool.submit(encode_batch, texts, eos), end, read))
        if len(pending) >= 2 * workers:
            future, end, read = pending.pop(0)
            yield future.result(), end, read
    for future, end, read in pending:
        yield future.result(), end, read


class _ShardSink:
    """Documents in, shards out: opens, fills and closes shards, and records them."""

    def __init__(self, output: Path, manifest: dict[str, Any], dtype: np.dtype) -> None:
        self.output = output
        self.manifest = manifest
        self.format = manifest["format"]
        self.dtype = dtype
        self.writer: TokenFileWriter | None = None
        self.lengths: list[np.ndarray] = []
        self.count = 0
        self.documents = sum(s["documents"] for s in manifest["shards"])
        self.tokens = sum(s["tokens"] for s in manifest["shards"])

    def add(self, flat: np.ndarray, lengths: np.ndarray, end: list[int], limit: int) -> None:
        """Append one batch of documents (all from input ``end[0]``, the last one numbered
        ``end[1]``); a shard closes before a document that would take it past ``limit``."""
        if flat.shape[0] and (int(flat.min()) < 0 or int(flat.max()) > np.iinfo(self.dtype).max):
            raise ValueError(f"the tokenizer produced ids outside {self.dtype}")
        starts = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        first = 0
        for i, length in enumerate(lengths.tolist()):
            pending = self.count + int(starts[i] - starts[first])
            if pending and pending + length > limit:
                self._write(flat[starts[first] : starts[i]], lengths[first:i])
                self._close([end[0], end[1] - lengths.shape[0] + i])
                first = i
        self._write(flat[starts[first] :], lengths[first:])
        self.next = end

    def _write(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        if lengths.shape[0] == 0:
            return
        if self.writer is None:
            index = len(self.manifest["shards"])
            path = self.output / tokenized.shard_file(index, self.format)
            self.writer = TokenFileWriter(path, self.format, self.dtype).__enter__()
        self.writer.write(flat)
        self.lengths.append(lengths)
        self.count += int(flat.shape[0])
        self.documents += int(lengths.shape[0])
        self.tokens += int(flat.shape[0])

    def _close(self, end_of_previous: list[int]) -> None:
        assert self.writer is not None
        index = len(self.manifest["shards"])
        lengths = np.concatenate(self.lengths)
        offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        self.writer.document_offsets = offsets
        writer, self.writer = self.writer, None
        writer.__exit__(None, None, None)
        if self.format != "megatron":
            files.write_tokens(
                self.output / tokenized.documents_file(index),
                offsets,
                format="npy",
                dtype=np.int64,
            )
        self.manifest["shards"].append(
            {"tokens": self.count, "documents": int(lengths.shape[0]), "next": end_of_previous}
        )
        tokenized.save(self.output, self.manifest)
        self.lengths, self.count = [], 0

    def finish(self) -> None:
        if self.writer is not None:
            self._close(self.next)

    def abandon(self) -> None:
        """Remove the shard being written (after an error; a finished run has none)."""
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.__exit__(RuntimeError, RuntimeError("abandoned"), None)
