"""The tokenize job: the inputs cut into ranges, each made into a shard by an engine's task."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokstream import _validate, writing
from tokstream.formats.writer import STREAMED
from tokstream.tokenize import engines, task
from tokstream.tokenize.chat import ChatEncoder, ChatSpec, load_spec
from tokstream.tokenize.encoders import Encoder
from tokstream.tokenize.inputs import check_chat_input, expand_inputs
from tokstream.tokenize.output import Output
from tokstream.tokenize.progress import Meter

FORMATS = STREAMED
DEFAULT_EOS = "<|endoftext|>"
#: Input bytes made into one shard (about 16 million tokens of English for a GPT-2-size BPE).
DEFAULT_SHARD_BYTES = 64_000_000

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
    #: For ``chat``: the tokens the loss masks train on, and the bad conversations skipped.
    trained: int | None = None
    skipped: int = 0

    def summary(self) -> str:
        """One line for people: what was written, and what an earlier run had already done;
        for ``chat``, the share of tokens trained (an all-zero or all-one mask shows here) and
        the conversations skipped."""
        kept = self.resumed_documents
        trained = ""
        if self.trained is not None:
            share = self.trained / self.tokens if self.tokens else 0.0
            trained = f", {self.trained:,} trained ({share:.1%})"
            if self.skipped:
                trained += f", {self.skipped:,} bad conversations skipped"
        return (
            f"wrote {self.output}: {self.shards} {self.format} shards, {self.dtype}, "
            f"{self.tokens:,} tokens in {self.documents:,} documents{trained}"
            + (f" ({kept:,} documents kept from an earlier run)" if kept else "")
        )


def tokenize_files(
    inputs: Sequence[str | os.PathLike[str]],
    tokenizer: str,
    output: str | os.PathLike[str],
    *,
    eos: int | str | None = DEFAULT_EOS,
    format: str = "npy",
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    workers: int = 1,
    text_field: str = "text",
    document_per_file: bool = False,
    dtype: Any = None,
    overwrite: bool = False,
    engine: str = "local",
    ray_address: str | None = None,
    progress: Progress | None = None,
    chat: bool = False,
    chat_template: str | os.PathLike[str] | None = None,
    skip_bad: bool = False,
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
    shard_bytes
        The input bytes made into one shard: the inputs are cut, in order, into ranges of about
        this size (a document is never split, and a ``.gz`` file or a document per file is never
        cut), each range a shard and each shard a task a worker runs.
    workers
        Tasks run at a time (1: in this process). The output does not depend on it.
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
        Where tasks run: ``"local"`` (this process, or ``workers`` spawned processes) or
        ``"ray"`` (Ray tasks, ``workers`` at a time); see :mod:`tokstream.tokenize.engines`.
        The output does not depend on it.
    ray_address
        The Ray cluster to run on (``engine="ray"``); None starts a local Ray for the job.
    progress
        Called with a one-line status (share of the input, documents, tokens, shards, rate,
        ETA) and whether it is a milestone: a milestone at the start and after each shard
        made; in between, after each batch of documents a running task has encoded (a
        milestone at most every 30 s, for logs).
    chat
        Each input record (JSON Lines, or a Parquet row) is a conversation, ``{"messages":
        [{"role": ..., "content": ...}, ...]}``, rendered with the tokenizer's chat template
        (``tokenizer`` is then a tokenizer directory, or its ``tokenizer.json`` with the
        ``tokenizer_config.json`` beside it) and written as one document with a loss mask
        beside each shard (:mod:`tokstream.tokenize.chat` says which tokens are trained). No
        eos is appended: the template writes its own end tokens.
    chat_template
        A Jinja2 chat template file to use instead of the tokenizer's (``chat`` only).
    skip_bad
        Count and skip bad conversations instead of stopping at the first (``chat`` only).

    Raises
    ------
    ValueError
        A bad input (named with its line), an unknown tokenizer or eos, an output directory
        that holds other files or another job's shards (unless ``overwrite``) or that another
        run is writing, a document longer than llm.c can count, an unknown engine or an
        unreachable ``ray_address`` (nothing is written then).
    ImportError
        ``tokenizers``, ``tiktoken``, ``pyarrow`` (for Parquet) or ``ray`` missing where needed.
    TimeoutError
        Ray made no shard for :data:`tokstream.tokenize.engines.STALL_SECONDS` (a dead or
        stalled cluster); the shards made stay made, and running the job again goes on.
    """
    _validate.choice(format, "format", FORMATS)
    shard_bytes = _validate.positive_int(shard_bytes, "shard_bytes")
    workers = _validate.positive_int(workers, "workers")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be a bool, got {type(overwrite).__name__}")
    _validate.choice(engine, "engine", engines.ENGINES)
    if ray_address is not None and not isinstance(ray_address, str):
        raise TypeError(f"ray_address must be a str or None, got {type(ray_address).__name__}")
    paths = expand_inputs(inputs)
    encoder: Encoder | ChatEncoder
    if chat:
        if eos not in (None, DEFAULT_EOS):
            raise ValueError(
                "eos does not apply to chat: a chat template writes its own end tokens"
            )
        for path in paths:
            check_chat_input(path)
        # The template is checked here: one that cannot be masked exactly writes nothing.
        encoder = ChatEncoder(load_spec(tokenizer, chat_template))
        eos_id = None
    else:
        if chat_template is not None or skip_bad:
            raise ValueError("chat_template and skip_bad apply to chat=True (--chat)")
        encoder = Encoder(tokenizer)
        eos_id = encoder.eos_id(eos)
    try:
        dtype = writing.stored_dtype(0, encoder.max_id, format, dtype)
    except ValueError as exc:
        raise ValueError(f"tokenizer {tokenizer}: {exc}") from None
    output = Path(output)
    job = {
        "inputs": [_input_identity(p) for p in paths],
        "tokenizer": encoder.fingerprint,
        "eos": eos_id,
        "format": format,
        "dtype": dtype.name,
        "shard_bytes": shard_bytes,
        "text_field": text_field,
        "document_per_file": document_per_file,
    }
    if isinstance(encoder, ChatEncoder):
        job["chat"] = {"template": encoder.spec.template_name, "skip_bad": skip_bad}
    claimed: list[Output] = []
    with contextlib.ExitStack() as stack:
        # Registered first, so released last: after the engine has stopped every task.
        @stack.callback
        def release_claimed() -> None:
            for out in claimed:
                out.release()

        # The engine before the plan and the output: one that cannot start leaves the output
        # untouched, and the local engine's workers start up while the ranges are planned.
        runner = engines.start(stack, engine, encoder, workers, ray_address)
        chat_spec = encoder.spec if isinstance(encoder, ChatEncoder) else None
        todo = _tasks(paths, job, output, tokenizer, chat_spec)
        out = Output.claim(output, job, overwrite)
        claimed.append(out)
        todo = [replace(t, run=out.run) for t in todo]
        if not out.complete:
            _run(out, todo, runner, progress)
        return _result(out)


def _tasks(
    paths: list[Path],
    job: dict[str, Any],
    output: Path,
    tokenizer: str,
    chat: ChatSpec | None = None,
) -> list[task.Task]:
    """The job's ranges as tasks, in input order."""
    ranges = task.plan(
        paths, job["shard_bytes"], job["text_field"], job["document_per_file"], chat is not None
    )
    return [
        task.Task(
            index=index,
            spans=tuple((i, a, b) for i, a, b in spans),
            size=size,
            paths=tuple((i, job["inputs"][i]["path"]) for i in sorted({i for i, _, _ in spans})),
            directory=os.fspath(output.resolve()),
            tokenizer=tokenizer,
            eos=job["eos"],
            format=job["format"],
            dtype=job["dtype"],
            text_field=job["text_field"],
            document_per_file=job["document_per_file"],
            chat=chat,
            skip_bad=bool(job.get("chat", {}).get("skip_bad")),
        )
        for index, (spans, size) in enumerate(ranges)
    ]


def _run(
    out: Output, todo: list[task.Task], runner: engines.Runner, progress: Progress | None
) -> None:
    if any(index >= len(todo) for index in out.finished):
        raise ValueError(
            f"output {out.directory}: it records shards its job does not have; rerun with "
            "--overwrite to start over"
        )
    meter = Meter(progress, sum(t.size for t in todo))
    done = sum(todo[index].size for index in out.finished)
    documents = sum(entry["documents"] for entry in out.finished.values())
    tokens = sum(entry["tokens"] for entry in out.finished.values())
    # How far each running task has got: documents, tokens, input bytes.
    running: dict[int, tuple[int, int, int]] = {}

    def show(milestone: bool) -> None:
        partial = [sum(column) for column in zip(*running.values(), strict=True)] or [0, 0, 0]
        meter.update(
            done + partial[2],
            documents + partial[0],
            tokens + partial[1],
            len(out.finished),
            milestone,
        )

    def report(index: int, task_documents: int, task_tokens: int, task_bytes: int) -> None:
        if index not in out.finished:  # an update read after the task's entry is stale
            running[index] = (task_documents, task_tokens, task_bytes)
            show(False)

    show(True)
    # The largest ranges first (they are all about shard_bytes but for a file never cut, a line
    # longer than shard_bytes and the last), so that the job does not end waiting on a large
    # one started last.
    remaining = sorted((t for t in todo if t.index not in out.finished), key=lambda t: -t.size)
    try:
        for made, entry in runner(remaining, report):
            out.record(made.index, entry)
            running.pop(made.index, None)
            done += made.size
            documents += entry["documents"]
            tokens += entry["tokens"]
            show(True)
        out.finish(len(todo))
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
        trained=sum(s["trained"] for s in shards) if out.manifest.get("loss_mask") else None,
        skipped=sum(s.get("skipped", 0) for s in shards),
    )
