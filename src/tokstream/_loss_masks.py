"""A corpus's recorded loss masks in a stream's batches: each label's own mask AND the stream's.

A corpus may record, per token, whether a loss trains on it (``Corpus.loss_masks``: the
assistant's tokens of a ``tokstream tokenize --chat`` run). A stream whose batch carries a loss
mask (``extras=("loss_mask",)``, packed rows, ``labels_ignore_index``) then gives
``loss_mask`` = the stream's own (a label of another document, padding) AND the label token's
recorded mask, in every window mode.

The masks are streamed as the tokens of a corpus of their own (:func:`mask_corpus`): the same
shard lengths, and as its recorded documents the boundaries the stream splits at (``eos=``'s
included). The same space over it numbers the same samples (windows of shards or of documents,
packed rows: the packing depends only on the documents' lengths and the options), so the same
fill, handed the stream's window indices, copies each label's mask exactly where the stream
copies the label; no window mode needs a rule of its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tokstream import _batch
from tokstream._options import StreamOptions
from tokstream._packed import packed_parts
from tokstream._space import window_space
from tokstream.corpus import Corpus
from tokstream.mixture import Mixture


def mask_fill(source: Corpus | Mixture, options: StreamOptions) -> tuple[Any, StreamOptions] | None:
    """The fill (and its options) that copies the masks of a stream's labels; None when the
    source records no mask or the stream's batches carry none.

    A mixture whose sources record masks is refused (ValueError) rather than streamed without
    them.
    """
    if "loss_mask" not in options.extras:
        return None
    if isinstance(source, Mixture):
        masked = [name for name, c in source.sources.items() if c.loss_masks is not None]
        if masked:
            raise ValueError(
                f"mixture sources {masked} record loss masks, which a mixture does not stream "
                "yet; stream each source on its own"
            )
        return None
    if source.loss_masks is None:
        return None
    masks = mask_corpus(source, options)
    packed = options.windows == "packed"
    own = dataclasses.replace(
        options,
        eos=None,
        extras=(),
        pad=0 if packed else None,
        labels_ignore_index=None,
        prefetch=0,
        reuse_buffers=0,
    )
    space = packed_parts(masks, own)[0] if packed else window_space(masks, own)
    return _batch.filler(space, own), own


def mask_corpus(corpus: Corpus, options: StreamOptions) -> Corpus:
    """``corpus``'s loss masks as a corpus: its shards' lengths, and as documents the boundaries
    a stream with ``options`` splits the corpus at."""
    assert corpus.loss_masks is not None
    boundaries = (
        corpus.document_boundaries
        if options.eos is None
        else corpus.boundaries_with_eos(options.eos)
    )
    starts = corpus.shard_starts
    offsets = []
    for start, length in zip(starts.tolist(), corpus.lengths.tolist(), strict=True):
        first, end = np.searchsorted(boundaries, [start, start + length], side="left")
        offsets.append(np.append(boundaries[first:end] - start, length).astype(np.int64))
    names = [f"loss_masks[{j}]" for j in range(len(offsets))]
    return Corpus._from_arrays(list(corpus.loss_masks), names, "loss_masks", offsets)


def apply(
    fill: tuple[Any, StreamOptions], windows_index: np.ndarray, buffers: dict[str, np.ndarray]
) -> None:
    """AND each label's recorded mask into the batch's ``buffers`` (its ``label_continues``)."""
    filling, own = fill
    masks = _batch.new_buffers(own, windows_index.shape[0])
    _batch.fill(filling, windows_index, masks)
    continues = buffers["label_continues"]
    continues &= masks["labels"].reshape(continues.shape).astype(np.uint8)
