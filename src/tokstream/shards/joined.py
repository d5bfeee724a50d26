"""Several corpora's shards, one after the other, as the shards of one lazily read corpus.

A mixture streams out of one corpus holding every source's shards. When its sources hold many
shards, or shards read on demand (a manifest, a large split), that corpus is a
:class:`JoinedShards` source: each source's lengths and documents joined as arrays, and a
batch's byte ranges handed to each source (its own shard source, or its arrays' addresses), so
that nothing is done per shard in Python and no shard is mapped before a batch reads it.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tokstream._arrays import frozen
from tokstream._windowing import cumulative
from tokstream.corpus import Corpus
from tokstream.shards.filemap import FileMap
from tokstream.shards.source import Readable, ShardSource


class JoinedShards(ShardSource):
    """The shards of ``corpora`` in order: shard ``first[k] + j`` is shard ``j`` of corpus
    ``k``; ``labels[k]`` names corpus ``k`` in messages (its shards ``labels[k][j]``)."""

    def __init__(self, corpora: Sequence[Corpus], labels: Sequence[str]) -> None:
        self.dtype = corpora[0].dtype
        self._corpora = tuple(corpora)
        self._first = frozen(cumulative(np.array([len(c.lengths) for c in corpora], np.int64)))
        self.lengths = frozen(np.concatenate([c.lengths for c in corpora]).astype(np.int64))
        self.names = _JoinedNames(tuple(labels), self._first)
        self._bases: list[np.ndarray | None] = [None] * len(corpora)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_bases": [None] * len(self._corpora)}  # this process' only

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.names = _JoinedNames(state["names"].labels, self._first)  # the one frozen table

    def _split(self, shards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each global shard's corpus and its shard index there."""
        which = np.searchsorted(self._first, shards, side="right") - 1
        return which, shards - self._first[which]

    def shard(self, index: int) -> np.ndarray:
        which, local = self._split(np.array([index], np.int64))
        shard: np.ndarray = self._corpora[int(which[0])].shards[int(local[0])]
        return shard

    def readable(self, shards: np.ndarray, offsets: np.ndarray, nbytes: Any) -> Readable:
        shards = np.asarray(shards, np.int64)
        offsets = np.asarray(offsets, np.int64)
        self.check_ranges(shards, offsets, nbytes)
        which, local = self._split(shards)
        addresses = np.empty(shards.shape[0], np.uint64)
        held: list[Readable] = []
        try:
            for k in np.unique(which).tolist():
                mask = which == k
                corpus = self._corpora[k]
                size = nbytes if np.ndim(nbytes) == 0 else np.asarray(nbytes)[mask]
                if corpus.source is not None:
                    held.append(corpus.source.readable(local[mask], offsets[mask], size))
                    addresses[mask] = held[-1].addresses
                    continue
                bases = self._bases[k]
                if bases is None:
                    # The corpus' arrays live as long as it, and it as long as this source.
                    bases = np.array([s.ctypes.data for s in corpus.shards], dtype=np.uint64)
                    self._bases[k] = bases
                addresses[mask] = bases[local[mask]] + offsets[mask].astype(np.uint64)
        except BaseException:
            for readable in held:
                readable.release()
            raise

        def release() -> None:
            for readable in held:
                readable.release()

        return Readable(addresses, release, keep=self._corpora)

    def document_boundaries(self) -> np.ndarray | None:
        if not any(c.has_documents for c in self._corpora):
            return None
        starts = cumulative(np.array([c.num_tokens for c in self._corpora], np.int64))
        joined = [
            c.document_boundaries[:-1] + base
            for c, base in zip(self._corpora, starts, strict=False)
        ]
        return np.concatenate([*joined, starts[-1:]])

    def document_counts(self) -> np.ndarray | None:
        if not any(c.has_documents for c in self._corpora):
            return None
        counts = []
        for corpus in self._corpora:
            documents = corpus.document_boundaries.shape[0] - 1
            # Each shard's first document (known once the boundaries are), then the count.
            first = corpus._shard_first_document
            assert first is not None
            counts.append(np.diff(np.append(first, documents)))
        return np.concatenate(counts)

    def memory_maps(self) -> Iterator[mmap.mmap | FileMap]:
        for corpus in self._corpora:
            yield from corpus.memory_maps()

    def advise(self, advice: int | None) -> None:
        for corpus in self._corpora:
            if corpus.source is not None:
                corpus.source.advise(advice)


class _JoinedNames(Sequence[str]):
    """The joined shards' names, made when asked for: ``sources['web'][3]``."""

    def __init__(self, labels: tuple[str, ...], first: np.ndarray) -> None:
        self.labels, self.first = labels, first

    def __len__(self) -> int:
        return int(self.first[-1])

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]
        k = int(np.searchsorted(self.first, i, side="right")) - 1
        return f"{self.labels[k]}[{i - int(self.first[k])}]"
