"""The handlers of the ``tokstream`` commands: each takes parsed arguments and the output streams.

They raise :class:`UsageError` for arguments that do not go together and :class:`CommandError`
(or TypeError/ValueError/OSError from the library) for expected failures; :func:`tokstream.cli.main`
alone decides what reaches the streams and the exit code.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import numpy as np

from tokstream import _inspect, _progress, baselines, bench, files

PROG = "tokstream"

DEFAULT_TOKENS = 10_000_000
#: BENCHMARKS.md's shapes, int64 and shuffled only: the default run stays well under a minute
#: on a 2-core machine. Pass --block/--batch-size for the others.
DEFAULT_BLOCKS = tuple(block for block, _ in bench.SHAPES)
DEFAULT_BATCH_SIZES = tuple(batch_size for _, batch_size in bench.SHAPES)


class UsageError(Exception):
    """A command's arguments do not go together: printed with the usage, exit code 2."""


class CommandError(Exception):
    """An expected failure of a command: printed as one line, exit code 1."""


# ---------------------------------------------------------------------------------------------
# bench: the command


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
            if dtype not in bench.SYNTHETIC_DTYPES:
                raise UsageError(
                    f"--dtype {dtype} cannot hold the synthetic ids below {bench.VOCAB_SIZE}; "
                    f"choose from {', '.join(bench.SYNTHETIC_DTYPES)}"
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
        bench.check_memory(
            num_tokens, corpus_bytes, shapes, paths, corpus_option=f"--tokens {num_tokens}"
        )
        progress.update("building the corpus", final=True)
        base = bench.synthetic_corpus(num_tokens, "int64", args.seed)
        corpora = [(dtype, base.astype(dtype, copy=False)) for dtype in dtypes]
        return corpora, f"synthetic corpus of {num_tokens:,} ids below {bench.VOCAB_SIZE}"
    corpus = files.open_tokens(args.file, dtype=args.dtype[0] if args.dtype else None)
    shards = corpus.shards
    # One file is paged in from its mapping; several are concatenated into memory.
    corpus_bytes = 0 if len(shards) == 1 else corpus.num_tokens * corpus.dtype.itemsize
    bench.check_memory(
        corpus.num_tokens, corpus_bytes, shapes, paths, corpus_option=f"--file {args.file}"
    )
    ids = shards[0] if len(shards) == 1 else np.concatenate(shards)
    return [(ids.dtype.name, ids)], f"{args.file} ({ids.shape[0]:,} tokens)"


def _bench_paths(args: argparse.Namespace, stderr: TextIO) -> list[str]:
    wanted = args.paths or list(baselines.PATHS)
    if "fast" not in wanted:
        wanted = [*wanted, "fast"]
    if "nanogpt" in wanted and not baselines.torch_available():
        if args.paths:
            raise CommandError("--paths asks for nanogpt, but PyTorch is not installed")
        print("tokstream bench: PyTorch is not installed; skipping the nanoGPT path", file=stderr)
        wanted.remove("nanogpt")
    return [p for p in baselines.PATHS if p in wanted]


def cmd_bench(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    shapes = _shapes(args)
    _check_corpus_options(args)
    if args.plot is not None:
        try:
            bench.check_plot_target(args.plot)
        except ImportError as exc:
            raise CommandError(str(exc)) from None
    paths = _bench_paths(args, stderr)
    progress = _progress.Progress(None if args.quiet else stderr)
    started = time.perf_counter()
    corpora, source = _bench_corpora(args, shapes, paths, progress)
    cases = bench.run_cases(
        corpora,
        shapes,
        paths,
        shuffle=args.shuffle,
        rounds=args.rounds,
        batches=args.batches,
        seed=args.seed,
        progress=progress,
    )
    elapsed = time.perf_counter() - started
    progress.update(f"done in {elapsed:.1f} s", final=True)
    progress.done()
    heading = bench.title(source, args.rounds, args.batches)
    if args.plot is not None:
        bench.plot_cases(cases, paths, args.plot, heading)
        print(f"tokstream bench: wrote {args.plot}", file=stderr)
    if args.json:
        report = bench.json_report(
            cases,
            source=source,
            rounds=args.rounds,
            batches=args.batches,
            seed=args.seed,
            seconds=elapsed,
        )
        json.dump(report, stdout, indent=2)
        stdout.write("\n")
    else:
        print(bench.text_report(cases, paths, heading), file=stdout)
    return 0


# ---------------------------------------------------------------------------------------------
# inspect and convert: token files through tokstream.files


def _expand(arguments: Sequence[str]) -> list[str]:
    """Each argument as a file, or a pattern's sorted matches (:func:`files.expand_pattern`)."""
    return [str(path) for argument in arguments for path in files.expand_pattern(argument)]


def cmd_inspect(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    progress = _progress.Progress(None if args.quiet else stderr)
    summaries = [
        _inspect.summarize(path, args.block, args.dtype, args.format, progress, args.column)
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
        print(_inspect.inspect_table(summaries, args.block), file=stdout)
    return 0


def _output_format(args: argparse.Namespace) -> str:
    if args.format is not None:
        return args.format
    suffix = Path(args.output).suffix.lower()
    if suffix not in files.SUFFIX_FORMATS:
        raise UsageError(
            f"cannot tell the output format from {args.output!r}: name it "
            f"{' or '.join('*' + s for s in files.SUFFIX_FORMATS)}, or pass --format "
            f"{'|'.join(files.FORMATS)}"
        )
    return files.SUFFIX_FORMATS[suffix]


def cmd_convert(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    out_format = _output_format(args)
    inputs = files.expand_pattern(args.input)
    if len(inputs) != 1:
        raise CommandError(f"{args.input!r} names {len(inputs)} files; convert takes one input")
    corpus = files.open_tokens(
        args.input, dtype=args.in_dtype, format=args.in_format, column=args.column
    )
    dtype = args.dtype if args.dtype is not None else files.kept_dtype(corpus.dtype, out_format)
    itemsize = corpus.dtype.itemsize if dtype is None else np.dtype(dtype).itemsize
    expected = files.FORMAT_TABLE[out_format].header_bytes + corpus.num_tokens * itemsize
    progress = _progress.Progress(None if args.quiet else stderr)
    label = f"{args.input} -> {args.output}"
    target = Path(args.output)
    if expected >= _progress.PROGRESS_MIN_BYTES:
        with _progress.WriteWatcher(target, expected, progress, label):
            written_path = files.write_tokens(target, corpus, format=out_format, dtype=dtype)
    else:
        written_path = files.write_tokens(target, corpus, format=out_format, dtype=dtype)
    progress.done()
    written = files.open_tokens(written_path, dtype=dtype if out_format == "bin" else None)
    in_format = files.detect_format(args.input) if args.in_format is None else args.in_format
    print(
        f"wrote {args.output}: {out_format}, {written.dtype}, {written.num_tokens:,} tokens "
        f"(from {args.input}: {in_format}, {corpus.dtype})",
        file=stdout,
    )
    return 0


def cmd_tokenize(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
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
        shard_tokens=args.shard_tokens,
        workers=args.workers,
        text_field=args.text_field,
        document_per_file=args.document_per_file,
        dtype=args.dtype,
        progress=lambda message, final: progress.update(message, final=final),
    )
    progress.done()
    print(result.summary(), file=stdout)
    return 0
