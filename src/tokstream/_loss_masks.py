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
copies the label; no window mode needs a rule of its own. The plan makes that fill
(:func:`tokstream.plan.mask_fill`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tokstream import _batch
from tokstream._options import StreamOptions
from tokstream.corpus import Corpus

if TYPE_CHECKING:
    from tokstream.plan import Fill


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
    fill: tuple[Fill, StreamOptions], windows_index: np.ndarray, buffers: dict[str, np.ndarray]
) -> None:
    """AND each label's recorded mask into the batch's ``buffers`` (its ``label_continues``):
    ``fill`` is the plan's fill of the masks and its options (:attr:`tokstream.plan.Plan.masks`)."""
    filling, own = fill
    masks = _batch.new_buffers(own, windows_index.shape[0])
    filling.into(windows_index, masks)
    continues = buffers["label_continues"]
    continues &= masks["labels"].reshape(continues.shape).astype(np.uint8)
