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

from typing import TYPE_CHECKING, Any

from tokstream.shards.remote._url import is_url

if TYPE_CHECKING:
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
]


def __getattr__(name: str) -> Any:
    # The client (asyncio among its imports) loads on first use: the core imports this package
    # for the few lines that tell a remote array from a local one, and every rank and
    # DataLoader worker reading local files would pay tens of milliseconds for it.
    if name in {"RemoteChangedError", "RemoteNotFoundError", "RemoteOptions", "RemoteReadError"}:
        from tokstream.shards.remote import _client

        return getattr(_client, name)
    raise AttributeError(f"module 'tokstream.shards.remote' has no attribute {name!r}")
