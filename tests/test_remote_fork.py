"""A remote corpus and other processes: a forked process is told so at once, never left hanging;
spawned processes and DataLoader workers read the same batches.

obstore runs every request on one process-wide runtime whose threads a ``fork()`` does not copy:
a request in a child forked after this process used the client would wait forever. These tests
use real processes (a ``ProcessPoolExecutor``, torch's ``DataLoader`` workers) against moto's S3
server; a child that hangs fails the test after a timeout and is killed.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import tokstream
from tests.remote_cases import (
    assert_same,
    documents,
    require_remote,
    stream_batches,
    uploaded_npy,
)

remote = require_remote()

DOCS = documents(count=12, seed=41)

#: Seconds a child may take before it counts as hanging.
HANG = 60


@pytest.fixture
def pair(s3_bucket, tmp_path):
    """(local corpus, remote corpus, its URL) of the same npy shards."""
    local, url = uploaded_npy(s3_bucket, tmp_path, DOCS)
    return tokstream.open_tokens(str(local)), tokstream.open_tokens(url), url


def in_pool(context: str, function, *args, **kwargs):
    """``function(*args, **kwargs)`` in a one-process pool of ``context``; a child still running
    after :data:`HANG` seconds is killed and the test fails."""
    pool = concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context(context)
    )
    try:
        return pool.submit(function, *args, **kwargs).result(timeout=HANG)
    except concurrent.futures.TimeoutError:
        pytest.fail(f"the {context}-started child did not answer in {HANG} s")
    finally:
        for process in list(getattr(pool, "_processes", {}).values()):
            if process.is_alive():
                os.kill(process.pid, signal.SIGKILL)
        pool.shutdown(wait=True, cancel_futures=True)


def open_and_stream(url: str) -> list:
    return stream_batches(tokstream.open_tokens(url), 16, 32, seed=3)


def test_a_corpus_pickled_into_a_forked_child_is_an_error_there_not_a_hang(pair):
    local, far, _ = pair
    with pytest.raises(RuntimeError, match="fork.*spawn"):
        in_pool("fork", stream_batches, far, 16, 32, seed=3)


def test_opening_a_corpus_anew_in_a_forked_child_is_an_error_there_not_a_hang(pair):
    _, _, url = pair
    with pytest.raises(RuntimeError, match="fork.*spawn"):
        in_pool("fork", open_and_stream, url)


def test_a_corpus_inherited_by_a_forked_child_is_an_error_there_not_a_hang(pair):
    local, far, _ = pair
    stream = tokstream.stream_token_source(far, 16, 32, seed=3)
    next(stream)  # the parent is mid-stream, its fetch thread running, when it forks
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe and exits
        try:
            try:
                next(stream)
                message = b"read"
            except RuntimeError as error:
                message = str(error).encode()
            os.write(writer, message)
        finally:
            os._exit(0)
    os.close(writer)
    try:
        with os.fdopen(reader, "rb") as answer:
            assert b"spawn" in answer.read()
    finally:
        os.waitpid(child, 0)
    stream.close()


def test_a_spawned_child_opens_and_streams_the_same_batches(pair):
    local, _, url = pair
    got = in_pool("spawn", open_and_stream, url)
    assert_same(got, tokstream.stream_token_source(local, 16, 32, seed=3))


CHILD = """
import concurrent.futures, multiprocessing, sys
import tokstream
from tests.remote_cases import stream_batches

def count(url):
    return len(stream_batches(tokstream.open_tokens(url), 16, 32, seed=3))

if __name__ == "__main__":
    # Forked before this process used the client: the child has a runtime of its own to start.
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        pool.submit(int).result()
        print(pool.submit(count, sys.argv[1]).result(timeout=60))
"""


def test_a_child_forked_before_the_client_was_used_reads_normally(pair, tmp_path):
    local, _, url = pair
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    done = subprocess.run(
        [sys.executable, str(script), url], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(tokstream.stream_token_source(local, 16, 32, seed=3))


# ------------------------------------------------------------------ DataLoader workers


def dataset(corpus, **options):
    from tokstream.torch import TokenDataset

    return TokenDataset(corpus, 16, 32, seed=6, **options)


def tensors(loader) -> list:
    return [tuple(t.numpy() for t in batch) for batch in loader]


def test_data_loader_spawns_workers_for_a_remote_corpus_with_the_same_batches(pair):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from tokstream.torch import data_loader

    local, far, _ = pair
    loader = data_loader(dataset(far, num_workers=2))
    assert loader.multiprocessing_context.get_start_method() == "spawn"
    expected = tensors(DataLoader(dataset(local), batch_size=None, num_workers=2))
    assert_same(tensors(loader), expected)


def test_data_loader_keeps_the_default_start_method_for_a_local_corpus(pair):
    pytest.importorskip("torch")
    from tokstream.torch import data_loader

    local, _, _ = pair
    assert data_loader(dataset(local), num_workers=2).multiprocessing_context is None
    assert data_loader(dataset(local, num_workers=2)).num_workers == 2


def test_data_loader_refuses_fork_for_a_remote_corpus(pair):
    pytest.importorskip("torch")
    from tokstream.torch import data_loader

    _, far, _ = pair
    for context in ("fork", multiprocessing.get_context("fork")):
        with pytest.raises(ValueError, match="multiprocessing_context='fork'"):
            data_loader(dataset(far), num_workers=1, multiprocessing_context=context)


# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates.
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_data_loader_takes_a_stateful_loader_class(pair):
    pytest.importorskip("torch")
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    from tokstream.torch import data_loader

    local, far, _ = pair
    loader = data_loader(dataset(far, num_workers=1), loader_class=stateful.StatefulDataLoader)
    assert isinstance(loader, stateful.StatefulDataLoader)
    assert loader.multiprocessing_context.get_start_method() == "spawn"


def test_forked_dataloader_workers_given_by_the_user_fail_with_a_clear_error(pair):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    _, far, _ = pair
    loader = DataLoader(
        dataset(far), batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=HANG
    )
    with pytest.raises(RuntimeError, match="spawn"):
        tensors(loader)
