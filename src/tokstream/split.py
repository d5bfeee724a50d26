"""Deterministic train/valid/test splits of a corpus by a keyed hash of each document's index.

:func:`split` assigns every unit of a corpus (each recorded document; in a corpus without
recorded documents, each range of ``range_tokens`` tokens of a shard) to one split name by
weighted rendezvous hashing: unit ``i`` draws, for every name ``n``, a uniform ``u_n(i)`` in
``(0, 1)`` from a 64-bit hash keyed by ``seed`` and ``n``, and goes to the name with the
smallest ``-ln(u_n(i)) / fraction_n`` (an exponential race, so name ``n`` wins with probability
``fraction_n / sum(fractions)``). Each name's draws depend only on the seed, the name and the
unit's index, never on the other names, so:

- the split is deterministic (the same corpus, fractions and seed give the same split in every
  process) and a partition (every unit in exactly one split). The hashes are exact integers;
  only the logarithm is float64, whose last bit NumPy builds may round differently, which can
  change a unit's split only where its two best scores agree to about ``1e-15`` (in
  expectation, fewer than one unit in ``10**14`` between two machines);
- adding a name ``m`` (the other names' fractions unchanged) moves units only into ``m``: every
  unit either stays in its split or goes to ``m``, never from one old split to another;
- removing a name sends its units to the others and moves nothing else.

A split is a :class:`~tokstream.Corpus` of views of the original shards (no tokens copied):
each run of consecutive units of one shard that went to the same split is one shard of it, with
its documents' boundaries. Windows never cross from one run into the next, so no window spans a
place where another split's document was cut out.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tokstream import _validate
from tokstream._arrays import frozen
from tokstream._windowing import cumulative
from tokstream.corpus import Corpus
from tokstream.mixture import Mixture, exact_weight, mix
from tokstream.shards.filemap import FileMap
from tokstream.shards.source import Readable, ShardSource

__all__ = ["split"]

#: Tokens per unit of a corpus without recorded documents (the last range of a shard is shorter).
RANGE_TOKENS = 1 << 16

# splitmix64's increment and output mix (Steele, Lea, Flood 2014): unit i of key k hashes to
# mix(k + (i + 1) * GAMMA).
_GAMMA = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
# Units hashed per NumPy pass, bounding the temporary arrays (a few MB) for any corpus.
_CHUNK = 1 << 18


def split(
    corpus_or_paths: Any,
    fractions: Mapping[str, Any],
    *,
    seed: int = 0,
    range_tokens: int = RANGE_TOKENS,
) -> dict[str, Any]:
    """Split a corpus into disjoint corpora by a keyed hash of each document's index.

    Parameters
    ----------
    corpus_or_paths
        A :class:`~tokstream.Corpus`; paths or a glob for :func:`tokstream.open_tokens`; a
        token array; or a :func:`tokstream.mix` mixture, whose every source is split (with the
        same seed) and mixed again with its weights.
    fractions
        A dict split name -> a positive finite number: the name's expected share of the units
        is its number over their sum (``{"train": 0.99, "valid": 0.01}``). The sum need not be
        1, so a name can be added without changing the others' numbers.
    seed
        Keys the hash: another seed is another split.
    range_tokens
        In a corpus without recorded documents, each shard is cut into ranges of this many
        tokens (the last one shorter), and the ranges are the units split.

    Returns
    -------
    dict
        Name -> :class:`~tokstream.Corpus` (or, for a mixture, :class:`~tokstream.Mixture`),
        in the order of ``fractions``. A split that received no unit is a corpus of one empty
        shard of no documents (``document_boundaries == [0]``).

    Raises
    ------
    TypeError
        ``fractions`` is not a dict, a name is not a str, a fraction is not a number;
        ``seed`` or ``range_tokens`` is not an int.
    ValueError
        No names, an empty name, a fraction that is not positive and finite (or lies outside
        ``[2**-1022, 2**1022]``), a seed outside ``[0, 2**32)``, ``range_tokens`` below 1; for a
        mixture, a split that leaves a source without tokens.
    """
    weights = _fractions(fractions)
    seed = _validate.seed_int(seed, "seed")
    range_tokens = _validate.positive_int(range_tokens, "range_tokens")
    if isinstance(corpus_or_paths, Mixture):
        return _split_mixture(corpus_or_paths, weights, seed, range_tokens)
    corpus = _corpus_of(corpus_or_paths)
    bounds = _unit_bounds(corpus, range_tokens)
    owners = assign(sum(len(b) - 1 for b in bounds), weights, seed)
    return _split_corpus(corpus, bounds, owners, list(weights))


def assign(num_units: int, fractions: Mapping[str, float], seed: int) -> np.ndarray:
    """The split of each of ``num_units`` units: indices into ``fractions``' names (int64).

    ``fractions`` maps names to positive floats, as validated by :func:`split`.
    """
    names = list(fractions)
    keys = [_name_key(name, seed) for name in names]
    inverse_weights = [1.0 / float(fractions[name]) for name in names]
    owners = np.empty(num_units, dtype=np.int64)
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps modulo 2**64, as intended
        for start in range(0, num_units, _CHUNK):
            units = np.arange(start + 1, min(start + _CHUNK, num_units) + 1, dtype=np.uint64)
            steps = units * np.uint64(_GAMMA)
            best = np.full(units.shape[0], np.inf)
            chosen = np.zeros(units.shape[0], dtype=np.int64)
            # Names in sorted order, a strict < per name: a (vanishingly rare) exact tie goes to
            # the first name in sorted order, whatever the dict's order or its other names.
            for index in sorted(range(len(names)), key=names.__getitem__):
                score = -np.log(_uniform(steps + np.uint64(keys[index]))) * inverse_weights[index]
                better = score < best
                best[better] = score[better]
                chosen[better] = index
            owners[start : start + units.shape[0]] = chosen
    return owners


def _uniform(z: np.ndarray) -> np.ndarray:
    """splitmix64's output mix of ``z``, as a float64 strictly inside (0, 1)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    # The top 53 bits plus a half: never 0 (whose log is infinite), never 1.
    uniform: np.ndarray = ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    return uniform


def _name_key(name: str, seed: int) -> int:
    """A 64-bit key for ``name`` under ``seed``: BLAKE2b, the same in every process."""
    digest = hashlib.blake2b(
        name.encode("utf-8"), digest_size=8, key=seed.to_bytes(8, "little"), person=b"tokstrsp"
    )
    return int.from_bytes(digest.digest(), "little")


def _fractions(fractions: Any) -> dict[str, float]:
    if not isinstance(fractions, Mapping):
        raise TypeError(
            f"fractions must be a dict of split name -> fraction, got {type(fractions).__name__}"
        )
    if not fractions:
        raise ValueError("fractions must name at least one split")
    weights = {}
    for name, value in fractions.items():
        if not isinstance(name, str):
            raise TypeError(f"fractions: split names must be str, got {name!r}")
        if not name:
            raise ValueError("fractions: a split name must not be empty")
        exact = exact_weight(value, f"fractions[{name!r}]", positive=True)
        # A score is -ln(u) * (1 / fraction) in float64: both the fraction and its inverse must
        # be finite normal floats (each name's scores must not depend on the other names, so
        # the fractions are not rescaled).
        if not 2.0**-1022 <= exact <= 2.0**1022:
            raise ValueError(
                f"fractions[{name!r}] must be between 2**-1022 and 2**1022, got {value!r}"
            )
        weights[name] = float(exact)
    return weights


def _corpus_of(corpus_or_paths: Any) -> Corpus:
    if isinstance(corpus_or_paths, Corpus):
        return corpus_or_paths
    paths = (str, os.PathLike)
    is_paths = isinstance(corpus_or_paths, paths) or (
        isinstance(corpus_or_paths, (list, tuple))
        and corpus_or_paths
        and all(isinstance(p, paths) for p in corpus_or_paths)
    )
    if is_paths:
        from tokstream.files import open_tokens

        return open_tokens(corpus_or_paths)
    return Corpus.from_tokens(corpus_or_paths, "corpus_or_paths")


def _unit_bounds(corpus: Corpus, range_tokens: int) -> list[np.ndarray]:
    """Per shard, its units' boundaries from 0 to its length: documents, or token ranges."""
    bounds = []
    for shard, length in enumerate(corpus.lengths.tolist()):
        documents = corpus.shard_documents(shard)
        if documents is None:
            # An empty shard: boundaries [0], no unit.
            documents = np.append(np.arange(0, length, range_tokens, dtype=np.int64), length)
        bounds.append(documents)
    return bounds


def _split_corpus(
    corpus: Corpus, bounds: list[np.ndarray], owners: np.ndarray, names: list[str]
) -> dict[str, Corpus]:
    """Each name's corpus: one shard per run of consecutive units it owns in one shard.

    Found with whole-array operations, whatever the number of runs. A split of at most
    :data:`LISTED_RUNS` runs holds its runs as arrays (views); a larger one reads them through a
    :class:`SplitShards` source, so that nothing is done per run in Python.
    """
    per_shard = np.array([b.shape[0] - 1 for b in bounds], dtype=np.int64)
    shard_of = np.repeat(np.arange(len(bounds), dtype=np.int64), per_shard)
    unit_starts = np.concatenate([b[:-1] for b in bounds]).astype(np.int64, copy=False)
    unit_ends = np.concatenate([b[1:] for b in bounds]).astype(np.int64, copy=False)
    # A run starts at the first unit, and wherever the shard or the owner changes.
    new_run = np.ones(owners.shape[0], dtype=bool)
    new_run[1:] = (owners[1:] != owners[:-1]) | (shard_of[1:] != shard_of[:-1])
    run_first = np.flatnonzero(new_run)
    run_end = np.append(run_first[1:], owners.shape[0])  # one past each run's last unit
    run_owner = owners[run_first]
    result = {}
    for index, name in enumerate(names):
        mine = np.flatnonzero(run_owner == index)
        first, end = run_first[mine], run_end[mine]
        shards = shard_of[first]
        starts, stops = unit_starts[first], unit_ends[end - 1]
        label = f"split {name!r}"
        if mine.shape[0] == 0:
            # An empty shard of no documents (boundaries [0]), as an empty file is.
            result[name] = Corpus._from_arrays(
                [corpus.shards[0][:0]],
                [f"{label} of shards[0][0:0]"],
                label,
                [np.zeros(1, np.int64)],
            )
        elif mine.shape[0] <= LISTED_RUNS:
            runs = (shards, starts, stops, first, end)
            result[name] = _listed_runs(corpus, label, bounds, cumulative(per_shard), runs)
        else:
            units = owners == index
            documents = None
            if corpus.has_documents:
                # Every unit is a document: its boundaries, laid end to end.
                documents = cumulative(unit_ends[units] - unit_starts[units]), end - first
            source = SplitShards(corpus, label, shards, starts, stops - starts, documents)
            result[name] = Corpus._from_source(source, label)
    return result


def _listed_runs(
    corpus: Corpus,
    label: str,
    bounds: list[np.ndarray],
    unit_base: np.ndarray,
    runs: tuple[np.ndarray, ...],
) -> Corpus:
    """A split of few runs as a corpus of views, each run's units its documents. ``runs``:
    each run's shard, first and end token, first and end unit (global unit indices;
    ``unit_base[shard]`` is the shard's first)."""
    arrays: list[np.ndarray] = []
    shard_names: list[str] = []
    documents: list[np.ndarray | None] = []
    for shard, start, stop, begin, finish in zip(*(r.tolist() for r in runs), strict=True):
        arrays.append(corpus.shards[shard][start:stop])
        shard_names.append(f"{label} of shards[{shard}][{start}:{stop}]")
        # A run of one document is a shard without recorded boundaries: one document.
        many = corpus.has_documents and finish - begin > 1
        base = int(unit_base[shard])
        run_bounds = bounds[shard][begin - base : finish - base + 1]
        documents.append(run_bounds - start if many else None)
    if corpus.has_documents and all(d is None for d in documents):
        # Every run one document: record the first's boundaries, so the split says it has
        # documents (and a split of it splits documents again, not token ranges).
        documents[0] = np.array([0, arrays[0].shape[0]], dtype=np.int64)
    return Corpus._from_arrays(arrays, shard_names, label, documents)


def _split_mixture(
    mixture: Mixture, weights: dict[str, float], seed: int, range_tokens: int
) -> dict[str, Mixture]:
    """Each source split alone, then each split's sources mixed with the mixture's weights (its
    stages, if it has several)."""
    parts = {
        source: split(corpus, weights, seed=seed, range_tokens=range_tokens)
        for source, corpus in mixture.sources.items()
    }
    stages = [
        (start, dict(zip(mixture.names, weights, strict=True)))
        for start, weights in mixture.integer_stages
    ]
    source_weights: Any = stages[0][1] if len(stages) == 1 else stages
    result = {}
    for name in weights:
        for source in mixture.names:
            if parts[source][name].num_tokens == 0:
                raise ValueError(
                    f"split {name!r} of source {source!r} received no tokens; every source of a "
                    "mixture needs some in every split (give the split a larger fraction)"
                )
        result[name] = mix({s: parts[s][name] for s in mixture.names}, source_weights)
    return result


#: A split of at most this many runs holds them as a tuple of array views (what a corpus of a
#: few shards is); beyond it, a :class:`SplitShards` source (no Python object per run).
LISTED_RUNS = 4096


class SplitShards(ShardSource):
    """The runs of a large split as the shards of a lazily read corpus: run ``i`` is tokens
    ``[starts[i], starts[i] + lengths[i])`` of shard ``shards[i]`` of ``parent``.

    ``documents`` is None (the parent records none: a run is one document) or ``(boundaries,
    counts)``: every document's first token in the runs laid end to end then their total, and
    each run's document count. Reading a run reads the parent: its arrays' addresses, or the
    parent's own source for a parent read on demand.
    """

    def __init__(
        self,
        parent: Corpus,
        label: str,
        shards: np.ndarray,
        starts: np.ndarray,
        lengths: np.ndarray,
        documents: tuple[np.ndarray, np.ndarray] | None,
    ) -> None:
        self.dtype = parent.dtype
        self.lengths = frozen(lengths.astype(np.int64))
        self.names = _RunNames(label, frozen(shards), frozen(starts), self.lengths)
        self._parent = parent
        self._shards, self._starts = self.names.shards, self.names.starts
        self._documents = None if documents is None else tuple(frozen(d) for d in documents)
        self._bases: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_bases": None}  # addresses are this process' only

    def shard(self, index: int) -> np.ndarray:
        start = int(self._starts[index])
        run: np.ndarray = self._parent.shards[int(self._shards[index])]
        return run[start : start + int(self.lengths[index])]

    def readable(self, shards: np.ndarray, offsets: np.ndarray, nbytes: Any) -> Readable:
        self.check_ranges(shards, offsets, nbytes)
        parent_shards = self._shards[shards]
        parent_offsets = self._starts[shards] * self.dtype.itemsize + offsets
        if self._parent.source is not None:
            return self._parent.source.readable(parent_shards, parent_offsets, nbytes)
        if self._bases is None:
            # The parent's arrays stay alive with it, and it with this source.
            bases = [shard.ctypes.data for shard in self._parent.shards]
            self._bases = np.array(bases, dtype=np.uint64)
        addresses = self._bases[parent_shards] + parent_offsets.astype(np.uint64)
        return Readable(addresses, keep=self._parent)

    def document_boundaries(self) -> np.ndarray | None:
        return None if self._documents is None else self._documents[0]

    def document_counts(self) -> np.ndarray | None:
        return None if self._documents is None else self._documents[1]

    def memory_maps(self) -> Iterator[mmap.mmap | FileMap]:
        return self._parent.memory_maps()

    def advise(self, advice: int | None) -> None:
        if self._parent.source is not None:
            self._parent.source.advise(advice)


class _RunNames(Sequence[str]):
    """The runs' names for messages, made when asked for: ``split 'valid' of
    shards[3][100:250]``."""

    def __init__(
        self, label: str, shards: np.ndarray, starts: np.ndarray, lengths: np.ndarray
    ) -> None:
        self.label, self.shards, self.starts, self.lengths = label, shards, starts, lengths

    def __len__(self) -> int:
        return int(self.shards.shape[0])

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]
        start = int(self.starts[i])
        stop = start + int(self.lengths[i])
        return f"{self.label} of shards[{int(self.shards[i])}][{start}:{stop}]"
