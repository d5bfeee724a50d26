"""``tokstream inspect``: what a token file holds: format, dtype, counts, id range, documents."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from tokstream import _progress, _validate, files, manifest
from tokstream._windowing import covered_tokens
from tokstream.bench.report import markdown_table
from tokstream.cli import _inspect_step
from tokstream.cli._common import PROG, dtype_name, positive
from tokstream.corpus import Corpus
from tokstream.formats import megatron, table, tokenized
from tokstream.packing import packing_summary


def _value_range(
    tokens: np.ndarray, progress: _progress.Progress, label: str
) -> tuple[int, int] | tuple[None, None]:
    """Min and max id, scanned in chunks (a memory map is never read into memory at once)."""

    def show(done: float) -> None:
        progress.update(f"{label}: scanning ids {done:.0%}")

    large = tokens.nbytes >= _progress.PROGRESS_MIN_BYTES
    bounds = _validate.value_range(tokens, show if large else None)
    return bounds or (None, None)


@dataclass
class FileSummary:
    """What ``tokstream inspect`` reports about one token file."""

    path: str
    format: str
    dtype: str
    tokens: int
    min_id: int | None
    max_id: int | None
    windows: int
    bytes: int
    #: Shares of the tokens that lie in a window of ``block + 1`` tokens (as inputs or target)
    #: under ``windows="cross"`` and ``windows="within"`` (:meth:`Corpus.tokens_in_windows`).
    kept_cross: float
    kept_within: float
    #: Which document boundaries a stream over the file uses, in words.
    boundaries: str
    #: Documents and their lengths, where the format records them (else None).
    documents: int | None = None
    min_document: int | None = None
    mean_document: float | None = None
    max_document: int | None = None
    #: Tokens equal to ``--eos`` (None without it).
    eos_tokens: int | None = None
    #: With ``--windows packed``: :func:`tokstream.packing.packing_summary` (else None).
    packed: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """Every field; the document fields only where documents are recorded."""
        fields = dict(self.__dict__)
        if self.documents is None:
            for name in ("documents", "min_document", "mean_document", "max_document"):
                del fields[name]
        if self.eos_tokens is None:
            del fields["eos_tokens"]
        if self.packed is None:
            del fields["packed"]
        return fields


def summarize(
    path: str,
    block: int,
    dtype: str | None,
    format: str | None,
    progress: _progress.Progress,
    column: str = "input_ids",
    eos: int | None = None,
    packed: bool = False,
) -> FileSummary:
    """Open ``path`` with :func:`tokstream.files.open_tokens` and describe it."""
    listed = manifest.find(path) if format is None else None
    # A tokenize directory is read through its manifest.json but named by its shards' format.
    ours = listed is not None and not tokenized.is_directory(Path(path))
    detected = "manifest" if ours else files.detect_format(path) if format is None else format
    corpus = files.open_tokens(path, dtype=dtype, format=format, column=column)
    # The boundaries of windows="within" (one scan for eos, which also counts its tokens).
    documents = corpus.document_boundaries if eos is None else corpus.boundaries_with_eos(eos)
    bounds = [_value_range(tokens, progress, path) for tokens in corpus.shards]
    lows = [low for low, _ in bounds if low is not None]
    highs = [high for _, high in bounds if high is not None]
    summary = FileSummary(
        path=path,
        format=detected,
        dtype=str(corpus.dtype),
        tokens=corpus.num_tokens,
        min_id=min(lows) if lows else None,
        max_id=max(highs) if highs else None,
        windows=corpus.num_windows(block),
        bytes=int(np.sum(getattr(corpus.source, "sizes", 0))) if listed else _size(path),
        kept_cross=_share(corpus.tokens_in_windows(block), corpus.num_tokens),
        kept_within=_share(covered_tokens(np.diff(documents), block, 1), corpus.num_tokens),
        boundaries=_boundaries(corpus, eos, documents),
        eos_tokens=None if eos is None else corpus.eos_count(eos),
    )
    if packed:
        boundaries = corpus.document_boundaries if eos is None else corpus.boundaries_with_eos(eos)
        summary.packed = packing_summary(boundaries, block)
    if corpus.has_documents:
        lengths = corpus.document_lengths
        summary.documents = int(lengths.shape[0])
        if lengths.shape[0]:
            summary.min_document = int(lengths.min())
            summary.mean_document = round(float(lengths.mean()), 1)
            summary.max_document = int(lengths.max())
    return summary


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def _boundaries(corpus: Corpus, eos: int | None, documents: np.ndarray) -> str:
    """Which document boundaries a stream over ``corpus`` uses (windows="within", extras)."""
    recorded = corpus.document_boundaries.shape[0] - 1
    base = (
        f"the {recorded:,} documents the file records"
        if corpus.has_documents
        else "none recorded (each file is one document)"
    )
    if eos is None:
        return f"{base}; with eos=ID also one after every token ID (--eos ID counts them)"
    count = corpus.eos_count(eos)
    if count == 0:
        return f"{base} only: eos={eos} occurs nowhere (a stream with it warns)"
    found = documents.shape[0] - 1
    return f"{base}, and with eos={eos} ({count:,} tokens) {found:,} documents in all"


def _size(path: str) -> int:
    """Bytes on disk: a directory's files, or both files of a Megatron dataset."""
    if os.path.isdir(path):
        return sum(
            os.path.getsize(os.path.join(root, name))
            for root, _, names in os.walk(path)
            for name in names
        )
    if not os.path.exists(path) or megatron.is_index(megatron.paths(path)[0]):
        return sum(os.path.getsize(p) for p in megatron.paths(path) if os.path.exists(p))
    return os.path.getsize(path)


def inspect_table(summaries: Sequence[FileSummary], block: int) -> str:
    """A Markdown table of the files, with a total row when there are several."""

    def text(value: int | None) -> str:
        return "-" if value is None else f"{value:,}"

    header = ["file", "format", "dtype", "tokens", "min id", "max id", f"windows (block {block})"]
    header += ["kept: cross / within"]
    rows = [
        [s.path, s.format, s.dtype, text(s.tokens), text(s.min_id), text(s.max_id), text(s.windows)]
        + [f"{s.kept_cross:.1%} / {s.kept_within:.1%}"]
        for s in summaries
    ]
    if any(s.documents is not None for s in summaries):
        header += ["documents", "document length min / mean / max"]
        for row, s in zip(rows, summaries, strict=True):
            spread = (
                "-"
                if s.min_document is None
                else f"{s.min_document:,} / {s.mean_document:,.1f} / {s.max_document:,}"
            )
            row += [text(s.documents), spread]
    if len(summaries) > 1:
        lows = [s.min_id for s in summaries if s.min_id is not None]
        highs = [s.max_id for s in summaries if s.max_id is not None]
        rows.append(
            [
                f"total ({len(summaries)} files)",
                "",
                "",
                text(sum(s.tokens for s in summaries)),
                text(min(lows) if lows else None),
                text(max(highs) if highs else None),
                text(sum(s.windows for s in summaries)),
                "",
            ]
            + (["", ""] if len(header) > 8 else [])
        )
    return markdown_table(header, rows, numeric_from=3)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``inspect`` command to ``commands``."""
    inspect = commands.add_parser(
        "inspect",
        help="describe token files",
        description=(
            "For each token file (.npy, raw .bin, llm.c shard, Megatron dataset, Arrow file or "
            "save_to_disk directory, tokenize output; a quoted pattern expands to its sorted "
            "matches): its format, dtype, token count, smallest and largest id, documents and "
            "their lengths where recorded, and how many windows of --block tokens plus a "
            "target it holds."
        ),
    )
    inspect.add_argument("files", nargs="+", metavar="FILE", help="token files or patterns")
    inspect.add_argument(
        "--block", type=positive, default=1024, help="window length to count (default 1024)"
    )
    inspect.add_argument(
        "--dtype",
        type=dtype_name,
        default=None,
        help="token dtype of raw .bin files (default uint16); for .npy and llm.c, an expectation",
    )
    inspect.add_argument(
        "--format",
        choices=table.FORMATS,
        default=None,
        help="read as this format (default: detect)",
    )
    inspect.add_argument(
        "--vocab-size",
        type=positive,
        default=None,
        metavar="N",
        help="warn about ids >= N (a corpus tokenized with another vocabulary)",
    )
    inspect.add_argument(
        "--eos",
        type=int,
        default=None,
        metavar="ID",
        help="count this end-of-document token and the documents a stream with eos=ID finds",
    )
    inspect.add_argument("--column", default="input_ids", help="Arrow column of token lists")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.add_argument("--quiet", action="store_true", help="no progress on stderr")
    _inspect_step.add_arguments(inspect)
    inspect.set_defaults(handler=run, command_parser=inspect)


def _expand(arguments: Sequence[str]) -> list[str]:
    """Each argument as a file, or a pattern's sorted matches (:func:`table.expand_pattern`)."""
    return [str(path) for argument in arguments for path in table.expand_pattern(argument)]


def run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    if args.step is not None:
        return _inspect_step.run(args, _expand(args.files), stdout)
    progress = _progress.Progress(None if args.quiet else stderr)
    summaries = [
        summarize(
            path,
            args.block,
            args.dtype,
            args.format,
            progress,
            args.column,
            args.eos,
            args.windows == "packed",
        )
        for path in _expand(args.files)
    ]
    progress.done()
    for summary in summaries:
        if args.vocab_size is not None and (summary.max_id or 0) >= args.vocab_size:
            print(
                f"{PROG} inspect: warning: {summary.path} holds ids up to {summary.max_id}, "
                f"beyond --vocab-size {args.vocab_size}",
                file=stderr,
            )
    if args.json:
        json.dump([s.to_json() for s in summaries], stdout, indent=2)
        stdout.write("\n")
    else:
        print(inspect_table(summaries, args.block), file=stdout)
        print(
            f"\nkept: the share of tokens in a window of --block {args.block} tokens plus a "
            "target under windows='cross' and 'within'\ndocument boundaries a stream uses:",
            file=stdout,
        )
        for summary in summaries:
            print(f"  {summary.path}: {summary.boundaries}", file=stdout)
        for summary in summaries:
            if summary.packed is not None:
                p = summary.packed
                print(
                    f"windows='packed' at --block {args.block}, {summary.path}: "
                    f"{p['documents']:,} documents, {p['pieces']:,} pieces, {p['split']:.2%} of "
                    f"documents split, {p['padding']:.2%} padding, {p['kept']:.2%} of tokens kept",
                    file=stdout,
                )
    return 0
