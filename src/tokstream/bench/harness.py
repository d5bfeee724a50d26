"""The benchmark harness behind ``tokstream bench``: measure every path on the same corpus.

The protocol of docs/benchmarks.md: every path of :mod:`tokstream.bench.baselines` runs in one
process on the same corpus; each path's first batch is drawn untimed and checked against the fast
path's (:func:`check_identical`); the timed rounds then take turns
between the paths, so the ratios come from the same minutes of the same machine. The results are
:class:`Case` objects, which :mod:`tokstream.bench.report` renders.

Nothing here prints: progress goes to an optional :class:`Progress` object, and expected failures
(a corpus too small, a path that disagrees, a run too large for memory) are ValueErrors.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Protocol

import numpy as np

from tokstream.bench import baselines

#: The synthetic corpus: GPT-2's vocabulary size, as in docs/benchmarks.md.
VOCAB_SIZE = 50257
#: The benchmark's shapes, ``(block, batch_size)``: from many tiny windows to few long ones.
SHAPES = ((8, 4096), (128, 512), (1024, 64), (1024, 512), (2048, 16))
#: Token dtypes the synthetic corpus may be held in: every one that holds ids below VOCAB_SIZE.
SYNTHETIC_DTYPES = ("int64", "uint16", "int32", "uint32", "uint64")


class Progress(Protocol):
    """Where the harness reports what it is doing (``final`` marks a milestone)."""

    def update(self, message: str, *, final: bool = False) -> None: ...


class _Silent:
    def update(self, message: str, *, final: bool = False) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Measurement


@dataclass
class Case:
    """One measured configuration: a corpus dtype, a window order and a shape."""

    dtype: str
    shuffle: bool
    block: int
    batch_size: int
    epochs: int = 1
    rates: dict[str, list[float]] = field(default_factory=dict)

    def median(self, path: str) -> float:
        """Median over rounds, in millions of tokens (gather limit: windows) per second."""
        return statistics.median(self.rates[path])

    def ratios(self) -> dict[str, float]:
        """``numerator/denominator`` of :data:`baselines.RATIOS` for the paths measured here."""
        return {
            f"{top}/{bottom}": baselines.ratio(
                top, bottom, self.median(top), self.median(bottom), self.block
            )
            for top, bottom, _ in baselines.RATIOS
            if top in self.rates and bottom in self.rates
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "shuffle": self.shuffle,
            "block": self.block,
            "batch_size": self.batch_size,
            "epochs": self.epochs,
            "paths": {
                path: {
                    "unit": "Mwindows/s" if path == "gather_limit" else "Mtok/s",
                    "median": self.median(path),
                    "rounds": rates,
                }
                for path, rates in self.rates.items()
            },
            "ratios": self.ratios(),
        }


def synthetic_corpus(num_tokens: int, dtype: str, seed: int) -> np.ndarray:
    """``num_tokens`` seeded random ids in ``[0, VOCAB_SIZE)``, held as ``dtype``.

    >>> ids = synthetic_corpus(5, "uint16", seed=0)
    >>> ids.dtype.name, len(ids), bool(ids.max() < VOCAB_SIZE)
    ('uint16', 5, True)
    """
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB_SIZE, size=num_tokens, dtype=np.int64)
    return ids.astype(dtype, copy=False)


#: Bytes per window of the Python objects (views, tensors) the per-window paths build per batch.
WINDOW_OBJECT_BYTES = 512


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say (Windows)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(
    num_tokens: int,
    corpus_bytes: int,
    shapes: Sequence[tuple[int, int]],
    paths: Sequence[str],
    *,
    corpus_option: str,
    memory: int | None = None,
) -> None:
    """Refuse, before anything is allocated, a run that cannot fit in ``memory`` bytes.

    The estimate is an upper bound of what a run holds at once: the corpora (``corpus_bytes``);
    for each case, an int64 copy of the corpus and a window order per path; and, while the first
    batches are compared, one batch per path plus two more, each window ``block + 1`` int64 and
    the per-window objects of the reference and nanoGPT paths. ``memory`` defaults to
    :func:`physical_memory` (no check where it is unknown). The ValueError names the option to
    change: ``corpus_option`` (e.g. ``"--tokens 10"``) or the shape's ``--batch-size``/``--block``.
    """
    memory = physical_memory() if memory is None else memory
    if memory is None:
        return
    per_corpus = corpus_bytes + num_tokens * 8 * (2 + len(paths))
    if per_corpus > memory:
        raise ValueError(
            f"{corpus_option} needs about {_gigabytes(per_corpus)} of memory (the corpus, and "
            f"an int64 copy and a window order for each of {len(paths)} paths); this machine "
            f"has {_gigabytes(memory)}"
        )
    for block, batch_size in shapes:
        rows = max(min(batch_size, num_tokens - block), 0)
        per_batch = rows * ((block + 1) * 8 + 2 * WINDOW_OBJECT_BYTES)
        needed = per_corpus + (len(paths) + 2) * per_batch
        if needed > memory:
            raise ValueError(
                f"--batch-size {batch_size} with --block {block} needs about "
                f"{_gigabytes(needed)} of memory (batches of {rows:,} windows for each of "
                f"{len(paths)} paths); this machine has {_gigabytes(memory)}"
            )


def _gigabytes(size: int) -> str:
    return f"{size / 1e9:,.1f} GB"


def measure_case(
    case: Case,
    ids: np.ndarray,
    paths: Sequence[str],
    *,
    rounds: int,
    batches: int,
    seed: int,
    progress: Progress | None = None,
    label: str = "",
    out_dtype: str = "int64",
) -> Case:
    """Time ``paths`` on one case: ``rounds`` rounds of ``batches`` batches per path.

    Every path is started and its first batch drawn untimed (that batch carries the one-off
    epoch permutation and is the one checked against the fast path's, so ``paths`` must hold
    ``"fast"``). The rounds then take turns between the paths, each round starting with a
    different path, so a drift of the machine's speed spreads over all of them. A corpus too
    small for one epoch to hold every round runs several epochs, and the later epochs'
    permutations then fall inside the timing. ``out_dtype`` is the dtype tokstream's paths
    (:data:`baselines.FAST_PATHS`) write their batches in; the other paths yield int64.
    """
    progress = progress or _Silent()
    needed = 1 + rounds * batches
    case.epochs = epochs_for(ids.shape[0], case.block, case.batch_size, needed)
    iterators = {}
    first = {}
    for path in paths:
        progress.update(f"{label}: starting {path}")
        output = {"out_dtype": out_dtype} if path in baselines.FAST_PATHS else {}
        iterator = baselines.PATHS[path](
            ids,
            case.block,
            case.batch_size,
            epochs=case.epochs,
            shuffle=case.shuffle,
            seed=seed,
            **output,
        )
        first[path] = next(iterator)
        iterators[path] = iterator
    check_identical(first, case.block, out_dtype=out_dtype)
    del first
    per_window = {path: 1 if path == "gather_limit" else case.block for path in paths}
    case.rates = {path: [] for path in paths}
    for round_index in range(rounds):
        shift = round_index % len(paths)
        for path in [*paths[shift:], *paths[:shift]]:
            progress.update(f"{label}: {path} round {round_index + 1}/{rounds}")
            started = time.perf_counter()
            windows = consume(iterators[path], batches)
            elapsed = time.perf_counter() - started
            case.rates[path].append(windows * per_window[path] / elapsed / 1e6)
    return case


def run_cases(
    corpora: Sequence[tuple[str, np.ndarray]],
    shapes: Sequence[tuple[int, int]],
    paths: Sequence[str],
    *,
    shuffle: bool,
    rounds: int,
    batches: int,
    seed: int,
    progress: Progress | None = None,
    out_dtype: str = "int64",
) -> list[Case]:
    """Measure every ``(dtype, ids)`` corpus on every ``(block, batch_size)`` shape, in order
    (tokstream's batches in ``out_dtype``).

    Raises ValueError before measuring anything when a block leaves a corpus no window.
    """
    progress = progress or _Silent()
    for dtype, ids in corpora:
        too_short = [block for block, _ in shapes if ids.shape[0] <= block]
        if too_short:
            raise ValueError(
                f"the corpus ({dtype}) holds {ids.shape[0]} tokens: no window of block "
                f"{too_short[0]} fits; use more --tokens or smaller --block"
            )
    cases = []
    total = len(corpora) * len(shapes)
    order = "shuffled" if shuffle else "sequential"
    for number, ((dtype, ids), (block, batch_size)) in enumerate(
        itertools.product(corpora, shapes), start=1
    ):
        label = f"[{number}/{total}] {dtype} {order} block={block} batch={batch_size}"
        progress.update(label, final=True)
        case = Case(dtype, shuffle, block, batch_size)
        cases.append(
            measure_case(
                case,
                ids,
                paths,
                rounds=rounds,
                batches=batches,
                seed=seed,
                progress=progress,
                label=label,
                out_dtype=out_dtype,
            )
        )
    return cases


def epochs_for(num_tokens: int, block: int, batch_size: int, batches: int) -> int:
    """The fewest epochs that hold ``batches`` batches (a timing run must not run dry).

    >>> epochs_for(num_tokens=108, block=8, batch_size=10, batches=25)
    3
    """
    batches_per_epoch = -(-(num_tokens - block) // batch_size)
    if batches_per_epoch <= 0:
        raise ValueError(f"no window of block={block} fits in {num_tokens} tokens")
    return max(1, -(-batches // batches_per_epoch))


def consume(batches: Iterator[tuple[Any, ...]], count: int) -> int:
    """Draw ``count`` batches (fewer if the iterator ends) and return how many windows they held.

    The timed loop of ``tokstream bench`` and of the benchmark suite: nothing but the iteration
    and one ``len()`` per batch.
    """
    windows = 0
    for batch in islice(batches, count):
        windows += len(batch[0])
    return windows


def _as_numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def check_identical(
    first: dict[str, tuple[Any, ...]], block: int, against: str = "fast", out_dtype: str = "int64"
) -> None:
    """Raise ValueError unless every path's first batch agrees with the ``against`` path's.

    ``first`` maps path names to their first batch and must hold ``against``, a loader. Loaders
    must yield its windows and next tokens (the same values in the same order; int64, or
    ``out_dtype`` for the :data:`baselines.FAST_PATHS`); the gather limit must hold each
    window's first token; the copy limit must have the windows' shape. A path that fails is not
    doing the same job, so timing it would compare unlike with unlike.
    """
    windows, next_tokens = (_as_numpy(part) for part in first[against])
    for path, batch in first.items():
        if path in baselines.LOADERS:
            got_windows, got_next = (_as_numpy(part) for part in batch)
            dtype = np.dtype(out_dtype if path in baselines.FAST_PATHS else np.int64)
            same = (
                got_windows.dtype == dtype
                and got_next.dtype == dtype
                and np.array_equal(got_windows, windows)
                and np.array_equal(got_next, next_tokens)
            )
        elif path == "gather_limit":
            same = np.array_equal(batch[0], windows[:, 0])
        else:
            same = batch[0].shape == windows.shape
        if not same:
            raise ValueError(
                f"path {path!r} yielded a different first batch from the {against} path at "
                f"block={block}; refusing to time it"
            )
