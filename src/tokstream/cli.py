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
import glob
import itertools
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

import tokstream
from tokstream import _validate, baselines

PROG = "tokstream"

#: The synthetic corpus: GPT-2's vocabulary size, as in BENCHMARKS.md.
VOCAB_SIZE = 50257
DEFAULT_TOKENS = 10_000_000
#: The five shapes of BENCHMARKS.md, int64 and shuffled only: the default run stays well under
#: a minute on a 2-core machine. Pass --block/--batch-size for the others.
DEFAULT_BLOCKS = (8, 128, 1024, 1024, 2048)
DEFAULT_BATCH_SIZES = (4096, 512, 64, 512, 16)
#: Token dtypes the synthetic corpus may be held in: every one that holds ids below VOCAB_SIZE.
SYNTHETIC_DTYPES = ("int64", "uint16", "int32", "uint32", "uint64")

#: Token file formats of :mod:`tokstream.files`.
FORMATS = ("npy", "bin", "llmc")

#: Table columns of the paths, in order, with the names the table and the plot show.
PATH_LABELS = {
    "reference": "reference",
    "best_numpy": "best NumPy",
    "nanogpt": "nanoGPT",
    "fast": "fast",
    "fast_reuse": "fast (reuse)",
    "copy_limit": "copy limit",
    "gather_limit": "gather limit",
    "c_loop": "C loop",
}
#: Ratios reported for each shape: (numerator, denominator, table label). The gather limit
#: counts windows, so the ratio to it compares windows per second.
RATIOS = (
    ("fast", "reference", "fast/ref"),
    ("fast", "best_numpy", "fast/NumPy"),
    ("fast", "nanogpt", "fast/nanoGPT"),
    ("fast", "copy_limit", "fast/copy"),
    ("fast_reuse", "copy_limit", "reuse/copy"),
    ("fast", "gather_limit", "fast win/gather"),
    ("fast", "c_loop", "fast/C loop"),
)


class CommandError(Exception):
    """An expected failure of a command: printed as one line, exit code 1."""


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
                raise argparse.ArgumentTypeError(
                    f"{name!r} is not one of {', '.join(allowed)}"
                )
        return list(dict.fromkeys(names))

    return parse


def _dtype_name(text: str) -> str:
    try:
        dtype = np.dtype(text)
    except TypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a NumPy dtype") from None
    if dtype.kind not in "iu":
        raise argparse.ArgumentTypeError(f"expected an integer dtype, got {text!r}")
    # The name drops the byte order: ">u2" must not come back as the native "uint16".
    return dtype.name if dtype.isnative else dtype.str


# ---------------------------------------------------------------------------------------------
# Progress on stderr


class Progress:
    """One status line on stderr: rewritten in place on a terminal, plain lines otherwise."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.tty = bool(stream is not None and stream.isatty())
        self._width = 0

    def update(self, message: str, *, final: bool = False) -> None:
        """Show ``message``; off a terminal only ``final`` messages are printed (as lines)."""
        if self.stream is None:
            return
        if self.tty:
            padding = " " * max(self._width - len(message), 0)
            self.stream.write("\r" + message + padding)
            self._width = len(message)
        elif final:
            self.stream.write(message + "\n")
        self.stream.flush()

    def done(self) -> None:
        """End the status line."""
        if self.stream is not None and self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


# ---------------------------------------------------------------------------------------------
# bench: measurement


@dataclass
class Case:
    """One measured configuration: a corpus dtype, a window order and a shape."""

    dtype: str
    shuffle: bool
    block: int
    batch_size: int
    epochs: int = 1
    rates: dict[str, list[float]] = field(default_factory=dict)

    def median(self, path: str) -> float:
        """Median over rounds, in millions of tokens (gather limit: windows) per second."""
        return statistics.median(self.rates[path])

    def ratios(self) -> dict[str, float]:
        """``numerator/denominator`` of :data:`RATIOS` for the paths measured here."""
        return {
            f"{top}/{bottom}": ratio(top, bottom, self.median(top), self.median(bottom), self.block)
            for top, bottom, _ in RATIOS
            if top in self.rates and bottom in self.rates
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "shuffle": self.shuffle,
            "block": self.block,
            "batch_size": self.batch_size,
            "epochs": self.epochs,
            "paths": {
                path: {
                    "unit": "Mwindows/s" if path == "gather_limit" else "Mtok/s",
                    "median": self.median(path),
                    "rounds": rates,
                }
                for path, rates in self.rates.items()
            },
            "ratios": self.ratios(),
        }


def ratio(top: str, bottom: str, top_rate: float, bottom_rate: float, block: int) -> float:
    """``top_rate / bottom_rate`` in the same unit: tokens/s, or windows/s for the gather limit.

    >>> ratio("fast", "gather_limit", 800.0, 50.0, block=8)
    2.0
    """
    if bottom == "gather_limit":
        top_rate /= block
    return top_rate / bottom_rate


def _as_numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def check_identical(first: dict[str, tuple[Any, ...]], block: int) -> None:
    """Raise CommandError unless every path's first batch agrees with the fast path's.

    Loaders must yield the fast path's windows and next tokens (int64, same order); the gather
    limit must hold each window's first token; the copy limit must have the windows' shape.
    """
    windows, next_tokens = first["fast"]
    for path, batch in first.items():
        if path in baselines.LOADERS:
            got_windows, got_next = (_as_numpy(part) for part in batch)
            same = (
                got_windows.dtype == np.int64
                and np.array_equal(got_windows, windows)
                and np.array_equal(got_next, next_tokens)
            )
        elif path == "gather_limit":
            same = np.array_equal(batch[0], windows[:, 0])
        else:
            same = batch[0].shape == windows.shape
        if not same:
            raise CommandError(
                f"path {path!r} yielded a different first batch from the fast path at "
                f"block={block}; refusing to time it"
            )


def measure_case(
    case: Case,
    ids: np.ndarray,
    paths: Sequence[str],
    *,
    rounds: int,
    batches: int,
    seed: int,
    progress: Progress,
    label: str,
) -> Case:
    """Time ``paths`` on one case: ``rounds`` rounds of ``batches`` batches per path.

    Every path is started and its first batch drawn untimed (that batch carries the one-off
    epoch permutation and is the one checked against the fast path's). The rounds then take
    turns between the paths, each round starting with a different path, so a drift of the
    machine's speed spreads over all of them; the ratios therefore come from the same minutes.
    A corpus too small for one epoch to hold every round runs several epochs, and the later
    epochs' permutations then fall inside the timing.
    """
    needed = 1 + rounds * batches
    case.epochs = baselines.epochs_for(ids.shape[0], case.block, case.batch_size, needed)
    iterators: dict[str, Iterator[tuple[Any, ...]]] = {}
    first: dict[str, tuple[Any, ...]] = {}
    for path in paths:
        progress.update(f"{label}: starting {path}")
        iterator = baselines.PATHS[path](
            ids, case.block, case.batch_size, epochs=case.epochs, shuffle=case.shuffle, seed=seed
        )
        first[path] = next(iterator)
        iterators[path] = iterator
    check_identical(first, case.block)
    del first
    per_window = {path: 1 if path == "gather_limit" else case.block for path in paths}
    case.rates = {path: [] for path in paths}
    for round_index in range(rounds):
        shift = round_index % len(paths)
        for path in [*paths[shift:], *paths[:shift]]:
            progress.update(f"{label}: {path} round {round_index + 1}/{rounds}")
            started = time.perf_counter()
            windows = baselines.consume(iterators[path], batches)
            elapsed = time.perf_counter() - started
            case.rates[path].append(windows * per_window[path] / elapsed / 1e6)
    return case


def synthetic_corpus(num_tokens: int, dtype: str, seed: int) -> np.ndarray:
    """``num_tokens`` seeded random ids in ``[0, VOCAB_SIZE)``, held as ``dtype``.

    >>> ids = synthetic_corpus(5, "uint16", seed=0)
    >>> ids.dtype.name, len(ids), bool(ids.max() < VOCAB_SIZE)
    ('uint16', 5, True)
    """
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB_SIZE, size=num_tokens, dtype=np.int64).astype(dtype)


# ---------------------------------------------------------------------------------------------
# bench: reports


def _format_rate(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    numeric = [i >= numeric_from for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if num else cell.ljust(width)
            for cell, width, num in zip(cells, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(
        "-" * (width + 1) + ":" if num else "-" * (width + 2)
        for width, num in zip(widths, numeric, strict=True)
    ) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def bench_table(cases: Sequence[Case], paths: Sequence[str]) -> str:
    """A Markdown table: one row per case, Mtok/s per path, then the ratios of :data:`RATIOS`."""
    shown = [(f"{top}/{bottom}", label) for top, bottom, label in RATIOS
             if top in paths and bottom in paths]
    ratio_names = [name for name, _ in shown]
    header = ["dtype", "order", "block", "batch"]
    header += [PATH_LABELS[p] + (" (Mwin/s)" if p == "gather_limit" else "") for p in paths]
    header += [label for _, label in shown]
    rows = []
    for case in cases:
        ratios = case.ratios()
        row = [
            case.dtype,
            "shuffled" if case.shuffle else "sequential",
            str(case.block),
            str(case.batch_size),
        ]
        row += [_format_rate(case.median(p)) for p in paths]
        row += [f"{ratios[name]:.2f}x" for name in ratio_names]
        rows.append(row)
    return _markdown(header, rows, numeric_from=2)


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean (BENCHMARKS.md's summary over shapes).

    >>> round(geometric_mean([2.0, 8.0]), 6)
    4.0
    """
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _check_plot_target(path: str) -> None:
    """Fail before the benchmark runs, not after, when ``--plot`` cannot be written."""
    try:
        import matplotlib  # noqa: F401  (the package first: its submodules may be cached)
        from matplotlib.figure import Figure
    except ImportError:
        raise CommandError(
            "--plot needs matplotlib, which is not installed: pip install 'tokstream[plot]'"
        ) from None
    target = Path(path)
    if not target.parent.is_dir():
        raise CommandError(f"--plot {path}: the directory {str(target.parent)!r} does not exist")
    suffix = target.suffix.lower().lstrip(".")
    supported = Figure().canvas.get_supported_filetypes()
    if suffix and suffix not in supported:
        raise CommandError(
            f"--plot {path}: matplotlib cannot write .{suffix} files; use one of "
            f"{', '.join(sorted(supported))}"
        )


def plot_cases(cases: Sequence[Case], paths: Sequence[str], path: str, title: str) -> None:
    """Save a figure of Mtok/s against block size, one line per path, one panel per corpus."""
    from matplotlib.figure import Figure

    panels = list(dict.fromkeys((c.dtype, c.shuffle) for c in cases))
    figure = Figure(figsize=(6.4 * len(panels), 4.8), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    token_paths = [p for p in paths if p != "gather_limit"]
    for ax, (dtype, shuffle) in zip(axes, panels, strict=True):
        chosen = sorted(
            (c for c in cases if (c.dtype, c.shuffle) == (dtype, shuffle)),
            key=lambda c: (c.block, c.batch_size),
        )
        positions = range(len(chosen))
        for name in token_paths:
            style = "--" if name.endswith("_limit") else "-"
            ax.plot(
                positions, [c.median(name) for c in chosen], style, marker="o",
                label=PATH_LABELS[name],
            )
        ax.set_xticks(list(positions), [f"{c.block}\n(batch {c.batch_size})" for c in chosen])
        ax.set_yscale("log")
        ax.set_xlabel("block size")
        ax.set_ylabel("context tokens per second (millions)")
        ax.set_title(f"{dtype} corpus, {'shuffled' if shuffle else 'sequential'} windows")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    figure.suptitle(title)
    figure.savefig(path, dpi=110)


# ---------------------------------------------------------------------------------------------
# bench: the command


def _shapes(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[tuple[int, int]]:
    blocks = args.block or list(DEFAULT_BLOCKS)
    sizes = args.batch_size or (
        list(DEFAULT_BATCH_SIZES) if args.block is None else [DEFAULT_BATCH_SIZES[1]]
    )
    if len(blocks) == 1:
        blocks = blocks * len(sizes)
    if len(sizes) == 1:
        sizes = sizes * len(blocks)
    if len(blocks) != len(sizes):
        parser.error(
            f"--block has {len(blocks)} values and --batch-size {len(sizes)}: give one value "
            "for both, or equally many (paired as shapes)"
        )
    return list(dict.fromkeys(zip(blocks, sizes, strict=True)))


def _bench_corpora(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[list[tuple[str, np.ndarray]], str]:
    if args.file is None:
        num_tokens = DEFAULT_TOKENS if args.tokens is None else args.tokens
        dtypes = args.dtype or ["int64"]
        for dtype in dtypes:
            if dtype not in SYNTHETIC_DTYPES:
                parser.error(
                    f"--dtype {dtype} cannot hold the synthetic ids below {VOCAB_SIZE}; "
                    f"choose from {', '.join(SYNTHETIC_DTYPES)}"
                )
        base = synthetic_corpus(num_tokens, "int64", args.seed)
        corpora = [(dtype, base.astype(dtype, copy=False)) for dtype in dtypes]
        return corpora, f"synthetic corpus of {num_tokens:,} ids below {VOCAB_SIZE}"
    if args.tokens is not None:
        parser.error("--tokens sizes the synthetic corpus; it cannot be used with --file")
    if args.dtype is not None and len(args.dtype) > 1:
        parser.error("--file takes at most one --dtype (the dtype of a raw token file)")
    from tokstream import files

    corpus = files.open_tokens(args.file, dtype=args.dtype[0] if args.dtype else None)
    shards = corpus.shards
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


def cmd_bench(
    args: argparse.Namespace, parser: argparse.ArgumentParser, stdout: TextIO, stderr: TextIO
) -> int:
    shapes = _shapes(args, parser)
    if args.plot is not None:
        _check_plot_target(args.plot)
    paths = _bench_paths(args, stderr)
    progress = Progress(None if args.quiet else stderr)
    started = time.perf_counter()
    progress.update("building the corpus", final=True)
    corpora, source = _bench_corpora(args, parser)
    for dtype, ids in corpora:
        too_short = [block for block, _ in shapes if ids.shape[0] <= block]
        if too_short:
            raise CommandError(
                f"the corpus ({dtype}) holds {ids.shape[0]} tokens: no window of block "
                f"{too_short[0]} fits; use more --tokens or smaller --block"
            )
    cases = []
    total = len(corpora) * len(shapes)
    for number, ((dtype, ids), (block, batch_size)) in enumerate(
        itertools.product(corpora, shapes), start=1
    ):
        order = "shuffled" if args.shuffle else "sequential"
        label = f"[{number}/{total}] {dtype} {order} block={block} batch={batch_size}"
        progress.update(label, final=True)
        case = Case(dtype, args.shuffle, block, batch_size)
        cases.append(
            measure_case(
                case, ids, paths, rounds=args.rounds, batches=args.batches, seed=args.seed,
                progress=progress, label=label,
            )
        )
    elapsed = time.perf_counter() - started
    progress.update(f"done in {elapsed:.1f} s", final=True)
    progress.done()
    title = (
        f"tokstream {tokstream.__version__} bench: {source}, "
        f"median of {args.rounds} rounds of {args.batches} batches"
    )
    if args.plot is not None:
        plot_cases(cases, paths, args.plot, title)
        print(f"tokstream bench: wrote {args.plot}", file=stderr)
    if args.json:
        report = {
            "tokstream": tokstream.__version__,
            "source": source,
            "rounds": args.rounds,
            "batches_per_round": args.batches,
            "seed": args.seed,
            "seconds": elapsed,
            "machine": {
                "python": platform.python_version(),
                "numpy": np.__version__,
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
            },
            "cases": [case.to_json() for case in cases],
        }
        json.dump(report, stdout, indent=2)
        stdout.write("\n")
        return 0
    print(title, file=stdout)
    print(file=stdout)
    print(bench_table(cases, paths), file=stdout)
    if "reference" in paths:
        summary = geometric_mean([c.ratios()["fast/reference"] for c in cases])
        print(f"\nfast/reference, geometric mean over the rows: {summary:.1f}x", file=stdout)
    print(
        "Mtok/s = millions of context tokens per second (batch x block per batch); the gather "
        "limit is in millions of windows per second and 'fast win/gather' compares windows/s.",
        file=stdout,
    )
    return 0


# ---------------------------------------------------------------------------------------------
# inspect and convert: token files through tokstream.files


#: Files at least this large get a progress display while they are scanned or written.
PROGRESS_MIN_BYTES = 64 << 20
#: Seconds between two looks at a conversion's output file.
PROGRESS_INTERVAL = 0.2
#: Output formats by file suffix (llm.c shards are usually named .bin too: pass --format llmc).
SUFFIX_FORMATS = {".npy": "npy", ".bin": "bin"}
_GLOB_CHARS = frozenset("*?[")


def _expand(arguments: Sequence[str]) -> list[str]:
    """Each argument as a file, or a pattern's sorted matches (an existing path is a file)."""
    paths: list[str] = []
    for argument in arguments:
        if not os.path.exists(argument) and _GLOB_CHARS & set(argument):
            matches = sorted(glob.glob(argument))
            if not matches:
                raise CommandError(f"the pattern {argument!r} matched no files")
            paths.extend(matches)
        else:
            paths.append(argument)
    return paths


def _value_range(
    tokens: np.ndarray, progress: Progress, label: str
) -> tuple[int, int] | tuple[None, None]:
    """Min and max id, scanned in chunks (a memory map is never read into memory at once)."""

    def show(done: float) -> None:
        progress.update(f"{label}: scanning ids {done:.0%}")

    bounds = _validate.value_range(tokens, show if tokens.nbytes >= PROGRESS_MIN_BYTES else None)
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

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summarize(
    path: str, block: int, dtype: str | None, format: str | None, progress: Progress
) -> FileSummary:
    """Open ``path`` with :func:`tokstream.files.open_tokens` and describe it."""
    from tokstream import files

    detected = files.detect_format(path) if format is None else format
    corpus = files.open_tokens(path, dtype=dtype, format=format)
    (tokens,) = corpus.shards
    low, high = _value_range(tokens, progress, path)
    return FileSummary(
        path=path,
        format=detected,
        dtype=str(corpus.dtype),
        tokens=corpus.num_tokens,
        min_id=low,
        max_id=high,
        windows=corpus.num_windows(block),
        bytes=os.path.getsize(path),
    )


def inspect_table(summaries: Sequence[FileSummary], block: int) -> str:
    """A Markdown table of the files, with a total row when there are several."""

    def text(value: int | None) -> str:
        return "-" if value is None else f"{value:,}"

    header = ["file", "format", "dtype", "tokens", "min id", "max id", f"windows (block {block})"]
    rows = [
        [s.path, s.format, s.dtype, text(s.tokens), text(s.min_id), text(s.max_id),
         text(s.windows)]
        for s in summaries
    ]
    if len(summaries) > 1:
        lows = [s.min_id for s in summaries if s.min_id is not None]
        highs = [s.max_id for s in summaries if s.max_id is not None]
        rows.append([
            f"total ({len(summaries)} files)", "", "",
            text(sum(s.tokens for s in summaries)),
            text(min(lows) if lows else None), text(max(highs) if highs else None),
            text(sum(s.windows for s in summaries)),
        ])
    return _markdown(header, rows, numeric_from=3)


def cmd_inspect(
    args: argparse.Namespace, parser: argparse.ArgumentParser, stdout: TextIO, stderr: TextIO
) -> int:
    progress = Progress(None if args.quiet else stderr)
    summaries = [
        summarize(path, args.block, args.dtype, args.format, progress)
        for path in _expand(args.files)
    ]
    progress.done()
    if args.json:
        json.dump([s.to_json() for s in summaries], stdout, indent=2)
        stdout.write("\n")
    else:
        print(inspect_table(summaries, args.block), file=stdout)
    return 0


class _WriteWatcher:
    """Reports how far a ``write_tokens`` call has got by watching its output grow.

    ``write_tokens`` writes beside the target under a temporary name (``.NAME.*.tmp``) and
    renames it into place, so the size of that file against the expected size is the progress.
    When no such file shows up, only the elapsed time is shown.
    """

    def __init__(self, target: Path, expected_bytes: int, progress: Progress, label: str) -> None:
        self.target = target
        self.expected = max(expected_bytes, 1)
        self.progress = progress
        self.label = label
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokstream-convert", daemon=True)
        self._last_decile = -1

    def __enter__(self) -> _WriteWatcher:
        self.started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _written(self) -> int | None:
        pattern = os.path.join(glob.escape(str(self.target.parent)), f".{self.target.name}.*.tmp")
        sizes = []
        for temp in glob.glob(pattern):
            try:
                sizes.append(os.path.getsize(temp))
            except OSError:  # renamed into place between glob() and getsize()
                continue
        return max(sizes) if sizes else None

    def _run(self) -> None:
        while not self._stop.wait(PROGRESS_INTERVAL):
            written = self._written()
            elapsed = time.perf_counter() - self.started
            if written is None:
                self.progress.update(f"{self.label}: {elapsed:.0f} s")
                continue
            fraction = min(written / self.expected, 1.0)
            decile = int(fraction * 10)
            message = (
                f"{self.label}: {fraction:.0%} ({written / 1e6:,.0f} of "
                f"{self.expected / 1e6:,.0f} MB, {elapsed:.0f} s)"
            )
            self.progress.update(message, final=decile > self._last_decile)
            self._last_decile = max(decile, self._last_decile)


def _output_format(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    if args.format is not None:
        return args.format
    suffix = Path(args.output).suffix.lower()
    if suffix not in SUFFIX_FORMATS:
        parser.error(
            f"cannot tell the output format from {args.output!r}: name it *.npy or *.bin, or "
            "pass --format npy|bin|llmc"
        )
    return SUFFIX_FORMATS[suffix]


def cmd_convert(
    args: argparse.Namespace, parser: argparse.ArgumentParser, stdout: TextIO, stderr: TextIO
) -> int:
    from tokstream import files

    out_format = _output_format(args, parser)
    corpus = files.open_tokens(args.input, dtype=args.in_dtype, format=args.in_format)
    if len(corpus.shards) != 1:
        raise CommandError(
            f"{args.input!r} names {len(corpus.shards)} files; convert takes one input file"
        )
    (tokens,) = corpus.shards
    if args.dtype is not None:
        dtype: str | None = args.dtype
    elif out_format == "llmc":
        dtype = None  # llm.c stores uint16; write_tokens checks that the ids fit
    else:
        dtype = str(corpus.dtype)
    itemsize = 2 if dtype is None else np.dtype(dtype).itemsize
    header = {"npy": 128, "llmc": 1024, "bin": 0}[out_format]
    expected = header + tokens.shape[0] * itemsize
    progress = Progress(None if args.quiet else stderr)
    label = f"{args.input} -> {args.output}"
    target = Path(args.output)
    if expected >= PROGRESS_MIN_BYTES:
        with _WriteWatcher(target, expected, progress, label):
            files.write_tokens(target, tokens, format=out_format, dtype=dtype)
    else:
        files.write_tokens(target, tokens, format=out_format, dtype=dtype)
    progress.done()
    written = files.open_tokens(target, dtype=dtype if out_format == "bin" else None)
    in_format = files.detect_format(args.input) if args.in_format is None else args.in_format
    print(
        f"wrote {args.output}: {out_format}, {written.dtype}, {written.num_tokens:,} tokens "
        f"(from {args.input}: {in_format}, {corpus.dtype})",
        file=stdout,
    )
    return 0


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
            "Time the fast path, the spec's reference, the best pure-NumPy gather, nanoGPT's "
            "torch.stack (when PyTorch is installed) and the copy and gather limits, in one "
            "process, and print millions of context tokens per second with the ratios of the "
            "fast path to each. Each path's first batch is drawn untimed (it carries the "
            "one-off permutation) and checked against the fast path's; the figure is the "
            "median over --rounds rounds of --batches batches."
        ),
    )
    bench.add_argument(
        "--tokens", type=_positive, default=None, metavar="N",
        help=f"synthetic corpus size in tokens (default {DEFAULT_TOKENS:,})",
    )
    bench.add_argument(
        "--block", type=_positive_list, default=None, metavar="N[,N...]",
        help="context length(s); paired with --batch-size as shapes "
        f"(default {','.join(map(str, DEFAULT_BLOCKS))})",
    )
    bench.add_argument(
        "--batch-size", type=_positive_list, default=None, metavar="N[,N...]",
        help="windows per batch, one per --block or one for all (default "
        f"{','.join(map(str, DEFAULT_BATCH_SIZES))} with the default blocks, else "
        f"{DEFAULT_BATCH_SIZES[1]})",
    )
    bench.add_argument(
        "--dtype", type=lambda text: [_dtype_name(t.strip()) for t in text.split(",")],
        default=None, metavar="DTYPE[,DTYPE...]",
        help="dtype(s) the corpus is held in, e.g. int64,uint16 (default int64; "
        "with --file: the dtype of a raw .bin file)",
    )
    bench.add_argument(
        "--shuffle", action=argparse.BooleanOptionalAction, default=True,
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
        "--paths", type=_name_list(tuple(baselines.PATHS)), default=None,
        metavar="NAME[,NAME...]",
        help=f"paths to time (default all: {', '.join(baselines.PATHS)}; fast is always timed)",
    )
    bench.add_argument("--json", action="store_true", help="print a JSON report instead")
    bench.add_argument(
        "--plot", default=None, metavar="FILE.png",
        help="also save a plot of throughput against block size (needs tokstream[plot])",
    )
    bench.add_argument("--quiet", action="store_true", help="no progress on stderr")
    bench.set_defaults(handler=cmd_bench, command_parser=bench)

    inspect = commands.add_parser(
        "inspect",
        help="describe token files",
        description=(
            "For each token file (.npy, raw .bin, llm.c shard; a quoted pattern expands to its "
            "sorted matches): its format, dtype, token count, smallest and largest id, and how "
            "many windows of --block tokens plus a target it holds."
        ),
    )
    inspect.add_argument("files", nargs="+", metavar="FILE", help="token files or patterns")
    inspect.add_argument(
        "--block", type=_positive, default=1024, help="window length to count (default 1024)"
    )
    inspect.add_argument(
        "--dtype", type=_dtype_name, default=None,
        help="token dtype of raw .bin files (default uint16); for .npy and llm.c, an expectation",
    )
    inspect.add_argument(
        "--format", choices=FORMATS, default=None, help="read as this format (default: detect)"
    )
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.add_argument("--quiet", action="store_true", help="no progress on stderr")
    inspect.set_defaults(handler=cmd_inspect, command_parser=inspect)

    convert = commands.add_parser(
        "convert",
        help="rewrite a token file in another format or dtype",
        description=(
            "Read IN (format detected, or --in-format) and write its tokens to OUT as .npy, raw "
            ".bin or an llm.c shard (--format; by default from OUT's suffix, .npy or .bin). "
            "OUT is written under a temporary name and renamed into place."
        ),
    )
    convert.add_argument("input", metavar="IN", help="token file to read")
    convert.add_argument("output", metavar="OUT", help="token file to write")
    convert.add_argument(
        "--format", choices=FORMATS, default=None,
        help="output format (default from OUT's suffix; llm.c shards need --format llmc)",
    )
    convert.add_argument(
        "--dtype", type=_dtype_name, default=None,
        help="stored dtype of OUT (default: IN's; llm.c: uint16)",
    )
    convert.add_argument(
        "--in-dtype", type=_dtype_name, default=None,
        help="token dtype of a raw .bin IN (default uint16)",
    )
    convert.add_argument(
        "--in-format", choices=FORMATS, default=None, help="read IN as this format"
    )
    convert.add_argument("--quiet", action="store_true", help="no progress on stderr")
    convert.set_defaults(handler=cmd_convert, command_parser=convert)
    return parser


def main(
    argv: Sequence[str] | None = None, *, stdout: TextIO | None = None,
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
        return args.handler(args, args.command_parser, stdout, stderr)
    except SystemExit as exc:  # parser.error() from a command's own argument checks
        return exc.code if isinstance(exc.code, int) else 2
    except (CommandError, TypeError, ValueError, OSError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=stderr)
        return 130
