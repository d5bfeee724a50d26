"""``tokstream convert``: rewrite a token file in another format or dtype."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

import numpy as np

from tokstream import _progress, files, writing
from tokstream.cli._common import CommandError, UsageError, dtype_name
from tokstream.formats import table


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``convert`` command to ``commands``."""
    convert = commands.add_parser(
        "convert",
        help="rewrite a token file in another format or dtype",
        description=(
            "Read IN (format detected, or --in-format) and write its tokens to OUT as .npy, raw "
            ".bin, an llm.c shard, a Megatron dataset (OUT is its prefix) or an Arrow stream "
            "(--format; by default from OUT's suffix, .npy, .bin or .arrow), keeping the "
            "documents when both formats record them. OUT is written under a temporary name "
            "and renamed into place."
        ),
    )
    convert.add_argument("input", metavar="IN", help="token file to read")
    convert.add_argument("output", metavar="OUT", help="token file to write")
    convert.add_argument(
        "--format",
        choices=table.FORMATS,
        default=None,
        help="output format (default from OUT's suffix; llm.c shards need --format llmc)",
    )
    convert.add_argument(
        "--dtype",
        type=dtype_name,
        default=None,
        help="stored dtype of OUT (default: IN's; llm.c and Megatron: the smallest that fits)",
    )
    convert.add_argument(
        "--in-dtype",
        type=dtype_name,
        default=None,
        help="token dtype of a raw .bin IN (default uint16)",
    )
    convert.add_argument(
        "--in-format", choices=table.FORMATS, default=None, help="read IN as this format"
    )
    convert.add_argument("--column", default="input_ids", help="Arrow column of token lists")
    convert.add_argument("--quiet", action="store_true", help="no progress on stderr")
    convert.set_defaults(handler=run, command_parser=convert)


def _output_format(args: argparse.Namespace) -> str:
    if args.format is not None:
        chosen: str = args.format
        return chosen
    suffix = Path(args.output).suffix.lower()
    if suffix not in table.SUFFIX_FORMATS:
        raise UsageError(
            f"cannot tell the output format from {args.output!r}: name it "
            f"{' or '.join('*' + s for s in table.SUFFIX_FORMATS)}, or pass --format "
            f"{'|'.join(table.FORMATS)}"
        )
    return table.SUFFIX_FORMATS[suffix]


def run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    out_format = _output_format(args)
    inputs = table.expand_pattern(args.input)
    if len(inputs) != 1:
        raise CommandError(f"{args.input!r} names {len(inputs)} files; convert takes one input")
    corpus = files.open_tokens(
        args.input, dtype=args.in_dtype, format=args.in_format, column=args.column
    )
    dtype = args.dtype if args.dtype is not None else writing.kept_dtype(corpus.dtype, out_format)
    itemsize = corpus.dtype.itemsize if dtype is None else np.dtype(dtype).itemsize
    expected = table.FORMAT_TABLE[out_format].header_bytes + corpus.num_tokens * itemsize
    progress = _progress.Progress(None if args.quiet else stderr)
    label = f"{args.input} -> {args.output}"
    target = Path(args.output)
    if expected >= _progress.PROGRESS_MIN_BYTES:
        with _progress.WriteWatcher(target, expected, progress, label):
            written_path = writing.write_tokens(target, corpus, format=out_format, dtype=dtype)
    else:
        written_path = writing.write_tokens(target, corpus, format=out_format, dtype=dtype)
    progress.done()
    written = files.open_tokens(written_path, dtype=dtype if out_format == "bin" else None)
    in_format = files.detect_format(args.input) if args.in_format is None else args.in_format
    print(
        f"wrote {args.output}: {out_format}, {written.dtype}, {written.num_tokens:,} tokens "
        f"(from {args.input}: {in_format}, {corpus.dtype})",
        file=stdout,
    )
    return 0
