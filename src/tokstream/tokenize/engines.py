"""Where a tokenize job's tasks run: this process, a process pool, or Ray.

A task (:class:`tokstream.tokenize.task.Task`) is pure: a range of the inputs in, a shard with
its documents and its manifest entry out. Every engine runs the same tasks, in any order and
on any worker, so the output is the same, byte for byte, whatever the engine and the number of
workers, and a run stopped under one engine is finished under any other.

- ``"local"``: one worker runs the tasks in this process; more are spawned processes, started
  (each importing tokstream and loading the tokenizer) as soon as the engine is, while the job
  plans its ranges. A job killed outright (SIGKILL, the OOM killer) cannot stop its pool: each
  worker watches its job and ends with it, and a task runs under the output's writers' lock
  (:func:`tokstream.tokenize.output.writing`), so a new run waits for a killed run's workers
  before it takes the directory over; a task that starts after that writes nothing (the
  directory no longer holds its run's token).
- ``"ray"``: each task is a Ray task (one CPU), at most ``workers`` at a time; without an
  address an embedded local Ray is started for the job (and stopped after it), with one the job
  runs on that cluster (``pip install "tokstream[ray]"``; every node needs tokstream and the
  tokenizer, and reads the inputs and writes the output directory at the same paths: a shared
  filesystem). Tasks hold the writers' lock and check the run's token as a pool's do, so a
  killed driver's task that Ray starts late writes nothing. A cluster that makes no shard for
  :data:`STALL_SECONDS` is a TimeoutError, not a hang (and Ray itself ends a driver whose
  cluster has been unreachable for 60 s).

Running tasks report their counts after each batch of documents (in this process directly, a
pool's workers through a queue, Ray tasks to a small actor of the job); the engine passes them
on while it waits for shards.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.queues
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

from tokstream._extras import install_hint
from tokstream.tokenize import task as tasks
from tokstream.tokenize.chat import ChatEncoder, ChatSpec
from tokstream.tokenize.encoders import Encoder, one_thread
from tokstream.tokenize.output import writing

ENGINES = ("local", "ray")
#: Seconds to wait for a Ray address to answer before calling it unreachable.
CONNECT_SECONDS = 5.0
#: Seconds Ray may go without finishing a shard before the job calls the cluster dead.
STALL_SECONDS = 1800.0
#: The logger of Ray's notice that a new local Ray uses token authentication: an embedded Ray
#: lives and dies with the job, so the notice is noise on the job's stderr.
AUTH_NOTICE = "ray._private.authentication.authentication_token_setup"
#: Seconds an engine waits for a shard before passing on its running tasks' progress.
REPORT_SECONDS = 0.5

Entries = Iterator[tuple[tasks.Task, dict[str, Any]]]
#: Told how far a running task has got: its index, documents, tokens and input bytes so far.
Reporter = Callable[[int, int, int, int], None]
#: What a pool's worker puts on the queue: a Reporter's arguments.
Update = tuple[int, int, int, int]
#: Runs tasks, yielding each with its shard's entry as made, telling the reporter meanwhile.
Runner = Callable[[list[tasks.Task], Reporter], Entries]


def start(
    stack: contextlib.ExitStack,
    engine: str,
    encoder: Encoder | ChatEncoder,
    workers: int,
    ray_address: str | None,
) -> Runner:
    """Start ``engine`` (its end registered on ``stack``); the function that runs tasks.

    The runner yields each task with its shard's entry as soon as it is made (in any order).
    Called before the ranges are planned and the output directory claimed: an engine that
    cannot start (Ray missing or unreachable) leaves nothing written, and the local engine's
    workers start up while the job plans.
    """
    if engine == "ray":
        return _ray_runner(stack, workers, ray_address)
    if ray_address is not None:
        raise ValueError("ray_address (--ray-address) is for engine='ray' (--engine ray)")
    if workers == 1:
        return lambda todo, report: _in_process(encoder, todo, report)
    context = multiprocessing.get_context("spawn")
    updates: multiprocessing.queues.SimpleQueue[Update] = context.SimpleQueue()
    pool = concurrent.futures.ProcessPoolExecutor(
        workers,
        mp_context=context,
        initializer=_start_worker,
        initargs=(encoder.spec, updates, os.getpid()),
    )
    stack.push(lambda error, *_: _stop_pool(pool, error is not None))
    # The pool spawns a worker for each item submitted while none is idle: one each starts them
    # all now, instead of at the first shard.
    for _ in range(workers):
        pool.submit(_started)
    return lambda todo, report: _pooled(pool, updates, todo, workers, report)


def _in_process(
    encoder: Encoder | ChatEncoder, todo: list[tasks.Task], report: Reporter
) -> Entries:
    """Each task made in this process, in order, the encoder on this thread only."""
    for task in todo:
        with one_thread():
            entry = tasks.run(task, encoder, functools.partial(report, task.index))
        yield task, entry


def _pooled(
    pool: concurrent.futures.ProcessPoolExecutor,
    updates: multiprocessing.queues.SimpleQueue[Update],
    todo: list[tasks.Task],
    workers: int,
    report: Reporter,
) -> Entries:
    """Each task with its entry as made, at most two tasks a worker submitted at a time; the
    workers' progress passed on to ``report`` every :data:`REPORT_SECONDS` meanwhile."""
    waiting = iter(todo)
    running: dict[concurrent.futures.Future[dict[str, Any]], tasks.Task] = {}
    while True:
        fill(running, waiting, 2 * workers, lambda task: pool.submit(_run_in_worker, task))
        if not running:
            return
        done, _ = concurrent.futures.wait(
            running, timeout=REPORT_SECONDS, return_when=concurrent.futures.FIRST_COMPLETED
        )
        # A worker puts a task's progress before it returns the task's entry: every update of
        # a task done is read here, before its entry is passed on.
        while not updates.empty():
            report(*updates.get())
        for future in done:
            yield running.pop(future), future.result()


def fill(
    running: dict[Any, tasks.Task],
    waiting: Iterator[tasks.Task],
    limit: int,
    submit: Callable[[tasks.Task], Any],
) -> None:
    """Submit tasks from ``waiting`` until ``limit`` are running (``running`` maps each one's
    handle to it); called again on every wake-up, it submits nothing while ``limit`` run."""
    while len(running) < limit:
        task = next(waiting, None)
        if task is None:
            return
        running[submit(task)] = task


#: In a pool's worker process, the queue its tasks report their progress on.
_updates: multiprocessing.queues.SimpleQueue[Update] | None = None
#: In a pool's worker process, the job's process id.
_job = 0


def _start_worker(
    tokenizer: str | ChatSpec,
    updates: multiprocessing.queues.SimpleQueue[Update] | None,
    job: int,
) -> None:
    """A pool worker's start: the progress queue kept, the tokenizer loaded before any task,
    and a thread that ends the worker when its job's process ``job`` ends, however it ends.

    A worker spawned just before its job was killed starts with another parent (the process
    that adopted it): it ends at once. Asked then, ``os.getppid()`` would name that adopter as
    the job, and the worker would run a task its dead job had queued into a directory a new
    run may own by now (a shard's temporary file was seen left behind after such a rerun).
    """
    global _updates, _job
    if os.getppid() != job:
        os._exit(1)
    _updates = updates
    _job = job
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()
    # A tokenizer that cannot be loaded here fails the worker's first task, with its own error.
    with contextlib.suppress(Exception):
        tasks.load(tokenizer)


def _started() -> None:
    """Submitted once per worker when the pool starts, so that all of them start at once."""


def _exit_with(sentinel: int) -> None:
    """Wait for the job's process to end (its sentinel readable), then end this worker at once:
    a task it runs stops where it is (its shard is made again by the next run)."""
    multiprocessing.connection.wait([sentinel])
    os._exit(1)


def _run_in_worker(task: tasks.Task) -> dict[str, Any]:
    with writing(task.directory, task.run):
        # A task taken just as the job was killed: a new run may own the directory by now.
        if os.getppid() != _job:
            os._exit(1)
        return tasks.run(task, report=functools.partial(_put_update, task.index))


def _put_update(index: int, documents: int, tokens: int, done: int) -> None:
    assert _updates is not None  # set by _start_worker
    _updates.put((index, documents, tokens, done))


def _stop_pool(pool: concurrent.futures.ProcessPoolExecutor, failed: bool) -> None:
    """Shut the pool down; a job stopping on an error does not wait for its tasks.

    Their worker processes are terminated then: a task left running would go on writing its
    shard into a directory whose lock the job is about to release.
    """
    if not failed:
        pool.shutdown()
        return
    processes = list(getattr(pool, "_processes", {}).values())  # the executor's own workers
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join()


def _ray_runner(stack: contextlib.ExitStack, workers: int, address: str | None) -> Runner:
    try:
        import ray
    except ImportError:
        raise ImportError(f"engine='ray' needs Ray: {install_hint('ray')}") from None
    if address is not None:
        _check_reachable(address)
    if not ray.is_initialized():  # a Ray the caller started is used as it is, and left running
        try:
            if address is None:
                with _quiet(AUTH_NOTICE):
                    ray.init(
                        num_cpus=workers,
                        include_dashboard=False,
                        log_to_driver=False,
                        configure_logging=False,
                    )
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = f"ray address {address!r}" if address else "a local Ray"
            raise ValueError(f"cannot start {where} (--ray-address): {exc}") from None
        stack.callback(ray.shutdown)
    remote = ray.remote(num_cpus=1)(_run_on_ray)
    # Created before any task takes the CPUs; it holds none while it runs.
    tally = ray.remote(num_cpus=0)(tally_class()).remote()
    where = f"Ray at {address!r}" if address else "the local Ray"

    def run(todo: list[tasks.Task], report: Reporter) -> Entries:
        waiting = iter(todo)
        running: dict[Any, tasks.Task] = {}
        last_shard = time.monotonic()
        try:
            while True:
                fill(running, waiting, workers, lambda task: remote.remote(task, tally))
                if not running:
                    return
                done, _ = ray.wait(list(running), num_returns=1, timeout=REPORT_SECONDS)
                if done:
                    last_shard = time.monotonic()
                elif time.monotonic() - last_shard > STALL_SECONDS:
                    raise TimeoutError(
                        f"{where} made no shard in {STALL_SECONDS:g} s ({len(running)} running): "
                        "is the cluster alive? Run the command again to go on"
                    )
                # Progress is shown, never waited for: counts that do not come back in time
                # (a cluster going away) are skipped, and the stall limit above decides.
                with contextlib.suppress(ray.exceptions.RayError):
                    for index, counts in ray.get(tally.take.remote(), timeout=CONNECT_SECONDS):
                        report(index, *counts)
                for reference in done:
                    yield running.pop(reference), _result(ray, reference, where)
        finally:
            for reference in running:
                with contextlib.suppress(Exception):  # a dead cluster cannot cancel either
                    ray.cancel(reference, force=True)

    return run


def _run_on_ray(task: tasks.Task, tally: Any) -> dict[str, Any]:
    """A Ray task: ``task`` made, its progress sent to the ``tally`` actor without waiting."""
    with writing(task.directory, task.run):
        return tasks.run(task, report=lambda *counts: tally.put.remote(task.index, *counts))


def tally_class() -> type:
    """The class of the small Ray actor that keeps the latest counts of each running task until
    the job takes them.

    Made by this function, not defined at module level, so that Ray sends the class by value:
    the actor's process then never imports tokstream (over half of its start-up, about 0.4 s
    of CPU per job taken from the encoders on a small machine).
    """

    class Tally:
        def __init__(self) -> None:
            self.counts: dict[int, tuple[int, int, int]] = {}

        def put(self, index: int, documents: int, tokens: int, done: int) -> None:
            self.counts[index] = (documents, tokens, done)

        def take(self) -> list[tuple[int, tuple[int, int, int]]]:
            counts, self.counts = self.counts, {}
            return list(counts.items())

    return Tally


def _result(ray: Any, reference: Any, where: str) -> dict[str, Any]:
    """A finished task's entry; its own error as it was raised (a bad input line is the same
    ValueError under every engine), Ray's failures as a ConnectionError naming the cluster."""
    try:
        entry: dict[str, Any] = ray.get(reference, timeout=STALL_SECONDS)
        return entry
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, Exception):
            raise exc.cause from None
        raise
    except ray.exceptions.RayError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConnectionError(f"{where}: {first}") from exc


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Only errors from the logger ``logger_name`` while the block runs."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _check_reachable(address: str) -> None:
    """A ValueError naming ``address`` unless something listens there (``auto`` is Ray's)."""
    if address in ("auto", "local"):
        return
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:  # a port that is no number
        raise ValueError(f"ray address {address!r} (--ray-address): {exc}") from None
    if not host:
        raise ValueError(f"ray address {address!r} (--ray-address): no host")
    port = port or (10001 if address.startswith("ray://") else 6379)
    try:
        socket.create_connection((host, port), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise ValueError(f"ray address {address!r} (--ray-address) is unreachable: {exc}") from None
