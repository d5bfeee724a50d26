"""The ``tokstream`` command line: commands, help, exit codes and outputs (never timings)."""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tokstream import _progress, cli, writing
from tokstream._order import SLOW_DRAW_WINDOWS
from tokstream.bench import baselines
from tokstream.formats import table

# A corpus and shapes small enough that a whole bench run takes a fraction of a second.
TINY = ["--tokens", "3000", "--block", "4,16", "--batch-size", "32,8", "--batches", "2"]


def run(*argv: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


def bench_json(*argv: str) -> dict:
    code, out, err = run("bench", *TINY, "--json", "--quiet", *argv)
    assert code == 0, err
    return json.loads(out)


# ---------------------------------------------------------------------------------------------
# Entry points and help


def test_console_script_is_declared_for_cli_main():
    (entry,) = [
        e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "tokstream"
    ]
    assert entry.load() is cli.main


def test_python_dash_m_runs_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "tokstream", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "usage: tokstream" in done.stdout
    for command in ("bench", "inspect", "convert"):
        assert command in done.stdout


def test_the_bench_does_not_warn_about_the_order_it_asks_for():
    # A corpus whose default (drawn) order is large enough to warn a user who did not ask for
    # it; the bench asks for that order by name, and Python's default filters show the rest.
    tokens = SLOW_DRAW_WINDOWS + 8
    done = subprocess.run(
        [sys.executable, "-m", "tokstream", "bench", "--tokens", str(tokens), "--block", "8"]
        + ["--batch-size", "64", "--rounds", "1", "--batches", "1", "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr


def test_python_dash_m_passes_the_exit_code_through():
    done = subprocess.run(
        [sys.executable, "-m", "tokstream", "bench", "--rounds", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--rounds" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", [[], ["bench"], ["inspect"], ["convert"]])
def test_every_command_has_help(command, capsys):
    code = cli.main([*command, "--help"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith(f"usage: tokstream {' '.join(command)}".rstrip())


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip().startswith("tokstream 0.")


# ---------------------------------------------------------------------------------------------
# Usage errors: exit code 2, the argument named


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ([], "COMMAND"),
        (["frobnicate"], "frobnicate"),
        (["bench", "--block", "0"], "--block"),
        (["bench", "--block", "eight"], "--block"),
        (["bench", "--batch-size", "4,-1"], "--batch-size"),
        (["bench", "--block", "8,3", "--batch-size", "1,2,3"], "--block has 2 values"),
        (["bench", "--tokens", "many"], "--tokens"),
        (["bench", "--rounds", "0"], "--rounds"),
        (["bench", "--dtype", "float32"], "float32"),
        (["bench", "--dtype", "int8"], "int8"),
        (["bench", "--dtype", "nonsense"], "nonsense"),
        (["bench", "--paths", "fast,warp"], "warp"),
        (["bench", "--seed", "-3"], "--seed"),
        (["bench", "--file", "x.npy", "--tokens", "10"], "--tokens"),
        (["bench", "--unknown"], "--unknown"),
        (["bench", "--out-dtype", "float32"], "--out-dtype"),
        (["bench", "--out-dtype", "int16"], "--out-dtype"),
    ],
)
def test_usage_errors_exit_2_naming_the_argument(argv, named, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert named in err
    assert "Traceback" not in err


def test_bench_out_dtype_times_tokstream_writing_int32_against_the_int64_baselines():
    report = bench_json("--out-dtype", "int32", "--paths", "reference,best_numpy,fast_reuse")
    assert "int32" in report["source"]
    for case in report["cases"]:
        assert {"reference", "best_numpy", "fast", "fast_reuse"} <= set(case["paths"])


def test_usage_errors_and_help_go_to_the_streams_main_was_given(capsys):
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["bench", "--block", "eight"], stdout=out, stderr=err) == 2
    assert "--block" in err.getvalue()
    assert cli.main(["inspect", "--help"], stdout=out, stderr=err) == 0
    assert "usage: tokstream inspect" in out.getvalue()
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["convert", "a.npy", "b.xyz"], "cannot tell the output format from 'b.xyz'"),
        (["bench", "--block", "8,3", "--batch-size", "1,2,3"], "--block has 2 values"),
        (["bench", "--dtype", "int8"], "--dtype int8 cannot hold the synthetic ids"),
        (["bench", "--file", "x.npy", "--tokens", "10"], "--tokens sizes the synthetic corpus"),
        (["bench", "--file", "x.npy", "--dtype", "int64,uint16"], "--file takes at most one"),
    ],
)
def test_usage_errors_of_command_handlers_go_to_the_streams_main_was_given(argv, message, capsys):
    """Handlers raise; main() prints the command's usage and the error on its stderr: exit 2."""
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(argv, stdout=out, stderr=err) == 2
    usage, error = err.getvalue().splitlines()[0], err.getvalue().splitlines()[-1]
    assert usage.startswith(f"usage: tokstream {argv[0]} ")
    assert error.startswith(f"tokstream {argv[0]}: error: ") and message in error
    assert out.getvalue() == ""
    assert capsys.readouterr() == ("", "")


# ---------------------------------------------------------------------------------------------
# bench


def test_bench_prints_a_table_that_fits_a_terminal():
    code, out, err = run("bench", *TINY, "--quiet")
    assert code == 0, err
    without_torch = "tokstream bench: PyTorch is not installed; skipping the nanoGPT path\n"
    assert err == ("" if baselines.torch_available() else without_torch)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    header = next(line for line in lines if line.startswith("| shape"))
    assert [cell.strip() for cell in header.split("|")[1:-1]] == [
        "shape",
        "reference",
        "best NumPy",
        "tokstream",
        "vs reference",
        "vs NumPy",
    ]
    rows = [line for line in lines if line.startswith("| 4 x 32") or line.startswith("| 16 x 8")]
    assert len(rows) == 2
    assert "int64 corpus; shuffled windows" in out and "shown with --full: " in out
    assert "geometric mean" in out


def test_bench_full_prints_every_path_with_ratios():
    code, out, err = run("bench", *TINY, "--quiet", "--full")
    assert code == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("| dtype"))
    for label in ("reference", "best NumPy", "fast", "fast (reuse)", "copy limit", "gather limit"):
        assert label in header
    for ratio in ("fast/ref", "fast/NumPy", "fast/copy", "reuse/copy", "fast win/gather"):
        assert ratio in header
    assert ("nanoGPT" in header) == baselines.torch_available()
    rows = [line for line in lines if line.startswith("| int64")]
    assert [row.split("|")[3].strip() for row in rows] == ["4", "16"]
    assert "geometric mean" in out and "--full" not in out


def test_bench_reports_progress_on_stderr():
    code, out, err = run("bench", *TINY)
    assert code == 0
    assert "[1/2] int64 shuffled block=4 batch=32" in err
    assert "[2/2] int64 shuffled block=16 batch=8" in err
    assert "[1/2]" not in out


def test_bench_json_holds_every_round_and_consistent_ratios():
    report = bench_json()
    assert report["rounds"] == 5 and report["batches_per_round"] == 2
    assert [(c["block"], c["batch_size"]) for c in report["cases"]] == [(4, 32), (16, 8)]
    expected_paths = set(baselines.PATHS) - (set() if baselines.torch_available() else {"nanogpt"})
    for case in report["cases"]:
        assert case["dtype"] == "int64" and case["shuffle"] is True
        assert set(case["paths"]) == expected_paths
        for name, path in case["paths"].items():
            assert len(path["rounds"]) == 5
            assert all(rate > 0 for rate in path["rounds"])
            assert path["median"] == pytest.approx(float(np.median(path["rounds"])))
            assert path["unit"] == ("Mwindows/s" if name == "gather_limit" else "Mtok/s")
        fast = case["paths"]["fast"]["median"]
        ratios = case["ratios"]
        assert ratios["fast/reference"] == pytest.approx(
            fast / case["paths"]["reference"]["median"]
        )
        assert ratios["fast/gather_limit"] == pytest.approx(
            fast / case["block"] / case["paths"]["gather_limit"]["median"]
        )
        assert ratios["fast_reuse/copy_limit"] == pytest.approx(
            case["paths"]["fast_reuse"]["median"] / case["paths"]["copy_limit"]["median"]
        )
        expected_ratios = {
            "fast/reference",
            "fast/best_numpy",
            "fast/copy_limit",
            "fast_reuse/copy_limit",
            "fast/gather_limit",
            "fast/c_loop",
            "fast_one_buffer/c_loop",
        }
        if baselines.torch_available():
            expected_ratios.add("fast/nanogpt")
        assert set(ratios) == expected_ratios


def test_bench_sequential_order_dtypes_and_chosen_paths():
    report = bench_json("--no-shuffle", "--dtype", "int64,uint16", "--paths", "reference")
    assert [(c["dtype"], c["block"]) for c in report["cases"]] == [
        ("int64", 4),
        ("int64", 16),
        ("uint16", 4),
        ("uint16", 16),
    ]
    for case in report["cases"]:
        assert case["shuffle"] is False
        assert set(case["paths"]) == {"reference", "fast"}
        assert set(case["ratios"]) == {"fast/reference"}


def test_bench_one_block_broadcasts_over_batch_sizes():
    report = bench_json("--block", "4", "--batch-size", "8,16", "--paths", "fast")
    assert [(c["block"], c["batch_size"]) for c in report["cases"]] == [(4, 8), (4, 16)]


def test_bench_runs_enough_epochs_on_a_corpus_shorter_than_the_rounds():
    report = bench_json("--tokens", "40", "--block", "4", "--batch-size", "16", "--paths", "fast")
    (case,) = report["cases"]
    # 36 windows make 3 batches per epoch; 1 untimed + 5 rounds x 2 batches need 4 epochs.
    assert case["epochs"] == 4


def test_bench_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "bench.png"
    code, _, err = run("bench", *TINY, "--dtype", "int64,uint16", "--quiet", "--plot", str(target))
    assert code == 0, err
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {target}" in err


def test_bench_plot_without_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    target = tmp_path / "bench.png"
    code, out, err = run("bench", *TINY, "--plot", str(target))
    assert code == 1
    assert err.strip() == (
        "tokstream bench: error: --plot needs matplotlib, which is not installed: "
        "pip install 'tokstream[plot]' (in a clone of the repository: pip install '.[plot]')"
    )
    assert out == "" and not target.exists()


@pytest.mark.parametrize(
    ("target", "message"),
    [("no/such/dir/bench.png", "does not exist"), ("bench.xyz", "cannot write .xyz files")],
)
def test_bench_plot_target_is_checked_before_the_run(tmp_path, target, message):
    pytest.importorskip("matplotlib")
    code, out, err = run("bench", *TINY, "--plot", str(tmp_path / target))
    assert code == 1 and out == ""
    assert err.startswith("tokstream bench: error: --plot ") and message in err
    assert "[1/2]" not in err  # nothing was measured


def test_bench_with_no_window_in_the_corpus_exits_1_with_one_line():
    code, out, err = run("bench", "--tokens", "8", "--block", "8", "--quiet", "--paths=reference")
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("tokstream bench: error: the corpus (int64) holds 8 tokens")


def test_bench_refuses_to_time_a_path_whose_batches_differ(monkeypatch):
    def off_by_one(ids, block, batch_size, **kwargs):
        for windows, next_tokens in baselines.fast(ids, block, batch_size, **kwargs):
            yield windows + 1, next_tokens

    monkeypatch.setitem(baselines.PATHS, "best_numpy", off_by_one)
    monkeypatch.setitem(baselines.LOADERS, "best_numpy", off_by_one)
    code, out, err = run("bench", *TINY, "--quiet", "--paths", "best_numpy")
    assert code == 1
    assert "'best_numpy' yielded a different first batch" in err
    assert out == ""


def test_bench_skips_nanogpt_without_torch(monkeypatch):
    monkeypatch.setattr(baselines, "torch_available", lambda: False)
    code, out, err = run("bench", *TINY, "--quiet")
    assert code == 0
    assert "PyTorch is not installed; skipping the nanoGPT path" in err
    assert "nanoGPT" not in out
    code, _, err = run("bench", *TINY, "--quiet", "--paths", "nanogpt")
    assert code == 1 and "PyTorch is not installed" in err


def test_bench_file_that_does_not_exist_exits_1(tmp_path):
    code, _, err = run(
        "bench", "--file", str(tmp_path / "missing.npy"), "--quiet", "--paths=reference"
    )
    assert code == 1
    assert err.startswith("tokstream bench: error:")
    assert "missing.npy" in err and "Traceback" not in err


def test_bench_on_a_token_file(tmp_path):

    path = tmp_path / "tokens.npy"
    writing.write_tokens(path, np.arange(3000, dtype=np.uint16) % 50257, format="npy")
    code, out, err = run(
        "bench",
        "--file",
        str(path),
        "--block",
        "4",
        "--batch-size",
        "32",
        "--batches",
        "2",
        "--paths",
        "best_numpy",
        "--json",
        "--quiet",
    )
    assert code == 0, err
    report = json.loads(out)
    assert str(path) in report["source"]
    assert [c["dtype"] for c in report["cases"]] == ["uint16"]


# ---------------------------------------------------------------------------------------------
# inspect and convert


@pytest.fixture
def token_files(tmp_path):
    """The same ids (below 50257) as .npy int64, raw uint16 .bin and an llm.c shard."""

    ids = np.random.default_rng(1).integers(0, 50257, 5000)
    ids[10], ids[20] = 3, 50256  # the extremes, known exactly
    ids[ids < 3] = 3
    paths = {
        "npy": writing.write_tokens(tmp_path / "ids.npy", ids, format="npy", dtype="int64"),
        "bin": writing.write_tokens(tmp_path / "ids.bin", ids, format="bin", dtype="uint16"),
        "llmc": writing.write_tokens(tmp_path / "shard.bin", ids, format="llmc"),
    }
    return ids, paths


def test_inspect_reports_format_dtype_count_range_and_windows(token_files):
    ids, paths = token_files
    code, out, err = run("inspect", *(str(p) for p in paths.values()), "--block", "1000")
    assert code == 0, err
    header, _, *rows = out.splitlines()
    assert [c.strip() for c in header.split("|")[1:-1]] == [
        "file",
        "format",
        "dtype",
        "tokens",
        "min id",
        "max id",
        "windows (block 1000)",
        "kept: cross / within",
    ]
    cells = [[c.strip() for c in row.split("|")[1:-1]] for row in rows[:4]]
    kept = "100.0% / 100.0%"
    assert [c[1:] for c in cells[:3]] == [
        ["npy", "int64", "5,000", "3", "50,256", "4,000", kept],
        ["bin", "uint16", "5,000", "3", "50,256", "4,000", kept],
        ["llmc", "uint16", "5,000", "3", "50,256", "4,000", kept],
    ]
    assert cells[3] == ["total (3 files)", "", "", "15,000", "3", "50,256", "12,000", ""]


def test_inspect_json_and_raw_dtype(tmp_path, token_files):
    ids, paths = token_files
    code, out, err = run("inspect", str(paths["bin"]), "--dtype", "uint16", "--json", "--block=8")
    assert code == 0, err
    (summary,) = json.loads(out)
    assert summary == {
        "path": str(paths["bin"]),
        "format": "bin",
        "dtype": "uint16",
        "tokens": 5000,
        "min_id": 3,
        "max_id": 50256,
        "windows": 4992,
        "bytes": 10000,
        "kept_cross": 1.0,
        "kept_within": 1.0,
        "boundaries": "none recorded (each file is one document); with eos=ID also one after "
        "every token ID (--eos ID counts them)",
    }
    # The same bytes read as uint32: half as many tokens, other values.
    code, out, _ = run("inspect", str(paths["bin"]), "--dtype", "uint32", "--json")
    assert code == 0 and json.loads(out)[0]["tokens"] == 2500


def test_inspect_expands_a_quoted_pattern_in_sorted_order(tmp_path):

    for i in (2, 0, 1):
        writing.write_tokens(tmp_path / f"part_{i}.npy", np.arange(10 + i), format="npy")
    code, out, err = run("inspect", str(tmp_path / "part_*.npy"), "--json", "--block", "4")
    assert code == 0, err
    report = json.loads(out)
    assert [Path(s["path"]).name for s in report] == ["part_0.npy", "part_1.npy", "part_2.npy"]
    assert [s["windows"] for s in report] == [6, 7, 8]


def test_inspect_an_empty_file(tmp_path):

    path = writing.write_tokens(tmp_path / "empty.npy", np.array([], dtype=np.int64), format="npy")
    code, out, err = run("inspect", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)[0] | {"path": None} == {
        "path": None,
        "format": "npy",
        "dtype": "uint16",
        "tokens": 0,
        "min_id": None,
        "max_id": None,
        "windows": 0,
        "bytes": path.stat().st_size,
        "kept_cross": 0.0,
        "kept_within": 0.0,
        "boundaries": "none recorded (each file is one document); with eos=ID also one after "
        "every token ID (--eos ID counts them)",
    }


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero on this OS")
@pytest.mark.parametrize("command", ["inspect", "convert", "bench"])
def test_a_device_is_refused_unread_in_one_line(tmp_path, command):
    argv = {
        "inspect": ["/dev/zero"],
        "convert": ["/dev/zero", str(tmp_path / "out.npy")],
        "bench": ["--file", "/dev/zero", "--paths", "reference"],
    }[command]
    code, out, err = run(command, *argv, "--quiet")
    assert (code, out) == (1, "")
    assert err == (
        f"tokstream {command}: error: token file /dev/zero is not a regular file "
        "(a device, pipe or socket)\n"
    )


def test_inspect_and_open_tokens_expand_a_pattern_alike(tmp_path):
    """One glob rule: an existing name holding glob characters is a file, not a pattern."""
    from tokstream import files

    for name in ("a[1].npy", "a1.npy", "b.npy"):
        writing.write_tokens(tmp_path / name, np.arange(10), format="npy")
    for pattern in ("a[1].npy", "a*.npy", "?.npy"):
        code, out, err = run("inspect", str(tmp_path / pattern), "--json")
        assert code == 0, err
        expected = [str(p) for p in table.expand_pattern(tmp_path / pattern)]
        assert [s["path"] for s in json.loads(out)] == expected
        assert len(files.open_tokens(tmp_path / pattern).shards) == len(expected)


@pytest.mark.parametrize("dtype", ["uint16", ">i4", "int8", "m8", "M8[D]", "float32", "?", "x"])
def test_cli_dtype_options_follow_the_integer_dtype_rule_of_open_tokens(tmp_path, dtype):
    """One integer-dtype rule: what ``open_tokens`` rejects, ``--dtype`` rejects too."""
    from tokstream import files

    path = writing.write_tokens(tmp_path / "ids.bin", np.arange(64), format="bin", dtype="uint8")
    try:
        files.open_tokens(path, dtype=dtype)
    except TypeError:
        rejected = True
    else:
        rejected = False
    code, _, err = run("inspect", str(path), "--dtype", dtype, "--json")
    assert code == (2 if rejected else 0), err


def test_convert_names_the_output_suffixes_and_formats_of_the_files_table(tmp_path):
    assert table.SUFFIX_FORMATS == {".npy": "npy", ".bin": "bin", ".arrow": "arrow"}
    code, _, err = run("convert", "in.npy", str(tmp_path / "out.tokens"))
    assert code == 2
    assert "name it *.npy or *.bin or *.arrow, or pass --format npy|bin|llmc|megatron|arrow" in err


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.npy", "missing.npy"),
        (lambda d: (d / "bad.npy").write_bytes(b"not numpy") and d / "bad.npy", "bad.npy"),
        (lambda d: (d / "odd.bin").write_bytes(b"\x01\x02\x03") and d / "odd.bin", "odd.bin"),
        (lambda d: d / "nothing_*.npy", "matched no files"),
    ],
    ids=["missing", "bad-magic", "odd-size", "empty-pattern"],
)
def test_inspect_bad_files_exit_1_with_one_line(tmp_path, make, message):
    code, out, err = run("inspect", str(make(tmp_path)))
    assert code == 1
    assert out == ""
    assert err.startswith("tokstream inspect: error: ") and err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize(
    ("source", "target", "extra", "format", "dtype"),
    [
        ("npy", "out.bin", [], "bin", "int64"),
        ("npy", "out.bin", ["--dtype", "uint16"], "bin", "uint16"),
        ("bin", "out.npy", [], "npy", "uint16"),
        ("bin", "out.npy", ["--dtype", "int32"], "npy", "int32"),
        ("npy", "train_000.bin", ["--format", "llmc"], "llmc", "uint16"),
        ("llmc", "out.npy", [], "npy", "uint16"),
        ("llmc", "out.raw", ["--format", "bin"], "bin", "uint16"),
    ],
)
def test_convert_round_trips_the_ids(tmp_path, token_files, source, target, extra, format, dtype):
    from tokstream import files

    ids, paths = token_files
    out_path = tmp_path / "converted" / target
    out_path.parent.mkdir()
    code, out, err = run("convert", str(paths[source]), str(out_path), "--quiet", *extra)
    assert code == 0, err
    assert files.detect_format(out_path) == format
    corpus = files.open_tokens(out_path, dtype=dtype if format == "bin" else None)
    assert str(corpus.dtype) == dtype
    np.testing.assert_array_equal(corpus.shards[0], ids)
    assert out.startswith(f"wrote {out_path}: {format}, {dtype}, 5,000 tokens")
    assert list(out_path.parent.iterdir()) == [out_path]  # no temporary file left behind


def test_convert_raw_input_dtype(tmp_path):

    ids = np.array([0, 70000, 5, 2**31 - 1], dtype=np.int64)
    raw = writing.write_tokens(tmp_path / "wide.bin", ids, format="bin", dtype="uint32")
    code, _, err = run("convert", str(raw), str(tmp_path / "wide.npy"), "--in-dtype", "uint32")
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "wide.npy"), ids)


def test_convert_to_llmc_refuses_ids_beyond_uint32(tmp_path):

    wide = writing.write_tokens(
        tmp_path / "wide.npy", np.array([1, 2**32]), format="npy", dtype="int64"
    )
    code, out, err = run("convert", str(wide), str(tmp_path / "s.bin"), "--format", "llmc")
    assert code == 1 and out == ""
    assert err.startswith("tokstream convert: error: ") and "neither uint16 nor uint32" in err
    assert not (tmp_path / "s.bin").exists()


def test_convert_to_llmc_writes_ids_beyond_uint16_as_a_version_7_shard(tmp_path):
    from tokstream import files

    wide = writing.write_tokens(tmp_path / "wide.npy", np.array([1, 70000]), format="npy")
    code, out, err = run("convert", str(wide), str(tmp_path / "s.bin"), "--format", "llmc")
    assert code == 0, err
    header = np.fromfile(tmp_path / "s.bin", dtype="<i4", count=3)
    assert header.tolist() == [20240801, 7, 2]
    assert files.open_tokens(tmp_path / "s.bin").shards[0].tolist() == [1, 70000]


def test_convert_needs_a_format_it_can_tell(tmp_path, token_files):
    _, paths = token_files
    code, out, err = run("convert", str(paths["npy"]), str(tmp_path / "out.tokens"))
    assert code == 2 and out == "" and "--format" in err
    assert not (tmp_path / "out.tokens").exists()
    code, _, err = run("convert", str(paths["npy"]), str(tmp_path / "o.npy"), "--format", "x")
    assert code == 2 and "--format" in err


def test_convert_missing_input_exits_1(tmp_path):
    code, _, err = run("convert", str(tmp_path / "nope.npy"), str(tmp_path / "out.npy"))
    assert code == 1
    assert "nope.npy" in err and err.count("\n") == 1


def test_convert_shows_progress_on_large_files(tmp_path, token_files, monkeypatch):
    """Progress is shown past PROGRESS_MIN_BYTES; lowered here so a small file counts."""

    _, paths = token_files
    monkeypatch.setattr(_progress, "PROGRESS_MIN_BYTES", 1)
    monkeypatch.setattr(_progress, "PROGRESS_INTERVAL", 0.001)
    real_write = writing.write_tokens

    def slow_write(path, ids, format="npy", dtype=None):
        # Let the watcher see the temporary file grow: write it, then pause before the rename.
        original_replace = os.replace

        def paused_replace(src, dst):
            time.sleep(0.05)
            original_replace(src, dst)

        monkeypatch.setattr(os, "replace", paused_replace)
        try:
            return real_write(path, ids, format=format, dtype=dtype)
        finally:
            monkeypatch.setattr(os, "replace", original_replace)

    monkeypatch.setattr(writing, "write_tokens", slow_write)
    code, _, err = run("convert", str(paths["npy"]), str(tmp_path / "big.bin"))
    assert code == 0, err
    assert "ids.npy -> " in err and "100% (0 of 0 MB" in err


# ---------------------------------------------------------------------------------------------
# Sizes: checked before anything is allocated; MemoryError as one line, the last resort


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--tokens", "1000000000000"], "--tokens 1000000000000 needs about"),
        (["--batch-size", "1000000000000"], "--batch-size 1000000000000 with --block 8 needs"),
        (["--block", "1024", "--batch-size", "10000000000"], "with --block 1024 needs about"),
    ],
)
def test_bench_refuses_sizes_beyond_memory_in_one_line_before_allocating(argv, named, torch_or_not):
    import tracemalloc

    tracemalloc.start()
    try:
        code, out, err = run("bench", *argv)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code == 1 and out == ""
    assert err.startswith("tokstream bench: error: ") and err.count("\n") == 1, err
    assert named in err and "of memory" in err and "this machine has" in err
    assert peak < 20 << 20  # nothing corpus- or batch-sized was allocated


def test_bench_file_sizes_are_checked_too(tmp_path, monkeypatch):
    from tokstream.bench import harness

    for i in range(2):
        writing.write_tokens(tmp_path / f"part_{i}.npy", np.arange(1000), format="npy")
    monkeypatch.setattr(harness, "physical_memory", lambda: 10_000)
    code, _, err = run("bench", "--file", str(tmp_path / "part_*.npy"), "--quiet")
    assert code == 1 and f"--file {tmp_path / 'part_*.npy'} needs about" in err


@pytest.fixture(
    params=["torch installed", "no torch"] if baselines.torch_available() else ["no torch"]
)
def torch_or_not(request, monkeypatch):
    """Both sides of the nanoGPT path where PyTorch is installed (bench notes its absence)."""
    if request.param == "no torch":
        monkeypatch.setattr(baselines, "torch_available", lambda: False)


@pytest.mark.parametrize("command", ["bench", "convert"])
def test_a_memory_error_is_one_line_and_exit_1(
    tmp_path, token_files, monkeypatch, command, torch_or_not
):
    from tokstream.bench import harness

    def out_of_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 7.28 TiB for an array")

    monkeypatch.setattr(harness, "run_cases", out_of_memory)
    monkeypatch.setattr(writing, "write_tokens", out_of_memory)
    _, paths = token_files
    argv = TINY if command == "bench" else [str(paths["npy"]), str(tmp_path / "o.npy")]
    code, out, err = run(command, *argv, "--quiet")
    assert code == 1 and out == ""
    assert err == (
        f"tokstream {command}: error: out of memory: Unable to allocate 7.28 TiB for an array\n"
    )


def test_inspect_reports_what_packing_makes_of_the_documents(tmp_path):
    tokens = np.tile(np.array([5, 6, 7, 0, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0]), 50)
    path = tmp_path / "t.npy"
    np.save(path, tokens.astype(np.uint16))
    code, out, err = run(
        "inspect", str(path), "--block", "8", "--eos", "0", "--windows", "packed", "--json"
    )
    assert code == 0, err
    packed = json.loads(out)[0]["packed"]
    # 150 documents: 50 each of 4, 3 and 12 tokens; the 12-token ones are cut into 2 pieces.
    assert packed["documents"] == 150 and packed["pieces"] == 200
    assert packed["split"] == round(50 / 150, 4) and packed["kept"] == 1.0
    assert 0 <= packed["padding"] < 0.1
