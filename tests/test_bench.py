"""The benchmark harness: measurement, reports and progress (the command is in test_cli)."""

from __future__ import annotations

import functools
import os
import time

import numpy as np
import pytest

from tokstream import _progress, bench
from tokstream.bench import baselines, harness


def test_table_formats_every_case():
    case = bench.Case("uint16", False, 8, 64)
    case.rates = {
        "reference": [10.0, 12.0, 11.0],
        "fast": [110.0, 100.0, 90.0],
        "gather_limit": [20.0, 30.0, 25.0],
    }
    table = bench.bench_table([case], ["reference", "fast", "gather_limit"])
    header, rule, row = table.splitlines()
    cells = row.split("|")[1:-1]
    assert [c.strip() for c in cells] == [
        "uint16",
        "sequential",
        "8",
        "64",
        "11.0",
        "100",
        "25.0",
        "9.09x",
        "0.50x",
    ]
    assert [c.strip() for c in header.split("|")[1:-1]] == [
        "dtype",
        "order",
        "block",
        "batch",
        "reference",
        "fast",
        "gather limit (Mwin/s)",
        "fast/ref",
        "fast win/gather",
    ]
    # Text left-aligned, numbers right-aligned (Markdown's "---:"), every column one width.
    assert cells[0] == " uint16 " and cells[2].endswith("8 ") and cells[2].startswith("  ")
    assert rule.split("|")[1:-1][0] == "--------" and rule.split("|")[1:-1][2].endswith(":")
    assert len(header) == len(rule) == len(row)


def _rated(dtype: str, shuffle: bool, block: int, batch_size: int) -> bench.Case:
    case = bench.Case(dtype, shuffle, block, batch_size)
    case.rates = {"reference": [10.0], "best_numpy": [40.0], "fast": [100.0], "copy_limit": [9.0]}
    return case


def test_the_default_table_shows_a_column_only_where_the_rows_differ():
    paths = ["reference", "best_numpy", "fast", "copy_limit"]
    one = bench.summary_table([_rated("int64", True, 8, 64), _rated("int64", True, 16, 4)], paths)
    header, _, first, _ = one.splitlines()
    assert [c.strip() for c in header.split("|")[1:-1]][:2] == ["shape", "reference"]
    assert [c.strip() for c in first.split("|")[1:-1]] == [
        "8 x 64",
        "10.0",
        "40.0",
        "100",
        "10.0x",
        "2.5x",
    ]
    both = bench.summary_table(
        [_rated("int64", True, 8, 64), _rated("uint16", False, 8, 64)], paths
    )
    header = both.splitlines()[0]
    assert [c.strip() for c in header.split("|")[1:-1]][:3] == ["dtype", "order", "shape"]
    # Without the best NumPy path, neither its column nor its ratio.
    narrow = bench.summary_table([_rated("int64", True, 8, 64)], ["reference", "fast"])
    assert "NumPy" not in narrow and "vs reference" in narrow


def test_watcher_falls_back_to_elapsed_time_without_a_temporary_file(tmp_path, monkeypatch):
    monkeypatch.setattr(_progress, "PROGRESS_INTERVAL", 0.001)

    class Recorder(_progress.Progress):
        def __init__(self):
            super().__init__(None)
            self.messages = []

        def update(self, message, *, final=False):
            self.messages.append(message)

    recorder = Recorder()
    with _progress.WriteWatcher(tmp_path / "never.bin", 100, recorder, "label"):
        time.sleep(0.05)
    assert recorder.messages
    assert all(m.startswith("label: ") and m.endswith(" s") for m in recorder.messages)


class Recorder:
    """A Progress that keeps every message."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, bool]] = []

    def update(self, message: str, *, final: bool = False) -> None:
        self.messages.append((message, final))


def test_synthetic_corpus_is_seeded_ids_below_the_vocabulary():
    ids = bench.synthetic_corpus(10_000, "int64", seed=3)
    expected = np.random.default_rng(3).integers(0, bench.VOCAB_SIZE, 10_000, dtype=np.int64)
    np.testing.assert_array_equal(ids, expected)
    for dtype in bench.SYNTHETIC_DTYPES:
        np.testing.assert_array_equal(bench.synthetic_corpus(10_000, dtype, seed=3), expected)


def test_measure_case_times_every_round_of_every_path_after_checking_first_batches():
    ids = bench.synthetic_corpus(500, "uint16", seed=0)
    paths = ["reference", "fast", "gather_limit"]
    recorder = Recorder()
    case = bench.measure_case(
        bench.Case("uint16", True, 8, 16),
        ids,
        paths,
        rounds=3,
        batches=2,
        seed=0,
        progress=recorder,
        label="L",
    )
    assert set(case.rates) == set(paths)
    assert all(len(rates) == 3 and min(rates) > 0 for rates in case.rates.values())
    assert set(case.ratios()) == {"fast/reference", "fast/gather_limit"}
    messages = [m for m, _ in recorder.messages]
    assert messages[:3] == ["L: starting reference", "L: starting fast", "L: starting gather_limit"]
    # Each round starts with a different path.
    rounds = [m.split(": ")[1] for m in messages[3:]]
    assert rounds[0].startswith("reference") and rounds[3].startswith("fast")


def test_run_cases_refuses_a_corpus_without_windows_before_measuring_anything():
    recorder = Recorder()
    corpora = [("int64", np.arange(100)), ("uint16", np.arange(8, dtype=np.uint16))]
    with pytest.raises(ValueError, match=r"the corpus \(uint16\) holds 8 tokens"):
        bench.run_cases(
            corpora,
            [(4, 2), (8, 2)],
            ["fast"],
            shuffle=True,
            rounds=1,
            batches=1,
            seed=0,
            progress=recorder,
        )
    assert recorder.messages == []


def test_run_cases_measures_every_corpus_and_shape_in_order():
    corpora = [("int64", np.arange(200)), ("uint16", np.arange(200, dtype=np.uint16))]
    cases = bench.run_cases(
        corpora, [(4, 8), (16, 2)], ["fast"], shuffle=False, rounds=1, batches=1, seed=0
    )
    assert [(c.dtype, c.shuffle, c.block, c.batch_size) for c in cases] == [
        ("int64", False, 4, 8),
        ("int64", False, 16, 2),
        ("uint16", False, 4, 8),
        ("uint16", False, 16, 2),
    ]


def _case() -> bench.Case:
    case = bench.Case("int64", True, 4, 8)
    case.rates = {"reference": [1.0, 2.0, 3.0], "fast": [30.0, 40.0, 50.0]}
    return case


def test_text_report_holds_the_heading_table_and_geometric_mean():
    text = bench.text_report([_case()], ["reference", "fast"], "HEADING", full=True)
    lines = text.splitlines()
    assert lines[0] == "HEADING" and lines[2].startswith("| dtype")
    assert "fast/reference, geometric mean over the rows: 20.0x" in text
    assert "Mtok/s = millions of context tokens per second" in text
    assert "geometric mean" not in bench.text_report([_case()], ["fast"], "H")


def test_json_report_is_json_with_every_round():
    import json

    report = bench.json_report([_case()], source="S", rounds=3, batches=2, seed=1, seconds=0.5)
    assert json.loads(json.dumps(report)) == report
    assert report["source"] == "S" and report["seed"] == 1
    (case,) = report["cases"]
    assert case["paths"]["fast"] == {"unit": "Mtok/s", "median": 40.0, "rounds": [30.0, 40.0, 50.0]}
    assert case["ratios"] == {"fast/reference": 20.0}


def test_markdown_table_aligns_text_columns_left_and_numeric_columns_right():
    table = bench.markdown_table(["name", "n"], [["a", "1"], ["bbb", "22"]], numeric_from=1)
    assert table.splitlines() == [
        "| name |  n |",
        "|------|---:|",
        "| a    |  1 |",
        "| bbb  | 22 |",
    ]


def test_nothing_under_benchmarks_imports_the_command_line():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "benchmarks"
    sources = {path.name: path.read_text() for path in root.glob("*.py")}
    assert "conftest.py" in sources
    for name, text in sources.items():
        assert "tokstream.cli" not in text and "import cli" not in text, name
    assert baselines.PATH_LABELS.keys() == baselines.PATHS.keys()


def test_check_memory_passes_what_fits_and_names_the_option_of_what_does_not():
    paths = ["fast", "reference"]
    check = functools.partial(bench.check_memory, corpus_option="--tokens 1000")
    # 1000 tokens: the corpus (8,000 bytes), an int64 copy, and 2 paths' int64 orders: 40,000.
    with pytest.raises(ValueError, match=r"^--tokens 1000 needs about 0\.0 GB of memory"):
        check(1000, 8000, [(8, 16)], paths, memory=39_999)
    # One batch of 16 windows for each path, plus two: 4 x 16 x (9 x 8 + 1024) bytes.
    check(1000, 8000, [(8, 16)], paths, memory=40_000 + 4 * 16 * (72 + 1024))
    with pytest.raises(ValueError, match=r"^--batch-size 16 with --block 8 needs about"):
        check(1000, 8000, [(8, 16)], paths, memory=40_000 + 4 * 16 * (72 + 1024) - 1)
    # A batch holds the windows there are, not the batch size asked for.
    with pytest.raises(ValueError, match=r"^--batch-size 10000000000 .* of 992 windows"):
        check(1000, 8000, [(4, 2), (8, 10**10)], paths, memory=10**6)


def test_check_memory_is_skipped_where_the_machine_does_not_say(monkeypatch):
    monkeypatch.setattr(harness, "physical_memory", lambda: None)
    bench.check_memory(10**15, 10**15, [(8, 10**15)], ["fast"], corpus_option="--tokens 1")


@pytest.mark.skipif(not hasattr(os, "sysconf"), reason="the OS does not report its memory")
def test_physical_memory_is_the_machines():
    memory = bench.physical_memory()
    assert memory is not None and memory > 100 << 20
