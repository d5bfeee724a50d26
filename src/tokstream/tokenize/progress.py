"""How far a tokenize job is: documents, tokens, shards, the share of the input, rate and ETA.

The share counts input bytes over all inputs (a ``.gz`` by its compressed bytes), so it only
grows from the first input to the last. The rate is taken over the last :data:`RATE_SECONDS`,
so the documents a resumed run skips do not inflate it for long. Every update is offered to the
callback; one at least every :data:`LOG_SECONDS` (and the first, and one per shard written) is
marked as a milestone: a terminal rewrites its status line on every update, a log gets the
milestones as lines.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

#: Seconds between two milestone lines when no shard is written in between: a log shows the
#: job moving, not one line at the start and the next when a shard of minutes is written.
LOG_SECONDS = 10.0
#: Seconds over which the rate (and so the ETA) is measured.
RATE_SECONDS = 30.0

#: Called with a one-line status, and whether it is a milestone (printed even in logs).
Callback = Callable[[str, bool], None]


class Meter:
    """Counts a job's progress and reports it to ``callback``; ``total_bytes`` of input."""

    def __init__(self, callback: Callback | None, total_bytes: int) -> None:
        self.callback = callback
        self.total_bytes = max(total_bytes, 1)
        self._samples: collections.deque[tuple[float, int, int, int]] = collections.deque()
        self._last_line = -float("inf")

    def update(
        self, position: int, documents: int, tokens: int, shards: int, milestone: bool
    ) -> None:
        """Report ``position`` input bytes done, with the counts so far."""
        if self.callback is None:
            return
        now = time.monotonic()
        samples = self._samples
        samples.append((now, position, tokens, documents))
        while len(samples) > 2 and now - samples[1][0] >= RATE_SECONDS:
            samples.popleft()
        then, then_position, then_tokens, then_documents = samples[0]
        elapsed = now - then
        parts = [
            f"tokenize: {min(position / self.total_bytes, 1.0):.1%}",
            f"{documents:,} documents, {tokens:,} tokens, {shards} shards written",
        ]
        if elapsed > 0:
            rate = (position - then_position) / elapsed
            parts.append(
                f"{rate / 1e6:,.1f} MB/s, {(documents - then_documents) / elapsed:,.0f} "
                f"documents/s, {(tokens - then_tokens) / elapsed:,.0f} tokens/s"
            )
            if rate > 0:
                parts.append(f"ETA {_duration((self.total_bytes - position) / rate)}")
        line = now - self._last_line >= LOG_SECONDS or milestone
        if line:
            self._last_line = now
        self.callback(" | ".join(parts), line)


def _duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
