"""The Grain and JAX adapters beside the stream they wrap, and beside Grain's own pipeline.

- ``test_adapter_rate``: ``stream_token_source``, ``tokstream.grain.TokenIterDataset`` and
  ``tokstream.jax.global_batches`` (one CPU device, and four) at block 2048 x 16, shuffled, the
  same stream options on every side (the JAX path's: int32, implicit order, whole batches), the
  first batch checked identical on every side (target: each adapter at most 10% slower a
  batch); beside the JAX path, the stream's batches put on the same devices with one
  ``jax.device_put`` each, the transfer any JAX loader pays (the JAX path's ratio to it is what
  the adapter adds);
- ``test_grain_pipeline_rate`` and ``test_grain_pipeline_first_batch``: shuffled windows of
  2049 tokens in batches of 16 from ``TokenIterDataset(targets="shifted")`` beside Grain's own
  pipeline over the same in-memory tokens (``MapDataset.source`` of the windows, ``.shuffle``,
  ``.batch``, ``.to_iter_dataset()``); and packed rows (``windows="packed"``) beside Grain's
  ``BestFitPackIterDataset`` over the same documents (lognormal lengths, median 500, mean 900
  tokens), each pipeline's padding share noted: tokens per second, and the time from making the
  pipeline to its first batch.

The adapters' cases need the ``grain`` and ``jax`` extras and skip without them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

grain = pytest.importorskip("grain")
jax = pytest.importorskip("jax")
# Before JAX's backend is made: four CPU devices in this process, for the sharded side.
jax.config.update("jax_num_cpu_devices", 4)

from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from tokstream import Corpus, stream_token_source  # noqa: E402
from tokstream.grain import TokenIterDataset  # noqa: E402
from tokstream.jax import global_batches  # noqa: E402

BLOCK, BATCH = 2048, 16
EPOCHS = 1_000  # never runs dry; the implicit order draws nothing per epoch
#: The JAX path's stream options (int32 unless jax_enable_x64; whole global batches), on every side.
OPTIONS = dict(seed=0, permutation="implicit", out_dtype="int32", drop_last=True, epochs=EPOCHS)


def _rows(batch: Any) -> np.ndarray:
    return np.asarray(batch[0])


def _drain(batches: Iterator[Any], count: int, ready: Callable[[Any], Any] = lambda b: b) -> Any:
    batch = None
    for batch in itertools.islice(batches, count):
        ready(batch)
    return batch


def _placed(batches: Iterator[Any], sharding: Any) -> Iterator[Any]:
    """The stream's batches put on the devices as they are: what any JAX loader pays."""
    for batch in batches:
        yield jax.device_put(batch, (sharding, sharding), may_alias=True)


def _sides(ids: np.ndarray) -> dict[str, Callable[[], Iterator[Any]]]:
    devices = np.array(jax.devices())[:4]
    one, every = Mesh(devices[:1], ("data",)), Mesh(devices, ("data",))
    count = len(devices)
    return {
        "tokstream": lambda: stream_token_source(ids, BLOCK, BATCH, **OPTIONS),
        "grain TokenIterDataset": lambda: iter(TokenIterDataset(ids, BLOCK, BATCH, **OPTIONS)),
        "stream + device_put 1 device": lambda: _placed(
            stream_token_source(ids, BLOCK, BATCH, **OPTIONS), NamedSharding(one, P("data"))
        ),
        "jax global_batches 1 device": lambda: global_batches(ids, BLOCK, BATCH, one, **OPTIONS),
        f"stream + device_put {count} devices": lambda: _placed(
            stream_token_source(ids, BLOCK, BATCH, **OPTIONS), NamedSharding(every, P("data"))
        ),
        f"jax global_batches {count} devices": lambda: global_batches(
            ids, BLOCK, BATCH, every, **OPTIONS
        ),
    }


SIDES = ["stream", "grain", "put-1", "jax-1", "put-4", "jax-4"]


@pytest.mark.parametrize("side", range(len(SIDES)), ids=SIDES)
@pytest.mark.parametrize("dtype", ["uint16", "int64"])
def test_adapter_rate(measure, settings, corpora, dtype, side) -> None:
    ids = corpora[dtype]
    sides = _sides(ids)
    name = list(sides)[side]
    batches = sides[name]()
    first = _rows(next(batches))
    np.testing.assert_array_equal(first, next(sides["tokstream"]())[0])
    measure(
        _drain,
        args=(batches, settings.batches, jax.block_until_ready),
        group=f"adapters {dtype} shuffled block={BLOCK} batch={BATCH}",
        side=name,
        units=settings.batches * BATCH * BLOCK,
    )


def _grain_windows(ids: np.ndarray) -> Iterator[Any]:
    """Grain's own pipeline: shuffled windows of ``BLOCK + 1`` tokens, batched by Grain."""
    windows = np.lib.stride_tricks.sliding_window_view(ids, BLOCK + 1)
    dataset = grain.MapDataset.source(windows).shuffle(seed=0).repeat(EPOCHS).batch(BATCH)
    return iter(dataset.to_iter_dataset())


def _tokstream_windows(ids: np.ndarray) -> Iterator[Any]:
    # The implicit order, as Grain's shuffle: a keyed permutation evaluated per index.
    dataset = TokenIterDataset(
        ids, BLOCK, BATCH, targets="shifted", permutation="implicit", epochs=EPOCHS, seed=0
    )
    return iter(dataset)


def _documents(ids: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """``ids`` (shifted to be non-zero, 0 being the pad) cut at ``lengths``."""
    cuts = np.cumsum(lengths)
    return np.split(ids % 50_000 + 1, cuts[cuts < ids.shape[0]])


def _grain_packed(documents: list[np.ndarray]) -> Iterator[Any]:
    """Grain's own packing: shuffled documents best-fit packed into rows of ``BLOCK + 1``
    (Grain's packer takes no longer sequence: a longer document is cut into pieces first, as
    tokstream's packing cuts it)."""
    pieces = [
        document[start : start + BLOCK + 1]
        for document in documents
        for start in range(0, max(len(document), 1), BLOCK + 1)
    ]
    dataset = grain.MapDataset.source(pieces).shuffle(seed=0).repeat(EPOCHS)
    dataset = dataset.map(lambda document: {"inputs": document}).to_iter_dataset()
    packed = grain.experimental.BestFitPackIterDataset(
        dataset, length_struct={"inputs": BLOCK + 1}, num_packing_bins=BATCH
    )
    return iter(packed.batch(BATCH))


def _tokstream_packed(documents: list[np.ndarray]) -> Iterator[Any]:
    corpus = Corpus.from_documents(documents)
    dataset = TokenIterDataset(corpus, BLOCK, BATCH, windows="packed", pad=0, epochs=EPOCHS)
    return iter(dataset)


def _padding(batch: Any) -> float:
    tokens = batch["inputs"] if "inputs" in batch else batch["input_ids"]
    return float((np.asarray(tokens) == 0).mean())


PIPELINES = {
    "windows": {"tokstream": _tokstream_windows, "grain": _grain_windows},
    "packed": {"tokstream": _tokstream_packed, "grain": _grain_packed},
}


def _source(kind: str, corpus_uint16: np.ndarray, lognormal_lengths: Any) -> Any:
    if kind == "windows":
        return corpus_uint16.astype(np.int64)
    count = corpus_uint16.shape[0] // 900 + 1
    return _documents(corpus_uint16, lognormal_lengths(count, 0))


def _check(kind: str, batch: Any) -> None:
    if kind == "windows":
        rows = np.asarray(batch) if not isinstance(batch, tuple) else None
        if rows is not None:  # Grain's: windows of BLOCK + 1 tokens
            assert rows.shape == (BATCH, BLOCK + 1)
        else:
            x, y = batch
            assert x.shape == y.shape == (BATCH, BLOCK)
            np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    else:
        tokens = batch["inputs"] if "inputs" in batch else batch["input_ids"]
        assert np.asarray(tokens).shape == (BATCH, BLOCK + ("inputs" in batch))


@pytest.mark.parametrize("pipeline", ["tokstream", "grain"])
@pytest.mark.parametrize("kind", list(PIPELINES))
def test_grain_pipeline_rate(
    measure, settings, corpus_uint16, lognormal_lengths, kind, pipeline
) -> None:
    source = _source(kind, corpus_uint16, lognormal_lengths)
    batches = PIPELINES[kind][pipeline](source)
    _check(kind, next(batches))
    group = f"grain pipelines {kind} block={BLOCK} batch={BATCH}"
    last = measure(
        _drain,
        args=(batches, settings.batches),
        group=group,
        side=pipeline,
        units=settings.batches * BATCH * BLOCK,
    )
    if kind == "packed" and last is not None:
        measure.note(group, f"{pipeline}: padding {_padding(last):.2%} of the last batch's tokens")


@pytest.mark.parametrize("pipeline", ["tokstream", "grain"])
@pytest.mark.parametrize("kind", list(PIPELINES))
def test_grain_pipeline_first_batch(
    measure, settings, corpus_uint16, lognormal_lengths, kind, pipeline
) -> None:
    source = _source(kind, corpus_uint16, lognormal_lengths)
    make = PIPELINES[kind][pipeline]
    batch = measure(
        lambda: next(make(source)),
        group=f"grain pipelines first batch {kind} block={BLOCK} batch={BATCH}",
        side=pipeline,
        units=1,
        unit="s",
        rounds=settings.size(3, 1),
    )
    _check(kind, batch)
