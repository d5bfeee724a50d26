"""Progress on a terminal: one status line, and the growth of a file being written.

The command line shows what a long run is doing on stderr; piped or redirected output gets only
the milestones, as plain lines, so logs stay readable.
"""

from __future__ import annotations

import glob
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, TextIO

#: Files at least this large get a progress display while they are scanned or written.
PROGRESS_MIN_BYTES = 64 << 20
#: Seconds between two looks at a file being written.
PROGRESS_INTERVAL = 0.2
#: Characters of the bar a terminal's status line opens with.
BAR_WIDTH = 24
#: The share a status message gives ("tokenize: 45.3% | ..."): the bar shows it.
_SHARE = re.compile(r"^[^:|]*: (\d+(?:\.\d+)?)%")


class Progress:
    """One status line on stderr: rewritten in place on a terminal, opening with a bar of the
    share the message gives; plain lines otherwise."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.tty = bool(stream is not None and stream.isatty())
        self._width = 0

    def update(self, message: str, *, final: bool = False) -> None:
        """Show ``message``; off a terminal only ``final`` messages are printed (as lines)."""
        if self.stream is None:
            return
        if self.tty:
            message = bar(message) + message
            padding = " " * max(self._width - len(message), 0)
            self.stream.write("\r" + message + padding)
            self._width = len(message)
        elif final:
            self.stream.write(message + "\n")
        self.stream.flush()

    def done(self) -> None:
        """End the status line."""
        if self.stream is not None and self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


def bar(message: str) -> str:
    """``[#####.....] `` for the share a status message opens with, "" when it gives none."""
    found = _SHARE.match(message)
    if found is None:
        return ""
    filled = round(min(float(found.group(1)), 100.0) / 100 * BAR_WIDTH)
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "] "


class WriteWatcher:
    """Reports how far a ``write_tokens`` call has got by watching its output grow.

    ``write_tokens`` writes beside the target under a temporary name (``.NAME.*.tmp``) and
    renames it into place, so the size of that file against the expected size is the progress.
    When no such file shows up, only the elapsed time is shown.
    """

    def __init__(self, target: Path, expected_bytes: int, progress: Progress, label: str) -> None:
        self.target = target
        self.expected = max(expected_bytes, 1)
        self.progress = progress
        self.label = label
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokstream-convert", daemon=True)
        self._last_decile = -1

    def __enter__(self) -> WriteWatcher:
        self.started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _written(self) -> int | None:
        pattern = os.path.join(glob.escape(str(self.target.parent)), f".{self.target.name}.*.tmp")
        sizes = []
        for temp in glob.glob(pattern):
            try:
                sizes.append(os.path.getsize(temp))
            except OSError:  # renamed into place between glob() and getsize()
                continue
        return max(sizes) if sizes else None

    def _run(self) -> None:
        while not self._stop.wait(PROGRESS_INTERVAL):
            written = self._written()
            elapsed = time.perf_counter() - self.started
            if written is None:
                self.progress.update(f"{self.label}: {elapsed:.0f} s")
                continue
            fraction = min(written / self.expected, 1.0)
            decile = int(fraction * 10)
            message = (
                f"{self.label}: {fraction:.0%} ({written / 1e6:,.0f} of "
                f"{self.expected / 1e6:,.0f} MB, {elapsed:.0f} s)"
            )
            self.progress.update(message, final=decile > self._last_decile)
            self._last_decile = max(decile, self._last_decile)
