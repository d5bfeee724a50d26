"""What ``windows="packed"`` costs and saves, on documents of lognormal lengths (median 500, mean
900 tokens).

- ``test_padding``: packing an epoch's rows (``Packing`` over a million documents), at block 2048
  and 8192, shuffled and not; noted: the share of the epoch's slots that are padding (target: at
  most 0.5%), the share of documents split across samples, packed against ``stride=block``
  windows of the concatenated documents, and the share of labels each window policy keeps;
- ``test_first_batch``: a shuffled packed stream's first batch (block 2048, batch 16) over ten
  million documents (their Megatron index real, their tokens a sparse file), the corpus already
  open, or opened from the Megatron files or through a manifest of them, open included (target:
  under a second at 10**7); noted: the memory it allocates (tracemalloc) and its
  ``state_dict()``'s JSON size (target: under 16 KB);
- ``test_rate``: packed rows against ``stride=block`` windows (``targets="shifted"``, loss mask)
  over the same ~2 * 10**7 uint16 tokens (target: at least 0.5).

Packed rows are checked against the packing's own pieces before timing (each row's labels its
inputs shifted by one within the row's pieces).
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tokstream import Corpus, open_tokens, stream_token_source
from tokstream.formats import megatron
from tokstream.manifest import write_manifest
from tokstream.packing import Packing, piece_counts

BLOCKS = [2048, 8192]


def boundaries_of(lengths: np.ndarray) -> np.ndarray:
    boundaries = np.zeros(lengths.shape[0] + 1, np.int64)
    np.cumsum(lengths, out=boundaries[1:])
    return boundaries


def split_shares(lengths: np.ndarray, block: int) -> str:
    """The share of documents of at least 2 tokens split across samples, packed and as
    ``stride=block`` windows of the concatenation, and the labels each policy keeps."""
    starts = boundaries_of(lengths)[:-1]
    counted = lengths >= 2
    labels = int(np.maximum(lengths - 1, 0).sum())
    packed = float((lengths[counted] > block + 1).mean())
    # Sample k of the concatenation holds tokens [k * block, (k + 1) * block]; a document is
    # whole when one sample holds its first and its last token.
    first = starts // block
    concatenated = float(((starts + lengths - 1) > first * block + block)[counted].mean())
    within = int(((lengths - 1) // block * block)[lengths > block].sum())
    return (
        f"documents split: packed {packed:.2%}, stride=block {concatenated:.2%}; labels kept: "
        f"cross 100% (less the tail), within {within / labels:.1%}, packed 100%"
    )


@pytest.mark.parametrize("shuffle", [False, True], ids=["in order", "shuffled"])
@pytest.mark.parametrize("block", BLOCKS)
def test_padding(measure, settings, lognormal_lengths, block, shuffle) -> None:
    lengths = lognormal_lengths(settings.size(1_000_000, 20_000), 0)
    boundaries = boundaries_of(lengths)
    full, short = piece_counts(lengths, block)
    tokens = int((full * (block + 1) + short).sum())
    packing = measure(
        lambda: Packing(boundaries, block, shuffle=shuffle, seed=0),
        group=f"packing {lengths.shape[0]:,} documents block={block} "
        f"{'shuffled' if shuffle else 'in order'}",
        side="plan an epoch",
        units=1,
        unit="s",
        rounds=settings.size(3, 1),
    )
    share = 1 - tokens / (packing.num_rows * (block + 1))
    assert 0 <= share < 1
    group = measure.benchmark.group
    measure.note(group, f"padding {share:.3%} of {packing.num_rows:,} rows")
    if shuffle:
        measure.note(group, split_shares(lengths, block))


@pytest.fixture(scope="module")
def megatron_documents(settings, lognormal_lengths, tmp_path_factory) -> dict[str, str]:
    """Ten million documents as a Megatron dataset (the index real, the tokens a sparse file)
    and a manifest of it: the corpus by each path."""
    lengths = lognormal_lengths(settings.size(10_000_000, 20_000), 1)
    boundaries = boundaries_of(lengths)
    directory = tmp_path_factory.mktemp("packed")
    prefix = directory / "docs"
    with open(f"{prefix}.bin", "wb") as tokens:
        tokens.truncate(int(boundaries[-1]) * 2)  # sparse: only the boundaries are real
    with open(f"{prefix}.idx", "wb") as index:
        megatron.write_index(index, boundaries, np.dtype(np.uint16))
    write_manifest([f"{prefix}.bin"], directory / "toc" / "manifest.json")
    return {"Megatron files": str(prefix), "manifest": str(directory / "toc")}


def first_packed_batch(source: Any) -> Any:
    """A shuffled packed stream over ``source`` (a path: opened first) and its first batch."""
    corpus = open_tokens(source) if isinstance(source, str) else source
    stream = stream_token_source(corpus, 2048, 16, windows="packed", pad=0)
    next(stream)
    return stream


@pytest.mark.parametrize("opened", ["already open", "Megatron files", "manifest"])
def test_first_batch(measure, settings, megatron_documents, opened) -> None:
    """The stream's first batch over the corpus in hand, and with the open of its files."""
    path = megatron_documents["Megatron files" if opened == "already open" else opened]
    batch = next(stream_token_source(open_tokens(path), 2048, 16, windows="packed", pad=0))
    assert batch["input_ids"].shape == (16, 2048)
    source: Any = open_tokens(path) if opened == "already open" else path
    group = "packed first batch block=2048 batch=16 shuffled"
    measure(
        first_packed_batch,
        args=(source,),
        group=group,
        side=f"{opened}: first batch" if opened == "already open" else f"open {opened} + batch",
        units=1,
        unit="s",
        subject=None,
        rounds=settings.size(3, 1),
    )
    tracemalloc.start()
    stream = first_packed_batch(source)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    state = len(json.dumps(stream.state_dict()))
    documents = open_tokens(path).document_lengths.shape[0]
    measure.note(
        group,
        f"{opened} ({documents:,} documents): peak {peak / 2**20:.1f} MiB allocated, "
        f"state_dict {state:,} bytes",
    )


RATE_SHAPES = [(2048, 16), (1024, 64), (8192, 4)]


@pytest.fixture(scope="module")
def rate_corpus(settings, lognormal_lengths) -> Corpus:
    """About 2 * 10**7 uint16 tokens in RAM, in documents of lognormal lengths."""
    lengths = lognormal_lengths(settings.size(24_000, 2_000), 2)
    boundaries = boundaries_of(lengths)
    tokens = np.random.default_rng(3).integers(0, 50257, int(boundaries[-1])).astype(np.uint16)
    return Corpus.from_documents(np.split(tokens, boundaries[1:-1]))


def take(stream: Iterator[Any], batches: int) -> None:
    for _ in range(batches):
        next(stream)


@pytest.mark.parametrize("policy", ["packed", "stride=block"])
@pytest.mark.parametrize("shape", RATE_SHAPES, ids=[f"{b}x{n}" for b, n in RATE_SHAPES])
def test_rate(measure, settings, rate_corpus, shape, policy) -> None:
    block, batch_size = shape
    common: dict[str, Any] = {"epochs": 1000, "targets": "shifted", "extras": ("loss_mask",)}
    layout: dict[str, Any] = (
        {"windows": "packed", "pad": 0} if policy == "packed" else {"stride": block}
    )
    stream = stream_token_source(rate_corpus, block, batch_size, **common, **layout)
    first = next(stream)
    inputs, labels, mask = first["input_ids"], first["labels"], first["loss_mask"]
    assert inputs.shape == (batch_size, block)
    kept = mask[:, :-1].astype(bool)
    assert np.array_equal(labels[:, :-1][kept], inputs[:, 1:][kept])
    measure(
        take,
        args=(stream, settings.batches),
        group=f"packed rate uint16 block={block} batch={batch_size}",
        side=policy,
        subject="packed",
        units=settings.batches * batch_size * block,
    )
