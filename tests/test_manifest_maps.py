"""The bound on a manifest corpus' open maps: at most ``max(max_open_maps, P)``, ``P`` the shards
the byte ranges being read right now lie in (a batch being copied, a read-ahead's batch being
advised); none of those is ever unmapped under a reader. Maps are counted where the kernel would
see them: in ``/proc/self/maps``."""

from __future__ import annotations

import ctypes
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import tokstream
from tokstream import files, writing
from tokstream.manifest import write_manifest

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/maps").exists(), reason="counts maps in /proc/self/maps (Linux)"
)


def mapped_files(directory: Path) -> int:
    """How many maps of files in ``directory`` this process holds now."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    return sum(1 for line in lines if line.endswith(".npy") and f"{directory}/" in line)


def write_shards(directory: Path, count: int, tokens: int) -> list[np.ndarray]:
    rng = np.random.default_rng(count)
    shards = [rng.integers(0, 999, tokens).astype(np.uint16) for _ in range(count)]
    for i, shard in enumerate(shards):
        writing.write_tokens(directory / f"s{i:03d}.npy", shard)
    write_manifest(str(directory / "s*.npy"), directory / "manifest.json")
    return shards


def test_readables_live_at_once_never_let_the_maps_grow_past_the_bound(tmp_path):
    # Each range is released only after the next one is made readable, so some range is always
    # being read: the shards no live range lies in must still be unmapped.
    shards = write_shards(tmp_path, 40, 30)
    source = files.open_tokens(tmp_path / "manifest.json", max_open_maps=3).source
    start = np.zeros(1, np.int64)
    live = source.readable(np.array([0]), start, 16)
    for k in range(1, 40):
        following = source.readable(np.array([k]), start, 16)
        live.release()
        live = following
        assert source.open_maps <= 3 and mapped_files(tmp_path) <= 3
        assert ctypes.string_at(int(live.addresses[0]), 16) == shards[k][:8].tobytes()
    live.release()
    assert mapped_files(tmp_path) <= 3


def test_a_batch_over_more_shards_than_the_bound_maps_them_while_copied_and_drops_them_after(
    tmp_path,
):
    write_shards(tmp_path, 40, 30)
    shutil.copytree(tmp_path, tmp_path.with_name(tmp_path.name + "-glob"))
    corpus = files.open_tokens(tmp_path / "manifest.json", max_open_maps=3)
    globbed = files.open_tokens(str(tmp_path.with_name(tmp_path.name + "-glob") / "s*.npy"))
    source = corpus.source
    during: list[int] = []
    opened = source._open

    def counted(index: int) -> np.ndarray:
        during.append(mapped_files(tmp_path))
        return opened(index)

    source._open = counted  # every map a batch (or the read-ahead) makes
    ours = tokstream.TokenStream(corpus, 8, 16, shuffle=True, seed=4, epochs=2)
    theirs = tokstream.TokenStream(globbed, 8, 16, shuffle=True, seed=4, epochs=2)
    assert ours._readahead is not None
    after = []
    for mine, want in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(mine[0], want[0])
        np.testing.assert_array_equal(mine[1], want[1])
        after.append(mapped_files(tmp_path))
    # While a batch of 16 windows is read, its (up to 16) shards are mapped at once; between
    # batches the bound holds.
    assert max(during) > 3 and max(during) < 16
    assert max(after) <= 3 and source.open_maps <= 3


def test_a_shard_refused_while_a_batch_is_made_readable_leaves_no_pin(tmp_path):
    write_shards(tmp_path, 6, 30)
    path = tmp_path / "manifest.json"
    body = json.loads(path.read_text())
    body["shards"]["size"][1] = 7
    path.write_text(json.dumps(body))
    source = files.open_tokens(path, max_open_maps=1).source
    two = np.array([0, 1])
    with pytest.raises(ValueError, match="s001.npy: .* bytes, the manifest"):
        source.readable(two, two * 0, 16)
    for k in (2, 3, 4):
        source.readable(np.array([k]), np.zeros(1, np.int64), 16).release()
        assert source.open_maps == 1 and mapped_files(tmp_path) == 1
