"""``tokstream bench``: time the fast path against its baselines and print the comparison."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import TextIO

import numpy as np

from tokstream import _progress, files
from tokstream.bench import baselines, harness, report
from tokstream.cli._common import (
    PROG,
    CommandError,
    UsageError,
    dtype_name,
    name_list,
    nonnegative,
    positive,
    positive_list,
)

DEFAULT_TOKENS = 10_000_000
#: The benchmark's shapes, int64 and shuffled only: the default run stays well under a minute
#: on a 2-core machine. Pass --block/--batch-size for the others.
DEFAULT_BLOCKS = tuple(block for block, _ in harness.SHAPES)
DEFAULT_BATCH_SIZES = tuple(batch_size for _, batch_size in harness.SHAPES)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``bench`` command to ``commands``."""
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
        type=positive,
        default=None,
        metavar="N",
        help=f"synthetic corpus size in tokens (default {DEFAULT_TOKENS:,})",
    )
    bench.add_argument(
        "--block",
        type=positive_list,
        default=None,
        metavar="N[,N...]",
        help="context length(s); paired with --batch-size as shapes "
        f"(default {','.join(map(str, DEFAULT_BLOCKS))})",
    )
    bench.add_argument(
        "--batch-size",
        type=positive_list,
        default=None,
        metavar="N[,N...]",
        help="windows per batch, one per --block or one for all (default "
        f"{','.join(map(str, DEFAULT_BATCH_SIZES))} with the default blocks, else "
        f"{DEFAULT_BATCH_SIZES[1]})",
    )
    bench.add_argument(
        "--dtype",
        type=lambda text: [dtype_name(t.strip()) for t in text.split(",")],
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
    bench.add_argument(
        "--out-dtype",
        choices=("int64", "int32"),
        default="int64",
        help="dtype tokstream writes its batches in (out_dtype=; default int64, the other paths' "
        "dtype); int32 moves half the output bytes",
    )
    bench.add_argument("--file", default=None, metavar="PATH", help="benchmark on a token file")
    bench.add_argument("--seed", type=nonnegative, default=0, help="corpus and order seed")
    bench.add_argument(
        "--rounds", type=positive, default=5, help="timed rounds per path (default 5)"
    )
    bench.add_argument(
        "--batches", type=positive, default=40, help="batches per round (default 40)"
    )
    bench.add_argument(
        "--paths",
        type=name_list(tuple(baselines.PATHS)),
        default=None,
        metavar="NAME[,NAME...]",
        help=f"paths to time (default all: {', '.join(baselines.PATHS)}; fast is always timed)",
    )
    bench.add_argument(
        "--full",
        action="store_true",
        help="print every path measured and every ratio (a wide table: nanoGPT, buffer reuse, "
        "the copy, gather and C-loop limits) instead of the reference, best NumPy and tokstream",
    )
    bench.add_argument("--json", action="store_true", help="print a JSON report instead")
    bench.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="also save a plot of throughput against block size (needs tokstream[plot])",
    )
    bench.add_argument("--quiet", action="store_true", help="no progress on stderr")
    bench.set_defaults(handler=run, command_parser=bench)


def _shapes(args: argparse.Namespace) -> list[tuple[int, int]]:
    blocks = args.block or list(DEFAULT_BLOCKS)
    sizes = args.batch_size or (
        list(DEFAULT_BATCH_SIZES) if args.block is None else [DEFAULT_BATCH_SIZES[1]]
    )
    if len(blocks) == 1:
        blocks = blocks * len(sizes)
    if len(sizes) == 1:
        sizes = sizes * len(blocks)
    if len(blocks) != len(sizes):
        raise UsageError(
            f"--block has {len(blocks)} values and --batch-size {len(sizes)}: give one value "
            "for both, or equally many (paired as shapes)"
        )
    return list(dict.fromkeys(zip(blocks, sizes, strict=True)))


def _check_corpus_options(args: argparse.Namespace) -> None:
    if args.file is None:
        for dtype in args.dtype or []:
            if dtype not in harness.SYNTHETIC_DTYPES:
                raise UsageError(
                    f"--dtype {dtype} cannot hold the synthetic ids below {harness.VOCAB_SIZE}; "
                    f"choose from {', '.join(harness.SYNTHETIC_DTYPES)}"
                )
        return
    if args.tokens is not None:
        raise UsageError("--tokens sizes the synthetic corpus; it cannot be used with --file")
    if args.dtype is not None and len(args.dtype) > 1:
        raise UsageError("--file takes at most one --dtype (the dtype of a raw token file)")


def _bench_corpora(
    args: argparse.Namespace,
    shapes: Sequence[tuple[int, int]],
    paths: Sequence[str],
    progress: _progress.Progress,
) -> tuple[list[tuple[str, np.ndarray]], str]:
    """The corpora to measure, once their sizes are known to fit in memory."""
    if args.file is None:
        num_tokens = DEFAULT_TOKENS if args.tokens is None else args.tokens
        dtypes = args.dtype or ["int64"]
        # The int64 ids, and a copy in each other dtype.
        corpus_bytes = num_tokens * (8 + sum(np.dtype(d).itemsize for d in dtypes if d != "int64"))
        harness.check_memory(
            num_tokens, corpus_bytes, shapes, paths, corpus_option=f"--tokens {num_tokens}"
        )
        progress.update("building the corpus", final=True)
        base = harness.synthetic_corpus(num_tokens, "int64", args.seed)
        corpora = [(dtype, base.astype(dtype, copy=False)) for dtype in dtypes]
        return corpora, f"synthetic corpus of {num_tokens:,} ids below {harness.VOCAB_SIZE}"
    corpus = files.open_tokens(args.file, dtype=args.dtype[0] if args.dtype else None)
    shards = corpus.shards
    # One file is paged in from its mapping; several are concatenated into memory.
    corpus_bytes = 0 if len(shards) == 1 else corpus.num_tokens * corpus.dtype.itemsize
    harness.check_memory(
        corpus.num_tokens, corpus_bytes, shapes, paths, corpus_option=f"--file {args.file}"
    )
    ids = shards[0] if len(shards) == 1 else np.concatenate(shards)
    return [(ids.dtype.name, ids)], f"{args.file} ({ids.shape[0]:,} tokens)"


def _bench_paths(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The paths to time, in table order, and notes on the ones left out."""
    wanted = args.paths or list(baselines.PATHS)
    notes = []
    if "fast" not in wanted:
        wanted = [*wanted, "fast"]
    if "nanogpt" in wanted and not baselines.torch_available():
        if args.paths:
            raise CommandError("--paths asks for nanogpt, but PyTorch is not installed")
        notes.append("PyTorch is not installed; skipping the nanoGPT path")
        wanted.remove("nanogpt")
    return [p for p in baselines.PATHS if p in wanted], notes


def run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    shapes = _shapes(args)
    _check_corpus_options(args)
    if args.plot is not None:
        try:
            report.check_plot_target(args.plot)
        except ImportError as exc:
            raise CommandError(str(exc)) from None
    paths, notes = _bench_paths(args)
    progress = _progress.Progress(None if args.quiet else stderr)
    started = time.perf_counter()
    corpora, source = _bench_corpora(args, shapes, paths, progress)
    cases = harness.run_cases(
        corpora,
        shapes,
        paths,
        shuffle=args.shuffle,
        rounds=args.rounds,
        batches=args.batches,
        seed=args.seed,
        progress=progress,
        out_dtype=args.out_dtype,
    )
    elapsed = time.perf_counter() - started
    progress.update(f"done in {elapsed:.1f} s", final=True)
    progress.done()
    if args.out_dtype != "int64":
        source += f"; tokstream's batches in {args.out_dtype}"
    heading = report.title(source, args.rounds, args.batches)
    if args.plot is not None:
        report.plot_cases(cases, paths, args.plot, heading)
        print(f"tokstream bench: wrote {args.plot}", file=stderr)
    if args.json:
        document = report.json_report(
            cases,
            source=source,
            rounds=args.rounds,
            batches=args.batches,
            seed=args.seed,
            seconds=elapsed,
        )
        json.dump(document, stdout, indent=2)
        stdout.write("\n")
    else:
        print(report.text_report(cases, paths, heading, full=args.full), file=stdout)
    # Notes on a finished run only: a run that fails says one thing, its error.
    for note in notes:
        print(f"{PROG} bench: {note}", file=stderr)
    return 0
