"""A slow pure-NumPy oracle of strides, documents, window policies and the batch extras.

Everything is computed token by token from the rules as the user documentation states them, with
no tokstream code: which token starts a document (a shard's first token, a recorded document
start, the token after an ``eos``), which windows an epoch holds and in which index order, which
of them each rank's batches take (``tokstream.plan.order``'s sharding rules), and every array of a
batch. Only a shuffled stream's window order is taken from outside: ``RandomState(seed)``
permutations for ``permutation="materialized"``, and for ``"implicit"`` the order of a plain
stride-1 stream with the same window count (the permutation depends on nothing else).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Shard:
    """One shard's tokens and its recorded document boundaries (0 ... len), or None."""

    tokens: np.ndarray
    boundaries: np.ndarray | None = None


def document_starts(shard: Shard, eos: int | None) -> set[int]:
    """Every token index of the shard that starts a document."""
    starts = {0}
    if shard.boundaries is not None:
        starts.update(int(b) for b in shard.boundaries[:-1])
    if eos is not None:
        for t in range(1, len(shard.tokens)):
            if int(shard.tokens[t - 1]) == eos:
                starts.add(t)
    return {t for t in starts if t < len(shard.tokens)}


def segments(shard: Shard, windows: str, eos: int | None) -> list[tuple[int, int]]:
    """``(start, end)`` of the spans windows must stay inside: the shard, or each document."""
    length = len(shard.tokens)
    if windows == "cross":
        return [(0, length)]
    starts = sorted(document_starts(shard, eos))
    return list(pairwise([*starts, length]))


def window_list(
    shards: Sequence[Shard], block: int, stride: int, windows: str, eos: int | None
) -> list[tuple[int, int]]:
    """``(shard, start)`` of every window, in window index order."""
    found = []
    for j, shard in enumerate(shards):
        for begin, end in segments(shard, windows, eos):
            start = begin
            while start + block < end:
                found.append((j, start))
                start += stride
    return found


def rank_positions(
    num_windows: int, batch_size: int, rank: int, world_size: int, drop_last: bool
) -> list[list[int]]:
    """Order positions of each of this rank's batches in one epoch."""
    usable = (num_windows // world_size) * world_size
    global_batch = world_size * batch_size
    batches = []
    for first in range(0, usable, global_batch):
        if drop_last and first + global_batch > usable:
            break
        rows = min(batch_size, (usable - first) // world_size)
        batches.append([first + rank + world_size * i for i in range(rows)])
    return batches


def window_batch(
    shards: Sequence[Shard],
    picked: Sequence[tuple[int, int]],
    block: int,
    targets: str,
    eos: int | None,
    extras: Sequence[str],
) -> Any:
    """The batch of the windows ``picked``, token by token."""
    rows = len(picked)
    input_ids = np.zeros((rows, block), np.int64)
    labels = np.zeros((rows,) if targets == "next" else (rows, block), np.int64)
    position_ids = np.zeros((rows, block), np.int64)
    document_ids = np.zeros((rows, block), np.int32)
    loss_mask = np.zeros(labels.shape, np.bool_)
    cu_seqlens = []
    for r, (j, start) in enumerate(picked):
        tokens = shards[j].tokens
        starts = document_starts(shards[j], eos)
        for i in range(block):
            input_ids[r, i] = int(tokens[start + i])
            is_start = i == 0 or start + i in starts
            position_ids[r, i] = 0 if is_start else position_ids[r, i - 1] + 1
            # The row's first piece is 0; each document start inside the row opens the next.
            document_ids[r, i] = 0 if i == 0 else document_ids[r, i - 1] + is_start
            if is_start:
                cu_seqlens.append(r * block + i)
            if targets == "shifted":
                labels[r, i] = int(tokens[start + i + 1])
                loss_mask[r, i] = start + i + 1 not in starts
        if targets == "next":
            labels[r] = int(tokens[start + block])
            loss_mask[r] = start + block not in starts
    if not extras:
        return input_ids, labels
    batch: dict[str, Any] = {"input_ids": input_ids, "labels": labels}
    if "document_ids" in extras:
        batch["document_ids"] = document_ids
    if "position_ids" in extras:
        batch["position_ids"] = position_ids
    if "loss_mask" in extras:
        batch["loss_mask"] = loss_mask
    if "cu_seqlens" in extras:
        cu_seqlens.append(rows * block)
        batch["cu_seqlens"] = np.array(cu_seqlens, np.int32)
        batch["max_seqlen"] = max(b - a for a, b in pairwise(cu_seqlens))
    return batch


def expected_batches(
    shards: Sequence[Shard],
    block: int,
    batch_size: int,
    *,
    epoch_order: Callable[[int, int], Sequence[int]] | None = None,
    epochs: int = 1,
    stride: int = 1,
    eos: int | None = None,
    windows: str = "cross",
    targets: str = "next",
    extras: Sequence[str] = (),
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
) -> list[Any]:
    """This rank's batches of the run; ``epoch_order(epoch, n)`` is the order (None: identity)."""
    found = window_list(shards, block, stride, windows, eos)
    batches: list[Any] = []
    if not found:
        return batches
    for epoch in range(epochs):
        order = range(len(found)) if epoch_order is None else epoch_order(epoch, len(found))
        for positions in rank_positions(len(found), batch_size, rank, world_size, drop_last):
            picked = [found[int(order[p])] for p in positions]
            batches.append(window_batch(shards, picked, block, targets, eos, extras))
    return batches


def materialized_orders(seed: int, epochs: int, num_windows: int) -> list[np.ndarray]:
    """The reference generator's orders: one ``RandomState(seed)`` drawing every epoch's."""
    rng = np.random.RandomState(seed)
    return [rng.permutation(num_windows) for _ in range(epochs)]


def assert_same_batch(actual: Any, expected: Any, where: str = "") -> None:
    """Same kind of batch, same keys, and every array of the same dtype, shape and values."""
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple), f"{where}: a {type(actual).__name__}, expected a tuple"
        pairs = list(zip(("input_ids", "labels"), actual, expected, strict=True))
    else:
        assert isinstance(actual, dict), f"{where}: a {type(actual).__name__}, expected a dict"
        assert list(actual) == list(expected), f"{where}: keys {list(actual)}"
        pairs = [(k, actual[k], expected[k]) for k in expected]
    for name, got, want in pairs:
        if name == "max_seqlen":
            assert type(got) is int and got == want, f"{where}: max_seqlen {got!r} != {want}"
            continue
        assert got.dtype == want.dtype, f"{where}: {name} is {got.dtype}, expected {want.dtype}"
        assert got.shape == want.shape, f"{where}: {name} {got.shape} != {want.shape}"
        assert np.array_equal(got, want), f"{where}: {name} differs\n{got}\n!=\n{want}"


def assert_same_batches(actual: Sequence[Any], expected: Sequence[Any]) -> None:
    assert len(actual) == len(expected), f"{len(actual)} batches, expected {len(expected)}"
    for i, (got, want) in enumerate(zip(actual, expected, strict=True)):
        assert_same_batch(got, want, f"batch {i}")


def copied(batch: Any) -> Any:
    """A batch that outlives the stream's reused buffers."""
    if isinstance(batch, tuple):
        return tuple(array.copy() for array in batch)
    return {k: v if k == "max_seqlen" else v.copy() for k, v in batch.items()}
