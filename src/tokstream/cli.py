"""The ``tokstream`` command line (also ``python -m tokstream``).

``tokstream bench`` measures every path of :mod:`tokstream.baselines` in one process and prints
their throughput with the ratios BENCHMARKS.md asks for; ``tokstream inspect`` and ``tokstream
convert`` look at and rewrite token files through :mod:`tokstream.files`.

Exit codes: 0 on success, 2 for a usage error (argparse's convention), 1 for any other expected
error (a bad file, a value our API rejects, a missing optional dependency), reported as one line
on stderr without a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

import tokstream
from tokstream import _validate, baselines, files
from tokstream._commands import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_BLOCKS,
    DEFAULT_TOKENS,
    PROG,
    CommandError,
    UsageError,
    cmd_bench,
    cmd_convert,
    cmd_inspect,
    cmd_tokenize,
)
from tokstream.formats.writer import STREAMED

# ---------------------------------------------------------------------------------------------
# Argument types (an ArgumentTypeError becomes a usage error, exit code 2)


def _positive(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _nonnegative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _positive_list(text: str) -> list[int]:
    return [_positive(part.strip()) for part in text.split(",")]


def _name_list(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [part.strip() for part in text.split(",")]
        for name in names:
            if name not in allowed:
                raise argparse.ArgumentTypeError(f"{name!r} is not one of {', '.join(allowed)}")
        return list(dict.fromkeys(names))

    return parse


def _dtype_name(text: str) -> str:
    try:
        dtype = _validate.integer_dtype(text, "dtype")
    except TypeError:
        raise argparse.ArgumentTypeError(f"expected an integer dtype, got {text!r}") from None
    # The name drops the byte order: ">u2" must not come back as the native "uint16".
    return dtype.name if dtype.isnative else dtype.str


# ---------------------------------------------------------------------------------------------
# Parser and entry point


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Exact, fast (context window, next token) micro-batches for LM training.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {tokstream.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    bench = commands.add_parser(
        "bench",
        help="measure the fast path against its baselines",
        description=(
            "Time the fast path, the reference generator, the best pure-NumPy gather, nanoGPT's "
            "torch.stack (when PyTorch is installed) and the copy and gather limits, in one "
            "process, and print millions of context tokens per second with the ratios of the "
            "fast path to each. Each path's first batch is drawn untimed (it carries the "
            "one-off permutation) and checked against the fast path's; the figure is the "
            "median over --rounds rounds of --batches batches."
        ),
    )
    bench.add_argument(
        "--tokens",
        type=_positive,
        default=None,
        metavar="N",
        help=f"synthetic corpus size in tokens (default {DEFAULT_TOKENS:,})",
    )
    bench.add_argument(
        "--block",
        type=_positive_list,
        default=None,
        metavar="N[,N...]",
        help="context length(s); paired with --batch-size as shapes "
        f"(default {','.join(map(str, DEFAULT_BLOCKS))})",
    )
    bench.add_argument(
        "--batch-size",
        type=_positive_list,
        default=None,
        metavar="N[,N...]",
        help="windows per batch, one per --block or one for all (default "
        f"{','.join(map(str, DEFAULT_BATCH_SIZES))} with the default blocks, else "
        f"{DEFAULT_BATCH_SIZES[1]})",
    )
    bench.add_argument(
        "--dtype",
        type=lambda text: [_dtype_name(t.strip()) for t in text.split(",")],
        default=None,
        metavar="DTYPE[,DTYPE...]",
        help="dtype(s) the corpus is held in, e.g. int64,uint16 (default int64; "
        "with --file: the dtype of a raw .bin file)",
    )
    bench.add_argument(
        "--shuffle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="random window order (the training case) or corpus order (default: --shuffle)",
    )
    bench.add_argument("--file", default=None, metavar="PATH", help="benchmark on a token file")
    bench.add_argument("--seed", type=_nonnegative, default=0, help="corpus and order seed")
    bench.add_argument(
        "--rounds", type=_positive, default=5, help="timed rounds per path (default 5)"
    )
    bench.add_argument(
        "--batches", type=_positive, default=40, help="batches per round (default 40)"
    )
    bench.add_argument(
        "--paths",
        type=_name_list(tuple(baselines.PATHS)),
        default=None,
        metavar="NAME[,NAME...]",
        help=f"paths to time (default all: {', '.join(baselines.PATHS)}; fast is always timed)",
    )
    bench.add_argument("--json", action="store_true", help="print a JSON report instead")
    bench.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="also save a plot of throughput against block size (needs tokstream[plot])",
    )
    bench.add_argument("--quiet", action="store_true", help="no progress on stderr")
    bench.set_defaults(handler=cmd_bench, command_parser=bench)

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
        "--block", type=_positive, default=1024, help="window length to count (default 1024)"
    )
    inspect.add_argument(
        "--dtype",
        type=_dtype_name,
        default=None,
        help="token dtype of raw .bin files (default uint16); for .npy and llm.c, an expectation",
    )
    inspect.add_argument(
        "--format",
        choices=files.FORMATS,
        default=None,
        help="read as this format (default: detect)",
    )
    inspect.add_argument(
        "--vocab-size",
        type=_positive,
        default=None,
        metavar="N",
        help="warn about ids >= N (a corpus tokenized with another vocabulary)",
    )
    inspect.add_argument("--column", default="input_ids", help="Arrow column of token lists")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.add_argument("--quiet", action="store_true", help="no progress on stderr")
    inspect.set_defaults(handler=cmd_inspect, command_parser=inspect)

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
        choices=files.FORMATS,
        default=None,
        help="output format (default from OUT's suffix; llm.c shards need --format llmc)",
    )
    convert.add_argument(
        "--dtype",
        type=_dtype_name,
        default=None,
        help="stored dtype of OUT (default: IN's; llm.c and Megatron: the smallest that fits)",
    )
    convert.add_argument(
        "--in-dtype",
        type=_dtype_name,
        default=None,
        help="token dtype of a raw .bin IN (default uint16)",
    )
    convert.add_argument(
        "--in-format", choices=files.FORMATS, default=None, help="read IN as this format"
    )
    convert.add_argument("--column", default="input_ids", help="Arrow column of token lists")
    convert.add_argument("--quiet", action="store_true", help="no progress on stderr")
    convert.set_defaults(handler=cmd_convert, command_parser=convert)

    tokenize = commands.add_parser(
        "tokenize",
        help="tokenize text into token shards",
        description="Encode text, JSON Lines and Parquet documents, each followed by --eos, into "
        "shards open_tokens(DIR) reads with their documents; the same output whatever --workers; "
        "run an interrupted command again to finish it. Nothing is downloaded.",
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
        type=_dtype_name,
        default=None,
        help="token dtype (default uint16 when the tokenizer's largest id fits, else 32-bit)",
    )
    tokenize.add_argument(
        "--shard-tokens",
        type=_positive,
        default=100_000_000,
        metavar="N",
        help="most tokens in a shard (default 100,000,000); documents are never split",
    )
    tokenize.add_argument("--workers", type=_positive, default=1, help="encoding processes")
    tokenize.add_argument("--text-field", default="text", help="JSON field or Parquet column")
    tokenize.add_argument(
        "--document-per-file",
        action="store_true",
        help="each text file is one document (default: each nonempty line)",
    )
    tokenize.add_argument("--quiet", action="store_true", help="no progress on stderr")
    tokenize.set_defaults(handler=cmd_tokenize, command_parser=tokenize)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run the command line and return its exit code (0 ok, 1 error, 2 usage error)."""
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    parser = build_parser()
    # argparse prints --help to sys.stdout and usage errors to sys.stderr: send both where the
    # caller asked.
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) and usage errors (2)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.handler(args, stdout, stderr)
    except UsageError as exc:  # as argparse reports its own: the usage, then the error
        command_parser = args.command_parser
        command_parser.print_usage(stderr)
        print(f"{command_parser.prog}: error: {exc}", file=stderr)
        return 2
    except (CommandError, TypeError, ValueError, OSError, ImportError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=stderr)
        return 1
    except MemoryError as exc:  # the last resort: the commands check sizes before allocating
        print(f"{PROG} {args.command}: error: out of memory: {exc or 'MemoryError'}", file=stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=stderr)
        return 130
