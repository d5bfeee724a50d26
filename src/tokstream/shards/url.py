"""What names object storage: URL schemes and the ``(root, key)`` of a URL.

Apart from the object-storage package (:mod:`tokstream.shards.remote`), so that telling a URL
from a path (every ``open_tokens`` call does) imports neither asyncio nor the object-store client,
and works where that package is not installed: a process reading local files never pays for it.
"""

from __future__ import annotations

import re
from typing import Any

#: URL schemes read from object storage (obstore's: S3, Google Cloud Storage, Azure, HTTP).
SCHEMES = ("s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "http", "https")
_URL = re.compile(r"^(?:" + "|".join(SCHEMES) + r")://[^/]+", re.IGNORECASE)


def is_url(spec: Any) -> bool:
    """Whether ``spec`` is a URL of object storage (``s3://``, ``gs://``, ``az://``, ...)."""
    return isinstance(spec, str) and _URL.match(spec) is not None


def split_url(url: str) -> tuple[str, str]:
    """``(root, key)``: ``s3://bucket/a/b.bin`` is ``("s3://bucket", "a/b.bin")``."""
    match = _URL.match(url)
    if match is None:
        raise ValueError(f"{url!r} is not a URL of object storage ({', '.join(SCHEMES)})")
    return match.group(0), url[match.end() :].lstrip("/")
