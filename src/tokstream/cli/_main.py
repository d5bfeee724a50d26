"""The parser of every command and :func:`main`, the one place that turns outcomes into output."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import TextIO

import tokstream
from tokstream.cli import _bench, _convert, _inspect, _manifest, _tokenize
from tokstream.cli._common import PROG, CommandError, UsageError


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command (exposed for tests and documentation)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Exact, fast (context window, next token) micro-batches for LM training.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {tokstream.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (_bench, _inspect, _convert, _tokenize, _manifest):
        command.add_parser(commands)
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
        code: int = args.handler(args, stdout, stderr)
        return code
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
