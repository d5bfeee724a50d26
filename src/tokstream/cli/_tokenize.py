"""``tokstream tokenize``: encode text into token shards that ``open_tokens(DIR)`` reads."""

from __future__ import annotations

import argparse
from typing import TextIO

from tokstream import _progress
from tokstream.cli._common import dtype_name, positive
from tokstream.formats.writer import STREAMED


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``tokenize`` command to ``commands``."""
    tokenize = commands.add_parser(
        "tokenize",
        help="tokenize text into token shards",
        description="Encode text, JSON Lines and Parquet documents, each followed by --eos, into "
        "shards open_tokens(DIR) reads with their documents; the same output whatever --engine "
        "and --workers; run an interrupted or failed command again to finish it. Nothing is "
        "downloaded.",
    )
    tokenize.add_argument("inputs", nargs="+", metavar="INPUT", help="input files or patterns")
    tokenize.add_argument(
        "--tokenizer",
        required=True,
        help="a tokenizers JSON file, or a tiktoken encoding in tiktoken's local cache",
    )
    tokenize.add_argument("--output", required=True, metavar="DIR", help="output directory")
    tokenize.add_argument(
        "--eos",
        default="<|endoftext|>",
        metavar="TOKEN",
        help="token ending each document: its text, or its id (default <|endoftext|>)",
    )
    tokenize.add_argument("--no-eos", action="store_true", help="end documents with no token")
    tokenize.add_argument("--format", choices=STREAMED, default="npy", help="shard format")
    tokenize.add_argument(
        "--dtype",
        type=dtype_name,
        default=None,
        help="token dtype (default uint16 when the tokenizer's largest id fits, else 32-bit)",
    )
    tokenize.add_argument(
        "--shard-bytes",
        type=positive,
        default=64_000_000,
        metavar="N",
        help="input bytes made into one shard (default 64,000,000); documents are never split",
    )
    tokenize.add_argument("--workers", type=positive, default=1, help="shards made at a time")
    tokenize.add_argument(
        "--engine",
        default="local",
        help="where shards are made: local (processes) or ray (tasks); the same output",
    )
    tokenize.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDRESS",
        help="the Ray cluster for --engine ray (default: a local Ray started for the job)",
    )
    tokenize.add_argument("--text-field", default="text", help="JSON field or Parquet column")
    tokenize.add_argument(
        "--document-per-file",
        action="store_true",
        help="each text file is one document (default: each nonempty line)",
    )
    tokenize.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the output of another tokenization in DIR (never other files)",
    )
    tokenize.add_argument(
        "--chat",
        action="store_true",
        help='inputs hold conversations ({"messages": [...]}), rendered with the tokenizer\'s '
        "chat template (--tokenizer DIR or its tokenizer.json) and written with a loss mask "
        "training the assistant's tokens",
    )
    tokenize.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja2 chat template to use instead of the tokenizer's (--chat)",
    )
    tokenize.add_argument(
        "--skip-bad",
        action="store_true",
        help="count and skip bad conversations instead of stopping at the first (--chat)",
    )
    tokenize.add_argument("--quiet", action="store_true", help="no progress on stderr")
    tokenize.set_defaults(handler=run, command_parser=tokenize)


def run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from tokstream import tokenize

    # isascii: str.isdigit() also holds for digits int() refuses, such as "²".
    digits = args.eos.isascii() and args.eos.isdigit()
    eos = None if args.no_eos else int(args.eos) if digits else args.eos
    progress = _progress.Progress(None if args.quiet else stderr)
    result = tokenize.tokenize_files(
        args.inputs,
        args.tokenizer,
        args.output,
        eos=eos,
        format=args.format,
        shard_bytes=args.shard_bytes,
        workers=args.workers,
        text_field=args.text_field,
        document_per_file=args.document_per_file,
        dtype=args.dtype,
        overwrite=args.overwrite,
        engine=args.engine,
        ray_address=args.ray_address,
        progress=lambda message, final: progress.update(message, final=final),
        chat=args.chat,
        chat_template=args.chat_template,
        skip_bad=args.skip_bad,
    )
    progress.done()
    print(result.summary(), file=stdout)
    return 0
