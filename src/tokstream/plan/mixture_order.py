"""A mixture's order: the schedule picks each sample's source and which of its windows it is.

:class:`MixtureOrder` is the :class:`~tokstream.plan.order.WindowOrder` of a stream over a
:func:`tokstream.mix` mixture: positions are global samples, mapped to windows of the sources'
combined window space by the compiled schedule (:func:`tokstream.mixture.mixture_windows`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from tokstream._frozen import read_only
from tokstream._options import StreamOptions
from tokstream._state import Cursor, schedule_fingerprint
from tokstream._validate import INT64_MAX
from tokstream.mixture import mixture_windows, source_label
from tokstream.plan.order import WindowOrder

if TYPE_CHECKING:
    from tokstream.mixture import Mixture
    from tokstream.plan.windows import WindowSpace


class MixtureOrder(WindowOrder):
    """The window indices of every batch of a stream over a :class:`Mixture`.

    A :class:`~tokstream.plan.order.WindowOrder` over the ``N`` samples of each epoch (ranks,
    epoch tail and cursors as for one corpus), whose position ``p`` of epoch ``e`` is global
    sample ``e * N + p``, mapped to a window of the combined corpus by the compiled schedule.
    Pure in the cursor: nothing about earlier batches is kept beyond the kernel's caches (each
    source's round keys and last epoch).
    """

    def __init__(self, mixture: Mixture, gather: WindowSpace, options: StreamOptions) -> None:
        # A source's first window is the first of the first segment starting in the source.
        segment_starts = gather.token_starts(gather.offsets[:-1])
        source_tokens = np.cumsum([0] + [c.num_tokens for c in mixture.sources.values()])
        first_windows = gather.offsets[np.searchsorted(segment_starts, source_tokens[:-1])]
        offsets = np.append(first_windows, gather.num_windows)
        counts = np.diff(offsets)
        for name, count in zip(mixture.names, counts, strict=True):
            if count == 0:
                inside = " inside one document" if options.within_documents else ""
                raise ValueError(
                    f"{source_label(name)} holds no window of block + 1 = {options.block + 1} "
                    f"tokens{inside}, so it cannot give its share of the samples"
                )
        samples = int(counts.sum()) if options.samples is None else options.samples
        if options.epochs * samples > INT64_MAX:
            raise ValueError(
                f"epochs * samples per epoch = {options.epochs} * {samples} must stay below 2**63"
            )
        super().__init__(samples, options)
        # First window of each source in the combined corpus, then the window count.
        self._source_offsets = read_only(offsets)
        self._mixture = mixture
        self._kernel = mixture_windows(mixture, first_windows, counts, gather.num_windows, options)

    def fill_extras(self, windows_index: np.ndarray, buffers: dict[str, np.ndarray]) -> None:
        """The ``"source"`` extra: each row's source, the last one whose first window is at or
        before the row's window."""
        if "source" in buffers:
            found = np.searchsorted(self._source_offsets, windows_index, side="right")
            np.subtract(found, 1, out=buffers["source"])

    def batch_windows(self, cursor: Cursor, count: int) -> np.ndarray:
        """Window indices of this rank's batch at ``cursor``: samples ``k + r + i W``."""
        windows = np.empty(count, dtype=np.int64)
        first = cursor.epoch * self.num_windows + cursor.position + self.options.rank
        self._kernel.fill(windows, first, self.options.world_size)
        return windows

    def fingerprint(self) -> dict[str, Any]:
        """The sources' names and shards, the samples per epoch and the schedule's stages (a
        state loads into a schedule that agrees with its own up to the state's position)."""
        mixture = self._mixture
        return {
            "mixture_sources": json.dumps(list(mixture.names)),
            "mixture_shards": json.dumps([len(c.shards) for c in mixture.sources.values()]),
            **schedule_fingerprint(mixture.integer_stages),
            "samples": self.num_windows,
        }
