"""The fuzz model of ``tokstream.split``: each unit's split by weighted rendezvous hashing in
pure Python (BLAKE2b keys, splitmix64 with Python integers, ``math.log``), and the runs each
split holds, cut with list slicing."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def split_owners(num_units: int, fractions: dict[str, float], seed: int) -> list[str]:
    """Each unit's split name: the smallest ``-ln(u_name(i)) / fraction``, ties to the first
    name in sorted order."""

    def key(name: str) -> int:
        digest = hashlib.blake2b(
            name.encode(), digest_size=8, key=seed.to_bytes(8, "little"), person=b"tokstrsp"
        )
        return int.from_bytes(digest.digest(), "little")

    def uniform(z: int) -> float:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        return ((z >> 11) + 0.5) / 2**53

    keys = {name: key(name) for name in fractions}
    owners = []
    for unit in range(num_units):
        scores = [
            (-math.log(uniform((keys[name] + (unit + 1) * GAMMA) & MASK)) / fractions[name], name)
            for name in sorted(fractions)
        ]
        owners.append(min(scores)[1])
    return owners


def model_split(
    shards: list[np.ndarray],
    documents: list[list[int] | None],
    fractions: dict[str, Any],
    seed: int,
    range_tokens: int,
) -> dict[str, list[tuple[np.ndarray, list[int]]]]:
    """``{name: [(run tokens, run document boundaries from 0 to its length)]}``: units are the
    recorded documents (a shard recording none is one), or without any recorded, ranges of
    ``range_tokens`` tokens of each shard; a run is consecutive units of one shard with one
    owner."""
    has_documents = any(d is not None for d in documents)
    bounds = []
    for tokens, offsets in zip(shards, documents, strict=True):
        if has_documents:
            bounds.append(list(offsets) if offsets is not None else [0, len(tokens)])
        else:
            bounds.append([*range(0, len(tokens), range_tokens), len(tokens)])
    exact = {name: float(value) for name, value in fractions.items()}
    owners = split_owners(sum(len(b) - 1 for b in bounds), exact, seed)
    runs: dict[str, list[tuple[np.ndarray, list[int]]]] = {name: [] for name in fractions}
    unit = 0
    for tokens, shard_bounds in zip(shards, bounds, strict=True):
        previous = None
        for begin, end in zip(shard_bounds[:-1], shard_bounds[1:], strict=True):
            owner = owners[unit]
            unit += 1
            if owner != previous:
                runs[owner].append((tokens[begin:end], [0, end - begin]))
            else:
                run_tokens, run_bounds = runs[owner][-1]
                joined = np.concatenate([run_tokens, tokens[begin:end]])
                runs[owner][-1] = (joined, [*run_bounds, len(joined)])
            previous = owner
    return runs
