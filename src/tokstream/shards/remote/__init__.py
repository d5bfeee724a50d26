"""Token files in object storage: ``open_tokens("s3://bucket/prefix/*.bin")`` and its peers.

``s3://``, ``gs://``, ``az://`` and ``http(s)://`` URLs (a file, a pattern, a Megatron prefix,
a ``tokstream tokenize`` directory, or a list of them) open as a :class:`~tokstream.Corpus` of
the same shards and documents as the same files on disk, through obstore (the ``remote`` extra:
``pip install 'tokstream[remote]'``), with credentials and endpoints from the client's standard
environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...). Opening reads headers and indexes
only. A stream over such a corpus fetches the byte ranges of its upcoming windows with
concurrent range GETs, ahead of the batches that read them, and every batch holds the same
windows as from local files: each window's bytes are in memory before the kernel copies it.
:class:`RemoteOptions` sets the requests in flight, the retry deadline and a local cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokstream.shards.url import is_url

if TYPE_CHECKING:
    import numpy as np

    from tokstream.formats.common import Shard
    from tokstream.shards.manifest import ManifestShards
    from tokstream.shards.remote._client import (
        RemoteChangedError,
        RemoteNotFoundError,
        RemoteOptions,
        RemoteReadError,
    )

__all__ = [
    "RemoteChangedError",
    "RemoteNotFoundError",
    "RemoteOptions",
    "RemoteReadError",
    "is_url",
    "open_url",
]


def open_url(
    spec: Any, dtype: np.dtype | None, format: str | None, remote: Any
) -> tuple[list[Shard], None] | tuple[None, tuple[str, Any, Callable[..., ManifestShards]]]:
    """What ``spec`` (a URL, or a list of URLs) names in object storage, opened with the
    options ``remote`` (a :class:`RemoteOptions` or None): ``(shards, None)`` for token files
    (their headers and indexes read, their tokens fetched on demand), or for a manifest (only
    it read) ``(None, (url, body, source))``, the ``path``, ``body`` and ``source`` of
    :func:`tokstream.manifest.open_manifest`."""
    from tokstream.shards.remote import _manifest, _open

    opened = _open.open_remote(spec, dtype, format, _open.options(remote))
    if isinstance(opened, _open.Listed):
        url, source = _manifest.open_listed(*opened)
        return None, (url, opened.body, source)
    return opened, None


def __getattr__(name: str) -> Any:
    # The client (asyncio among its imports) loads on first use: the core imports this package
    # for the few lines that tell a remote array from a local one, and every rank and
    # DataLoader worker reading local files would pay tens of milliseconds for it.
    if name in {"RemoteChangedError", "RemoteNotFoundError", "RemoteOptions", "RemoteReadError"}:
        from tokstream.shards.remote import _client

        return getattr(_client, name)
    raise AttributeError(f"module 'tokstream.shards.remote' has no attribute {name!r}")
