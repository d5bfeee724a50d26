"""``tokstream bench``'s machinery: the harness, the baselines it times, and their reports.

- :mod:`tokstream.bench.baselines`: every path a figure is measured against (the reference, the
  best NumPy gather, nanoGPT's loop, the copy and gather limits, a plain C loop), each yielding
  the fast path's batches so that outputs are checked identical before anything is timed;
- :mod:`tokstream.bench.harness`: the measurement (one process, interleaved rounds, first batch
  untimed and checked), the synthetic corpus and the memory check;
- :mod:`tokstream.bench.report`: the table, the JSON document and the plot;
- ``_loop`` (compiled): the plain C window-copy loop of the ``c_loop`` baseline;
  ``_device`` (compiled): the device's random-read rate, for the cold-cache benchmark.

The benchmark suites (``benchmarks/``) import these, never the command line.
"""

from tokstream.bench.harness import (
    SHAPES,
    SYNTHETIC_DTYPES,
    VOCAB_SIZE,
    Case,
    check_memory,
    consume,
    epochs_for,
    measure_case,
    physical_memory,
    run_cases,
    synthetic_corpus,
)
from tokstream.bench.report import (
    bench_table,
    check_plot_target,
    format_rate,
    geometric_mean,
    json_report,
    markdown_table,
    plot_cases,
    summary_table,
    text_report,
    title,
)

__all__ = [
    "summary_table",
    "SHAPES",
    "SYNTHETIC_DTYPES",
    "VOCAB_SIZE",
    "Case",
    "bench_table",
    "check_memory",
    "check_plot_target",
    "consume",
    "epochs_for",
    "format_rate",
    "geometric_mean",
    "json_report",
    "markdown_table",
    "measure_case",
    "physical_memory",
    "plot_cases",
    "run_cases",
    "synthetic_corpus",
    "text_report",
    "title",
]
