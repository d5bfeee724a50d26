"""The window index space of a corpus: segments, their buckets, each window's first token.

For one ``block``, ``stride`` and window policy, :class:`WindowSpace` numbers the corpus'
windows (O(segments) memory: shards, or documents for ``windows="within"``) and finds where
each lies: its segment, its first token and that token's address (by the lookup kernel, one
call a batch whatever shards the windows lie in; a space of one segment needs no lookup). Which
kernel then copies the windows into a batch's buffers is :mod:`tokstream._batch`'s business.
"""

from __future__ import annotations

import hashlib

import numpy as np

from tokstream._arrays import frozen
from tokstream._kernels.advice import advise_at
from tokstream._options import StreamOptions
from tokstream._windowing import capped_stride, cumulative, windows_per_segment
from tokstream._windows import lookup_windows
from tokstream.corpus import Corpus
from tokstream.shards.source import Readable

#: The kernel requests about this many bytes of window data into the cache ahead of the window
#: it copies, and at most this many windows ahead (see :func:`cache_ahead`).
CACHE_AHEAD_BYTES = 2048
CACHE_AHEAD_MAX_WINDOWS = 32

#: Windows are bucketed into at least this many buckets (when there are as many windows), so
#: that with a few segments almost every bucket lies inside one: the segment lookup then takes
#: no search, and no branch whose outcome random windows would make a coin flip.
MIN_SEGMENT_BUCKETS = 1024


def cache_ahead(block: int, dtype: np.dtype) -> int:
    """How many windows ahead of the one it copies the kernel requests into the cache (a
    software prefetch), for a random order.

    Found by sweeping distances 0-64 over block 8-3072, int64 and uint16 corpora in and beyond
    the last-level cache (``test_prefetch_sweep`` in ``benchmarks/test_gather.py``): the best
    distance keeps about ``CACHE_AHEAD_BYTES`` (32 cache lines) of window data in flight, e.g.
    28 windows of 8 int64 tokens, 7 of 128 uint16 tokens, one of 1024 uint16 tokens or of 128
    int64 tokens. Windows longer than 33 cache lines (a 2 KiB window) are better off without:
    the hardware prefetcher streams each after its first lines, and the extra instructions cost
    up to 3x. The same rule holds for windows of the output dtype, which are copied by
    ``memcpy``: a stream of int64 windows of 129 tokens with shifted targets (two copies a
    window) ran 1.4-1.6x faster with one or two windows requested ahead than with none.
    """
    window_bytes = (block + 1) * dtype.itemsize
    if window_bytes > 33 * 64:
        return 0
    return max(1, min(CACHE_AHEAD_MAX_WINDOWS, CACHE_AHEAD_BYTES // window_bytes))


def rows_ahead(block: int, dtype: np.dtype) -> int:
    """How many packed rows ahead of the one it fills the packed-row kernel requests the pieces
    of into the cache, for shuffled packing (pieces of random documents, each a cache miss).

    About twice :data:`CACHE_AHEAD_BYTES` of rows (``block + 1`` slots of ``dtype`` tokens),
    none for rows longer than that, which the hardware prefetcher streams: a row of 129 int64
    tokens 3 ahead, of 1025 uint16 tokens one, of 1025 int64 tokens none. Measured on the
    documents corpus of ``benchmarks/test_out_dtype.py`` (load ~10): the kernel's time at block 128
    fell by a third with 2-4 rows ahead, at block 1024 it did not change.
    """
    row_bytes = (block + 1) * dtype.itemsize
    if row_bytes > 2 * CACHE_AHEAD_BYTES:
        return 0
    return max(1, min(CACHE_AHEAD_MAX_WINDOWS, 2 * CACHE_AHEAD_BYTES // row_bytes))


class WindowSpace:
    """The window index space of a corpus for one ``block``, ``stride`` and window policy.

    Windows start every ``stride`` tokens from the start of each segment, while ``start + block``
    stays inside it: the segments are the shards (``windows="cross"``, a window may span
    documents but never shards) or, given ``document_boundaries``, the documents
    (``windows="within"``). Global index ``w`` is window ``w - offsets[j]`` of the segment ``j``
    it falls in; only segments that hold a window are kept, so the space costs O(segments).
    Every index handed to :meth:`locate` must lie in ``[0, num_windows)``; the stream
    guarantees it. ``random_order`` says whether the windows come in a random order (the
    kernels then request windows into the cache ahead of the copy, see :func:`cache_ahead`).

    :attr:`documents` says where documents start (the corpus' recorded documents and, given
    ``eos``, the token that ends one), for the rows' position ids and loss mask.
    """

    def __init__(
        self,
        corpus: Corpus,
        block: int,
        random_order: bool = True,
        *,
        stride: int = 1,
        document_boundaries: np.ndarray | None = None,
        eos: int | None = None,
    ) -> None:
        self.corpus = corpus
        self.block = block
        self.random_order = random_order
        # Private copies: the kernel's bounds come only from what was validated here.
        self._shards = corpus.shards
        self._shard_starts = corpus.shard_starts.copy()
        if document_boundaries is None:
            segment_starts, segment_lengths = self._shard_starts, corpus.lengths
        else:
            segment_starts, segment_lengths = document_boundaries[:-1], np.diff(document_boundaries)
        stride = capped_stride(segment_lengths, stride)
        counts = windows_per_segment(segment_lengths, block, stride)
        kept = np.flatnonzero(counts)
        self._segment_starts = frozen(segment_starts[kept].copy())
        self._offsets = frozen(cumulative(counts[kept]))
        self.num_windows = int(self._offsets[-1])
        self._stride = stride
        # With a single segment a window's start is an affine function of its index.
        one_segment = self._offsets.shape[0] == 2
        self._one_segment_base = int(self._segment_starts[0]) if one_segment else None
        self._bucket_shift, self._bucket_segments, self._bucket_probes = _segment_buckets(
            self._offsets
        )
        self._single = self._shards[0] if len(self._shards) == 1 and corpus.source is None else None
        # Each segment's first-token address and its length: every segment lies in one shard
        # (a shard starts every document), found as the last shard starting at or before it;
        # the addresses stay valid as long as ``self._shards`` lives. Frozen: nothing a caller
        # can do makes the kernels' bounds writeable.
        shard_of = np.searchsorted(self._shard_starts, self._segment_starts, side="right") - 1
        local = (self._segment_starts - self._shard_starts[shard_of]).astype(np.uint64)
        local *= np.uint64(corpus.dtype.itemsize)
        self._source = corpus.source
        if self._source is None:
            shard_addresses = np.array([shard.ctypes.data for shard in self._shards], np.uint64)
            self._segment_addresses = frozen(shard_addresses[shard_of] + local)
        else:
            # Shards read on demand have no address yet: a segment's "address" holds its shard
            # above bit ``_shard_shift`` and its byte offset in the shard below; :meth:`locate`
            # asks the source for the real ones (see tokstream.shards.source).
            largest = int(corpus.lengths.max(initial=0)) * corpus.dtype.itemsize
            self._shard_shift = max(1, largest.bit_length())
            if self._shard_shift + max(1, len(self._shards) - 1).bit_length() > 63:
                raise ValueError("too many shards, or shards too large, for 64-bit addresses")
            shards = shard_of.astype(np.uint64) << np.uint64(self._shard_shift)
            self._segment_addresses = frozen(shards + local)
        self._segment_lengths = frozen(segment_lengths[kept].astype(np.int64))
        self._eos = 0 if eos is None else eos
        self._use_eos = eos is not None
        # Made on first use (a manifest's documents are read then, not when a stream is made).
        self._documents: tuple[np.ndarray, np.ndarray, int, int, bool] | None = None

    @property
    def offsets(self) -> np.ndarray:
        """The first global window index of each segment holding a window, then their count."""
        return self._offsets

    def segments_sha256(self) -> str:
        """A hash of where the windows lie: each kept segment's first token, then the first
        window index of each (O(segments) bytes, read once)."""
        digest = hashlib.sha256(np.ascontiguousarray(self._segment_starts, "<i8").data)
        digest.update(np.ascontiguousarray(self._offsets, "<i8").data)
        return digest.hexdigest()

    def token_starts(self, windows: np.ndarray) -> np.ndarray:
        """The first token of each window, in the shards laid end to end."""
        if self._one_segment_base is not None:
            if self._stride == 1 and self._one_segment_base == 0:
                return windows
            return windows * self._stride + self._one_segment_base
        return self._lookup(windows, None)

    def _lookup(self, windows: np.ndarray, addresses: np.ndarray | None) -> np.ndarray:
        """Each window's first token (returned) and, into ``addresses``, its address."""
        starts = np.empty(windows.shape[0], np.int64)
        lookup_windows(
            windows,
            self._offsets,
            self._segment_starts,
            self._segment_addresses,
            self._segment_lengths,
            self._bucket_segments,
            self._bucket_shift,
            self._bucket_probes,
            self._stride,
            self.corpus.dtype.itemsize,
            self.block,
            starts,
            addresses,
        )
        return starts

    def locate(self, windows_index: np.ndarray) -> tuple[np.ndarray, np.ndarray, Readable]:
        """``(first tokens, their addresses, what keeps them readable)`` of the windows: where
        the kernels copy from.

        The addresses are valid until the :class:`~tokstream.shards.source.Readable` is
        released, and only until then: release it right after the kernel call. For shards in
        hand that costs nothing (this space holds them); for shards read on demand the corpus'
        source is asked to make each window's ``block + 1`` tokens readable (mapping shards).
        """
        addresses = np.empty(windows_index.shape[0], np.uint64)
        starts = self._lookup(windows_index, addresses)
        if self._source is None:
            return starts, addresses, Readable(addresses)
        shards = (addresses >> np.uint64(self._shard_shift)).astype(np.int64)
        offsets = (addresses & np.uint64((1 << self._shard_shift) - 1)).astype(np.int64)
        nbytes = (self.block + 1) * self.corpus.dtype.itemsize
        readable = self._source.readable(shards, offsets, nbytes)
        return starts, readable.addresses, readable

    @property
    def one_shard(self) -> tuple[np.ndarray, int, int] | None:
        """``(shard, stride, base)`` when every window lies in one segment of one shard: window
        ``w`` then starts at token ``base + stride * w`` of that shard, no lookup needed."""
        if self._single is None or self._one_segment_base is None:
            return None
        return self._single, self._stride, self._one_segment_base

    @property
    def documents(self) -> tuple[np.ndarray, np.ndarray, int, int, bool]:
        """``(document starts, their buckets, the buckets' shift, eos, whether eos is used)``:
        where documents start inside the corpus (positions in the shards laid end to end,
        frozen), as the document kernel reads them (see :func:`document_buckets`)."""
        if self._documents is None:
            boundaries, total = self.corpus.document_boundaries, self.corpus.num_tokens
            inside = frozen(boundaries[(boundaries > 0) & (boundaries < total)].astype(np.int64))
            shift, buckets = document_buckets(inside, total)
            self._documents = (inside, buckets, shift, self._eos, self._use_eos)
        return self._documents

    def advise(self, windows_index: np.ndarray, sample: int) -> int:
        """Ask the OS to start reading these windows, unless a sample of them is in memory.

        The advice goes to the addresses the kernels copy from (:meth:`locate`), whatever
        shards the windows lie in; see :func:`tokstream._kernels.advice.advise_at`. Returns
        how many windows were advised (0 when the sampled windows were all resident, or where
        ``madvise`` does not exist).
        """
        _, addresses, readable = self.locate(windows_index)
        with readable:
            return advise_at(addresses, (self.block + 1) * self.corpus.dtype.itemsize, sample)


def window_space(corpus: Corpus, options: StreamOptions) -> WindowSpace:
    """The corpus' windows for ``options``: stride, window policy and document boundaries.

    ``options.eos`` is a token id of the corpus dtype (a rule of ``StreamOptions.create``);
    here the corpus only says whether it holds that token (``Corpus.check_eos``)."""
    boundaries = None
    if options.windows == "within":
        boundaries = (
            corpus.document_boundaries
            if options.eos is None
            else corpus.boundaries_with_eos(options.eos)
        )
    if options.eos is not None:
        corpus.check_eos(options.eos)
    return WindowSpace(
        corpus,
        options.block,
        random_order=options.shuffle,
        stride=options.stride,
        document_boundaries=boundaries,
        eos=options.eos,
    )


def _segment_buckets(offsets: np.ndarray) -> tuple[int, np.ndarray, int]:
    """``(shift, segment of window b << shift for each b then the last segment, probes)``.

    About one bucket per segment, and at least :data:`MIN_SEGMENT_BUCKETS` (8 KiB), so a
    window's segment is searched among the few that start in its bucket, most often none:
    O(segments) memory, and a lookup that does not grow with their number. ``probes`` search
    steps cover the widest bucket (``2**probes`` segments or fewer).
    """
    segments, num_windows = offsets.shape[0] - 1, int(offsets[-1])
    if num_windows == 0:
        return 0, np.zeros(2, np.int64), 0
    buckets = max(segments - 1, MIN_SEGMENT_BUCKETS - 1).bit_length()
    shift = max(0, (num_windows - 1).bit_length() - buckets)
    firsts = np.arange(((num_windows - 1) >> shift) + 1, dtype=np.int64) << shift
    buckets = np.append(np.searchsorted(offsets[:-1], firsts, side="right") - 1, segments - 1)
    widest = int(np.diff(buckets).max(initial=0)) + 1
    return shift, frozen(buckets), (widest - 1).bit_length()


def document_buckets(starts: np.ndarray, length: int) -> tuple[int, np.ndarray]:
    """``(shift, how many of the sorted ``starts`` are <= k << shift, for each k)``.

    Buckets about as wide as the mean gap between starts, so that the document kernel finds
    the first start after a token among the few counted between its bucket and the next: O(1)
    per window and O(documents) memory. The counts run to bucket ``(length - 1 >> shift) + 1``.
    """
    shift = max(0, (length // max(1, starts.shape[0])).bit_length() - 1)
    firsts = np.arange((max(0, length - 1) >> shift) + 2, dtype=np.int64) << shift
    return shift, frozen(np.searchsorted(starts, firsts, side="right").astype(np.int64))
