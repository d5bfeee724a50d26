"""Corpora and shared machinery of the benchmark suite (the protocol of docs/benchmarks.md).

Run the whole suite with ``pytest benchmarks`` (it is outside pyproject's ``testpaths``); add
``--benchmark-autosave`` to keep the JSON under ``.benchmarks/`` and ``--benchmark-compare`` to
compare with the last saved run. Environment variables shrink it for a quick look:

``TOKSTREAM_BENCH_TOKENS``
    corpus size in tokens (default 10,000,000: 80 MB as int64, larger than any cache);
``TOKSTREAM_BENCH_ROUNDS``, ``TOKSTREAM_BENCH_BATCHES``
    timed rounds per benchmark (default 5) and batches per round (default 40).

At the end of the run a table of median Mtok/s per path with the ratios ``tokstream bench``
reports is printed, one row per group (corpus dtype, order, shape), from the same run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pytest

from tokstream.bench import synthetic_corpus
from tokstream.bench.baselines import PATH_LABELS, RATIOS, ratio

SEED = 0


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    if not text:
        return default
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise pytest.UsageError(f"{name} must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise pytest.UsageError(f"{name} must be a positive integer, got {text!r}")
    return value


NUM_TOKENS = _env_int("TOKSTREAM_BENCH_TOKENS", 10_000_000)
ROUNDS = _env_int("TOKSTREAM_BENCH_ROUNDS", 5)
BATCHES = _env_int("TOKSTREAM_BENCH_BATCHES", 40)


@pytest.fixture(scope="session")
def corpus_int64() -> np.ndarray:
    """The seeded synthetic corpus of ``tokstream bench``: ``NUM_TOKENS`` ids below 50257, int64."""
    return synthetic_corpus(NUM_TOKENS, "int64", SEED)


@pytest.fixture(scope="session")
def corpus_uint16(corpus_int64: np.ndarray) -> np.ndarray:
    """The same ids as uint16, the on-disk dtype of GPT-2-sized vocabularies."""
    return corpus_int64.astype(np.uint16)


@pytest.fixture(scope="session")
def corpora(corpus_int64: np.ndarray, corpus_uint16: np.ndarray) -> dict[str, np.ndarray]:
    return {"int64": corpus_int64, "uint16": corpus_uint16}


@dataclass(frozen=True)
class Settings:
    """How much each benchmark measures (from the environment, see the module docstring)."""

    num_tokens: int = NUM_TOKENS
    rounds: int = ROUNDS
    batches: int = BATCHES
    seed: int = SEED


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings()


@dataclass
class Results:
    """Median rates per group and path, gathered for the summary table."""

    rates: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, group: str, path: str, rate: float) -> None:
        self.rates.setdefault(group, {})[path] = rate


_RESULTS = Results()


@pytest.fixture(scope="session")
def results() -> Results:
    return _RESULTS


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Print median Mtok/s per path and the ratios of ``tokstream bench``, one row per group."""
    if not _RESULTS.rates:
        return
    paths = [p for p in PATH_LABELS if any(p in row for row in _RESULTS.rates.values())]
    ratios = [(top, bottom, label) for top, bottom, label in RATIOS if {top, bottom} <= set(paths)]
    labels = [PATH_LABELS[p] + (" Mwin/s" if p == "gather_limit" else "") for p in paths]
    header = ["group", *labels, *(label for _, _, label in ratios)]
    lines = []
    for group, row in _RESULTS.rates.items():
        block = int(group.split("block=")[1].split()[0])
        cells = [group]
        cells += [f"{row[p]:,.1f}" if p in row else "-" for p in paths]
        cells += [
            f"{ratio(top, bottom, row[top], row[bottom], block):.2f}x"
            if top in row and bottom in row
            else "-"
            for top, bottom, _ in ratios
        ]
        lines.append(cells)
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    terminalreporter.section(
        f"tokstream throughput: median of {ROUNDS} rounds x {BATCHES} batches, "
        f"{NUM_TOKENS:,} tokens (Mtok/s; gather limit in Mwindows/s)"
    )
    for cells in [header, *lines]:
        terminalreporter.write_line(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
        )
