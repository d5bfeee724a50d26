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

from dataclasses import dataclass
from typing import Any

from tokstream import _state
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
        return Plan(corpus, packed, order, PackedFill(packed, options), options)
    windows = window_space(corpus, options)
    if mixture is None:
        order = WindowOrder(windows.num_windows, options)
    else:
        order = MixtureOrder(mixture, windows, options)
    return Plan(corpus, windows, order, WindowFill(windows, options), options)
