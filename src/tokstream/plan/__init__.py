"""The window plan: what a stream's sample is, in what order samples come, how a batch is filled.

:func:`plan` decides it once per stream, from the source (one corpus or a :func:`tokstream.mix`
mixture) and the validated options, and the stream only asks the :class:`Plan`:

========================  ==============================  ==================================
source, ``windows=``      space (what a sample is)        order (which sample comes when)
========================  ==============================  ==================================
corpus, cross / within    ``WindowSpace``: windows of     ``WindowOrder``: each epoch's
                          shards / of documents           permutation, ranks' shares
mixture, cross / within   ``WindowSpace`` of the sources  ``MixtureOrder``: the schedule
                          laid end to end                 picks each sample's source
corpus, packed            ``PackedSpace``: packed rows    ``PackedOrder``: the packing's
mixture, packed           ``PackedMixtureSpace``          ``PackedMixtureOrder``
========================  ==============================  ==================================

The fill is the kernel calls that copy a batch of the space's samples, beside its space:
windows (:class:`~tokstream.plan.windows.WindowFill`) or packed rows
(:class:`~tokstream.plan.packed.PackedFill`).
Of the stream's modules this is the only one that asks whether a source is a mixture
(:func:`tokstream.mixture.mixture_of`, the one test, which :func:`tokstream.mix` and
:func:`tokstream.split` also ask of their arguments); what each ``windows`` value means is read
from :mod:`tokstream._options`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from tokstream import _state
from tokstream._loss_masks import mask_corpus
from tokstream._options import StreamOptions
from tokstream.corpus import Corpus
from tokstream.mixture import Mixture, mixture_of
from tokstream.plan.mixture_order import MixtureOrder
from tokstream.plan.order import WindowOrder, warn_if_slow_draw
from tokstream.plan.packed import (
    PackedFill,
    PackedMixtureOrder,
    PackedMixtureSpace,
    PackedOrder,
    PackedSpace,
)
from tokstream.plan.windows import WindowFill, WindowSpace, window_space

#: What a sample is: a window of a corpus (or of a mixture's sources), or a packed row.
Space = WindowSpace | PackedSpace | PackedMixtureSpace
#: How a batch is filled: the kernel calls that copy a space's samples into its buffers.
Fill = WindowFill | PackedFill


@dataclass(frozen=True)
class Plan:
    """A stream's samples, decided once: read by :class:`tokstream.TokenStream` as it iterates.

    ``corpus`` holds every token a sample is read from (a mixture's: its sources' shards in
    order); ``space`` numbers the samples and says where each one's tokens lie; ``order``
    gives the window indices of every batch at a cursor; ``fill`` copies them into a batch's
    buffers.
    """

    corpus: Corpus
    space: Space
    order: WindowOrder
    fill: Fill
    options: StreamOptions
    #: The fill of the corpus' recorded loss masks and its options, ANDed into each batch's
    #: loss mask (:mod:`tokstream._loss_masks`); None when there are none to stream.
    masks: tuple[Fill, StreamOptions] | None = None

    def fingerprint(self) -> dict[str, Any]:
        """The state dict's ``config``: everything that decides the global sample sequence.

        Where the documents decide the samples (within documents, packed) the space's
        segments are hashed (O(documents): made only when a state is saved or loaded).
        """
        splits = self.options.packed or self.options.within_documents
        segments = self.space.segments_sha256() if splits else None
        return {
            **_state.fingerprint(self.corpus, self.options, segments),
            **self.order.fingerprint(),
        }


def stream_source(
    token_ids: Any, block: Any, batch_size: Any, **options: Any
) -> tuple[Corpus | Mixture, StreamOptions]:
    """The token source of a stream call and its validated options.

    A :func:`tokstream.mix` mixture is its own source; anything else becomes a
    :class:`~tokstream.Corpus` (checked first, as the reference generator checks its array
    first). The options are checked against the source: its token dtype (``eos``) and whether
    it is a mixture (``samples``, the ``"source"`` extra, the implicit order).
    """
    mixture = mixture_of(token_ids)
    source: Corpus | Mixture
    if mixture is None:
        source = corpus = Corpus.from_tokens(token_ids)
    else:
        source, corpus = mixture, mixture.corpus
    stream_options = StreamOptions.create(
        block,
        batch_size,
        mixture=mixture is not None,
        token_dtype=corpus.dtype,
        # An array or a sequence, made a corpus here: what the reference generator takes.
        reference_input=source is not token_ids,
        **options,
    )
    if (
        options.get("permutation") is None
        and stream_options.shuffle
        and stream_options.permutation == "materialized"
    ):
        # The drawn order chosen by default: the caller who did not ask for it is told when it
        # takes seconds to draw (one who asked for it, as the benchmark does, knows).
        warn_if_slow_draw(corpus.num_windows(stream_options.block))
    return source, stream_options


def plan(source: Corpus | Mixture, options: StreamOptions) -> Plan:
    """The plan of a stream over ``source`` (from :func:`stream_source`) with ``options``."""
    mixture = mixture_of(source)
    corpus = Corpus.from_tokens(source) if mixture is None else mixture.corpus
    order: WindowOrder
    if options.packed:
        packed: PackedSpace | PackedMixtureSpace
        if mixture is None:
            packed = PackedSpace(corpus, options)
            order = PackedOrder(packed.num_windows, options)
        else:
            packed = PackedMixtureSpace(mixture, options)
            order = PackedMixtureOrder(mixture, packed, options)
        fill: Fill = PackedFill(packed, options)
        return Plan(corpus, packed, order, fill, options, mask_fill(corpus, mixture, options))
    windows = window_space(corpus, options)
    if mixture is None:
        order = WindowOrder(windows.num_windows, options)
    else:
        order = MixtureOrder(mixture, windows, options)
    fill = WindowFill(windows, options)
    return Plan(corpus, windows, order, fill, options, mask_fill(corpus, mixture, options))


def mask_fill(
    corpus: Corpus, mixture: Mixture | None, options: StreamOptions
) -> tuple[Fill, StreamOptions] | None:
    """The fill (and its options) that copies the recorded loss masks of a stream's labels;
    None when the source records no mask or the stream's batches carry none.

    The masks are a corpus of their own (:func:`tokstream._loss_masks.mask_corpus`) with the
    stream's shard lengths and document boundaries, so the same kind of space numbers the same
    samples over it. A mixture whose sources record masks is refused (ValueError) rather than
    streamed without them.
    """
    if "loss_mask" not in options.extras:
        return None
    if mixture is not None:
        masked = [name for name, c in mixture.sources.items() if c.loss_masks is not None]
        if masked:
            raise ValueError(
                f"mixture sources {masked} record loss masks, which a mixture does not stream "
                "yet; stream each source on its own"
            )
        return None
    if corpus.loss_masks is None:
        return None
    masks = mask_corpus(corpus, options)
    own = dataclasses.replace(
        options,
        eos=None,
        extras=(),
        pad=0 if options.packed else None,
        labels_ignore_index=None,
        prefetch=0,
        reuse_buffers=0,
    )
    if options.packed:
        return PackedFill(PackedSpace(masks, own), own), own
    return WindowFill(window_space(masks, own), own), own
