"""Start-up over many shards: a manifest against a glob, in one process and in many at once.

Makes ``--shards`` small ``.npy`` shards of random uint16 tokens in ``--directory`` (kept for the
next run), writes their manifest with :func:`tokstream.manifest.write_manifest`, then measures:

- ``open_tokens(manifest)`` in this process (median of ``--rounds``), and the first batch of a
  shuffled stream over it (implicit permutation; stream made + ``next``), each from a fresh
  open; the same for a glob over the first ``--glob-shards`` shards, for the ratio per shard;
- ``--processes`` processes started at once, each importing tokstream, opening the manifest and
  taking its first shuffled batch (a rank of ``world_size=processes``): the slowest process's
  time from its start to its first batch, and the median.

Every batch is checked against the glob's before any figure is printed (on the glob subset).

    python benchmarks/manifest_open.py --shards 100000 --directory /tmp/shards
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import tokstream
from tokstream import files
from tokstream.formats import npy
from tokstream.manifest import write_manifest

CHILD = """
import sys, time, json
start = time.perf_counter()
import tokstream
imported = time.perf_counter()
path, rank, world, block, batch = sys.argv[1], *map(int, sys.argv[2:6])
corpus = tokstream.open_tokens(path)
opened = time.perf_counter()
stream = tokstream.TokenStream(corpus, block, batch, shuffle=True, seed=rank % 2,
                               rank=rank, world_size=world)
next(stream)
end = time.perf_counter()
print(json.dumps({"cpu": time.process_time(), "import": imported - start,
                  "open": opened - imported, "first_batch": end - start,
                  "after_import": end - imported}))
"""


def make_shards(directory: Path, count: int, tokens: int) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    header = npy.header(tokens, np.dtype(np.uint16))
    paths = []
    for i in range(count):
        path = directory / f"shard_{i:06d}.npy"
        if not path.exists():
            path.write_bytes(header + rng.integers(0, 50257, tokens, np.uint16).tobytes())
        paths.append(path)
    return paths


def timed(function) -> tuple[float, object]:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def first_batch(source, block: int, batch: int) -> float:
    def run():
        corpus = files.open_tokens(source)
        stream = tokstream.TokenStream(corpus, block, batch, shuffle=True, seed=0)
        return next(stream)

    return timed(run)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=100_000)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per shard")
    parser.add_argument("--glob-shards", type=int, default=5_000)
    parser.add_argument("--directory", type=Path, default=Path("/tmp/tokstream_manifest_shards"))
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--rewrite", action="store_true", help="write the manifest even if kept")
    args = parser.parse_args()

    seconds, paths = timed(lambda: make_shards(args.directory, args.shards, args.tokens))
    print(f"{args.shards:,} shards of {args.tokens:,} uint16 tokens ready in {seconds:.1f} s")
    manifest = args.directory.parent / f"{args.directory.name}.manifest.json"
    if args.rewrite or not manifest.exists():
        seconds, _ = timed(lambda: write_manifest([str(args.directory / "*.npy")], manifest))
        print(f"write_manifest: {seconds:.1f} s ({manifest.stat().st_size / 1e6:.1f} MB)")
    subset = paths[: args.glob_shards]
    subset_manifest = args.directory.parent / f"{args.directory.name}.subset.json"
    write_manifest(subset, subset_manifest)

    # The manifest's corpus streams the glob's batches (checked before any figure).
    ours = tokstream.TokenStream(files.open_tokens(subset_manifest), args.block, 64, seed=1)
    theirs = tokstream.TokenStream(files.open_tokens(subset), args.block, 64, seed=1)
    for _, mine, want in zip(range(20), ours, theirs, strict=False):
        assert all(np.array_equal(a, b) for a, b in zip(mine, want, strict=True))
    assert ours.state_dict() == theirs.state_dict()

    opens = [timed(lambda: files.open_tokens(manifest))[0] for _ in range(args.rounds)]
    firsts = [first_batch(manifest, args.block, args.batch_size) for _ in range(args.rounds)]
    glob_opens = [timed(lambda: files.open_tokens(subset))[0] for _ in range(args.rounds)]
    subset_opens = [timed(lambda: files.open_tokens(subset_manifest))[0] for _ in range(3)]
    median = statistics.median
    print(f"load average {os.getloadavg()[0]:.1f} (2 cores)")
    print(
        f"open_tokens(manifest of {args.shards:,}): median {median(opens) * 1e3:.0f} ms "
        f"(min {min(opens) * 1e3:.0f}, max {max(opens) * 1e3:.0f})"
    )
    print(
        f"open + first shuffled batch (block {args.block}, batch {args.batch_size}): median "
        f"{median(firsts) * 1e3:.0f} ms (max {max(firsts) * 1e3:.0f})"
    )
    per_glob = median(glob_opens) / len(subset)
    per_manifest = median(subset_opens) / len(subset)
    print(
        f"glob of {len(subset):,}: {median(glob_opens) * 1e3:.0f} ms ({per_glob * 1e6:.0f} us a "
        f"shard); its manifest {median(subset_opens) * 1e3:.1f} ms ({per_manifest * 1e6:.1f} us "
        f"a shard): {per_glob / per_manifest:.0f}x"
    )

    argv = [sys.executable, "-c", CHILD, str(manifest)]
    shape = [str(args.processes), str(args.block), str(args.batch_size)]
    start = time.perf_counter()
    children = [
        subprocess.Popen([*argv, str(rank), *shape], stdout=subprocess.PIPE, text=True)
        for rank in range(args.processes)
    ]
    results = [json.loads(child.communicate()[0]) for child in children]
    wall = time.perf_counter() - start
    batches = sorted(r["first_batch"] for r in results)
    after = sorted(r["after_import"] for r in results)
    imports = sorted(r["import"] for r in results)
    cpu = sorted(r["cpu"] for r in results)
    print(
        f"{args.processes} processes at once: first batch slowest {batches[-1]:.2f} s, median "
        f"{median(batches):.2f} s from each one's start; of which `import tokstream` slowest "
        f"{imports[-1]:.2f} s, median {median(imports):.2f} s; open + first batch after the "
        f"import slowest {after[-1]:.2f} s, median {median(after):.2f} s; CPU a process "
        f"median {median(cpu):.2f} s; all done {wall:.2f} s after the first started"
    )


if __name__ == "__main__":
    main()
