"""What every benchmark suite shares: sizes, corpora, the timed measurement and the ratio table.

Each case times one *side* (tokstream, or what it is compared with: the reference, the best
NumPy gather, a plain C loop, a peer library, the device) with pytest-benchmark, in a *group*
that holds every side of one comparison; the first batch (or output) of each side is checked
identical to the reference's or tokstream's before anything is timed. Beside pytest-benchmark's
own tables a summary prints, per group, each side's median rate and tokstream's ratio to every
other side, all from the same run (``docs/benchmarks.md``).

    pytest benchmarks/ --benchmark-only                  # minutes; -k picks a part
    pytest benchmarks/test_gather.py --benchmark-only -k "8x4096"
    pytest benchmarks/ --benchmark-only --bench-large    # also the multi-GB and long cases
    pytest benchmarks/ --benchmark-disable --bench-tiny  # every case once, tiny (CI's smoke run)

Sizes: ``--bench-tiny`` makes every case tiny (a smoke run: does every case still run and agree
with its baseline?); ``TOKSTREAM_BENCH_TOKENS``, ``TOKSTREAM_BENCH_ROUNDS`` and
``TOKSTREAM_BENCH_BATCHES`` set the corpus (default 10,000,000 tokens: 80 MB as int64, beyond any
cache), the timed rounds of a case (5) and the batches of a round (40). Cases that need an
optional package (torch, obstore and moto, tokenizers, Ray) skip without it; cases that write
gigabytes or run for minutes run only with ``--bench-large``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from tokstream import Corpus
from tokstream.bench import synthetic_corpus
from tokstream.bench.baselines import PATH_LABELS, RATIOS, ratio

SEED = 0
#: The side whose ratios to the others the summary prints, unless a group names another.
SUBJECT = "tokstream"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tokstream benchmarks")
    group.addoption(
        "--bench-tiny",
        action="store_true",
        help="tiny corpora, one round of two batches: prove that every case runs (CI)",
    )
    group.addoption(
        "--bench-large",
        action="store_true",
        help="also the cases that write gigabytes or run for minutes (cold cache, 100,000 "
        "shards, 200 MB of text, 5,000,000 documents)",
    )


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


@dataclass(frozen=True)
class Settings:
    """How much each case measures (see the module docstring)."""

    num_tokens: int
    rounds: int
    batches: int
    tiny: bool = False
    large: bool = False
    seed: int = SEED

    def size(self, full: int, tiny: int) -> int:
        """``full`` in a real run, ``tiny`` in a smoke run."""
        return tiny if self.tiny else full


def _settings(config: pytest.Config) -> Settings:
    tiny = bool(config.getoption("--bench-tiny"))
    return Settings(
        num_tokens=_env_int("TOKSTREAM_BENCH_TOKENS", 200_000 if tiny else 10_000_000),
        rounds=_env_int("TOKSTREAM_BENCH_ROUNDS", 1 if tiny else 5),
        batches=_env_int("TOKSTREAM_BENCH_BATCHES", 2 if tiny else 40),
        tiny=tiny,
        large=bool(config.getoption("--bench-large")),
    )


@pytest.fixture(scope="session")
def settings(pytestconfig: pytest.Config) -> Settings:
    return _settings(pytestconfig)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the large cases unless asked for (a smoke run runs them too, at tiny sizes)."""
    if config.getoption("--bench-large") or config.getoption("--bench-tiny"):
        return
    skip = pytest.mark.skip(reason="writes gigabytes or runs for minutes: add --bench-large")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "large: a case that writes gigabytes or runs for minutes (--bench-large)"
    )


# ---------------------------------------------------------------------------------------------
# Corpora


@pytest.fixture(scope="session")
def corpus_int64(settings: Settings) -> np.ndarray:
    """The seeded synthetic corpus of ``tokstream bench``: ids below 50257, int64."""
    return synthetic_corpus(settings.num_tokens, "int64", settings.seed)


@pytest.fixture(scope="session")
def corpus_uint16(corpus_int64: np.ndarray) -> np.ndarray:
    """The same ids as uint16, the on-disk dtype of GPT-2-sized vocabularies."""
    return corpus_int64.astype(np.uint16)


@pytest.fixture(scope="session")
def corpora(corpus_int64: np.ndarray, corpus_uint16: np.ndarray) -> dict[str, np.ndarray]:
    return {"int64": corpus_int64, "uint16": corpus_uint16}


@pytest.fixture(scope="session")
def check_rows_in() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """``check_rows_in(tokens, windows, next_tokens)``: each of the first 32 rows is ``block``
    consecutive tokens of ``tokens`` followed by its next token (found by its first token, then
    compared whole): for sides whose rows come in an order of their own."""

    def check(tokens: np.ndarray, windows: np.ndarray, next_tokens: np.ndarray) -> None:
        block = windows.shape[1]
        for row, after in zip(windows[:32], next_tokens[:32], strict=False):
            starts = np.flatnonzero(tokens[: tokens.shape[0] - block] == row[0])
            assert any(
                np.array_equal(tokens[s : s + block], row) and tokens[s + block] == after
                for s in starts
            ), "a row is not a run of the corpus' tokens"

    return check


#: Mean tokens of a document of the documents corpus.
MEAN_DOCUMENT = 2000


@pytest.fixture(scope="session")
def documents_corpus(settings: Settings) -> Callable[[str], Corpus]:
    """``documents_corpus(dtype)``: the benchmark corpus cut into documents of seeded
    exponential lengths (mean :data:`MEAN_DOCUMENT`, some empty), recorded with
    ``Corpus.from_documents``; made once per dtype."""
    made: dict[str, Corpus] = {}

    def corpus(dtype: str) -> Corpus:
        if dtype not in made:
            ids = synthetic_corpus(settings.num_tokens, dtype, settings.seed)
            rng = np.random.default_rng(settings.seed + 1)
            count = 2 * settings.num_tokens // MEAN_DOCUMENT + 16
            cuts = np.cumsum(rng.exponential(MEAN_DOCUMENT, count).astype(int))
            made[dtype] = Corpus.from_documents(np.split(ids, cuts[cuts < settings.num_tokens]))
        return made[dtype]

    return corpus


#: Lognormal document lengths of median 500 and mean 900 tokens (the packing targets' documents).
LOGNORMAL_SIGMA = float(np.sqrt(2 * np.log(900 / 500)))


@pytest.fixture(scope="session")
def lognormal_lengths() -> Callable[[int, int], np.ndarray]:
    """``lognormal_lengths(count, seed)``: seeded document lengths, median 500, mean 900."""

    def lengths(count: int, seed: int = 0) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return rng.lognormal(np.log(500), LOGNORMAL_SIGMA, count).astype(np.int64)

    return lengths


# ---------------------------------------------------------------------------------------------
# Measuring a side and collecting its rate


@dataclass
class Side:
    """One side's median rates: by the wall clock and, when measured, by this process's CPU
    time, in ``unit`` (a rate: higher is faster; or, unit ``s``, seconds: lower is faster)."""

    rate: float
    unit: str
    cpu_rate: float | None = None


@dataclass
class Results:
    """Median rates per group and side, the subject of each group and notes, for the summary."""

    sides: dict[str, dict[str, Side]] = field(default_factory=dict)
    subjects: dict[str, str] = field(default_factory=dict)  # "": no ratios
    notes: dict[str, list[str]] = field(default_factory=dict)

    def add(self, group: str, side: str, value: Side, subject: str | None = SUBJECT) -> None:
        """``subject`` None: the group's sides are figures side by side, not a comparison."""
        self.sides.setdefault(group, {})[side] = value
        self.subjects.setdefault(group, subject or "")

    def note(self, group: str, text: str) -> None:
        """A figure of the group that is not a rate (padding, bytes fetched, a floor's limits)."""
        self.notes.setdefault(group, []).append(text)


_RESULTS = Results()


@pytest.fixture(scope="session")
def results() -> Results:
    return _RESULTS


class Measure:
    """Times one side of a comparison with pytest-benchmark and records its rate.

    ``measure(function, group=..., side=..., units=...)`` runs ``function`` (one round) for the
    settings' rounds (``benchmark.pedantic``), and records ``units / median seconds / scale`` as
    the side's rate in ``unit`` (``units`` may be a function of the last round's result), with
    the rate by this process's CPU time beside it; with ``unit="s"`` it records the median
    seconds of a round instead (a one-off operation: an open, a first batch, a split), and with
    ``rate_of`` the rate it computes from the last round's result (a side that times itself).
    ``setup`` runs untimed before each round and returns the round's arguments, as pedantic's
    does. Under ``--benchmark-disable`` the function runs once and nothing is recorded.
    """

    def __init__(self, benchmark: Any, settings: Settings, results: Results) -> None:
        self.benchmark = benchmark
        self.settings = settings
        self.results = results

    def __call__(
        self,
        function: Callable[..., Any],
        *,
        group: str,
        side: str,
        units: float | Callable[[Any], float],
        unit: str = "Mtok/s",
        scale: float = 1e6,
        subject: str | None = SUBJECT,
        rounds: int | None = None,
        setup: Callable[[], Any] | None = None,
        args: tuple[Any, ...] = (),
        rate_of: Callable[[Any], float] | None = None,
    ) -> Any:
        self.benchmark.group = group
        self.benchmark.extra_info.update(side=side, unit=unit)
        cpu: list[float] = []

        def timed(*arguments: Any) -> Any:
            started = time.process_time()
            try:
                return function(*arguments)
            finally:
                cpu.append(time.process_time() - started)

        result = self.benchmark.pedantic(
            timed,
            args=args if setup is None else (),
            setup=setup,
            rounds=rounds or self.settings.rounds,
            iterations=1,
        )
        if self.benchmark.stats is not None:  # None under --benchmark-disable
            count = units(result) if callable(units) else units
            median, median_cpu = self.benchmark.stats.stats.median, statistics.median(cpu)
            if unit == "s":  # a time, not a rate
                rate, cpu_rate = median, median_cpu
            elif rate_of is not None:  # the side times itself
                rate, cpu_rate = rate_of(result), None
            else:
                rate = count / median / scale
                cpu_rate = count / max(median_cpu, 1e-9) / scale
            self.benchmark.extra_info[f"median {unit}"] = rate
            if cpu_rate is not None:
                self.benchmark.extra_info[f"median {unit} by CPU time"] = cpu_rate
            self.results.add(group, side, Side(rate, unit, cpu_rate), subject)
        return result

    def note(self, group: str, text: str) -> None:
        self.benchmark.extra_info.setdefault("notes", []).append(text)
        self.results.note(group, text)


@pytest.fixture
def measure(benchmark: Any, settings: Settings, results: Results) -> Measure:
    return Measure(benchmark, settings, results)


# ---------------------------------------------------------------------------------------------
# The summary


def _paths_table(groups: dict[str, dict[str, Side]]) -> list[list[str]]:
    """The groups of test_gather's paths, as ``tokstream bench --full`` tabulates them."""
    paths = [p for p in PATH_LABELS if any(p in row for row in groups.values())]
    ratios = [(top, bottom, label) for top, bottom, label in RATIOS if {top, bottom} <= set(paths)]
    labels = [PATH_LABELS[p] + (" Mwin/s" if p == "gather_limit" else "") for p in paths]
    lines = [["group", *labels, *(label for _, _, label in ratios)]]
    for group, row in groups.items():
        block = int(group.split("block=")[1].split()[0])
        cells = [group]
        cells += [f"{row[p].rate:,.1f}" if p in row else "-" for p in paths]
        cells += [
            f"{ratio(top, bottom, row[top].rate, row[bottom].rate, block):.2f}x"
            if top in row and bottom in row
            else "-"
            for top, bottom, _ in ratios
        ]
        lines.append(cells)
    return lines


def _aligned(lines: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in lines
    ]


def _group_lines(group: str, sides: dict[str, Side], subject: str, notes: list[str]) -> list[str]:
    """The group, its sides' rates on one line, the subject's ratios on the next, then notes."""
    units = sorted({side.unit for side in sides.values()})
    lines = [f"{group}  ({', '.join(units)})"] if sides else [group]
    if sides:
        lines.append("  " + "; ".join(f"{name} {side.rate:,.4g}" for name, side in sides.items()))
    top = sides.get(subject)
    ratios = []
    for name, side in sides.items():
        if top is None or name == subject or side.unit != top.unit:
            continue
        # Speed ratios: rates top / side, times side / top (above 1: the subject is faster).
        pair = (side, top) if top.unit == "s" else (top, side)
        text = f"{subject} / {name} {pair[0].rate / pair[1].rate:.2f}x"
        if pair[0].cpu_rate and pair[1].cpu_rate:
            text += f" (CPU time {pair[0].cpu_rate / pair[1].cpu_rate:.2f}x)"
        ratios.append(text)
    if ratios:
        lines.append("  " + "; ".join(ratios))
    return lines + [f"  {note}" for note in notes]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Per group: each side's median rate and the subject's ratio to every other side."""
    if not _RESULTS.sides:  # nothing timed (--benchmark-disable)
        return
    settings = _settings(config)
    terminalreporter.section(
        f"tokstream ratios: median of {settings.rounds} rounds, one run "
        f"({settings.num_tokens:,}-token corpus; {settings.batches} batches a round)"
    )
    paths = {g: s for g, s in _RESULTS.sides.items() if g.startswith("paths ")}
    if paths:
        terminalreporter.write_line("Mtok/s per path (gather limit: Mwindows/s), and ratios:")
        for line in _aligned(_paths_table(paths)):
            terminalreporter.write_line(line)
    for group in dict.fromkeys([*_RESULTS.sides, *_RESULTS.notes]):
        if group in paths:
            continue
        sides = _RESULTS.sides.get(group, {})
        subject = _RESULTS.subjects.get(group, SUBJECT)
        for line in _group_lines(group, sides, subject, _RESULTS.notes.get(group, [])):
            terminalreporter.write_line(line)
