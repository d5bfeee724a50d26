"""Packed streams (``windows="packed"``) under random layouts, resumed into new shapes and seeked.

The model of a packed run is the stream itself at one rank and one row a batch: its rows, epoch
after epoch, are the global sequence (checked against the packing contract for a lone corpus).
Every other shape must stream that sequence, cut at each epoch's tail as the order's rule says
(each rank's rows: ``min(batch_size, (n - p) // world_size)``), and a seek to a step must give
what the same stream gives after that many batches.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import strategies as st

from tokstream import Corpus, mix, stream_token_source

PAD = -1
PARTS = ("input_ids", "labels", "loss_mask")


@st.composite
def document_layouts(draw) -> list[int]:
    """Document lengths: empty and one-token documents, runs of equal ones, one huge one."""
    return draw(
        st.one_of(
            st.lists(st.integers(0, 30), min_size=1, max_size=40),
            st.lists(st.sampled_from([0, 1, 2, 5, 9]), min_size=1, max_size=25),
            st.tuples(st.integers(0, 300), st.lists(st.integers(0, 8), max_size=8)).map(
                lambda t: [t[0], *t[1]]
            ),
        )
    )


@st.composite
def packed_runs(draw):
    """``(layouts, weights, options, shapes, seek)``: one or two sources' document lengths,
    their weights (a mixture when two), the stream options, ``[(world_size, batch_size,
    steps), ...]`` (the last shape runs to the end) and ``(world_size, batch_size, rank,
    step)`` of a seek."""
    layouts = draw(st.lists(document_layouts(), min_size=1, max_size=2))
    weights = draw(st.tuples(st.integers(1, 3), st.integers(1, 3)))
    options = {
        "block": draw(st.integers(1, 10)),
        "shuffle": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "epochs": draw(st.integers(1, 3)),
    }
    shape = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(0, 4))
    shapes = draw(st.lists(shape, min_size=1, max_size=3))
    seek = draw(
        st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(0, 2), st.integers(0, 9))
    )
    return layouts, weights, options, shapes, seek


def _source(layouts: list[list[int]], weights: tuple[int, int]) -> Any:
    """A corpus of documents whose tokens are their own indices, or a mixture of two."""
    corpora = []
    for lengths in layouts:
        boundaries = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = np.arange(int(boundaries[-1]), dtype=np.int64)
        corpora.append(
            Corpus.from_documents(
                [tokens[a:b] for a, b in zip(boundaries, boundaries[1:], strict=False)]
            )
        )
    if len(corpora) == 1:
        return corpora[0]
    return mix({"a": corpora[0], "b": corpora[1]}, {"a": weights[0], "b": weights[1]})


def _rows(batch: dict[str, np.ndarray]) -> list[tuple[bytes, ...]]:
    parts = (*PARTS, "source") if "source" in batch else PARTS
    return [tuple(batch[p][k].tobytes() for p in parts) for k in range(batch["input_ids"].shape[0])]


def check_packed_run(layouts, weights, options, shapes, seek) -> str:
    """See the module docstring."""
    mixed = len(layouts) > 1
    try:
        source = _source(layouts, weights)
    except ValueError as error:
        assert mixed and "holds no tokens" in str(error), error
        return "packed refused"
    kwargs = {
        **options,
        "windows": "packed",
        "pad": PAD,
        "extras": ("document_ids", "source") if mixed else ("document_ids",),
    }
    try:
        single = stream_token_source(source, batch_size=1, **kwargs)
    except ValueError as error:
        # Only a mixture source without a document of 2 tokens is refused.
        assert mixed and "holds no document of at least 2" in str(error), error
        return "packed refused"
    per_epoch = single.num_windows
    epochs: list[list[tuple[bytes, ...]]] = [[] for _ in range(options["epochs"])]
    batches = [dict(batch) for batch in single]
    assert len(batches) == per_epoch * options["epochs"], "rows per epoch"
    for i, batch in enumerate(batches):
        epochs[i // max(1, per_epoch)].extend(_rows(batch))
    if not mixed:
        _check_contract(layouts[0], batches[:per_epoch])
    _check_reshaped(source, kwargs, shapes, epochs, per_epoch)
    _check_seek(source, kwargs, seek)
    return f"packed {'mixture ' if mixed else ''}reshaped x{len(shapes) - 1}"


def _check_contract(lengths: list[int], batches: list[dict[str, np.ndarray]]) -> None:
    """One epoch's labels are every token but each document's first, once; inputs precede them."""
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    expected = sorted(t for a, b in zip(starts, starts[1:], strict=False) for t in range(a + 1, b))
    labels = [b["labels"][b["loss_mask"]] for b in batches]
    inputs = [b["input_ids"][b["loss_mask"]] for b in batches]
    got = np.concatenate(labels) if labels else np.empty(0, np.int64)
    assert sorted(got.tolist()) == expected, "an epoch's labels"
    if labels:
        assert (np.concatenate(inputs) == got - 1).all(), "inputs precede labels"
    for b in batches:
        assert (b["labels"][~b["loss_mask"]] >= PAD).all()


def _check_reshaped(source, kwargs, shapes, epochs, per_epoch) -> None:
    """Every shape in turn (each resumed from rank 0's state of the last) streams the global
    sequence cut at the epochs' tails."""
    epoch = position = 0
    state = None
    for index, (world, batch_size, steps) in enumerate(shapes):
        last = index == len(shapes) - 1
        streams = []
        for rank in range(world):
            stream = stream_token_source(
                source, batch_size=batch_size, rank=rank, world_size=world, **kwargs
            )
            if state is not None:
                stream.load_state_dict(state)
            streams.append(stream)
        taken = 0
        while last or taken < steps:
            # A loaded cursor with no rows left for this shape starts the next epoch.
            at_epoch, at = epoch, position
            rows = min(batch_size, (per_epoch - at) // world)
            while rows == 0 and at_epoch < len(epochs):
                at_epoch, at = at_epoch + 1, 0
                rows = min(batch_size, per_epoch // world)
            got = [next(stream, None) for stream in streams]
            if at_epoch >= len(epochs) or rows == 0:
                assert all(batch is None for batch in got), "a batch past the model's end"
                break
            assert all(batch is not None for batch in got), "ranks ended early"
            epoch, position = at_epoch, at
            merged = [_rows(got[r])[k] for k in range(rows) for r in range(world)]
            want = epochs[epoch][position : position + rows * world]
            assert merged == want, f"shape {index} ({world}, {batch_size}), epoch {epoch}"
            position += rows * world
            taken += 1
            # A cursor with no round of ``world`` rows left in the epoch starts the next (from a
            # position not a multiple of ``world``, resumed from another shape, too).
            if (per_epoch - position) // world == 0:
                epoch, position = epoch + 1, 0
        state = json.loads(json.dumps(streams[0].state_dict()))
        for stream in streams:
            stream.close()


def _check_seek(source, kwargs, seek) -> None:
    """A seek to a step gives the batch the stream gives after that many."""
    world, batch_size, rank, step = seek
    call = {**kwargs, "batch_size": batch_size, "rank": rank % world, "world_size": world}
    walked = stream_token_source(source, **call)
    expected = None
    for _ in range(step + 1):
        expected = next(walked, None)
    seeked = stream_token_source(source, **call)
    seeked.seek(step)
    got = next(seeked, None)
    if expected is None:
        assert got is None, "a seek past the end gave a batch"
        return
    assert got is not None and _rows(got) == _rows(expected), f"seek to step {step}"
