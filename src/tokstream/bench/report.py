"""What ``tokstream bench`` prints: the measured cases as a table, a JSON document or a plot.

Nothing here measures or prints.
"""

from __future__ import annotations

import math
import os
import platform
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import tokstream
from tokstream._extras import install_hint
from tokstream.bench import baselines
from tokstream.bench.harness import Case


def format_rate(value: float) -> str:
    """A rate with three significant digits or so, thousands separated.

    >>> format_rate(1234.5), format_rate(12.34), format_rate(1.234)
    ('1,234', '12.3', '1.23')
    """
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int) -> str:
    """A Markdown table, columns from ``numeric_from`` on right-aligned (``---:``)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    numeric = [i >= numeric_from for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if num else cell.ljust(width)
            for cell, width, num in zip(cells, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            "-" * (width + 1) + ":" if num else "-" * (width + 2)
            for width, num in zip(widths, numeric, strict=True)
        )
        + "|"
    )
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def bench_table(cases: Sequence[Case], paths: Sequence[str]) -> str:
    """Every path and ratio, one row per case (``--full``): Mtok/s per path, then the ratios of
    :data:`baselines.RATIOS`."""
    shown = [
        (f"{top}/{bottom}", label)
        for top, bottom, label in baselines.RATIOS
        if top in paths and bottom in paths
    ]
    header = ["dtype", "order", "block", "batch"]
    header += [
        baselines.PATH_LABELS[p] + (" (Mwin/s)" if p == "gather_limit" else "") for p in paths
    ]
    header += [label for _, label in shown]
    rows = []
    for case in cases:
        ratios = case.ratios()
        row = [case.dtype, _order(case), str(case.block), str(case.batch_size)]
        row += [format_rate(case.median(p)) for p in paths]
        row += [f"{ratios[name]:.2f}x" for name, _ in shown]
        rows.append(row)
    return markdown_table(header, rows, numeric_from=2)


#: The width the default report keeps to (with the default arguments): a terminal's.
TERMINAL_WIDTH = 80

#: The default table's paths, as a newcomer compares them: the reference generator, the best
#: pure-NumPy gather, and tokstream; then tokstream's speed-up over the first two.
SUMMARY_PATHS = {"reference": "reference", "best_numpy": "best NumPy", "fast": "tokstream"}
SUMMARY_RATIOS = {"reference": "vs reference", "best_numpy": "vs NumPy"}


def summary_table(cases: Sequence[Case], paths: Sequence[str]) -> str:
    """The default table, narrow enough for a terminal: the shape, Mtok/s of the reference, the
    best NumPy gather and tokstream, and tokstream's speed-up over each. A dtype or order column
    appears only when the cases differ in it."""
    shown = [p for p in SUMMARY_PATHS if p in paths]
    against = [p for p in SUMMARY_RATIOS if p in paths]
    header = ["shape"]
    columns: list[Callable[[Case], str]] = []
    if len({c.dtype for c in cases}) > 1:
        header.insert(0, "dtype")
        columns.append(lambda c: c.dtype)
    if len({c.shuffle for c in cases}) > 1:
        header.insert(len(columns), "order")
        columns.append(_order)
    header += [SUMMARY_PATHS[p] for p in shown] + [SUMMARY_RATIOS[p] for p in against]
    rows = []
    for case in cases:
        ratios = case.ratios()
        row = [column(case) for column in columns] + [f"{case.block} x {case.batch_size}"]
        row += [format_rate(case.median(p)) for p in shown]
        row += [f"{ratios[f'fast/{p}']:.1f}x" for p in against]
        rows.append(row)
    return markdown_table(header, rows, numeric_from=len(columns) + 1)


def _order(case: Case) -> str:
    return "shuffled" if case.shuffle else "sequential"


def geometric_mean(values: Sequence[float]) -> float:
    """The geometric mean (docs/benchmarks.md's summary over shapes).

    >>> round(geometric_mean([2.0, 8.0]), 6)
    4.0
    """
    return math.exp(sum(math.log(v) for v in values) / len(values))


def title(source: str, rounds: int, batches: int) -> str:
    """The heading of a report: version, corpus, and how much was measured, on two lines."""
    return (
        f"tokstream {tokstream.__version__} bench: {source}\n"
        f"median of {rounds} rounds of {batches} batches"
    )


def text_report(
    cases: Sequence[Case], paths: Sequence[str], heading: str, *, full: bool = False
) -> str:
    """The heading, the table (:func:`summary_table`, or with ``full`` :func:`bench_table`), the
    geometric mean of tokstream's speed-up over the reference, and what the units mean."""
    table = bench_table(cases, paths) if full else summary_table(cases, paths)
    parts = [heading, "", table, ""]
    if "reference" in paths:
        summary = geometric_mean([c.ratios()["fast/reference"] for c in cases])
        name = "fast/reference" if full else "tokstream vs reference"
        parts.append(f"{name}, geometric mean over the rows: {summary:.1f}x")
    if full:
        parts.append(
            "Mtok/s = millions of context tokens per second (batch x block per batch); the "
            "gather limit is in millions of windows per second and 'fast win/gather' compares "
            "windows/s."
        )
    else:
        # What the table's columns leave out when every row shares it.
        dtypes, orders = {c.dtype for c in cases}, {_order(c) for c in cases}
        common = [f"{dtypes.pop()} corpus"] if len(dtypes) == 1 else []
        common += [f"{orders.pop()} windows"] if len(orders) == 1 else []
        units = (
            "Millions of context tokens per second; shape: block x batch size; vs: tokstream's "
            "speed-up"
        )
        parts.append(textwrap.fill("; ".join([units, *common]) + ".", width=TERMINAL_WIDTH))
        hidden = [baselines.PATH_LABELS[p] for p in paths if p not in SUMMARY_PATHS]
        if hidden:
            more = f"Also measured, shown with --full: {', '.join(hidden)}."
            parts.append(textwrap.fill(more, width=TERMINAL_WIDTH))
    return "\n".join(parts)


def json_report(
    cases: Sequence[Case], *, source: str, rounds: int, batches: int, seed: int, seconds: float
) -> dict[str, Any]:
    """Every round of every path, the ratios, the settings and the machine, as JSON values."""
    return {
        "tokstream": tokstream.__version__,
        "source": source,
        "rounds": rounds,
        "batches_per_round": batches,
        "seed": seed,
        "seconds": seconds,
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "cases": [case.to_json() for case in cases],
    }


def check_plot_target(path: str) -> None:
    """Fail before a benchmark runs, not after, when ``--plot`` cannot be written.

    Raises ImportError when matplotlib is missing, ValueError when the directory does not exist
    or matplotlib cannot write the suffix.
    """
    try:
        import matplotlib  # noqa: F401  (the package first: its submodules may be cached)
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            f"--plot needs matplotlib, which is not installed: {install_hint('plot')}"
        ) from None
    target = Path(path)
    if not target.parent.is_dir():
        raise ValueError(f"--plot {path}: the directory {str(target.parent)!r} does not exist")
    suffix = target.suffix.lower().lstrip(".")
    supported = Figure().canvas.get_supported_filetypes()
    if suffix and suffix not in supported:
        raise ValueError(
            f"--plot {path}: matplotlib cannot write .{suffix} files; use one of "
            f"{', '.join(sorted(supported))}"
        )


def plot_cases(cases: Sequence[Case], paths: Sequence[str], path: str, heading: str) -> None:
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
                positions,
                [c.median(name) for c in chosen],
                style,
                marker="o",
                label=baselines.PATH_LABELS[name],
            )
        ax.set_xticks(list(positions), [f"{c.block}\n(batch {c.batch_size})" for c in chosen])
        ax.set_yscale("log")
        ax.set_xlabel("block size")
        ax.set_ylabel("context tokens per second (millions)")
        ax.set_title(f"{dtype} corpus, {'shuffled' if shuffle else 'sequential'} windows")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    figure.suptitle(heading)
    figure.savefig(path, dpi=110)
