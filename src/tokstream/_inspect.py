"""What ``tokstream inspect`` reports about a token file: format, dtype, counts, id range."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokstream import _progress, _validate, bench, files


def _value_range(
    tokens: np.ndarray, progress: _progress.Progress, label: str
) -> tuple[int, int] | tuple[None, None]:
    """Min and max id, scanned in chunks (a memory map is never read into memory at once)."""

    def show(done: float) -> None:
        progress.update(f"{label}: scanning ids {done:.0%}")

    large = tokens.nbytes >= _progress.PROGRESS_MIN_BYTES
    bounds = _validate.value_range(tokens, show if large else None)
    return bounds or (None, None)


@dataclass
class FileSummary:
    """What ``tokstream inspect`` reports about one token file."""

    path: str
    format: str
    dtype: str
    tokens: int
    min_id: int | None
    max_id: int | None
    windows: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summarize(
    path: str, block: int, dtype: str | None, format: str | None, progress: _progress.Progress
) -> FileSummary:
    """Open ``path`` with :func:`tokstream.files.open_tokens` and describe it."""
    detected = files.detect_format(path) if format is None else format
    corpus = files.open_tokens(path, dtype=dtype, format=format)
    (tokens,) = corpus.shards
    low, high = _value_range(tokens, progress, path)
    return FileSummary(
        path=path,
        format=detected,
        dtype=str(corpus.dtype),
        tokens=corpus.num_tokens,
        min_id=low,
        max_id=high,
        windows=corpus.num_windows(block),
        bytes=os.path.getsize(path),
    )


def inspect_table(summaries: Sequence[FileSummary], block: int) -> str:
    """A Markdown table of the files, with a total row when there are several."""

    def text(value: int | None) -> str:
        return "-" if value is None else f"{value:,}"

    header = ["file", "format", "dtype", "tokens", "min id", "max id", f"windows (block {block})"]
    rows = [
        [s.path, s.format, s.dtype, text(s.tokens), text(s.min_id), text(s.max_id), text(s.windows)]
        for s in summaries
    ]
    if len(summaries) > 1:
        lows = [s.min_id for s in summaries if s.min_id is not None]
        highs = [s.max_id for s in summaries if s.max_id is not None]
        rows.append(
            [
                f"total ({len(summaries)} files)",
                "",
                "",
                text(sum(s.tokens for s in summaries)),
                text(min(lows) if lows else None),
                text(max(highs) if highs else None),
                text(sum(s.windows for s in summaries)),
            ]
        )
    return bench.markdown_table(header, rows, numeric_from=3)
