"""The end-of-document token in a corpus: where it ends documents, how often it occurs, and the
warning when a stream's ``eos`` is nowhere to be found.

A :class:`~tokstream.Corpus` keeps one :class:`EosTokens` and answers its ``eos`` methods
(``boundaries_with_eos``, ``eos_count``, ``check_eos``) through it, so a corpus scans its tokens
for a given ``eos`` at most once and warns about it at most once.
"""

from __future__ import annotations

import sys
import warnings
from types import FrameType
from typing import TYPE_CHECKING

import numpy as np

from tokstream import _validate
from tokstream._frozen import read_only
from tokstream.shards.source import present

if TYPE_CHECKING:
    from tokstream.corpus import Corpus

#: A stream with ``eos=`` that does not scan every token anyway (``windows="within"`` does)
#: looks for the token in at most this many tokens: all of a smaller corpus, else
#: :data:`EOS_CHECK_CHUNKS` evenly spaced runs (8 MB of uint16 read at most).
EOS_CHECK_TOKENS = 1 << 22
EOS_CHECK_CHUNKS = 64


class EosNotFoundWarning(UserWarning):
    """A stream's ``eos`` token occurs nowhere the stream looked for it in its corpus."""


class EosTokens:
    """What one corpus has found of each ``eos`` token: how many of the tokens looked at held
    it (over every token, or in a sample), and which tokens it has warned about."""

    def __init__(self) -> None:
        self._found: dict[int, int] = {}
        self._warned: set[int] = set()
        self._sampled: set[int] = set()  # counted in a sample, not over every token

    def boundaries(self, corpus: Corpus, eos: int) -> np.ndarray:
        """``corpus``' document boundaries plus one after every token equal to ``eos``: every
        token scanned once, chunk by chunk (a memory map is paged through, not copied)."""
        after_eos = []
        for shard, base in zip(corpus.shards, corpus.shard_starts, strict=True):
            done = 0
            for chunk in _validate.chunks(shard):
                # A remote shard's chunk is read once fetched (and pinned while it is read).
                chunk = present(shard, done, done + chunk.shape[0])
                after_eos.append(np.flatnonzero(chunk == eos) + (int(base) + done + 1))
                done += chunk.shape[0]
        self._found[eos] = sum(found.shape[0] for found in after_eos)
        self._sampled.discard(eos)
        # Two ascending runs, so a stable sort is one merge (np.unique would hash or sort
        # O(documents) values from scratch: seconds at 10^7 documents). A boundary both recorded
        # and after an eos (an eos ending a document or a shard) is kept once.
        merged = np.sort(np.concatenate([corpus.document_boundaries, *after_eos]), kind="stable")
        first = np.ones(merged.shape[0], dtype=bool)
        np.not_equal(merged[1:], merged[:-1], out=first[1:])
        return read_only(merged[first])

    def count(self, corpus: Corpus, eos: int) -> int:
        """How many of ``corpus``' tokens equal ``eos``: a full scan, unless
        :meth:`boundaries` made one for this token already."""
        if eos not in self._found or eos in self._sampled:
            self.boundaries(corpus, eos)
        return self._found[eos]

    def check(self, corpus: Corpus, eos: int) -> None:
        """Warn (:class:`EosNotFoundWarning`, once per corpus and token) when ``eos`` is absent.

        How it decides, without a pass over a large corpus that nothing else needs: after
        :meth:`boundaries` (``windows="within"``), by its count over every token; otherwise by
        looking at up to :data:`EOS_CHECK_TOKENS` tokens, the whole corpus when it is no
        larger, else :data:`EOS_CHECK_CHUNKS` evenly spaced runs of tokens (a token rare enough
        to miss every run is warned about too; the message says where it looked). The
        documents are then only those the corpus records (a Megatron dataset written without
        ``--append-eod`` has documents but no eod tokens), or none.
        """
        if eos in self._warned:
            return
        if eos not in self._found:
            self._found[eos] = _count_sampled(corpus, eos)
            self._sampled.add(eos)
        if self._found[eos] or corpus.num_tokens == 0:
            return
        self._warned.add(eos)
        total = corpus.num_tokens
        looked = (
            f"the corpus' {total:,} tokens"
            if total <= EOS_CHECK_TOKENS
            else f"{EOS_CHECK_CHUNKS} evenly spaced runs of "
            f"{EOS_CHECK_TOKENS // EOS_CHECK_CHUNKS:,} of the corpus' {total:,} tokens"
        )
        documents = (
            f"only the {corpus.document_boundaries.shape[0] - 1:,} documents the corpus records"
            if corpus.has_documents
            else "no document boundaries but the shards' own"
        )
        warnings.warn(
            f"eos={eos} occurs in none of {looked}; windows='within' and the document extras "
            f"will find {documents}. Was the corpus tokenized without an end-of-document "
            "token, or with another one?",
            EosNotFoundWarning,
            stacklevel=_outside_tokstream(),
        )


def _count_sampled(corpus: Corpus, eos: int) -> int:
    """Occurrences of ``eos`` among the tokens :meth:`EosTokens.check` looks at."""
    total = corpus.num_tokens
    if total <= EOS_CHECK_TOKENS:
        runs = [(0, total)]
    else:
        span = EOS_CHECK_TOKENS // EOS_CHECK_CHUNKS
        step = (total - span) // (EOS_CHECK_CHUNKS - 1)
        runs = [(k * step, k * step + span) for k in range(EOS_CHECK_CHUNKS)]
    found = 0
    shards, starts, lengths = corpus.shards, corpus.shard_starts, corpus.lengths
    for first, last in runs:
        # A run may cross from one shard into the next.
        shard = int(np.searchsorted(starts, first, side="right")) - 1
        while first < last and shard < len(shards):
            local = first - int(starts[shard])
            take = min(last - first, int(lengths[shard]) - local)
            piece = present(shards[shard], local, local + take)
            found += int(np.count_nonzero(piece == eos))
            first += max(take, 0)
            shard += 1
    return found


def _outside_tokstream() -> int:
    """The ``stacklevel`` of the first caller outside tokstream, for a warning made here."""
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("tokstream"):
        frame, level = frame.f_back, level + 1
    return level
