"""tokstream tokenize's output directory: claimed safely, locked, resumable shard by shard.

Real processes throughout: a second run is tried while another holds the directory, and runs
are killed (SIGKILL) at random points and run again; every file of the finished directory must
then be byte for byte that of a run never interrupted.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import byte_level_bpe
from tokstream import cli, open_tokens
from tokstream.formats import tokenized
from tokstream.tokenize import engines, output, tokenize_files
from tokstream.tokenize import job as tokenize_job
from tokstream.tokenize.output import WRITERS, RunSuperseded, writing

pytest.importorskip("tokenizers")

TEXTS = [f"text {i}: {'lorem ipsum ' * (i % 7)}dolor {i * 13} sit amet" for i in range(3000)]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    return byte_level_bpe(TEXTS[:500], path, vocab_size=350)


def write_inputs(directory: Path) -> list[str]:
    """A text file and a JSON Lines file of :data:`TEXTS` in ``directory/in``."""
    (directory / "in").mkdir()
    (directory / "in" / "a.txt").write_text("\n".join(TEXTS[:1800]))
    (directory / "in" / "b.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in TEXTS[1800:])
    )
    return [str(directory / "in" / "a.txt"), str(directory / "in" / "b.jsonl")]


@pytest.fixture
def inputs(tmp_path) -> list[str]:
    return write_inputs(tmp_path)


def hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


# A run in another process: after ``hold_after`` progress milestones (the first at the start,
# then one per shard made) it says "holding" and waits, up to 600 s or until SIGUSR1 (so that the
# test can try a second run, kill it, or kill its cluster, while it holds the directory); it
# prints "go" once imported (and connected to the Ray at ``address``), so a kill lands in the
# job, not in the imports; each milestone goes to stderr with the seconds since "go".
# ``engine`` and ``address`` choose where its shards are made; the environment's STALL, Ray's
# stall limit.
CHILD = """
import os, signal, sys, threading, time
from tokstream.tokenize import engines, tokenize_files
engines.STALL_SECONDS = float(os.environ.get("STALL", engines.STALL_SECONDS))
hold_after = int(sys.argv[4])
calls = []
resume = threading.Event()
signal.signal(signal.SIGUSR1, lambda *_: resume.set())
def progress(message, milestone):
    if not milestone:  # progress within a shard
        return
    calls.append(message)
    print(f"{time.perf_counter() - began:.3f}", message, file=sys.stderr, flush=True)
    if len(calls) == hold_after:
        print("holding", flush=True)
        resume.wait(600)
if sys.argv[5] == "ray" and sys.argv[6]:  # connected before "go": kills land in the job
    import ray
    ray.init(address=sys.argv[6], log_to_driver=False, configure_logging=False)
print("go", flush=True)
began = time.perf_counter()
tokenize_files(sys.argv[3].split(","), sys.argv[1], sys.argv[2], shard_bytes=10000,
               engine=sys.argv[5], ray_address=sys.argv[6] or None, workers=int(sys.argv[7]),
               progress=progress)
print("done", flush=True)
"""


def start_child(
    tokenizer_file, out, inputs, engine="local", address="", workers=1, hold_after=0, stall=None
) -> subprocess.Popen:
    argv = [str(tokenizer_file), str(out), ",".join(inputs), str(hold_after), engine, address]
    argv.append(str(workers))
    environment = dict(os.environ, **({} if stall is None else {"STALL": str(stall)}))
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
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
    tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=30000)
    clean = hashes(out)
    leftover = out / ".shard_000001.npy.0123456789abcdef.tmp"
    leftover.write_bytes(b"half a shard")
    (out / ".mine.tmp").write_text("the user's")
    tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=30000)
    assert not leftover.exists() and (out / ".mine.tmp").read_text() == "the user's"
    (out / ".mine.tmp").unlink()
    assert hashes(out) == clean


def test_a_second_run_into_a_directory_being_written_is_refused(tmp_path, tokenizer_file, inputs):
    out = tmp_path / "out"
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean, shard_bytes=10000)
    child = start_child(tokenizer_file, out, inputs, hold_after=3)
    try:
        wait_for(child, "go")
        wait_for(child, "holding")
        before = hashes(out)
        with pytest.raises(ValueError, match="being written by another tokstream tokenize"):
            tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=30000)
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
    result = tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=10000, workers=2)
    assert result.resumed_documents > 0  # the two shards made before it held
    assert hashes(out) == hashes(clean)


# ---------------------------------------------------------------------------------------------
# Resumable shard by shard; byte-identical whatever the interruptions


def test_an_interrupt_keeps_the_shards_made_before_it(tmp_path, tokenizer_file, inputs):
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean, shard_bytes=10000)
    out = tmp_path / "out"
    calls = []

    def interrupt_after_four_shards(message: str, milestone: bool) -> None:
        if milestone:
            calls.append(message)
        if len(calls) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_files(
            inputs,
            str(tokenizer_file),
            out,
            shard_bytes=10000,
            progress=interrupt_after_four_shards,
        )
    assert not tokenized.load(out)["complete"] and "4 shards written" in calls[-1]
    made = sorted(p.name for p in out.glob("shard_*.documents.npy"))
    assert len(made) == 4  # the largest ranges first, whichever they are
    result = tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=10000)
    assert result.resumed_documents == sum(np.load(out / name).shape[0] - 1 for name in made)
    assert result.documents == len(TEXTS)
    assert hashes(out) == hashes(clean)


@pytest.mark.parametrize("stop", ["before the record is removed", "before the contents"])
def test_a_run_stopped_after_marking_its_directory_complete_is_finished_by_a_rerun(
    tmp_path, tokenizer_file, inputs, monkeypatch, stop
):
    """The window a kill can land in between the manifest marked complete and the job's last
    steps (its record removed, ``manifest.json`` written): a rerun leaves the directory a clean
    run's, file for file."""
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean, shard_bytes=10000)
    out = tmp_path / "out"
    stopped = output.Output._close_record if "record" in stop else output._write_contents

    def killed(*args):  # once: the run's own clean-up goes on as usual
        patch.undo()
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(stopped.__module__ + "." + stopped.__qualname__, killed)
        with pytest.raises(KeyboardInterrupt):
            tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=10000)
    assert tokenized.load(out)["complete"] and not (out / "manifest.json").exists()
    assert (out / output.FINISHED).exists() == ("record" in stop)
    result = tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=10000)
    assert result.resumed_documents == result.documents == len(TEXTS)
    assert hashes(out) == hashes(clean)


def killed_and_finished(tmp_path, tokenizer_file, inputs, trials, engine, address="") -> int:
    """``trials`` directories each made by runs of ``engine`` SIGKILLed at random points of the
    job, then finished (by the local engine, or every other Ray trial on the same cluster); each
    must equal a clean local run's, file for file. The shards the kills had left made, in all."""
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean, shard_bytes=10000)
    want = hashes(clean)
    shards = len([name for name in want if name.endswith(".documents.npy")])
    assert shards > 10
    rng = random.Random(1234)
    resumed = 0
    for trial in range(trials):
        out = tmp_path / f"trial_{trial}"
        workers = 1 + trial % 2
        for _ in range(rng.randint(1, 2)):
            child = start_child(tokenizer_file, out, inputs, engine, address, workers)
            wait_for(child, "go")
            # A random point of the job: after its k-th progress message (the first comes
            # before any shard, so k = 0 lands in the start-up), then up to 0.3 s more.
            # Timed kills would mostly land in the start-up, whose length varies by more than
            # the time these few shards take.
            k = rng.randint(0, shards - 1)
            seen = 0
            for line in child.stderr:  # until the job's k-th message, or its end
                seen += "shards written" in line
                if seen > k:
                    break
            time.sleep(rng.uniform(0, 0.3))
            child.send_signal(signal.SIGKILL)
            child.wait()
            child.stdout.close()
            child.stderr.close()
        made = len(list(out.glob("shard_*.documents.npy"))) if out.is_dir() else 0
        if engine == "ray" and trial % 2:  # finished on the same cluster
            child = start_child(tokenizer_file, out, inputs, engine, address, workers)
            # Its progress lines are read as it runs: a pipe nobody reads would block it.
            _, progress_lines = child.communicate(timeout=300)
            assert child.returncode == 0, progress_lines
        else:  # finished by the local engine
            tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=10000, workers=workers)
        resumed += made
        assert hashes(out) == want, trial
        assert documents_count(out) == len(TEXTS)
    return resumed


def test_runs_killed_at_random_points_finish_byte_identical(tmp_path, tokenizer_file, inputs):
    assert killed_and_finished(tmp_path, tokenizer_file, inputs, 10, "local") > 0


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
        tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=30000)
    assert not tokenized.load(out)["complete"]  # the failed run's record is left
    bad.write_text(good)
    tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=30000)
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean, shard_bytes=30000)
    assert hashes(out) == hashes(clean)


def test_another_jobs_output_is_replaced_only_with_overwrite(tmp_path, tokenizer_file, inputs):
    out = tmp_path / "out"
    tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=30000)
    with pytest.raises(ValueError, match="differs in shard_bytes.*--overwrite"):
        tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=17000)
    base = ["tokenize", *inputs, "--tokenizer", str(tokenizer_file), "--quiet"]
    code, _, stderr = run(*base, "--output", str(out), "--shard-bytes", "17000")
    assert code == 1 and "--overwrite" in stderr
    code, _, stderr = run(*base, "--output", str(out), "--shard-bytes", "17000", "--overwrite")
    assert code == 0, stderr
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean, shard_bytes=17000)
    assert hashes(out) == hashes(clean)
    (out / "notes.txt").write_text("not a tokenize output any more")
    (out / tokenized.MANIFEST).unlink()
    with pytest.raises(ValueError, match="is not empty"):
        tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=17000, overwrite=True)
    assert (out / "notes.txt").exists()


# ---------------------------------------------------------------------------------------------
# Progress


def test_progress_counts_over_all_inputs_with_rate_and_eta(tmp_path, tokenizer_file, inputs):
    messages = []

    def progress(message: str, milestone: bool) -> None:
        if milestone:
            messages.append(message)

    tokenize_files(
        inputs, str(tokenizer_file), tmp_path / "out", shard_bytes=10000, progress=progress
    )
    shares = [float(re.match(r"tokenize: ([\d.]+)%", m).group(1)) for m in messages]
    shards = len(list((tmp_path / "out").glob("shard_*.documents.npy")))
    assert len(shares) == shards + 1 and shares == sorted(shares) and shares[-1] == 100.0
    assert all(
        "MB/s" in m and "documents/s" in m and "tokens/s" in m and "ETA" in m for m in messages[1:]
    )
    assert f"{len(TEXTS):,} documents" in messages[-1]


def test_a_terminal_gets_a_bar_of_the_share_and_a_log_plain_lines():
    from tokstream._progress import BAR_WIDTH, Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal, log = Terminal(), io.StringIO()
    for stream in (terminal, log):
        shown = Progress(stream)
        shown.update("tokenize: 50.0% | 10 documents, 20 tokens, 0 shards written")
        shown.update("tokenize: 100.0% | 20 documents, 40 tokens, 1 shards written", final=True)
        shown.done()
    half = "#" * (BAR_WIDTH // 2) + "." * (BAR_WIDTH // 2)
    assert terminal.getvalue().startswith(f"\r[{half}] tokenize: 50.0% |")
    assert f"\r[{'#' * BAR_WIDTH}] tokenize: 100.0% |" in terminal.getvalue()
    assert log.getvalue() == "tokenize: 100.0% | 20 documents, 40 tokens, 1 shards written\n"


def test_a_parquet_inputs_progress_rises_row_by_row(tmp_path, tokenizer_file):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "one_group.parquet"
    pq.write_table(pa.table({"text": TEXTS[:3000]}), path, row_group_size=3000)
    shown = []
    tokenize_files(
        [str(path)],
        str(tokenizer_file),
        tmp_path / "out",
        progress=lambda message, milestone: shown.append(counts(message)[0]),
    )
    # Batches of 1,000 rows of one row group: a third, two thirds, all of it.
    within = [share for share in shown if 0 < share < 100]
    assert len(within) >= 2 and within == sorted(within), shown
    assert 20 < within[0] < 50 and 50 < within[1] < 80, shown


def test_a_log_gets_a_progress_line_at_the_start_and_per_shard(tmp_path, tokenizer_file, inputs):
    base = ["tokenize", *inputs, "--tokenizer", str(tokenizer_file)]
    code, _, stderr = run(*base, "--output", str(tmp_path / "log"), "--shard-bytes", "30000")
    assert code == 0, stderr
    lines = stderr.splitlines()
    assert "\r" not in stderr and "0 shards written" in lines[0]
    written = [int(re.search(r"(\d+) shards written", line).group(1)) for line in lines]
    assert len(written) > 2 and written == list(range(len(written)))
    assert all("ETA" in line for line in lines[1:])


def counts(message: str) -> tuple[float, int, int, int]:
    """The share, documents, tokens and shards written a progress message shows."""
    found = re.match(
        r"tokenize: ([\d.]+)% \| ([\d,]+) documents, ([\d,]+) tokens, (\d+) shards", message
    )
    assert found, message
    share, documents, tokens, shards = found.groups()
    return float(share), int(documents.replace(",", "")), int(tokens.replace(",", "")), int(shards)


@pytest.mark.parametrize(("shard_bytes", "workers"), [(10**9, 1), (10**9, 2), (30000, 2)])
def test_progress_within_a_shard_counts_each_batch_of_documents(
    tmp_path, tokenizer_file, inputs, shard_bytes, workers
):
    """Between milestones, the running tasks report after each batch of documents they encode
    (in this process or through the pool), and every count only grows."""
    messages = []
    result = tokenize_files(
        inputs,
        str(tokenizer_file),
        tmp_path / "out",
        shard_bytes=shard_bytes,
        workers=workers,
        progress=lambda message, milestone: messages.append((message, milestone)),
    )
    shown = [counts(message) for message, _ in messages]
    assert shown == sorted(shown)  # share, documents, tokens, shards: never backwards
    assert shown[-1] == (100.0, len(TEXTS), result.tokens, result.shards)
    milestones = [c for c, (_, milestone) in zip(shown, messages, strict=True) if milestone]
    assert [c[3] for c in milestones] == list(range(result.shards + 1))
    if result.shards == 1:  # one shard of 3,000 documents: encoded in batches of 1,000
        within = [c for c, (_, milestone) in zip(shown, messages, strict=True) if not milestone]
        assert [c[1] for c in within][:2] == [1000, 2000] and all(c[3] == 0 for c in within)
        assert 0 < within[0][0] < within[1][0] < 100.0 and 0 < within[0][2] < within[1][2]


def test_the_largest_ranges_are_made_first(tmp_path, tokenizer_file):
    """Ranges are the same size but where a file is never cut: a .gz makes a range of its own
    size, and the largest is made first whatever its place in the inputs."""
    sizes = [200, 1500, 600]
    paths = []
    for i, lines in enumerate(sizes):
        path = tmp_path / f"{i}.txt.gz"
        path.write_bytes(gzip.compress("\n".join(TEXTS[:lines]).encode(), mtime=0))
        paths.append(str(path))
    order = []

    def progress(message: str, milestone: bool) -> None:
        if milestone and counts(message)[3]:
            order.append(counts(message)[1])  # the documents made so far

    tokenize_files(paths, str(tokenizer_file), tmp_path / "out", shard_bytes=100, progress=progress)
    assert order == [1500, 2100, 2300]


def test_a_killed_jobs_pool_workers_end_with_it(tmp_path, tokenizer_file, inputs):
    """SIGKILL gives a job no chance to stop its pool: its spawned workers notice and end."""
    child = start_child(tokenizer_file, tmp_path / "out", inputs, workers=2, hold_after=1)
    workers = sigkilled_while_holding(child, children_of)
    assert len(workers) >= 2  # the pool's 2 workers (and the resource tracker)
    wait_until_gone(workers, 120)


def test_a_pool_worker_that_starts_after_its_job_died_ends_before_any_task():
    """Spawned just before its job was killed, a worker starts adopted by another process: it
    must not take that one for its job and run a task the dead job queued (a shard's temporary
    file was left behind after a rerun's clean-up, once in 10 kill trials)."""
    start = (
        "import os, sys; from tokstream.tokenize import engines; "
        "engines._start_worker('no tokenizer', None, int(sys.argv[1])); print('started')"
    )
    # Its job is this process, or (adopted) another one.
    for job, code, printed in [(os.getpid(), 0, "started\n"), (os.getppid(), 1, "")]:
        ran = subprocess.run(
            [sys.executable, "-c", start, str(job)], capture_output=True, text=True, timeout=120
        )
        assert (ran.returncode, ran.stdout) == (code, printed), ran.stderr


def sigkilled_while_holding(child: subprocess.Popen, processes_of) -> list[int]:
    """Once ``child`` (from :func:`start_child` with ``hold_after``) holds, the processes
    ``processes_of(child.pid)`` finds, then SIGKILL for the child."""
    try:
        wait_for(child, "go")
        wait_for(child, "holding")  # its workers are up and a shard made
        processes = processes_of(child.pid)
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        child.stderr.close()
    return processes


def wait_until_gone(pids: list[int], seconds: float) -> None:
    """Return once none of ``pids`` runs; fail after ``seconds`` (a hang guard)."""
    deadline = time.monotonic() + seconds
    while left := [pid for pid in pids if Path(f"/proc/{pid}").exists()]:
        assert time.monotonic() < deadline, left
        time.sleep(0.2)


def descendants_of(pid: int) -> list[int]:
    """Every process below ``pid`` (its children, theirs, ...), from /proc."""
    found, last = [], [pid]
    while last:
        last = [child for parent in last for child in children_of(parent)]
        found += last
    return found


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


# A worker of a killed run, still writing: it holds the output's writers' lock, says "holding",
# then writes a temporary shard file a moment later and ends.
WRITER = """
import sys, time
from pathlib import Path
from tokstream.tokenize.output import WRITERS, writing
# A worker of a killed run that owned the directory (its token in the writers' file).
(Path(sys.argv[1]) / WRITERS).write_text("0123456789abcdef")
with writing(sys.argv[1], "0123456789abcdef"):
    print("holding", flush=True)
    time.sleep(1)
    (Path(sys.argv[1]) / ".shard_000003.npy.0123456789abcdef.tmp").write_bytes(b"half a shard")
"""


def test_a_task_of_a_run_that_no_longer_owns_the_directory_writes_nothing(
    tmp_path, tokenizer_file, inputs
):
    """While a run owns the directory, the writers' file holds its token, and a task with any
    other token (a killed run's, started late by its pool or Ray) is refused before it writes;
    the run's end empties the file."""
    out = tmp_path / "out"
    seen = []

    def during_the_run(message: str, milestone: bool) -> None:
        if seen:
            return
        token = (out / WRITERS).read_text()
        assert re.fullmatch(r"[0-9a-f]{16}", token)
        for stale in ("0123456789abcdef", ""):
            with pytest.raises(RunSuperseded, match="writes nothing"), writing(out, stale):
                pytest.fail("a stale task ran")
        with writing(out, token):
            seen.append(token)

    tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=10000, progress=during_the_run)
    assert seen and (out / WRITERS).read_text() == ""
    # A task of the finished run, or of any other, writes nothing now.
    before = hashes(out)
    task = replace(engines_tasks(out, tokenizer_file, inputs)[0], run=seen[0])
    with pytest.raises(RunSuperseded):
        engines._run_on_ray(task, None)
    assert hashes(out) == before


def engines_tasks(out, tokenizer_file, inputs) -> list:
    """The tasks a run of ``inputs`` into ``out`` would hand its engine."""
    job = tokenized.load(out)["job"]
    return tokenize_job._tasks([Path(p) for p in inputs], job, out, str(tokenizer_file))


def test_a_new_run_waits_for_a_killed_runs_workers_before_cleaning_up(
    tmp_path, tokenizer_file, inputs
):
    """Files a killed run's worker is still writing are removed only once it has stopped."""
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean, shard_bytes=10000)
    out = tmp_path / "out"

    def interrupt_after_two_shards(message: str, milestone: bool) -> None:
        if milestone and "2 shards written" in message:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_files(
            inputs, str(tokenizer_file), out, shard_bytes=10000, progress=interrupt_after_two_shards
        )
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        wait_for(writer, "holding")
        tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=10000, workers=2)
        assert writer.wait(timeout=60) == 0
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
    assert hashes(out) == hashes(clean)
