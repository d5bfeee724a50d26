"""What the remote suites share: the same corpus in every format that opens from object storage,
uploaded beside its local copy, and the comparison of a remote stream with the local one.

The suites skip, rather than fail, until ``tokstream.shards.remote`` and its client (the ``remote``
extra) are installed: each calls :func:`require_remote` at import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tokstream

#: Documents of the shared corpus end with EOS; ids below 2**16 (uint16 files).
EOS = 0
SEED = 1234


def require_remote() -> Any:
    """``tokstream.shards.remote``, or skip the module: not there, or obstore not installed."""
    remote = pytest.importorskip(
        "tokstream.shards.remote", reason="tokstream.shards.remote is not there yet"
    )
    pytest.importorskip("obstore", reason="the remote extra (obstore) is not installed")
    return remote


def documents(count: int = 16, seed: int = SEED, longest: int = 80) -> list[np.ndarray]:
    """``count`` documents of 1 to ``longest`` tokens (some shorter than a block, some longer).

    Small on purpose: every window of a remote stream is a range GET unless it overlaps another
    one fetched with it, and moto's server answers a few hundred a second, so a corpus of a few
    hundred tokens keeps a whole epoch to tens of requests.
    """
    rng = np.random.default_rng(seed)
    docs = []
    for length in rng.integers(1, longest + 1, size=count):
        doc = rng.integers(1, 50_000, size=int(length), dtype=np.uint16)
        doc[-1] = EOS
        docs.append(doc)
    return docs


def _shards(docs: list[np.ndarray], count: int) -> list[np.ndarray]:
    cuts = np.linspace(0, len(docs), count + 1).astype(int)
    return [np.concatenate(docs[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


# Each writer lays out the shared documents in one format under ``directory`` and returns the
# spec ``open_tokens`` takes, relative to ``directory`` (a pattern, a prefix or the directory).


def write_npy(directory: Path, docs: list[np.ndarray]) -> str:
    for i, shard in enumerate(_shards(docs, 3)):
        tokstream.write_tokens(directory / f"shard_{i:03d}.npy", shard, "npy")
    return "shard_*.npy"


def write_bin(directory: Path, docs: list[np.ndarray]) -> str:
    for i, shard in enumerate(_shards(docs, 3)):
        tokstream.write_tokens(directory / f"shard_{i:03d}.bin", shard, "bin", dtype="uint16")
    return "shard_*.bin"


def write_llmc(directory: Path, docs: list[np.ndarray]) -> str:
    for i, shard in enumerate(_shards(docs, 2)):
        tokstream.write_tokens(directory / f"train_{i:06d}.bin", shard, "llmc")
    return "train_*.bin"


def write_megatron(directory: Path, docs: list[np.ndarray]) -> str:
    corpus = tokstream.Corpus.from_documents(docs)
    tokstream.write_tokens(directory / "corpus_text_document", corpus, "megatron")
    return "corpus_text_document"


def write_megatron_glob(directory: Path, docs: list[np.ndarray]) -> str:
    half = len(docs) // 2
    for i, part in enumerate([docs[:half], docs[half:]]):
        corpus = tokstream.Corpus.from_documents(part)
        tokstream.write_tokens(directory / f"part_{i}_text_document", corpus, "megatron")
    return "part_*_text_document.bin"


def write_tokenized(directory: Path, docs: list[np.ndarray]) -> str:
    """A ``tokstream tokenize`` output directory, written by the tokenizer itself."""
    from tests.conftest import byte_level_bpe
    from tokstream.tokenize import tokenize_files

    pytest.importorskip("tokenizers")
    text = directory.parent / f"{directory.name}-text.txt"
    text.write_text("\n".join(" ".join(f"w{t % 97}" for t in doc[:12]) for doc in docs) + "\n")
    tokenizer = byte_level_bpe([text.read_text()], directory.parent / "bpe.json", vocab_size=300)
    tokenize_files([str(text)], str(tokenizer), directory / "tokenized", shard_bytes=250)
    return "tokenized"


#: Every layout that opens from object storage, by name.
WRITERS: dict[str, Callable[[Path, list[np.ndarray]], str]] = {
    "npy": write_npy,
    "bin": write_bin,
    "llmc": write_llmc,
    "megatron": write_megatron,
    "megatron-glob": write_megatron_glob,
    "tokenized": write_tokenized,
}


def uploaded_npy(bucket: Any, directory: Path, docs: list[np.ndarray]) -> tuple[Path, str]:
    """``docs`` written as npy shards under ``directory/data`` and uploaded to ``bucket``:
    the local spec (a path or pattern) and the same spec's URL."""
    data = directory / "data"
    data.mkdir()
    spec = WRITERS["npy"](data, docs)
    bucket.upload(data, prefix="npy")
    return data / spec, bucket.url(f"npy/{spec}")


def as_list(batches: Iterable[Any]) -> list[Any]:
    """Every batch, copied (a stream that reuses buffers overwrites the last one)."""

    def copy(batch: Any) -> Any:
        if isinstance(batch, dict):
            return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in batch.items()}
        return tuple(array.copy() for array in batch)

    return [copy(batch) for batch in batches]


def assert_same(actual: Iterable[Any], expected: Iterable[Any]) -> int:
    """The same batches, array for array, dtype, shape and bytes; the number of batches."""
    actual, expected = as_list(actual), as_list(expected)
    assert len(actual) == len(expected), f"{len(actual)} batches, expected {len(expected)}"
    for i, (got, want) in enumerate(zip(actual, expected, strict=True)):
        if isinstance(want, dict):
            assert isinstance(got, dict) and got.keys() == want.keys(), f"batch {i}: keys"
            pairs = [(got[k], want[k], k) for k in want]
        else:
            pairs = [(g, w, j) for j, (g, w) in enumerate(zip(got, want, strict=True))]
        for g, w, name in pairs:
            if not isinstance(w, np.ndarray):
                assert g == w, f"batch {i} {name}: {g} != {w}"
                continue
            assert g.dtype == w.dtype and g.shape == w.shape, f"batch {i} {name}: {g.dtype}"
            assert g.tobytes() == w.tobytes(), f"batch {i} {name} differs"
    return len(expected)


def stream_batches(corpus: tokstream.Corpus, block: int, batch_size: int, **options: Any) -> list:
    """Every batch of a stream over ``corpus``: run in another process (spawned)."""
    return as_list(tokstream.stream_token_source(corpus, block, batch_size, **options))


def open_remote(spec: Any, **options: Any) -> tokstream.Corpus:
    """``open_tokens(spec)`` with :class:`tokstream.shards.remote.RemoteOptions` made of ``options``
    (the deadline, timeout, cache directory ... of the requests)."""
    remote = require_remote()
    return tokstream.open_tokens(spec, remote=remote.RemoteOptions(**options) if options else None)
