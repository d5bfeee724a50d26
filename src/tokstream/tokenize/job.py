"""The tokenize job: inputs in order, encoded in batches, written as shards with a manifest."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokstream import _validate, files
from tokstream.formats.writer import STREAMED
from tokstream.tokenize import engines
from tokstream.tokenize.encoders import Encoder
from tokstream.tokenize.inputs import expand_inputs, read_documents
from tokstream.tokenize.output import Output
from tokstream.tokenize.progress import Meter

FORMATS = STREAMED
DEFAULT_EOS = "<|endoftext|>"
DEFAULT_SHARD_TOKENS = 100_000_000
#: Documents sent to a worker at a time, and at most this many characters of them.
BATCH_DOCUMENTS = 1000
BATCH_CHARS = 4 << 20

#: Called with a one-line status, and whether it is a milestone: a terminal may show every
#: status, a log only the milestones (a shard written, or a periodic line).
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
    overwrite: bool = False,
    engine: str = "local",
    ray_address: str | None = None,
    progress: Progress | None = None,
) -> Result:
    """Tokenize ``inputs`` into shards in the directory ``output``; see :mod:`tokstream.tokenize`.

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
    overwrite
        Replace the output of another tokenization in ``output`` (only a tokenize output: a
        directory holding other files is refused all the same).
    engine
        Where batches are encoded: ``"local"`` (this process, or ``workers`` spawned
        processes) or ``"ray"`` (``workers`` Ray actors); see :mod:`tokstream.tokenize.engines`.
        The output does not depend on it.
    ray_address
        The Ray cluster to run on (``engine="ray"``); None starts a local Ray for the job.
    progress
        Called after each batch with a one-line status (share of the input, documents, tokens,
        shards, rate, ETA) and whether it is a milestone: one at least every
        :data:`tokstream.tokenize.progress.LOG_SECONDS` and one per shard written.

    Raises
    ------
    ValueError
        A bad input (named with its line), an unknown tokenizer or eos, an output directory
        that holds other files or another job's shards (unless ``overwrite``) or that another
        run is writing, a document longer than llm.c can count, an unknown engine or an
        unreachable ``ray_address`` (nothing is written then).
    ImportError
        ``tokenizers``, ``tiktoken``, ``pyarrow`` (for Parquet) or ``ray`` missing where needed.
    """
    _validate.choice(format, "format", FORMATS)
    shard_tokens = _validate.positive_int(shard_tokens, "shard_tokens")
    workers = _validate.positive_int(workers, "workers")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be a bool, got {type(overwrite).__name__}")
    _validate.choice(engine, "engine", engines.ENGINES)
    if ray_address is not None and not isinstance(ray_address, str):
        raise TypeError(f"ray_address must be a str or None, got {type(ray_address).__name__}")
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
    with contextlib.ExitStack() as stack:
        # The engine first: one that cannot start leaves the output untouched.
        encode = engines.start(stack, engine, tokenizer, encoder, workers, eos_id, ray_address)
        out = Output.claim(output, job, overwrite)
        stack.callback(out.release)
        if not out.complete:
            _run(out, paths, encode, shard_tokens, job, progress)
        return _result(out)


def _run(
    out: Output,
    paths: list[Path],
    encode: Callable[[engines.Batches], engines.Encoded],
    shard_tokens: int,
    job: dict[str, Any],
    progress: Progress | None,
) -> None:
    sizes = [p.stat().st_size for p in paths]
    before = [sum(sizes[:i]) for i in range(len(paths))]
    meter = Meter(progress, sum(sizes))
    try:
        batches = _batches(paths, job["text_field"], job["document_per_file"], out.position)
        end = out.position
        for (flat, lengths), end, read in encode(batches):
            shards_before = len(out.manifest["shards"])
            out.add(flat, lengths, end, shard_tokens)
            out.checkpoint(end)
            shards = len(out.manifest["shards"])
            meter.update(
                before[end[0]] + read, out.documents, out.tokens, shards, shards > shards_before
            )
        out.finish(end)
    except Exception as error:
        out.fail(error)
        raise


def _input_identity(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"path": os.fspath(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _result(out: Output) -> Result:
    shards = out.manifest["shards"]
    return Result(
        output=out.directory,
        shards=len(shards),
        documents=sum(s["documents"] for s in shards),
        tokens=sum(s["tokens"] for s in shards),
        resumed_documents=out.resumed_documents,
        dtype=out.manifest["dtype"],
        format=out.manifest["format"],
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
