"""``tokstream manifest``: one table of contents for token files, which ``open_tokens`` reads
instead of every file (:mod:`tokstream.manifest`); ``--verify`` checks the files against it."""

from __future__ import annotations

import argparse
import json
from typing import TextIO

from tokstream import manifest
from tokstream.cli._common import CommandError, UsageError, dtype_name


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``manifest`` command to ``commands``."""
    command = commands.add_parser(
        "manifest",
        help="write a manifest of token files, so that opening them reads one file",
        description=(
            "Read FILES (paths or patterns, in any format open_tokens reads: .npy, raw .bin, "
            "llm.c shards, Megatron datasets, Arrow files and save_to_disk directories, "
            "tokstream tokenize directories) and write OUTPUT, a JSON manifest of their shards "
            "(path relative to OUTPUT, format, token and document counts, size, fingerprint), "
            "with their documents beside it. open_tokens(OUTPUT), or of its directory when it "
            "is named manifest.json, then reads only the manifest and maps each shard when a "
            "batch first reads it, checking its size and header (not its content). --verify "
            "MANIFEST instead re-reads every file it lists and checks size, header, documents "
            "and content fingerprint: it prints each file that disagrees and exits 1."
        ),
    )
    command.add_argument("inputs", nargs="*", metavar="FILES", help="token files or patterns")
    command.add_argument("--output", metavar="OUTPUT", help="the manifest to write (a .json file)")
    command.add_argument(
        "--verify",
        metavar="MANIFEST",
        help="check the files a manifest (or a directory holding manifest.json) lists",
    )
    command.add_argument(
        "--dtype", type=dtype_name, default=None, help="token dtype of raw .bin files (uint16)"
    )
    command.add_argument("--column", default="input_ids", help="Arrow column of token lists")
    command.set_defaults(handler=run, command_parser=command)


def run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    if args.verify is not None:
        if args.inputs or args.output is not None:
            raise UsageError("--verify MANIFEST takes no FILES and no --output")
        return verify(args.verify, stdout)
    if not args.inputs or args.output is None:
        raise UsageError("FILES and --output are required (or --verify MANIFEST)")
    written = manifest.write_manifest(args.inputs, args.output, args.dtype, column=args.column)
    body = json.loads(written.read_bytes())
    table = body["shards"]
    counts = [count for count in table["documents"] if count is not None]
    documents = f", {sum(counts):,} documents" if counts else ""
    formats = ", ".join(sorted(set(table["format"])))
    print(
        f"wrote {written}: {body['num_shards']:,} shards ({formats}), {body['dtype']}, "
        f"{body['num_tokens']:,} tokens{documents}",
        file=stdout,
    )
    return 0


def verify(path: str, stdout: TextIO) -> int:
    """Each file that disagrees with the manifest on a line of ``stdout``, then an error."""
    problems = manifest.verify_manifest(path)
    for problem in problems:
        print(problem, file=stdout)
    if problems:
        count = "1 file disagrees" if len(problems) == 1 else f"{len(problems):,} files disagree"
        raise CommandError(f"{count} with the manifest {path}")
    print(f"{path}: every file agrees with the manifest", file=stdout)
    return 0
