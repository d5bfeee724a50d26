"""tokstream tokenize's output directory: claimed safely, locked, resumable within a shard.

Real processes throughout: a second run is tried while another holds the directory, and runs
are killed (SIGKILL) at random points and run again; every file of the finished directory must
then be byte for byte that of a run never interrupted.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import byte_level_bpe
from tokstream import cli, open_tokens
from tokstream.formats import tokenized
from tokstream.tokenize import job, progress, tokenize_files

pytest.importorskip("tokenizers")

TEXTS = [f"text {i}: {'lorem ipsum ' * (i % 7)}dolor {i * 13} sit amet" for i in range(3000)]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    return byte_level_bpe(TEXTS[:500], path, vocab_size=350)


@pytest.fixture
def inputs(tmp_path) -> list[str]:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("\n".join(TEXTS[:1800]))
    (tmp_path / "in" / "b.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in TEXTS[1800:])
    )
    return [str(tmp_path / "in" / "a.txt"), str(tmp_path / "in" / "b.jsonl")]


def hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


# A run in another process: tokenize with small batches; after ``hold_after`` batches it says
# "holding" and sleeps (so that the test can try a second run, or kill it, while it holds the
# directory); it prints "go" once imported, so a kill lands in the job, not in the imports.
CHILD = """
import sys, time
from tokstream.tokenize import job, tokenize_files
job.BATCH_DOCUMENTS = int(sys.argv[4])
hold_after = int(sys.argv[5])
calls = []
def progress(message, milestone):
    calls.append(message)
    if len(calls) == hold_after:
        print("holding", flush=True)
        time.sleep(600)
print("go", flush=True)
tokenize_files(sys.argv[3].split(","), sys.argv[1], sys.argv[2], shard_tokens=9000,
               progress=progress)
print("done", flush=True)
"""


def start_child(tokenizer_file, out, inputs, batch=25, hold_after=0) -> subprocess.Popen:
    argv = [str(tokenizer_file), str(out), ",".join(inputs), str(batch), str(hold_after)]
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(child: subprocess.Popen, word: str) -> None:
    line = child.stdout.readline().strip()
    assert line == word, (line, child.stderr.read() if child.poll() is not None else "")


# ---------------------------------------------------------------------------------------------
# The directory is claimed before anything in it is touched, and locked


def test_nothing_in_a_directory_that_is_not_ours_is_touched(tmp_path, tokenizer_file, inputs):
    for name, files in {
        "user": {".draft.tmp": "mine", "notes.txt": "mine too"},
        "only_temporaries": {".keep.tmp": "mine"},
    }.items():
        directory = tmp_path / name
        directory.mkdir()
        for file, content in files.items():
            (directory / file).write_text(content)
        with pytest.raises(ValueError, match="is not empty"):
            tokenize_files(inputs, str(tokenizer_file), directory)
        assert sorted(p.name for p in directory.iterdir()) == sorted(files)
        assert all((directory / f).read_text() == c for f, c in files.items())


def test_only_our_own_leftovers_are_removed_from_our_directory(tmp_path, tokenizer_file, inputs):
    out = tmp_path / "out"
    tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=9000)
    clean = hashes(out)
    leftover = out / ".shard_000001.npy.0123456789abcdef.tmp"
    leftover.write_bytes(b"half a shard")
    (out / ".mine.tmp").write_text("the user's")
    tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=9000)
    assert not leftover.exists() and (out / ".mine.tmp").read_text() == "the user's"
    (out / ".mine.tmp").unlink()
    assert hashes(out) == clean


def test_a_second_run_into_a_directory_being_written_is_refused(tmp_path, tokenizer_file, inputs):
    out = tmp_path / "out"
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean, shard_tokens=9000)
    child = start_child(tokenizer_file, out, inputs, hold_after=3)
    try:
        wait_for(child, "go")
        wait_for(child, "holding")
        before = hashes(out)
        with pytest.raises(ValueError, match="being written by another tokstream tokenize"):
            tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=9000)
        code, _, stderr = run(
            "tokenize", *inputs, "--tokenizer", str(tokenizer_file), "--output", str(out)
        )
        assert code == 1 and "being written by another" in stderr and stderr.count("\n") == 1
        assert hashes(out) == before  # the second run touched nothing
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()
    # The killed run's lock file stays behind, and blocks nobody: the lock died with it.
    assert (out / ".tokstream.lock").exists()
    result = tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=9000)
    assert result.resumed_documents == 3 * 25
    assert hashes(out) == hashes(clean)


# ---------------------------------------------------------------------------------------------
# Resumable within a shard; byte-identical whatever the interruptions


def test_an_interrupt_inside_a_shard_keeps_the_documents_before_it(
    tmp_path, tokenizer_file, inputs, monkeypatch
):
    monkeypatch.setattr(job, "BATCH_DOCUMENTS", 100)
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean)  # one shard of 100M tokens at most
    out = tmp_path / "out"
    batches = []

    def interrupt_at_the_fifth_batch(message: str, milestone: bool) -> None:
        batches.append(message)
        if len(batches) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_files(inputs, str(tokenizer_file), out, progress=interrupt_at_the_fifth_batch)
    assert tokenized.load(out)["shards"] == []
    result = tokenize_files(inputs, str(tokenizer_file), out)
    assert result.resumed_documents == 500
    assert result.documents == len(TEXTS)
    assert hashes(out) == hashes(clean)


def test_runs_killed_at_random_points_finish_byte_identical(tmp_path, tokenizer_file, inputs):
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean, shard_tokens=9000)
    want = hashes(clean)
    assert len([name for name in want if name.endswith(".documents.npy")]) > 3
    rng = random.Random(1234)
    # How long the job takes once imported, so that the kills land anywhere inside it.
    child = start_child(tokenizer_file, tmp_path / "timed", inputs)
    wait_for(child, "go")
    began = time.perf_counter()
    assert child.wait(timeout=300) == 0, child.stderr.read()
    child.stdout.close()
    child.stderr.close()
    duration = time.perf_counter() - began
    resumed = 0
    for trial in range(4):
        out = tmp_path / f"trial_{trial}"
        for _ in range(3):
            child = start_child(tokenizer_file, out, inputs)
            wait_for(child, "go")
            time.sleep(rng.uniform(0, duration))
            child.send_signal(signal.SIGKILL)
            child.wait()
            child.stdout.close()
            child.stderr.close()
        if tokenized.is_directory(out):
            resumed += tokenize_files(
                inputs, str(tokenizer_file), out, shard_tokens=9000
            ).resumed_documents
        else:  # killed before it made its manifest every time
            tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=9000)
        assert hashes(out) == want, trial
        assert documents_count(out) == len(TEXTS)
    assert resumed > 0  # at least one kill landed inside the job


def documents_count(directory: Path) -> int:
    return open_tokens(directory).document_boundaries.shape[0] - 1


# ---------------------------------------------------------------------------------------------
# A failed run, another job's output, --overwrite


def test_a_run_that_failed_on_a_bad_line_is_rerun_cleanly_once_fixed(
    tmp_path, tokenizer_file, inputs
):
    bad = Path(inputs[1])
    good = bad.read_text()
    lines = good.splitlines(keepends=True)
    bad.write_text("".join(lines[:500]) + "not json\n" + "".join(lines[500:]))
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"b\.jsonl, line 501: not JSON"):
        tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=9000)
    assert tokenized.load(out)["shards"]  # it had written shards of a.txt before it failed
    bad.write_text(good)
    tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=9000)
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean, shard_tokens=9000)
    assert hashes(out) == hashes(clean)


def test_another_jobs_output_is_replaced_only_with_overwrite(tmp_path, tokenizer_file, inputs):
    out = tmp_path / "out"
    tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=9000)
    with pytest.raises(ValueError, match="differs in shard_tokens.*--overwrite"):
        tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=5000)
    base = ["tokenize", *inputs, "--tokenizer", str(tokenizer_file), "--quiet"]
    code, _, stderr = run(*base, "--output", str(out), "--shard-tokens", "5000")
    assert code == 1 and "--overwrite" in stderr
    code, _, stderr = run(*base, "--output", str(out), "--shard-tokens", "5000", "--overwrite")
    assert code == 0, stderr
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean, shard_tokens=5000)
    assert hashes(out) == hashes(clean)
    (out / "notes.txt").write_text("not a tokenize output any more")
    (out / tokenized.MANIFEST).unlink()
    with pytest.raises(ValueError, match="is not empty"):
        tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=5000, overwrite=True)
    assert (out / "notes.txt").exists()


# ---------------------------------------------------------------------------------------------
# Progress


def test_progress_counts_over_all_inputs_with_rate_and_eta(
    tmp_path, tokenizer_file, inputs, monkeypatch
):
    monkeypatch.setattr(job, "BATCH_DOCUMENTS", 200)
    messages = []
    tokenize_files(
        inputs, str(tokenizer_file), tmp_path / "out", progress=lambda m, _: messages.append(m)
    )
    shares = [float(re.match(r"tokenize: ([\d.]+)%", m).group(1)) for m in messages]
    assert len(shares) == 15 and shares == sorted(shares) and shares[-1] == 100.0
    assert all("MB/s" in m and "tokens/s" in m and "ETA" in m for m in messages[1:])
    assert f"{len(TEXTS):,} documents" in messages[-1]


def test_a_log_gets_progress_lines_before_the_first_shard_and_periodically(
    tmp_path, tokenizer_file, inputs, monkeypatch
):
    monkeypatch.setattr(job, "BATCH_DOCUMENTS", 500)
    monkeypatch.setattr(progress, "LOG_SECONDS", 0.0)
    base = ["tokenize", *inputs, "--tokenizer", str(tokenizer_file)]
    code, _, stderr = run(*base, "--output", str(tmp_path / "log"))  # one shard, at the end
    assert code == 0, stderr
    lines = stderr.splitlines()
    assert len(lines) == 7 and all("0 shards written" in line for line in lines)
    assert "\r" not in stderr and all("ETA" in line for line in lines[1:])
    monkeypatch.setattr(progress, "LOG_SECONDS", 3600.0)
    code, _, stderr = run(*base, "--output", str(tmp_path / "hourly"), "--shard-tokens", "9000")
    lines = stderr.splitlines()
    assert code == 0 and "0 shards written" in lines[0]  # the first update is always a line
    written = [int(re.search(r"(\d+) shards written", line).group(1)) for line in lines]
    assert len(written) > 2 and written == sorted(set(written))  # then one per shard written
