"""Helpers shared by the test modules: ``from tests.conftest import KERNEL_DTYPES, ...``.

Kept to NumPy alone, so that the NumPy 1.26 CI run (parity and ABI suites only) loads it too.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

# Test modules that need an optional extra; without it installed they are left out of the run
# (and the run's header says so), so that `pip install ".[test]" && pytest` passes anywhere.
NEEDS_EXTRA = {
    "test_torch.py": "torch",
    "test_mixture_torch.py": "torch",
    "test_torch_resume.py": "torch",
    "test_torch_groups.py": "torch",
    "test_packing_torch.py": "torch",
    "test_grain.py": "grain",
    "test_jax.py": "jax",
}
collect_ignore = [
    module for module, extra in NEEDS_EXTRA.items() if importlib.util.find_spec(extra) is None
]


def pytest_report_header() -> list[str]:
    return [
        f"not collected, {NEEDS_EXTRA[module]} is not installed: {module}"
        for module in collect_ignore
    ]


# ---- object storage: a real S3 server process and a fault-injecting proxy (tests/object_store.py)
# Session-scoped processes on 127.0.0.1, skipped without moto's server; each test gets its own
# bucket and the standard AWS variables of a client that reaches it, straight or by the proxy.


@pytest.fixture(scope="session")
def s3_server() -> Iterator:
    for module in ("moto", "flask", "boto3"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the S3 server needs moto[server] ({module} is not installed)")
    from tests.object_store import S3Server

    server = S3Server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def fault_proxy(s3_server) -> Iterator:
    from tests.object_store import FaultProxy

    proxy = FaultProxy(s3_server)
    yield proxy
    proxy.stop()


def _use_env(monkeypatch, env: dict) -> dict:
    """Only ``env``'s AWS variables for the test (none of the machine's own)."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> dict:
    """The environment set for a client to reach the S3 server directly (every bucket on it)."""
    return _use_env(monkeypatch, s3_server.env())


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A new bucket on the S3 server, the environment set for a client to reach it directly."""
    from tests.object_store import Bucket

    bucket = Bucket(s3_server)
    _use_env(monkeypatch, bucket.env)
    return bucket


@pytest.fixture
def proxied_bucket(s3_server, fault_proxy, monkeypatch) -> Iterator:
    """A new bucket reached through the fault proxy (no delay, no rule until the test sets them
    with ``proxied_bucket.proxy.configure``); the proxy is reset after the test."""
    from tests.object_store import Bucket

    fault_proxy.configure()
    bucket = Bucket(s3_server, fault_proxy)
    _use_env(monkeypatch, bucket.env)
    yield bucket
    fault_proxy.configure()


def stress(full: int) -> int:
    """A long stress test's size: ``full`` against a release build, a quarter of it against the
    bounds-checked debug build (``TOKSTREAM_DEBUG=1``), whose CI pass is there to run every
    kernel path with its checks on; the release passes run the whole length."""
    from tokstream._windows import DEBUG_BUILD

    return max(1, full // 4) if DEBUG_BUILD else full


# Every token dtype the compiled kernel reads in place, without a conversion.
KERNEL_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def assert_same_batches(actual: Iterable, expected: Iterable) -> list:
    """The same number of batches, each array int64 with the same shape and the same bytes.

    Takes lists or streams (a stream is consumed); returns ``actual`` as a list.
    """
    actual, expected = list(actual), list(expected)
    assert len(actual) == len(expected), f"{len(actual)} batches, expected {len(expected)}"
    for i, (batch, want_batch) in enumerate(zip(actual, expected, strict=True)):
        for array, want in zip(batch, want_batch, strict=True):
            assert array.dtype == want.dtype == np.int64, f"batch {i}: {array.dtype}"
            assert array.shape == want.shape, f"batch {i}: {array.shape} != {want.shape}"
            assert array.tobytes() == want.tobytes(), f"batch {i} differs"
    return actual


def sharded_oracle_batches(
    shards: list[np.ndarray],
    block: int,
    batch_size: int,
    epochs: int,
    shuffle: bool,
    seed: int,
    targets: str = "next",
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The sharded semantics in plain NumPy: concatenated per-shard windows, one RandomState."""
    windows = [(j, s) for j, shard in enumerate(shards) for s in range(max(len(shard) - block, 0))]
    rng = np.random.RandomState(seed)
    out: list[tuple[np.ndarray, np.ndarray]] = []
    if not windows:
        return out
    for _ in range(epochs):
        order = rng.permutation(len(windows)) if shuffle else np.arange(len(windows))
        for k in range(0, len(windows), batch_size):
            picked = [windows[i] for i in order[k : k + batch_size]]
            ctx = np.stack([shards[j][s : s + block] for j, s in picked]).astype(np.int64)
            if targets == "next":
                nxt = np.array([shards[j][s + block] for j, s in picked], dtype=np.int64)
            else:
                nxt = np.stack([shards[j][s + 1 : s + 1 + block] for j, s in picked])
            out.append((ctx, nxt.astype(np.int64)))
    return out


def evict(*paths) -> None:
    """Write the files' pages back and drop them from the page cache (a cold read follows)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def byte_level_bpe(texts: Iterable[str], path: Path, vocab_size: int) -> Path:
    """A tiny GPT-2-style byte-level BPE (``<|endoftext|>`` its special token) trained here on
    ``texts`` and saved as a tokenizers JSON file at ``path``: the tokenize tests' encoder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(path))
    return path
