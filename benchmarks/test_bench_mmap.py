"""A uint16 memory-mapped token file against the same ids held in RAM as int64.

The mapped file is in the page cache (it was just written), so this measures what the mapping and
the narrower dtype cost or save once the data is resident, not disk speed. Each benchmark times
``BATCHES`` batches of one stream whose epoch order was drawn before timing.

    pytest benchmarks/test_bench_mmap.py --benchmark-columns=median,rounds
"""

from __future__ import annotations

import numpy as np
import pytest

from tokstream import bench, open_tokens, stream_token_source, write_tokens

CORPUS_TOKENS = 10_000_000
SHAPES = list(bench.SHAPES)
BATCHES = 200
ROUNDS = 5


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    ids = bench.synthetic_corpus(CORPUS_TOKENS, "int64", seed=0)
    path = write_tokens(tmp_path_factory.mktemp("mmap") / "tokens.bin", ids, format="bin")
    mapped = open_tokens(path)
    assert mapped.dtype == np.uint16
    return {"uint16 memmap": mapped, "int64 in RAM": ids}


def take(stream, count: int) -> int:
    tokens = 0
    for _ in range(count):
        windows, _ = next(stream)
        tokens += windows.size
    return tokens


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "sequential"])
@pytest.mark.parametrize("block, batch_size", SHAPES)
@pytest.mark.parametrize("source", ["uint16 memmap", "int64 in RAM"])
def test_memmap_against_ram(benchmark, sources, source, block, batch_size, shuffle):
    def stream():
        return stream_token_source(
            sources[source], block, batch_size, epochs=10, shuffle=shuffle, seed=0
        )

    checked, baseline = (
        stream(),
        stream_token_source(sources["int64 in RAM"], block, batch_size, shuffle=shuffle, seed=0),
    )
    for _ in range(3):
        (w, t), (bw, bt) = next(checked), next(baseline)
        assert w.tobytes() == bw.tobytes() and t.tobytes() == bt.tobytes()

    order = "shuffled" if shuffle else "sequential"
    benchmark.group = f"mmap block={block} batch={batch_size} {order}"
    benchmark.extra_info["context_tokens_per_round"] = BATCHES * batch_size * block
    timed = stream()
    next(timed)  # draws the epoch's order outside the timing
    tokens = benchmark.pedantic(take, args=(timed, BATCHES), rounds=ROUNDS, warmup_rounds=1)
    assert tokens == BATCHES * batch_size * block
