"""Where a tokenize job's batches are encoded: this process, a process pool, or Ray.

Every engine takes the same batches of document texts, in input order, and gives back each
batch's ids and document lengths in that same order; the job alone writes them. So the output
is the same, byte for byte, whatever the engine and the number of workers, and a run stopped
under one engine is finished under any other.

- ``"local"``: one worker encodes in this process; more are spawned processes.
- ``"ray"``: one Ray actor per worker, each loading the tokenizer once; without an address an
  embedded local Ray is started for the job (and stopped after it), with one the job runs on
  that cluster (``pip install "tokstream[ray]"``; the cluster's nodes need tokstream and the
  tokenizer too). The batches are read here and sent to the actors, at most two per actor in
  flight, so a cluster scales the encoding, not the reading.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import itertools
import multiprocessing
import socket
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from tokstream._extras import install_hint
from tokstream.tokenize.encoders import Encoder, encode_batch, start_worker

ENGINES = ("local", "ray")
#: Seconds to wait for a Ray address to answer before calling it unreachable.
CONNECT_SECONDS = 5.0

Batches = Iterator[tuple[list[str], list[int], int]]
Encoded = Iterator[tuple[tuple[np.ndarray, np.ndarray], list[int], int]]


def start(
    stack: contextlib.ExitStack,
    engine: str,
    spec: str,
    encoder: Encoder,
    workers: int,
    eos: int | None,
    ray_address: str | None,
) -> Callable[[Batches], Encoded]:
    """Start ``engine`` (its end registered on ``stack``); the function that encodes batches.

    Called before the output directory is claimed: an engine that cannot start (Ray missing or
    unreachable) leaves nothing written.
    """
    if engine == "ray":
        submit = _ray_submitter(stack, spec, workers, eos, ray_address)
        return lambda batches: _in_order(submit, batches, 2 * workers)
    if ray_address is not None:
        raise ValueError("ray_address (--ray-address) is for engine='ray' (--engine ray)")
    if workers == 1:
        return lambda batches: (
            (encode_batch(texts, eos, encoder), end, read) for texts, end, read in batches
        )
    pool = stack.enter_context(
        concurrent.futures.ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=start_worker,
            initargs=(spec,),
        )
    )
    return lambda batches: _in_order(
        lambda texts: pool.submit(encode_batch, texts, eos).result, batches, 2 * workers
    )


def _in_order(
    submit: Callable[[list[str]], Callable[[], Any]], batches: Batches, limit: int
) -> Iterator[tuple[Any, list[int], int]]:
    """Each batch's result in input order, with at most ``limit`` batches in flight."""
    pending: collections.deque[tuple[Callable[[], Any], list[int], int]] = collections.deque()
    for texts, end, read in batches:
        pending.append((submit(texts), end, read))
        if len(pending) >= limit:
            result, end, read = pending.popleft()
            yield result(), end, read
    while pending:
        result, end, read = pending.popleft()
        yield result(), end, read


def _ray_submitter(
    stack: contextlib.ExitStack, spec: str, workers: int, eos: int | None, address: str | None
) -> Callable[[list[str]], Callable[[], Any]]:
    try:
        import ray
    except ImportError:
        raise ImportError(f"engine='ray' needs Ray: {install_hint('ray')}") from None
    if address is not None:
        _check_reachable(address)
    if not ray.is_initialized():  # a Ray the caller started is used as it is, and left running
        try:
            if address is None:
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

    @ray.remote(num_cpus=1)
    class EncodeWorker:
        def __init__(self, spec: str) -> None:
            start_worker(spec)

        def encode(self, texts: list[str], eos: int | None) -> tuple[np.ndarray, np.ndarray]:
            return encode_batch(texts, eos)

    remote: Any = EncodeWorker  # ray.remote made it an actor class (with .remote)
    actors = [remote.remote(spec) for _ in range(workers)]
    stack.callback(lambda: [ray.kill(actor) for actor in actors])
    turn = itertools.count()

    def submit(texts: list[str]) -> Callable[[], Any]:
        reference = actors[next(turn) % workers].encode.remote(texts, eos)
        return lambda: ray.get(reference)

    return submit


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
