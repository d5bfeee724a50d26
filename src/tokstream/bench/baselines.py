"""The baselines every tokstream figure is measured against (see docs/benchmarks.md).

One module, shared by ``tokstream bench`` and the pytest-benchmark suite, so both time exactly
the same code. Every path is a function ``path(token_ids, block, batch_size, *, epochs=1,
shuffle=True, seed=0)`` returning an iterator of tuples whose first element holds one row per
window (its ``len()`` is the batch's window count):

``reference``, ``best_numpy``, ``nanogpt``, ``fast``, ``fast_reuse``, ``fast_one_buffer``
    Yield ``(windows, next_tokens)``: the same batches in the same order as
    :func:`tokstream.stream_token_source`, so their outputs can be asserted identical before they
    are timed (``nanogpt`` yields torch tensors holding the same values; ``fast_reuse``
    overwrites each batch two batches later, ``fast_one_buffer`` one batch later).
``copy_limit``
    Yields ``(buffer,)``: a reused ``(b, block)`` int64 buffer filled by ``np.copyto`` from one
    random offset of the corpus per batch. It moves the same tokens per batch as the fast path
    but from contiguous memory, so it is the bandwidth ceiling of the job, not a loader.
``gather_limit``
    Yields ``(buffer,)``: a reused ``(b,)`` buffer in the corpus dtype filled by ``np.take`` with
    the batch's window starts, i.e. the first token of every window. At small blocks a window
    is one or two random cache lines, so windows/s cannot beat this rate by much.
``c_loop``
    Yields ``(windows, next_tokens)``, the fast path's batches, from one reused pair of buffers
    filled by a plain C loop (one ``memcpy`` per int64 window) at the software-prefetch distance
    that is fastest on this machine: the single-thread random-window limit.

:data:`PATH_LABELS` names the paths in tables and plots; :data:`RATIOS` and :func:`ratio` are the
figures every report derives from them. The first-batch check that must pass before any path is
timed is :func:`tokstream.bench.harness.check_identical`.

Like the stream, every path draws its epoch order (``RandomState(seed).permutation(n)``, or the
random offsets of ``copy_limit``) when its first batch is requested, not when it is called: a
benchmark that takes the first batch untimed excludes the one-off permutation from its figure.
Arguments are validated by the same rules as the stream (``tokstream._validate``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, cast

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tokstream import _validate
from tokstream import reference as _reference
from tokstream.bench import _loop
from tokstream.stream import stream_token_source as _fast

Path = Callable[..., Iterator[tuple[Any, ...]]]

__all__ = [
    "FAST_PATHS",
    "LIMITS",
    "LOADERS",
    "PATHS",
    "C_LOOP_DISTANCES",
    "PATH_LABELS",
    "RATIOS",
    "best_c_loop_distance",
    "best_numpy",
    "c_loop",
    "copy_limit",
    "fast",
    "fast_one_buffer",
    "fast_reuse",
    "gather_limit",
    "nanogpt",
    "ratio",
    "reference",
    "torch_available",
]


def _prepare(
    token_ids: Any, block: Any, batch_size: Any, epochs: Any, shuffle: Any, seed: Any
) -> tuple[np.ndarray, int, int, int, bool, int]:
    ids = _validate.token_array(token_ids)
    block, batch_size, epochs, shuffle, seed = _validate.stream_controls(
        block, batch_size, epochs, shuffle, seed
    )
    return ids, block, batch_size, epochs, shuffle, seed


def _batch_starts(
    num_windows: int, batch_size: int, epochs: int, shuffle: bool, seed: int
) -> Iterator[np.ndarray]:
    """The reference's batches of window starts, from a ``RandomState(seed)`` of their own."""
    return _reference.batch_starts(
        num_windows, batch_size, epochs, shuffle, np.random.RandomState(seed)
    )


def reference(
    token_ids: Any,
    block: int,
    batch_size: int,
    *,
    epochs: int = 1,
    shuffle: bool = True,
    seed: int = 0,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The spec's path, :func:`tokstream.reference.stream_token_source`: one ``np.stack``/batch."""
    return _reference.stream_token_source(
        token_ids, block, batch_size, epochs=epochs, shuffle=shuffle, seed=seed
    )


def fast(
    token_ids: Any,
    block: int,
    batch_size: int,
    *,
    epochs: int = 1,
    shuffle: bool = True,
    seed: int = 0,
    reuse_buffers: int = 0,
    out_dtype: str = "int64",
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """tokstream's fast path, :func:`tokstream.stream_token_source`, with its defaults but the
    order asked for by name: the reference's drawn permutation (an array's default), whose
    batches are checked identical to the reference's before any path is timed.

    ``reuse_buffers`` is there for :data:`fast_reuse` and :data:`fast_one_buffer`;
    ``out_dtype`` for ``tokstream bench --out-dtype`` (the :data:`FAST_PATHS` take it).
    """
    stream = _fast(
        token_ids,
        block,
        batch_size,
        epochs=epochs,
        shuffle=shuffle,
        seed=seed,
        permutation="materialized",
        reuse_buffers=reuse_buffers,
        out_dtype=out_dtype,
    )
    # The stream itself, not a wrapper that would add its own cost to every timed batch: without
    # extras each of its batches is a (windows, next_tokens) tuple.
    return cast("Iterator[tuple[np.ndarray, np.ndarray]]", stream)


#: The fast path cycling through two preallocated batches (``reuse_buffers=2``): the same
#: batches as :func:`fast`, each overwritten two batches later, so no fresh multi-MB allocation
#: (and its page faults) per batch.
fast_reuse = partial(fast, reuse_buffers=2)
#: The fast path refilling one preallocated batch (``reuse_buffers=1``): the buffer discipline
#: of :func:`c_loop`, so the two compare like with like (the buffer written last batch is still
#: in the core's cache). A consumer that holds a batch while the next is made needs two buffers
#: (:data:`fast_reuse`) and pays for it in cache misses (docs/out-of-core.md measures how much).
fast_one_buffer = partial(fast, reuse_buffers=1)


#: The paths that are tokstream's stream, which take ``out_dtype=`` (the others yield int64).
FAST_PATHS = ("fast", "fast_reuse", "fast_one_buffer")


def best_numpy(
    token_ids: Any,
    block: int,
    batch_size: int,
    *,
    epochs: int = 1,
    shuffle: bool = True,
    seed: int = 0,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The fastest pure-NumPy gather we know: fancy-index a strided view of all windows.

    ``sliding_window_view(ids, block)[starts]`` copies the selected windows in one C loop (no
    Python object per window); ``ids[starts + block]`` gives the next tokens. The corpus is
    converted to int64 once, up front, as the reference does, so each batch is already int64.

    >>> [w.tolist() for w, _ in best_numpy([5, 6, 7, 8], 2, 2, shuffle=False)]
    [[[5, 6], [6, 7]]]
    """
    ids, block, batch_size, epochs, shuffle, seed = _prepare(
        token_ids, block, batch_size, epochs, shuffle, seed
    )
    return _best_numpy(ids.astype(np.int64, copy=False), block, batch_size, epochs, shuffle, seed)


def _best_numpy(
    ids: np.ndarray, block: int, batch_size: int, epochs: int, shuffle: bool, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    if block > ids.shape[0]:  # no window, no batch; sliding_window_view would refuse the block
        return
    windows_view = sliding_window_view(ids, block)
    for starts in _batch_starts(ids.shape[0] - block, batch_size, epochs, shuffle, seed):
        yield windows_view[starts], ids[starts + block]


def torch_available() -> bool:
    """Whether the ``nanogpt`` path can run (PyTorch importable)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def nanogpt(
    token_ids: Any,
    block: int,
    batch_size: int,
    *,
    epochs: int = 1,
    shuffle: bool = True,
    seed: int = 0,
) -> Iterator[tuple[Any, Any]]:
    """nanoGPT's ``get_batch``: ``torch.stack`` of one ``torch.from_numpy`` slice per window.

    Yields int64 CPU tensors with the values of the fast path's batches. A non-int64 corpus is
    cast per window (``astype(np.int64)``), as nanoGPT does for its uint16 memory map. Raises
    ImportError when PyTorch is not installed (it is imported only here).
    """
    import torch

    ids, block, batch_size, epochs, shuffle, seed = _prepare(
        token_ids, block, batch_size, epochs, shuffle, seed
    )
    return _nanogpt(torch, ids, block, batch_size, epochs, shuffle, seed)


def _nanogpt(
    torch: Any,
    ids: np.ndarray,
    block: int,
    batch_size: int,
    epochs: int,
    shuffle: bool,
    seed: int,
) -> Iterator[tuple[Any, Any]]:
    for starts in _batch_starts(ids.shape[0] - block, batch_size, epochs, shuffle, seed):
        windows = torch.stack(
            [torch.from_numpy(ids[i : i + block].astype(np.int64, copy=False)) for i in starts]
        )
        next_tokens = torch.from_numpy(ids[starts + block].astype(np.int64, copy=False))
        yield windows, next_tokens


def copy_limit(
    token_ids: Any,
    block: int,
    batch_size: int,
    *,
    epochs: int = 1,
    shuffle: bool = True,
    seed: int = 0,
) -> Iterator[tuple[np.ndarray]]:
    """Copy as many tokens per batch as the fast path, contiguously, into one reused buffer.

    Each batch of ``b`` windows becomes one ``np.copyto`` of ``b * block`` consecutive tokens
    from a random offset (drawn per epoch from ``RandomState(seed)``; a corpus shorter than a
    batch is read around its end) into a reused ``(b, block)`` int64 buffer, so there is no
    allocation, no page fault and no random access: what is left is the copy bandwidth.
    ``shuffle`` is accepted for a uniform signature; the offsets are random either way.

    >>> ids = np.arange(100)
    >>> (buffer,) = next(copy_limit(ids, 4, 3))
    >>> start = int(buffer[0, 0])
    >>> bool((buffer.ravel() == ids[start : start + 12]).all())
    True
    """
    ids, block, batch_size, epochs, shuffle, seed = _prepare(
        token_ids, block, batch_size, epochs, shuffle, seed
    )
    return _copy_limit(ids, block, batch_size, epochs, seed)


def _copy_limit(
    ids: np.ndarray, block: int, batch_size: int, epochs: int, seed: int
) -> Iterator[tuple[np.ndarray]]:
    num_tokens = ids.shape[0]
    num_windows = num_tokens - block
    if num_windows <= 0:
        return
    rng = np.random.RandomState(seed)
    full = np.empty(min(batch_size, num_windows) * block, dtype=np.int64)  # the largest batch
    num_batches = -(-num_windows // batch_size)
    # Offsets leave room for a whole batch, so only a corpus shorter than one batch wraps.
    high = max(num_tokens - batch_size * block, 0) + 1
    for _ in range(epochs):
        offsets = rng.randint(0, high, size=num_batches)
        for batch, k in enumerate(range(0, num_windows, batch_size)):
            count = min(batch_size, num_windows - k)
            need = count * block
            flat = full[:need]
            offset = int(offsets[batch])
            if need <= num_tokens - offset:
                np.copyto(flat, ids[offset : offset + need])
            else:
                _copy_around(flat, ids, offset)
            yield (flat.reshape(count, block),)


def _copy_around(flat: np.ndarray, ids: np.ndarray, offset: int) -> None:
    done = 0
    while done < flat.shape[0]:
        take = min(flat.shape[0] - done, ids.shape[0] - offset)
        np.copyto(flat[done : done + take], ids[offset : offset + take])
        done += take
        offset = 0


def gather_limit(
    token_ids: Any,
    block: int,
    batch_size: int,
    *,
    epochs: int = 1,
    shuffle: bool = True,
    seed: int = 0,
) -> Iterator[tuple[np.ndarray]]:
    """``np.take`` one token per window start into a reused buffer: random lines per second.

    The buffer holds the first token of each of the batch's windows (``windows[:, 0]`` of the
    fast path, in the corpus dtype), for the same starts in the same order.

    >>> [b.tolist() for (b,) in gather_limit([5, 6, 7, 8], 2, 2, shuffle=False)]
    [[5, 6]]
    """
    ids, block, batch_size, epochs, shuffle, seed = _prepare(
        token_ids, block, batch_size, epochs, shuffle, seed
    )
    return _gather_limit(ids, block, batch_size, epochs, shuffle, seed)


def _gather_limit(
    ids: np.ndarray, block: int, batch_size: int, epochs: int, shuffle: bool, seed: int
) -> Iterator[tuple[np.ndarray]]:
    num_windows = ids.shape[0] - block
    full = np.empty(max(min(batch_size, num_windows), 0), dtype=ids.dtype)  # the largest batch
    for starts in _batch_starts(num_windows, batch_size, epochs, shuffle, seed):
        out = full[: starts.shape[0]]
        np.take(ids, starts, out=out)
        yield (out,)


#: Software-prefetch distances (windows ahead) :func:`c_loop` tries; 0 is no prefetch.
C_LOOP_DISTANCES = (0, 1, 2, 4, 8, 16, 32, 64)


def c_loop(
    token_ids: Any,
    block: int,
    batch_size: int,
    *,
    epochs: int = 1,
    shuffle: bool = True,
    seed: int = 0,
    distance: int | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The fast path's batches copied by a plain C loop: the random-window limit of one thread.

    Per window one ``memcpy`` (a widening loop for dtypes other than int64) into one reused
    ``(b, block)`` buffer, the next token into a reused ``(b,)`` one, after a software prefetch
    of every cache line of the window ``distance`` windows ahead. With ``distance=None`` the
    loop first tries every distance of :data:`C_LOOP_DISTANCES` on random windows of this
    corpus and shape (best of 3 rounds each, about 2M tokens a round) and keeps the fastest;
    that calibration runs when the first batch is requested, which benchmarks leave untimed.

    >>> [w.tolist() for w, _ in c_loop([5, 6, 7, 8], 2, 2, shuffle=False, distance=0)]
    [[[5, 6], [6, 7]]]
    """
    ids, block, batch_size, epochs, shuffle, seed = _prepare(
        token_ids, block, batch_size, epochs, shuffle, seed
    )
    if distance is not None:
        distance = _validate.nonnegative_int(distance, "distance")
    return _c_loop(ids, block, batch_size, epochs, shuffle, seed, distance)


def _c_loop(
    ids: np.ndarray,
    block: int,
    batch_size: int,
    epochs: int,
    shuffle: bool,
    seed: int,
    distance: int | None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    num_windows = ids.shape[0] - block
    rows = max(min(batch_size, num_windows), 0)  # the largest batch
    windows = np.empty((rows, block), dtype=np.int64)
    next_tokens = np.empty(rows, dtype=np.int64)
    if distance is None:
        distance = best_c_loop_distance(ids, block, rows, seed) if rows else 0
    for starts in _batch_starts(num_windows, batch_size, epochs, shuffle, seed):
        count = starts.shape[0]
        _loop.copy_windows(ids, starts, windows, next_tokens, distance)
        yield windows[:count], next_tokens[:count]


def best_c_loop_distance(ids: np.ndarray, block: int, batch_size: int, seed: int = 0) -> int:
    """The distance of :data:`C_LOOP_DISTANCES` at which :func:`c_loop` copies fastest here.

    Each distance copies the same number of random windows (about 2M tokens, 4 to 64 batches)
    in each of 3 rounds, the distances taking turns within a round; the best round
    counts. ``ids`` is a validated token array holding more than ``block`` tokens.
    """
    num_windows = ids.shape[0] - block
    batches = min(64, max(4, -(-2_000_000 // (block * batch_size))))
    rng = np.random.default_rng(seed)
    windows = np.empty((batch_size, block), dtype=np.int64)
    next_tokens = np.empty(batch_size, dtype=np.int64)
    best = dict.fromkeys(C_LOOP_DISTANCES, 0.0)
    for _ in range(3):
        for distance in C_LOOP_DISTANCES:
            starts = rng.integers(0, num_windows, size=(batches, batch_size), dtype=np.int64)
            started = time.perf_counter()
            for batch in starts:
                _loop.copy_windows(ids, batch, windows, next_tokens, distance)
            best[distance] = max(best[distance], 1.0 / (time.perf_counter() - started))
    return max(best, key=best.__getitem__)


#: Paths that yield the fast path's batches, by name, in table order.
LOADERS: dict[str, Path] = {
    "reference": reference,
    "best_numpy": best_numpy,
    "nanogpt": nanogpt,
    "fast": fast,
    "fast_reuse": fast_reuse,
    "fast_one_buffer": fast_one_buffer,
}

#: The ceilings: same tokens moved (``copy_limit``), same windows touched (``gather_limit``), same
#: windows copied by a plain C loop (``c_loop``).
LIMITS: dict[str, Path] = {
    "copy_limit": copy_limit,
    "gather_limit": gather_limit,
    "c_loop": c_loop,
}

PATHS: dict[str, Path] = {**LOADERS, **LIMITS}

#: The names tables and plots show for the paths, in table order.
PATH_LABELS = {
    "reference": "reference",
    "best_numpy": "best NumPy",
    "nanogpt": "nanoGPT",
    "fast": "fast",
    "fast_reuse": "fast (reuse)",
    "fast_one_buffer": "fast (1 buffer)",
    "copy_limit": "copy limit",
    "gather_limit": "gather limit",
    "c_loop": "C loop",
}
#: Ratios reported for each shape: (numerator, denominator, table label). The gather limit
#: counts windows, so the ratio to it compares windows per second.
RATIOS = (
    ("fast", "reference", "fast/ref"),
    ("fast", "best_numpy", "fast/NumPy"),
    ("fast", "nanogpt", "fast/nanoGPT"),
    ("fast", "copy_limit", "fast/copy"),
    ("fast_reuse", "copy_limit", "reuse/copy"),
    ("fast", "gather_limit", "fast win/gather"),
    ("fast", "c_loop", "fast/C loop"),
    ("fast_one_buffer", "c_loop", "1 buffer/C loop"),
)


def ratio(top: str, bottom: str, top_rate: float, bottom_rate: float, block: int) -> float:
    """``top_rate / bottom_rate`` in the same unit: tokens/s, or windows/s for the gather limit.

    >>> ratio("fast", "gather_limit", 800.0, 50.0, block=8)
    2.0
    """
    if bottom == "gather_limit":
        top_rate /= block
    return top_rate / bottom_rate
