"""A validated token corpus: one or more shards and the window index space over them.

A shard is an independent token stream (a document, a file): windows never cross from one shard
into the next. For a given ``block`` shard ``j`` of length ``L_j`` holds ``max(L_j - block, 0)``
windows, and the corpus' window index space is the concatenation of its shards' windows, so a
single-shard corpus has exactly the reference's ``len(token_ids) - block`` windows.
"""

from __future__ import annotations

import mmap
import sys
import warnings
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

import numpy as np

from tokstream import _validate
from tokstream._arrays import (
    frozen,
    frozen_state,
    offsets_array,
    same_dtype_arrays,
    write_document_starts,
)
from tokstream._arrays import read_only as _read_only
from tokstream._windowing import covered_tokens, cumulative, windows_per_segment
from tokstream.shards.filemap import FileMap, MappedFiles, file_map_of
from tokstream.shards.source import LazyShards, ShardSource, on_demand_of, present

#: A stream with ``eos=`` that does not scan every token anyway (``windows="within"`` does)
#: looks for the token in at most this many tokens: all of a smaller corpus, else
#: :data:`EOS_CHECK_CHUNKS` evenly spaced runs (8 MB of uint16 read at most).
EOS_CHECK_TOKENS = 1 << 22
EOS_CHECK_CHUNKS = 64


class EosNotFoundWarning(UserWarning):
    """A stream's ``eos`` token occurs nowhere the stream looked for it in its corpus."""


class Corpus:
    """Validated shards of token ids, read in place by the kernel, with their documents.

    Parameters
    ----------
    shards
        A sequence of 1-D token arrays (or anything :func:`tokstream.stream_token_source`
        accepts as ``token_ids``). Every shard must end up with the same dtype: mixing, say,
        uint16 and uint32 shards is a ValueError, since it almost always means two tokenizers.
    name
        What error messages call the input.

    Notes
    -----
    Integer shards keep their dtype and are not copied (memory maps stay memory maps); float
    shards are converted to int64 once. The arrays are referenced, not owned: mutating one while a
    stream reads it changes the windows that stream yields from then on. ``shards``, ``lengths``
    and the document boundaries are read-only: they are what every stream's bounds come from.

    A shard without recorded documents is one document; :meth:`from_documents` and the readers
    of formats that store documents record their boundaries.
    """

    #: Per shard, the loss mask its tokens came with (None: no mask recorded).
    _loss_masks: tuple[np.ndarray, ...] | None = None

    def __init__(self, shards: Sequence[Any], name: str = "shards") -> None:
        if isinstance(shards, (np.ndarray, str, bytes)) or not isinstance(shards, Sequence):
            raise TypeError(
                f"{name} must be a sequence of 1-D token arrays, got {type(shards).__name__}"
            )
        names = [f"{name}[{i}]" for i in range(len(shards))]
        arrays = [_validate.token_array(shard, names[i]) for i, shard in enumerate(shards)]
        self._set_shards(arrays, names, name, None)

    @classmethod
    def _from_arrays(
        cls,
        arrays: Sequence[np.ndarray],
        names: Sequence[str],
        name: str = "shards",
        document_offsets: Sequence[np.ndarray | None] | None = None,
    ) -> Corpus:
        """A corpus of arrays already returned by :func:`tokstream._validate.token_array`.

        For readers (such as :func:`tokstream.open_tokens`) that validated each shard under a
        more telling name (its file) and must not pay for a second value scan. ``names`` label
        the shards in errors, ``name`` the whole. ``document_offsets`` holds, per shard, None
        (one document) or the boundaries of its documents: a nondecreasing int64 array from 0 to
        the shard's length (empty documents allowed), checked here.
        """
        corpus = cls.__new__(cls)
        corpus._set_shards(arrays, names, name, document_offsets)
        return corpus

    @classmethod
    def from_documents(cls, documents: Sequence[Any], name: str = "documents") -> Corpus:
        """One shard holding ``documents`` back to back, with a boundary between each two.

        Windows may span documents (``windows="cross"``) or stay inside one
        (``windows="within"``); the document extras of a stream follow these boundaries. Arrays
        of one integer dtype are joined with one ``np.concatenate`` (no Python loop per token
        or per document beyond reading their lengths); anything else is validated document by
        document as ``token_ids`` is.
        """
        if isinstance(documents, (np.ndarray, str, bytes)) or not isinstance(documents, Sequence):
            raise TypeError(
                f"{name} must be a sequence of 1-D token arrays, got {type(documents).__name__}"
            )
        if not documents:
            raise ValueError(f"{name} must hold at least one document")
        arrays = same_dtype_arrays(documents)
        if arrays is None:
            arrays = [_validate.token_array(d, f"{name}[{i}]") for i, d in enumerate(documents)]
            dtypes = {a.dtype for a in arrays}
            if len(dtypes) > 1:
                raise ValueError(
                    f"{name} mix token dtypes {sorted(map(str, dtypes))}; every document must "
                    "have one dtype, since mixing usually means two tokenizers"
                )
        lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = _validate.token_array(np.concatenate(arrays), name)
        return cls._from_arrays([tokens], [name], name, [offsets])

    def _set_shards(
        self,
        arrays: Sequence[np.ndarray],
        names: Sequence[str],
        name: str,
        document_offsets: Sequence[np.ndarray | None] | None,
    ) -> None:
        if not arrays:
            raise ValueError(f"{name} must hold at least one shard")
        first_of_dtype: dict[str, str] = {}
        for shard_name, array in zip(names, arrays, strict=True):
            first_of_dtype.setdefault(str(array.dtype), shard_name)
        if len(first_of_dtype) > 1:
            examples = ", ".join(f"{n} is {d}" for d, n in first_of_dtype.items())
            raise ValueError(
                f"{name} mix token dtypes {sorted(first_of_dtype)} ({examples}); every shard "
                "must have one dtype, since mixing usually means two tokenizers"
            )
        lengths = np.array([a.shape[0] for a in arrays], dtype=np.int64)
        if document_offsets is None:
            document_offsets = [None] * len(arrays)
        if len(document_offsets) != len(arrays):
            raise ValueError(
                f"{name}: {len(document_offsets)} document boundary arrays for {len(arrays)} shards"
            )
        offsets_of = [
            offsets_array(offsets, shard_name)
            for offsets, shard_name in zip(document_offsets, names, strict=True)
        ]
        shard_starts = np.zeros(len(arrays), dtype=np.int64)
        np.cumsum(lengths[:-1], out=shard_starts[1:])
        # Every document's first token, as an index into the shards laid end to end; a shard
        # boundary is always a document boundary. Followed by the total, so diff = lengths.
        # Written in place: no other array of the documents' size on the way.
        first_documents = cumulative(
            np.array([1 if o is None else o.shape[0] - 1 for o in offsets_of], dtype=np.int64)
        )
        boundaries = np.empty(first_documents[-1] + 1, dtype=np.int64)
        for shard, offsets in enumerate(offsets_of):
            into = boundaries[first_documents[shard] : first_documents[shard + 1]]
            write_document_starts(
                offsets, int(lengths[shard]), names[shard], into, int(shard_starts[shard])
            )
        boundaries[-1] = lengths.sum()
        self._shards: Sequence[np.ndarray] = tuple(arrays)
        self._source: ShardSource | None = None
        self._dtype = arrays[0].dtype
        self._lengths = frozen(lengths)
        self._shard_starts = frozen(shard_starts)
        self._shard_first_document: np.ndarray | None = frozen(first_documents[:-1])
        self._document_boundaries: np.ndarray | None = frozen(boundaries)
        self._has_documents = any(offsets is not None for offsets in document_offsets)
        self._set_eos_tables()

    @classmethod
    def _from_source(cls, source: ShardSource, name: str) -> Corpus:
        """A corpus whose shards are read on demand from ``source`` (a manifest's files).

        Nothing is read here: lengths and dtype are the source's, the documents are read on
        first use of :attr:`document_boundaries`, and a shard is mapped (and checked against
        the source's table of contents) when a batch or :attr:`shards` first reads it.
        """
        if not len(source):
            raise ValueError(f"{name} must hold at least one shard")
        corpus = cls.__new__(cls)
        corpus._shards = LazyShards(source)
        corpus._source = source
        corpus._dtype = source.dtype
        corpus._lengths = source.lengths
        corpus._shard_starts = frozen(cumulative(source.lengths)[:-1])
        corpus._shard_first_document = None
        corpus._document_boundaries = None
        corpus._has_documents = source.document_counts() is not None
        corpus._set_eos_tables()
        return corpus

    def _set_eos_tables(self) -> None:
        # eos token -> how many of the tokens looked at held it; the tokens warned about.
        self._eos_found: dict[int, int] = {}
        self._eos_warned: set[int] = set()
        self._eos_sampled: set[int] = set()  # counted in a sample, not over every token

    def __setattr__(self, name: str, value: Any) -> None:
        # Streams compute their bounds through these methods and properties: a method replaced
        # on the instance (corpus.boundaries_with_eos = ...) would hand the kernel any bounds.
        if not name.startswith("_"):
            raise AttributeError(
                f"Corpus attributes are read-only: a corpus cannot be given {name!r}"
            )
        super().__setattr__(name, value)

    @classmethod
    def from_tokens(cls, token_ids: Any, name: str = "token_ids") -> Corpus:
        """One shard; a :class:`Corpus` is passed through unchanged."""
        if isinstance(token_ids, Corpus):
            return token_ids
        return cls._from_arrays([_validate.token_array(token_ids, name)], [name], name)

    @property
    def shards(self) -> Sequence[np.ndarray]:
        """The token arrays, one per shard (read-only attribute): a tuple, or for a corpus
        opened from a manifest a sequence that maps (and checks) a shard when it is indexed."""
        return self._shards

    @property
    def source(self) -> ShardSource | None:
        """Where shards read on demand come from (None: every shard is an array in hand)."""
        return self._source

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per shard: a read-only int64 array."""
        return self._lengths

    @property
    def has_documents(self) -> bool:
        """Whether document boundaries inside shards were recorded."""
        return self._has_documents

    @property
    def document_boundaries(self) -> np.ndarray:
        """Each document's first token in the shards laid end to end, then the token count.

        Read-only int64, nondecreasing, O(documents). Every shard starts a document. A corpus
        opened from a manifest reads them on first use.
        """
        if self._document_boundaries is None:
            self._load_documents()
        assert self._document_boundaries is not None
        return self._document_boundaries

    def _load_documents(self) -> None:
        assert self._source is not None
        counts = self._source.document_counts()
        boundaries = self._source.document_boundaries()
        if counts is None or boundaries is None:
            counts = np.ones(self._lengths.shape[0], np.int64)
            boundaries = np.append(self._shard_starts, self.num_tokens)
        first = cumulative(counts)
        # The source checked its documents against its own lengths: each shard's first
        # document starts at the shard's first token.
        self._shard_first_document = frozen(first[:-1])
        self._document_boundaries = frozen(boundaries)

    @property
    def loss_masks(self) -> tuple[np.ndarray, ...] | None:
        """Per shard, a read-only uint8 array of its length, 1 where a loss trains on the token
        (the assistant's tokens of a ``tokstream tokenize --chat`` run); None when the corpus
        records no mask (every token is trained)."""
        return self._loss_masks

    def with_loss_masks(self, masks: Sequence[Any]) -> Corpus:
        """This corpus (its shards and documents shared) with ``masks``: per shard, a 1-D array
        of its length, of bools or of 0 and 1, 1 where a loss trains on the token.

        Raises TypeError for a mask that is not an array of bools or integers, ValueError for
        one of another length than its shard, with values other than 0 and 1, or a count of
        masks other than the shards'.
        """
        if isinstance(masks, (np.ndarray, str, bytes)) or not isinstance(masks, Sequence):
            raise TypeError(f"masks must be a sequence of 1-D arrays, got {type(masks).__name__}")
        if len(masks) != len(self._lengths):
            raise ValueError(f"masks holds {len(masks)} masks for {len(self._lengths)} shards")
        checked = []
        for j, mask in enumerate(masks):
            array = np.asarray(mask)
            if array.dtype.kind not in "biu":
                raise TypeError(f"masks[{j}] must hold bools or 0 and 1, got {array.dtype}")
            if array.ndim != 1 or array.shape[0] != self._lengths[j]:
                raise ValueError(
                    f"masks[{j}] has shape {array.shape}, shard {j} holds "
                    f"{int(self._lengths[j])} tokens"
                )
            if array.dtype != np.uint8:
                if array.dtype.kind != "b" and np.count_nonzero((array != 0) & (array != 1)):
                    raise ValueError(f"masks[{j}] holds values other than 0 and 1")
                array = array.astype(np.uint8)
            elif np.count_nonzero(array > 1):
                raise ValueError(f"masks[{j}] holds values other than 0 and 1")
            checked.append(_read_only(array))
        return self._with_loss_masks(checked)

    def _with_loss_masks(self, masks: Sequence[np.ndarray]) -> Corpus:
        """:meth:`with_loss_masks` of read-only uint8 masks already checked (a reader's)."""
        corpus = Corpus.__new__(Corpus)
        corpus.__dict__.update(self.__dict__)
        corpus._set_eos_tables()
        corpus._loss_masks = tuple(masks)
        return corpus

    @property
    def document_lengths(self) -> np.ndarray:
        """Tokens per document, in order (a shard without recorded documents is one)."""
        return np.diff(self.document_boundaries)

    @property
    def dtype(self) -> np.dtype:
        """The dtype every shard is stored in."""
        return self._dtype

    @property
    def num_tokens(self) -> int:
        """Tokens in all shards together."""
        return int(self.lengths.sum())

    def __len__(self) -> int:
        return self.num_tokens

    def __repr__(self) -> str:
        return f"Corpus(shards={len(self.shards)}, tokens={self.num_tokens}, dtype={self.dtype})"

    def __getstate__(self) -> dict[str, Any]:
        # A shard mapped from a token file (by open_tokens, np.memmap, pyarrow) travels as its
        # file, offset and dtype, and is mapped again where it is unpickled (a spawned
        # DataLoader worker), instead of as a copy; a remote shard as its object's URL.
        state = self.__dict__.copy()
        files = MappedFiles()
        if self._loss_masks is not None:
            state["_loss_masks"] = tuple(
                file_map_of(mask) or files.region(mask) or mask for mask in self._loss_masks
            )
        if self._source is not None:
            return state  # the source pickles as its table of contents
        state["_shards"] = tuple(
            file_map_of(shard) or on_demand_of(shard) or files.region(shard) or shard
            for shard in self._shards
        )
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state.get("_loss_masks") is not None:
            masks = state["_loss_masks"] = tuple(np.asarray(m) for m in state["_loss_masks"])
            for mask in masks:
                mask.flags.writeable = False
        if state.get("_source") is None:
            shards = state["_shards"] = tuple(np.asarray(shard) for shard in state["_shards"])
            for shard in shards:
                shard.flags.writeable = False  # unpickled arrays come back writeable
        self.__dict__.update(frozen_state(state))

    def window_offsets(self, block: int, stride: int = 1) -> np.ndarray:
        """``offsets[j]`` = index of shard ``j``'s first window; ``offsets[-1]`` = window count."""
        return cumulative(windows_per_segment(self.lengths, block, stride))

    def num_windows(self, block: int, stride: int = 1) -> int:
        """How many ``(block + 1)``-token windows the corpus holds, one every ``stride`` tokens."""
        return int(self.window_offsets(block, stride)[-1])

    @property
    def shard_starts(self) -> np.ndarray:
        """Each shard's first token in the shards laid end to end (read-only int64)."""
        return self._shard_starts

    def shard_documents(self, shard: int) -> np.ndarray | None:
        """Shard ``shard``'s recorded document boundaries, from 0 to its length (None: none)."""
        if not self._has_documents:
            return None
        starts, firsts = self.document_boundaries, self._shard_first_document
        assert firsts is not None
        last = firsts[shard + 1] if shard + 1 < firsts.shape[0] else starts.shape[0] - 1
        # A shard's first document starts at the shard's first token.
        return np.append(starts[firsts[shard] : last] - starts[firsts[shard]], self._lengths[shard])

    def boundaries_with_eos(self, eos: int) -> np.ndarray:
        """:attr:`document_boundaries` plus a boundary after every token equal to ``eos``.

        Scans every token once, chunk by chunk (a memory map is paged through, not copied); the
        result is O(documents).
        """
        after_eos = []
        for shard, base in zip(self._shards, self.shard_starts, strict=True):
            done = 0
            for chunk in _validate.chunks(shard):
                # A remote shard's chunk is read once fetched (and pinned while it is read).
                chunk = present(shard, done, done + chunk.shape[0])
                after_eos.append(np.flatnonzero(chunk == eos) + (int(base) + done + 1))
                done += chunk.shape[0]
        self._eos_found[eos] = sum(found.shape[0] for found in after_eos)
        self._eos_sampled.discard(eos)
        # Two ascending runs, so a stable sort is one merge (np.unique would hash or sort
        # O(documents) values from scratch: seconds at 10^7 documents). A boundary both recorded
        # and after an eos (an eos ending a document or a shard) is kept once.
        merged = np.sort(np.concatenate([self.document_boundaries, *after_eos]), kind="stable")
        first = np.ones(merged.shape[0], dtype=bool)
        np.not_equal(merged[1:], merged[:-1], out=first[1:])
        return _read_only(merged[first])

    def eos_count(self, eos: int) -> int:
        """How many tokens equal ``eos``: a full scan, unless :meth:`boundaries_with_eos` made
        one for this token already."""
        if eos not in self._eos_found or eos in self._eos_sampled:
            self.boundaries_with_eos(eos)
        return self._eos_found[eos]

    def check_eos(self, eos: int) -> None:
        """Warn (:class:`EosNotFoundWarning`, once per corpus and token) when ``eos`` is absent.

        How it decides, without a pass over a large corpus that nothing else needs: after
        :meth:`boundaries_with_eos` (``windows="within"``), by its count over every token;
        otherwise by looking at up to :data:`EOS_CHECK_TOKENS` tokens, the whole corpus when it
        is no larger, else :data:`EOS_CHECK_CHUNKS` evenly spaced runs of tokens (a token rare
        enough to miss every run is warned about too; the message says where it looked). The
        documents are then only those the corpus records (a Megatron dataset written without
        ``--append-eod`` has documents but no eod tokens), or none.
        """
        if eos in self._eos_warned:
            return
        if eos not in self._eos_found:
            self._eos_found[eos] = self._count_sampled(eos)
            self._eos_sampled.add(eos)
        if self._eos_found[eos] or self.num_tokens == 0:
            return
        self._eos_warned.add(eos)
        total = self.num_tokens
        looked = (
            f"the corpus' {total:,} tokens"
            if total <= EOS_CHECK_TOKENS
            else f"{EOS_CHECK_CHUNKS} evenly spaced runs of "
            f"{EOS_CHECK_TOKENS // EOS_CHECK_CHUNKS:,} of the corpus' {total:,} tokens"
        )
        documents = (
            f"only the {self.document_boundaries.shape[0] - 1:,} documents the corpus records"
            if self._has_documents
            else "no document boundaries but the shards' own"
        )
        warnings.warn(
            f"eos={eos} occurs in none of {looked}; windows='within' and the document extras "
            f"will find {documents}. Was the corpus tokenized without an end-of-document "
            "token, or with another one?",
            EosNotFoundWarning,
            stacklevel=_outside_tokstream(),
        )

    def _count_sampled(self, eos: int) -> int:
        """Occurrences of ``eos`` among the tokens :meth:`check_eos` looks at."""
        total = self.num_tokens
        if total <= EOS_CHECK_TOKENS:
            runs = [(0, total)]
        else:
            span = EOS_CHECK_TOKENS // EOS_CHECK_CHUNKS
            step = (total - span) // (EOS_CHECK_CHUNKS - 1)
            runs = [(k * step, k * step + span) for k in range(EOS_CHECK_CHUNKS)]
        found = 0
        starts = self.shard_starts
        for first, last in runs:
            # A run may cross from one shard into the next.
            shard = int(np.searchsorted(starts, first, side="right")) - 1
            while first < last and shard < len(self._shards):
                local = first - int(starts[shard])
                take = min(last - first, int(self._lengths[shard]) - local)
                piece = present(self._shards[shard], local, local + take)
                found += int(np.count_nonzero(piece == eos))
                first += max(take, 0)
                shard += 1
        return found

    def tokens_in_windows(
        self, block: int, stride: int = 1, windows: str = "cross", eos: int | None = None
    ) -> int:
        """How many tokens lie in at least one window of a stream with these options.

        A window is ``block + 1`` tokens (its inputs and its last target). ``windows="cross"``
        loses only shards shorter than that and the tail after a shard's last window;
        ``"within"`` also every document shorter than ``block + 1`` tokens (with ``eos``, the
        documents its tokens end as well, a full scan). Divided by :attr:`num_tokens`: the share
        of the corpus a policy keeps (``tokstream inspect --block N`` prints both).
        """
        _validate.choice(windows, "windows", ("cross", "within"))
        if windows == "cross":
            return covered_tokens(self._lengths, block, stride)
        boundaries = self.document_boundaries if eos is None else self.boundaries_with_eos(eos)
        return covered_tokens(np.diff(boundaries), block, stride)

    def memory_maps(self) -> Iterator[mmap.mmap | FileMap]:
        """The distinct mappings the shards are views of (none for in-RAM arrays).

        Found by following each shard's ``.base`` chain, which ends at the ``mmap.mmap`` for a
        ``np.memmap``, for ``np.load(..., mmap_mode=...)`` and for views of either, and at the
        :class:`~tokstream.shards.filemap.FileMap` for a file :func:`tokstream.open_tokens` opened.
        A corpus opened from a manifest yields the maps open now.
        """
        if self._source is not None:
            yield from self._source.memory_maps()
            return
        seen: set[int] = set()
        for shard in self.shards:
            base: Any = shard
            while base is not None and not isinstance(base, (mmap.mmap, FileMap)):
                base = getattr(base, "base", None)
            if base is not None and id(base) not in seen and not base.closed:
                seen.add(id(base))
                yield base

    def advise(self, random: bool) -> int:
        """Tell the OS how the memory-mapped shards will be read; return how many were advised.

        ``random=True`` (a shuffled epoch) sends ``MADV_RANDOM``: no read-ahead and no
        fault-around, so each window faults in only the pages it touches. ``random=False`` sends
        ``MADV_SEQUENTIAL``: aggressive read-ahead, and the pages already read are the first the
        kernel reclaims. Advice is a hint: arrays in RAM are left alone, and on a platform
        without ``madvise`` (or when the kernel refuses the hint) nothing happens and 0 mappings
        are counted. Nothing about the batches changes either way.
        """
        advice_name = "MADV_RANDOM" if random else "MADV_SEQUENTIAL"
        advice = getattr(mmap, advice_name, None)
        if advice is None or not hasattr(mmap.mmap, "madvise"):
            return 0
        advised = 0
        if self._source is not None:
            self._source.advise(advice)  # the maps made from now on too
        for mapping in self.memory_maps():
            try:
                mapping.madvise(advice)
            except OSError:
                continue
            advised += 1
        return advised


def _outside_tokstream() -> int:
    """The ``stacklevel`` of the first caller outside tokstream, for a warning made here."""
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("tokstream"):
        frame, level = frame.f_back, level + 1
    return level
