"""tokstream tokenize's engines: the same bytes from every engine and number of workers.

The Ray tests start a real local Ray (skipped without ray installed), embedded by the job
itself: started for it and stopped after it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import byte_level_bpe
from tests.test_tokenize_resume import (
    counts,
    descendants_of,
    killed_and_finished,
    sigkilled_while_holding,
    start_child,
    wait_for,
    wait_until_gone,
    write_inputs,
)
from tokstream import cli
from tokstream.tokenize import engines, tokenize_files
from tokstream.tokenize.encoders import Encoder
from tokstream.tokenize.output import WRITERS
from tokstream.tokenize.task import Task

pytest.importorskip("tokenizers")

#: Kill-and-resume trials on a Ray cluster (CI makes fewer: each costs a few Ray drivers).
RAY_KILL_TRIALS = int(os.environ.get("TOKSTREAM_RAY_KILL_TRIALS", "10"))

TEXTS = [f"text {i}: {'lorem ipsum ' * (i % 7)}dolor {i * 13} sit amet" for i in range(2000)]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    return byte_level_bpe(TEXTS[:500], path, vocab_size=350)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    directory = tmp_path_factory.mktemp("inputs")
    (directory / "a.txt").write_text("\n".join(TEXTS[:1200]))
    (directory / "b.txt").write_text("\n".join(TEXTS[1200:]))
    return [str(directory / "a.txt"), str(directory / "b.txt")]


@pytest.fixture(scope="module")
def local_hashes(tmp_path_factory, tokenizer_file, inputs) -> dict[str, str]:
    out = tmp_path_factory.mktemp("local") / "out"
    tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=20000)
    return hashes(out)


def hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"engine": "spark"}, r"engine must be one of \('local', 'ray'\), got 'spark'"),
        ({"engine": "local", "ray_address": "127.0.0.1:6379"}, "--ray-address"),
    ],
)
def test_an_unknown_engine_is_one_error_and_writes_nothing(
    tmp_path, tokenizer_file, inputs, options, message
):
    with pytest.raises(ValueError, match=message):
        tokenize_files(inputs, str(tokenizer_file), tmp_path / "out", **options)
    assert not (tmp_path / "out").exists()
    argv = ["--engine", options["engine"]]
    if "ray_address" in options:
        argv += ["--ray-address", options["ray_address"]]
    code, _, stderr = run(
        "tokenize",
        *inputs,
        "--tokenizer",
        str(tokenizer_file),
        "--output",
        str(tmp_path / "o"),
        *argv,
    )
    assert code == 1 and stderr.count("\n") == 1 and "engine" in stderr, stderr
    assert not (tmp_path / "o").exists()


def test_the_local_engine_gives_the_same_bytes_for_any_number_of_workers(
    tmp_path, tokenizer_file, inputs, local_hashes
):
    for workers in (2, 3):
        out = tmp_path / f"out_{workers}"
        tokenize_files(inputs, str(tokenizer_file), out, shard_bytes=20000, workers=workers)
        assert hashes(out) == local_hashes


def test_an_engine_keeps_at_most_its_limit_of_tasks_submitted_however_often_it_wakes():
    """The engines wake every half second to pass progress on: a wake-up with ``limit`` tasks
    running submits none (Ray would run them all at once, past ``workers``)."""
    waiting = iter(range(10))
    running: dict = {}
    submitted = []

    def submit(task):
        submitted.append(task)
        return f"handle {task}"

    for _ in range(3):
        engines.fill(running, waiting, 2, submit)
    assert submitted == [0, 1] and running == {"handle 0": 0, "handle 1": 1}
    del running["handle 0"]  # one done
    for _ in range(3):
        engines.fill(running, waiting, 2, submit)
    assert submitted == [0, 1, 2] and len(running) == 2
    for handle in list(running):
        del running[handle]
        engines.fill(running, waiting, 2, submit)
    assert submitted == [0, 1, 2, 3, 4]


def test_the_local_pool_starts_every_worker_before_the_first_task(tokenizer_file):
    """Its workers import tokstream and load the tokenizer while the job plans, not after."""
    before = set(multiprocessing.active_children())
    with contextlib.ExitStack() as stack:
        engines.start(stack, "local", Encoder(str(tokenizer_file)), 3, None)
        started = set(multiprocessing.active_children()) - before
        assert len(started) == 3 and all(process.is_alive() for process in started)
    assert not set(multiprocessing.active_children()) - before


# ---------------------------------------------------------------------------------------------
# Ray


def test_an_unreachable_ray_address_is_one_error_and_writes_nothing(
    tmp_path, tokenizer_file, inputs
):
    pytest.importorskip("ray")
    with pytest.raises(ValueError, match=r"ray address '127\.0\.0\.1:1' .*unreachable"):
        tokenize_files(
            inputs, str(tokenizer_file), tmp_path / "out", engine="ray", ray_address="127.0.0.1:1"
        )
    assert not (tmp_path / "out").exists()
    code, _, stderr = run(
        "tokenize",
        *inputs,
        "--tokenizer",
        str(tokenizer_file),
        "--output",
        str(tmp_path / "o"),
        "--engine",
        "ray",
        "--ray-address",
        "127.0.0.1:1",
    )
    assert code == 1 and stderr.count("\n") == 1 and "--ray-address" in stderr, stderr
    assert not (tmp_path / "o").exists()


def test_an_embedded_ray_gives_the_local_bytes_and_is_stopped(
    tmp_path, tokenizer_file, inputs, local_hashes
):
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    out = tmp_path / "out"
    messages = []
    result = tokenize_files(
        inputs,
        str(tokenizer_file),
        out,
        shard_bytes=20000,
        engine="ray",
        workers=2,
        progress=lambda message, milestone: messages.append(message),
    )
    assert not ray.is_initialized()
    assert hashes(out) == local_hashes
    # Counts from the tasks' actor and from the shards made never go backwards.
    shown = [counts(message) for message in messages]
    assert shown == sorted(shown)
    assert shown[-1] == (100.0, len(TEXTS), result.tokens, result.shards)


def test_a_ray_task_reports_its_batches_to_the_jobs_actor(tmp_path, tokenizer_file):
    """A Ray task sends its counts after each batch, without waiting, to the job's actor; the
    last it sends are the shard's own. The actor's process does not import tokstream."""
    ray = pytest.importorskip("ray")
    path = tmp_path / "in.txt"
    path.write_text("\n".join(TEXTS + TEXTS))  # 4,000 documents: batches of 1,000
    # The directory a run owns: its token in the writers' file, the task's own.
    (tmp_path / WRITERS).write_text("feedfacecafebeef")
    task = Task(7, ((0, 0, path.stat().st_size),), path.stat().st_size, ((0, str(path)),),
                str(tmp_path), str(tokenizer_file), 0, "npy", "uint16", "text", False,
                "feedfacecafebeef")  # fmt: skip
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        tally = ray.remote(num_cpus=0)(engines.tally_class()).remote()
        entry = ray.get(ray.remote(engines._run_on_ray).remote(task, tally), timeout=300)
        latest: dict[int, tuple[int, int, int]] = {}
        deadline = time.monotonic() + 300  # a hang guard: the sends are on their way
        while latest.get(7, (0,))[0] < entry["documents"]:
            assert time.monotonic() < deadline, latest
            latest.update(ray.get(tally.take.remote(), timeout=300))
        assert latest == {7: (entry["documents"], entry["tokens"], task.size)}
        # Sent by value: the actor's process (one per job) never imports tokstream.
        assert not ray.get(tally.__ray_call__.remote(lambda _: "tokstream" in sys.modules))
    finally:
        ray.shutdown()


def test_an_embedded_ray_ends_with_a_killed_job(tmp_path, tokenizer_file, inputs):
    """SIGKILL gives a job no chance to stop the Ray it started: every process of that Ray
    (GCS, raylet, agents, workers) ends by itself soon after (the agents after Ray's 60 s)."""
    pytest.importorskip("ray")
    child = start_child(tokenizer_file, tmp_path / "out", inputs, engine="ray", hold_after=2)
    ray_processes = sigkilled_while_holding(child, descendants_of)
    assert len(ray_processes) >= 3, ray_processes  # GCS, raylet, a worker at least
    wait_until_gone(ray_processes, 300)


def test_ray_finishes_an_interrupted_run_with_the_local_bytes(
    tmp_path, tokenizer_file, inputs, local_hashes
):
    pytest.importorskip("ray")
    out = tmp_path / "stopped"
    calls = []

    def stop_after_two_shards(message: str, milestone: bool) -> None:
        if milestone:
            calls.append(message)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_files(
            inputs,
            str(tokenizer_file),
            out,
            shard_bytes=20000,
            engine="ray",
            workers=1,
            progress=stop_after_two_shards,
        )
    made = sorted(p.name for p in out.glob("shard_*.documents.npy"))
    assert len(made) == 2  # the largest ranges first, whichever they are
    result = tokenize_files(
        inputs, str(tokenizer_file), out, shard_bytes=20000, engine="ray", workers=3
    )
    assert result.resumed_documents == sum(np.load(out / name).shape[0] - 1 for name in made)
    assert hashes(out) == local_hashes


# ---------------------------------------------------------------------------------------------
# A Ray cluster the caller started (``ray start --head``), in processes of its own


@pytest.fixture
def ray_head(tmp_path, monkeypatch):
    """A Ray head started as a user would (``ray start --head --block``), in a process group of
    its own that the fixture ends; its address on 127.0.0.1, its process, its directory.

    Token authentication is off for it and for the processes the test starts (they inherit this
    environment): the token a head makes lives in the user's home, shared by every Ray here.
    """
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray_command = Path(sys.executable).with_name("ray")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # A short directory: Ray's unix socket paths must stay under about 100 characters.
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    log = open(tmp_path / "ray_head.log", "w")
    head = subprocess.Popen(
        [
            str(ray_command),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (tmp_path / "ray_head.log").read_text():
            assert head.poll() is None, (tmp_path / "ray_head.log").read_text()
            assert time.monotonic() < deadline, "the Ray head did not start in 120 s"
            time.sleep(0.5)
        yield address, head, temp
    finally:
        stop_group(head)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def stop_group(process: subprocess.Popen) -> None:
    """End ``process`` and everything it started in its process group."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


def test_a_caller_started_ray_runs_the_job_at_its_address(
    tmp_path, tokenizer_file, inputs, local_hashes, ray_head
):
    address, head, temp = ray_head
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokstream",
            "tokenize",
            *inputs,
            "--tokenizer",
            str(tokenizer_file),
            "--output",
            str(out),
            "--shard-bytes",
            "20000",
            "--engine",
            "ray",
            "--ray-address",
            address,
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert hashes(out) == local_hashes
    # The job was a driver of that cluster (its log is in the cluster's session), which is up.
    logs = temp / "session_latest" / "logs"
    assert list(logs.glob("python-core-driver-*")), sorted(p.name for p in logs.iterdir())
    assert head.poll() is None


def test_ray_runs_killed_at_random_points_finish_byte_identical(tmp_path, tokenizer_file, ray_head):
    address, _, _ = ray_head
    inputs = write_inputs(tmp_path)
    assert (
        killed_and_finished(tmp_path, tokenizer_file, inputs, RAY_KILL_TRIALS, "ray", address) > 0
    )


def test_a_dead_cluster_is_an_error_not_a_hang(tmp_path, tokenizer_file, ray_head):
    address, head, temp = ray_head
    inputs = write_inputs(tmp_path)
    child = start_child(
        tokenizer_file,
        tmp_path / "out",
        inputs,
        engine="ray",
        address=address,
        workers=2,
        hold_after=2,
        stall=10,
    )
    try:
        wait_for(child, "go")
        wait_for(child, "holding")  # the first shard is made; the cluster dies
        stop_group(head)
        child.send_signal(signal.SIGUSR1)  # let the job go on, now against a dead cluster
        code = child.wait(timeout=240)
    finally:
        child.kill()
        child.wait()
    stderr = child.stderr.read()
    child.stdout.close()
    child.stderr.close()
    # Waiting on its tasks, the job gives up after the stall limit; caught submitting one, Ray
    # itself ends the driver once its cluster has been gone for 60 s. Either way, no hang.
    timed_out = "TimeoutError: Ray at" in stderr and "made no shard in 10 s" in stderr
    assert code == 1 and (timed_out or "Failed to connect to GCS within 60 seconds" in stderr)
    # What the dead cluster had made stays made; the local engine finishes the job.
    clean = tmp_path / "clean"
    tokenize_files(inputs, str(tokenizer_file), clean, shard_bytes=10000)
    result = tokenize_files(inputs, str(tokenizer_file), tmp_path / "out", shard_bytes=10000)
    assert result.resumed_documents > 0 and hashes(tmp_path / "out") == hashes(clean)
