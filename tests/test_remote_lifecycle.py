"""What a remote stream leaves behind: after ``close()`` or a Ctrl-C mid-flight, no thread and no
connection; after a run, no file anywhere but the cache directory it was given.

Connections are counted by the fault proxy in front of moto's S3 server (the client's side of
each TCP connection is the proxy's client), threads by ``threading.enumerate()``, files written
by ``strace`` on a child process (where strace runs) and by the directories a library would use.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import tokstream
from tests.remote_cases import (
    as_list,
    assert_same,
    documents,
    open_remote,
    require_remote,
    uploaded_npy,
)

remote = require_remote()

DOCS = documents(count=12, seed=33)


@pytest.fixture
def files(proxied_bucket, tmp_path):
    local, url = uploaded_npy(proxied_bucket, tmp_path, DOCS)
    return tokstream.open_tokens(str(local)), url


def new_threads(before: set[threading.Thread], seconds: float = 10.0) -> list[str]:
    """The threads started since ``before`` still alive after up to ``seconds``."""
    end = time.monotonic() + seconds
    while True:
        # Python threads only: a thread of the client's own runtime (obstore's process-wide
        # Rust pool) that once called back into Python shows as a _DummyThread for good.
        alive = [
            t.name
            for t in threading.enumerate()
            if t not in before and t.is_alive() and not isinstance(t, threading._DummyThread)
        ]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.02)


def stream(corpus, seed=2, **options):
    return tokstream.stream_token_source(corpus, 16, 32, seed=seed, **options)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_close_mid_flight_leaves_no_thread_and_no_connection(files, proxied_bucket, prefetch):
    local, url = files
    before, ports = set(threading.enumerate()), proxied_bucket.proxy.ports()
    corpus = open_remote(url)
    # Slow requests: the stream has range GETs in flight when it is closed.
    proxied_bucket.proxy.configure(delay_ms=300)
    far = stream(corpus, prefetch=prefetch)
    first = next(far)
    assert_same([first], [next(stream(local))])
    assert proxied_bucket.proxy.ports() - ports, "no request in flight"
    far.close()
    assert new_threads(before) == []
    assert proxied_bucket.proxy.wait_until_no_connection(besides=ports) == []


def test_a_stream_run_to_its_end_then_closed_leaves_no_thread_and_no_connection(
    files, proxied_bucket
):
    local, url = files
    before, ports = set(threading.enumerate()), proxied_bucket.proxy.ports()
    far = stream(open_remote(url), prefetch=1)
    assert_same(far, stream(local))
    far.close()
    assert new_threads(before) == []
    assert proxied_bucket.proxy.wait_until_no_connection(besides=ports) == []


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_stream_run_to_its_end_ends_its_thread_and_connections_without_close(
    files, proxied_bucket, prefetch
):
    local, url = files
    before, ports = set(threading.enumerate()), proxied_bucket.proxy.ports()
    far = stream(open_remote(url), prefetch=prefetch, epochs=2)
    assert_same(far, stream(local, epochs=2))
    assert new_threads(before) == []
    assert proxied_bucket.proxy.wait_until_no_connection(besides=ports) == []
    # Moved back, it fetches again, and ends again at its end.
    far.seek(1)
    assert_same(far, as_list(stream(local, epochs=2))[1:])
    assert new_threads(before) == []
    far.load_state_dict(stream(local).state_dict())
    assert_same(far, stream(local, epochs=2))
    assert new_threads(before) == []
    assert proxied_bucket.proxy.wait_until_no_connection(besides=ports) == []


def test_opening_alone_leaves_no_thread_and_no_connection(files, proxied_bucket):
    local, url = files
    before, ports = set(threading.enumerate()), proxied_bucket.proxy.ports()
    open_remote(url)
    assert new_threads(before) == []
    assert proxied_bucket.proxy.wait_until_no_connection(besides=ports) == []


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_ctrl_c_while_waiting_for_the_store_leaves_the_stream_whole(
    files, proxied_bucket, prefetch
):
    local, url = files
    before, ports = set(threading.enumerate()), proxied_bucket.proxy.ports()
    corpus = open_remote(url, timeout=30.0, deadline=60.0)
    expected = as_list(stream(local, epochs=2))
    far = stream(corpus, prefetch=prefetch, epochs=2)
    got = [next(far)]
    # From now on every token request hangs (1.5 s, then the connection closes): next() is
    # waiting on the store when SIGINT comes, as a Ctrl-C would.
    proxied_bucket.proxy.configure(rules=[{"action": "stall", "ms": 1500, "ranged": True}])
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            while True:
                got.append(next(far))
    finally:
        timer.join()
    # The store is well again: the stream goes on from the batch the interrupt stopped.
    proxied_bucket.proxy.configure()
    got.extend(far)
    assert_same(got, expected)
    far.close()
    assert new_threads(before) == []
    assert proxied_bucket.proxy.wait_until_no_connection(besides=ports) == []


CHILD = """
import json, sys, threading, tokstream
from tokstream.shards.remote import RemoteOptions
url, cache = sys.argv[1], sys.argv[2] or None
corpus = tokstream.open_tokens(url, remote=RemoteOptions(cache_dir=cache))
epochs = 10**6 if sys.argv[3] == "interrupt" else 2  # interrupted: still running at SIGINT
stream = tokstream.stream_token_source(corpus, 16, 32, seed=2, epochs=epochs, prefetch=2)
if sys.argv[3] == "interrupt":
    next(stream)
    try:  # the parent sends SIGINT as soon as it reads "ready": print it inside the try
        print("ready", flush=True)
        for batch in stream:
            pass
    except KeyboardInterrupt:
        stream.close()
        print(json.dumps(sorted(t.name for t in threading.enumerate())), flush=True)
        raise
else:
    print(sum(1 for _ in stream), flush=True)
"""


def run_child(tmp_path: Path, env: dict, *args: str, trace: Path | None = None, **popen):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    command = [sys.executable, str(script), *args]
    if trace is not None:
        calls = "open,openat,creat,mkdir,mkdirat,rename,renameat,renameat2,link,linkat,symlink"
        command = ["strace", "-f", "-qq", "-e", f"trace={calls}", "-o", str(trace), *command]
    with open(tmp_path / "child.stderr", "w") as stderr:
        return subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, **popen
        )


def read_line(child: subprocess.Popen, stderr: Path, seconds: float = 60.0) -> str:
    """The child's next line of output, or a failure naming its stderr after ``seconds`` (a
    child that never answers fails the test instead of hanging it)."""
    ready, _, _ = select.select([child.stdout], [], [], seconds)
    if not ready:
        raise AssertionError(f"no answer in {seconds} s; the child's stderr:\n{stderr.read_text()}")
    return child.stdout.readline()


def interrupt(child: subprocess.Popen, stderr: Path, seconds: float = 15.0) -> str:
    """Send the child a Ctrl-C and return its next line. Python drops a KeyboardInterrupt that
    lands inside a callback it cannot raise from (a weakref callback, a ``__del__``: reported as
    "Exception ignored"), and a user then presses Ctrl-C again: so does this, once."""
    child.send_signal(signal.SIGINT)
    ready, _, _ = select.select([child.stdout], [], [], seconds)
    if not ready and "KeyboardInterrupt" in stderr.read_text():
        child.send_signal(signal.SIGINT)
    return read_line(child, stderr)


def test_a_ctrl_c_in_a_training_process_ends_it_with_nothing_left_running(
    files, proxied_bucket, tmp_path
):
    local, url = files
    ports = proxied_bucket.proxy.ports()
    proxied_bucket.proxy.configure(delay_ms=100)
    child = run_child(
        tmp_path, {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, url, "", "interrupt"
    )
    stderr = tmp_path / "child.stderr"
    try:
        assert read_line(child, stderr).strip() == "ready"
        threads = json.loads(interrupt(child, stderr))
        code = child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    assert code != 0  # the KeyboardInterrupt ended it, as it would a training script
    assert threads == ["MainThread"]
    assert proxied_bucket.proxy.wait_until_no_connection(besides=ports) == []


WRITE_FLAGS = re.compile(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND")


def written_paths(trace: Path, cwd: Path) -> set[str]:
    """Every path the traced process opened for writing, created, renamed or linked."""
    paths = set()
    for line in trace.read_text().splitlines():
        call = re.match(r"^\d+\s+(open|creat|mkdir|rename|link|symlink)\w*\((.*)$", line)
        if not call:
            continue
        name, rest = call.groups()
        if re.search(r"= -1 E", rest) or (name == "open" and not WRITE_FLAGS.search(rest)):
            continue  # failed, or opened for reading
        for path in re.findall(r'"([^"]*)"', rest):
            paths.add(os.path.normpath(os.path.join(cwd, path)))
    return paths


@pytest.mark.parametrize("cached", [True, False], ids=["cache-dir", "no-cache"])
def test_nothing_is_written_outside_the_cache_directory(files, proxied_bucket, tmp_path, cached):
    local, url = files
    watched = {name: tmp_path / name for name in ("home", "tmp", "xdg-cache", "cwd")}
    for directory in watched.values():
        directory.mkdir()
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {
        **proxied_bucket.env,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": str(watched["home"]),
        "TMPDIR": str(watched["tmp"]),
        "XDG_CACHE_HOME": str(watched["xdg-cache"]),
    }
    if "PYTHONPATH" in os.environ:  # where this process found tokstream
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    trace = tmp_path / "trace.log" if shutil.which("strace") else None
    child = run_child(
        tmp_path, env, url, str(cache) if cached else "", "run", trace=trace, cwd=watched["cwd"]
    )
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0, (tmp_path / "child.stderr").read_text()
    assert int(out) == len(as_list(stream(local, epochs=2, prefetch=2)))
    for name, directory in watched.items():
        assert list(directory.iterdir()) == [], f"written in {name}"
    if cached:
        assert any(path.is_file() for path in cache.rglob("*")), "the cache directory is unused"
    else:
        assert list(cache.iterdir()) == []
    if trace is not None:
        allowed = (str(cache) + os.sep, "/dev/null")
        outside = {
            path
            for path in written_paths(trace, watched["cwd"])
            if not (path.startswith(allowed) or path == str(cache))
        }
        assert outside == set()


def test_a_second_epoch_from_the_cache_directory_fetches_no_token_again(
    files, proxied_bucket, tmp_path
):
    local, url = files
    (tmp_path / "cache").mkdir()
    corpus = open_remote(url, cache_dir=str(tmp_path / "cache"))
    proxied_bucket.proxy.configure()
    assert_same(stream(corpus, epochs=1), stream(local, epochs=1))
    first = sum(r["body_bytes"] for r in proxied_bucket.proxy.stats()["requests"])
    proxied_bucket.proxy.configure()
    assert_same(stream(corpus, epochs=1, seed=99), stream(local, epochs=1, seed=99))
    again = sum(r["body_bytes"] for r in proxied_bucket.proxy.stats()["requests"])
    assert first > 0
    assert again == 0
