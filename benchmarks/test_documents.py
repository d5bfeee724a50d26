"""What strides, documents and the batch extras cost, against the plain stream and a floor.

The documents corpus of conftest (the benchmark corpus cut into documents of exponential lengths,
mean 2,000 tokens). Every stream is shuffled with the implicit permutation and yields
``targets="shifted"``, so that only the feature differs between the sides of a group:

- ``test_feature``: ``extras`` (``position_ids``, ``loss_mask``, ``cu_seqlens``) against the
  plain stream (target: at most 1.3x the time, a rate ratio of at least 0.77); ``eos``: the
  same with the documents told by ``eos=`` alone; ``within``: ``windows="within"`` against
  ``"cross"`` (target: as fast); ``strided``: ``stride=block`` against ``stride=1`` (as fast);
- ``test_extras_floor``: the stream with every extra against the plain stream and the *floor*:
  the plain stream plus, a batch, the position ids' and the loss mask's memory written as fast
  as NumPy writes (one reused buffer each, rows copied from a ramp, the mask set to ones), with
  no document logic and no ``cu_seqlens``. No stream writing int64 position ids can beat the
  floor (target: the extras at least 0.9x the floor).

Before timing, sides that deliver the same windows (extras, eos and the floor against the plain
stream) are checked identical, and every side's targets are its windows shifted by one token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import pytest

from tokstream import Corpus, stream_token_source

SHAPES = [(1024, 64), (128, 512)]
SHAPE_IDS = [f"{b}x{n}" for b, n in SHAPES]
DTYPES = ["uint16", "int64"]
EXTRAS = ("position_ids", "loss_mask", "cu_seqlens")
#: GPT-2's end-of-text token, closing each document of the ``eos`` comparison's corpus.
EOS = 50256

#: Each comparison: (name, the feature's options, the baseline's name and options).
COMPARISONS: list[tuple[str, dict[str, Any], str, dict[str, Any]]] = [
    ("extras", {"extras": EXTRAS}, "plain", {}),
    ("eos", {"extras": EXTRAS, "eos": EOS}, "plain", {}),
    ("within", {"windows": "within"}, "cross", {"windows": "cross"}),
    ("strided", {"stride": "block"}, "stride=1", {"stride": 1}),
]


def make_stream(corpus: Corpus, block: int, batch_size: int, **options: Any) -> Iterator[Any]:
    """A shuffled implicit stream with shifted targets over enough epochs for any benchmark."""
    if options.get("stride") == "block":
        options["stride"] = block
    return stream_token_source(
        corpus,
        block,
        batch_size,
        epochs=10**6,
        seed=0,
        permutation="implicit",
        targets="shifted",
        **options,
    )


_eos_corpora: dict[int, Corpus] = {}


def eos_corpus(corpus: Corpus) -> Corpus:
    """The same tokens with each document's last token set to :data:`EOS` and no recorded
    boundaries, the documents told by ``eos=`` alone (nanoGPT's and llm.c's files)."""
    if id(corpus) not in _eos_corpora:
        ids = np.concatenate(list(corpus.shards))
        ends = np.cumsum(corpus.document_lengths)[:-1]
        ids[ends[ends > 0] - 1] = EOS
        _eos_corpora[id(corpus)] = Corpus([ids])
    return _eos_corpora[id(corpus)]


def windows_and_targets(batch: Any) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(batch, dict):
        return batch["input_ids"], batch["labels"]
    return batch[0], batch[1]


def check_first_batches(streams: dict[str, Iterator[Any]], same_windows: bool) -> None:
    """Draw each side's first batch (untimed: it carries the set-up) and check it."""
    first = {side: windows_and_targets(next(stream)) for side, stream in streams.items()}
    for windows, targets in first.values():
        assert windows.dtype == np.int64 and targets.shape == windows.shape
        assert np.array_equal(targets[:, :-1], windows[:, 1:])
    if same_windows:
        (windows, targets), *others = first.values()
        for other_windows, other_targets in others:
            assert np.array_equal(other_windows, windows)
            assert np.array_equal(other_targets, targets)


def take(stream: Iterator[Any], batches: int) -> None:
    for _ in range(batches):
        next(stream)


@pytest.mark.parametrize("side", ["feature", "base"])
@pytest.mark.parametrize("comparison", COMPARISONS, ids=[c[0] for c in COMPARISONS])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_feature(measure, settings, documents_corpus, dtype, shape, comparison, side) -> None:
    name, feature, base_name, base = comparison
    block, batch_size = shape
    corpus = documents_corpus(dtype)
    if "eos" in feature:
        corpus = eos_corpus(corpus)
    streams = {
        name: make_stream(corpus, block, batch_size, **feature),
        base_name: make_stream(corpus, block, batch_size, **base),
    }
    check_first_batches(streams, same_windows=name in ("extras", "eos"))
    timed = name if side == "feature" else base_name
    measure(
        take,
        args=(streams[timed], settings.batches),
        group=f"documents {dtype} block={block} batch={batch_size}: {name}",
        side=timed,
        subject=name,
        units=settings.batches * batch_size * block,
    )


def floor_batch(
    stream: Iterator[Any], ramp: np.ndarray, positions: np.ndarray, mask: np.ndarray
) -> Any:
    """A plain batch, then the position ids' and the loss mask's memory written as fast as
    NumPy writes: one reused buffer each, rows copied from a ramp, the mask set to ones."""
    batch = next(stream)
    np.copyto(positions, ramp)
    mask.fill(True)
    return batch


def take_steps(step: Callable[[], Any], batches: int) -> None:
    for _ in range(batches):
        step()


@pytest.mark.parametrize("side", ["extras", "plain", "floor"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_extras_floor(measure, settings, documents_corpus, dtype, shape, side) -> None:
    block, batch_size = shape
    corpus = documents_corpus(dtype)
    streams = {
        "extras": make_stream(corpus, block, batch_size, extras=EXTRAS),
        "plain": make_stream(corpus, block, batch_size),
        "floor": make_stream(corpus, block, batch_size),
    }
    check_first_batches(streams, same_windows=True)
    steps: dict[str, Callable[[], Any]] = {
        "extras": partial(next, streams["extras"]),
        "plain": partial(next, streams["plain"]),
        "floor": partial(
            floor_batch,
            streams["floor"],
            np.arange(block, dtype=np.int64),
            np.empty((batch_size, block), np.int64),
            np.empty((batch_size, block), np.bool_),
        ),
    }
    measure(
        take_steps,
        args=(steps[side], settings.batches),
        group=f"extras floor {dtype} block={block} batch={batch_size}",
        side=side,
        subject="extras",
        units=settings.batches * batch_size * block,
    )
