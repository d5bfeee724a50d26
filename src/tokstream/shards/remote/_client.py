"""One object store, through obstore: listing, sizes, whole objects and byte ranges.

obstore (the Rust ``object_store`` crate's bindings) is the ``remote`` extra. A store is made
from the URL's scheme and bucket (``s3://bucket``, ``gs://bucket``, ``az://container``,
``https://host``) and takes its credentials and endpoint from the client's standard environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_REGION``, ``GOOGLE_SERVICE_ACCOUNT``,
``AZURE_STORAGE_ACCOUNT_NAME``, ...). The store's own retries are off: every request here is
retried by :func:`retrying`, with backoff, until :attr:`RemoteOptions.deadline` seconds have passed
since its first attempt, and a request that still fails is a :class:`RemoteReadError` naming the
object and the byte range.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from tokstream._extras import install_hint

T = TypeVar("T")


class RemoteReadError(OSError):
    """A request to an object store failed for longer than the deadline allows (or for good:
    a refused credential). The message names the object and the byte range."""


class RemoteNotFoundError(RemoteReadError, FileNotFoundError):
    """The object (or bucket) does not exist; ``.filename`` is its URL."""


class RemoteChangedError(RemoteReadError):
    """The object was replaced after it was opened (its ETag changed): its bytes are no longer
    those of the version read so far, so none of them are read. Open it again to read it."""


@dataclass(frozen=True)
class RemoteOptions:
    """How a remote corpus is read: requests in flight, time limits, an optional local cache.

    Parameters
    ----------
    max_in_flight
        Range GETs in flight at once, per corpus and process.
    timeout
        Seconds one attempt of a request may take.
    deadline
        Seconds after a request's first attempt after which it is no longer retried: the read
        fails with a :class:`RemoteReadError` naming the object and byte range.
    backoff, max_backoff
        The first retry's wait in seconds, doubled (with jitter) each retry up to the second.
    cache_dir
        A directory for the bytes fetched, kept for later epochs and runs: one sparse file per
        object, the size of the object, plus its index files. Nothing is written anywhere else.
        Without ``cache_max_bytes`` the files grow up to the objects' sizes and are shared by
        every process using the directory (DataLoader workers). None (the default): fetched
        bytes are held in anonymous memory, within ``cache_max_bytes``.
    stall_warning
        Seconds a batch may wait on its byte ranges before a warning is logged (logger
        ``tokstream``) naming an object and byte range still awaited and how long the batch has
        waited; another says when the batch's bytes came after all.
    cache_max_bytes
        The most bytes of fetched tokens kept for later reads (counted in whole pages), least
        recently used out first, whole extents at a time. Bytes a batch being copied or a read
        ahead still needs are kept beyond it. None (the default): without ``cache_dir``, nothing
        beyond those (each epoch fetches its windows again); with ``cache_dir``, no limit. With
        both, the limit is per process: each process keeps its files in a slot directory of
        its own under ``cache_dir`` (``bounded-0``, ``bounded-1``, ...), which a later run
        takes over.
    """

    max_in_flight: int = 64
    timeout: float = 10.0
    deadline: float = 60.0
    backoff: float = 0.05
    max_backoff: float = 2.0
    cache_dir: str | None = None
    cache_max_bytes: int | None = None
    stall_warning: float = 30.0

    def __post_init__(self) -> None:
        if type(self.max_in_flight) is not int:
            raise TypeError(
                f"max_in_flight must be an int, got {type(self.max_in_flight).__name__}"
            )
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {self.max_in_flight}")
        for name in ("timeout", "deadline", "backoff", "max_backoff", "stall_warning"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
            if not value > 0 or value == float("inf"):
                raise ValueError(
                    f"{name} must be a positive, finite number of seconds, got {value}"
                )
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise TypeError(
                f"cache_dir must be a path or None, got {type(self.cache_dir).__name__}"
            )
        if self.cache_max_bytes is not None:
            if type(self.cache_max_bytes) is not int:
                raise TypeError(
                    "cache_max_bytes must be an int or None, got "
                    f"{type(self.cache_max_bytes).__name__}"
                )
            if self.cache_max_bytes < 0:
                raise ValueError(f"cache_max_bytes must be at least 0, got {self.cache_max_bytes}")


def require() -> Any:
    """The obstore module, or ImportError naming the extra."""
    try:
        import obstore
    except ImportError:
        raise ImportError(
            f"reading token files from object storage needs obstore: {install_hint('remote')}"
        ) from None
    return obstore


def _store_config(root: str, options: RemoteOptions) -> dict[str, Any]:
    """The store's settings beyond the environment's: our timeout, and no retries of its own."""
    config: dict[str, Any] = {
        "client_options": {"timeout": timedelta(seconds=options.timeout)},
        "retry_config": {"max_retries": 0},
    }
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    if root.startswith("http://") or (
        root.startswith("s3://") and endpoint and endpoint.startswith("http://")
    ):
        # A local S3-compatible server (MinIO, moto) speaks plain HTTP, which obstore only
        # allows when asked to; the endpoint named it, so it is asked for.
        config["client_options"]["allow_http"] = True
    return config


class Client:
    """The objects under one store root (``scheme://bucket``), made lazily, dropped by close().

    Dropping the store closes its pooled connections; the next request makes a new one.
    Picklable: a spawned worker makes its own store from the same root and the environment.
    """

    def __init__(self, root: str, options: RemoteOptions) -> None:
        self.root, self.options = root, options
        self._store: Any = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (Client, (self.root, self.options))

    @property
    def store(self) -> Any:
        if self._store is None:
            require()
            from obstore.store import from_url

            self._store = from_url(self.root, **_store_config(self.root, self.options))
        return self._store

    def close(self) -> None:
        self._store = None

    def url(self, key: str) -> str:
        return f"{self.root}/{key}"

    async def size(self, key: str) -> tuple[int, str | None]:
        """The object's size in bytes and its ETag (None when the store gives none)."""
        obstore = require()
        meta = await retrying(
            lambda: obstore.head_async(self.store, key), f"{self.url(key)} (its size)", self.options
        )
        return int(meta["size"]), meta.get("e_tag")

    async def read(self, key: str, etag: str | None = None) -> bytes:
        """The whole object; with ``etag``, only that version of it (else
        :class:`RemoteChangedError`)."""
        obstore = require()

        async def whole() -> bytes:
            result = await obstore.get_async(self.store, key, options=_version(etag))
            _check_version(result.meta, etag, None, self.url(key))
            return bytes(await result.bytes_async())

        return await retrying(whole, f"{self.url(key)} (the whole object)", self.options)

    async def read_head(self, key: str, nbytes: int) -> tuple[bytes, int, str | None]:
        """The object's first ``nbytes`` bytes (all of it when shorter), its size and ETag: one
        request (an empty object: its size alone)."""
        obstore = require()

        async def head() -> tuple[bytes, int, str | None]:
            try:
                result = await obstore.get_async(self.store, key, options={"range": (0, nbytes)})
            except Exception as error:  # noqa: BLE001 - an empty object has no byte 0
                if _not_found(error) or (_permanent(error) and _status(error) != 416):
                    raise
                meta = await obstore.head_async(self.store, key)
                if int(meta["size"]) != 0:
                    raise
                return b"", 0, meta.get("e_tag")
            data = bytes(await result.bytes_async())
            size = int(result.meta["size"])
            if len(data) != min(nbytes, size):
                raise _Truncated(f"{len(data)} bytes came of the {min(nbytes, size)} asked")
            return data, size, result.meta.get("e_tag")

        return await retrying(head, f"{self.url(key)} bytes [0, {nbytes})", self.options)

    async def list_level(self, folder: str) -> tuple[list[tuple[str, int, str | None]], list[str]]:
        """One level of the folder ``folder`` (``""``: the bucket's top): ``(key, size, etag)``
        of each object directly in it and the name of each folder in it, both sorted. Nothing
        below those folders is listed, so a key the client cannot parse there (an empty
        segment, ``..``) is never seen."""
        obstore = require()

        async def listing() -> tuple[list[tuple[str, int, str | None]], list[str]]:
            found = await obstore.list_with_delimiter_async(self.store, folder or None)
            objects = [
                (meta["path"], int(meta["size"]), meta.get("e_tag")) for meta in found["objects"]
            ]
            return sorted(objects), sorted(found["common_prefixes"])

        return await retrying(listing, f"{self.url(folder)}/* (a listing)", self.options)

    async def read_range(
        self,
        key: str,
        start: int,
        end: int,
        etag: str | None = None,
        size: int | None = None,
        since: float | None = None,
    ) -> bytes | memoryview:
        """Bytes ``[start, end)`` of the version of the object whose ETag is ``etag`` and
        whose size is ``size`` (either None: not checked), retried until the deadline (counted
        from ``since``, a :func:`time.monotonic` time, when given); a short answer is retried
        too, another version is a :class:`RemoteChangedError` at once."""
        obstore = require()
        what = f"{self.url(key)} bytes [{start}, {end})"
        options = _version(etag)
        options["range"] = (start, end)

        async def attempt() -> memoryview:
            result = await obstore.get_async(self.store, key, options=options)
            _check_version(result.meta, etag, size, self.url(key))
            data = memoryview(await result.bytes_async())
            if data.nbytes != end - start:
                raise _Truncated(f"{data.nbytes} bytes came of the {end - start} asked")
            return data

        return await retrying(attempt, what, self.options)


def _version(etag: str | None) -> dict[str, Any]:
    """A GET's options that make it conditional on the version ``etag`` (``If-Match``)."""
    return {} if etag is None else {"if_match": etag}


def _check_version(meta: Any, etag: str | None, size: int | None, url: str) -> None:
    """Raise :class:`RemoteChangedError` when a response is of another version than the one
    opened: the store answers ``If-Match`` with 412, and a store that ignores it is caught by
    the ETag and size of the answer itself."""
    found_etag, found_size = meta.get("e_tag"), int(meta["size"])
    if (etag is not None and found_etag is not None and found_etag != etag) or (
        size is not None and found_size != size
    ):
        raise _Changed(f"ETag {found_etag}, {found_size} bytes")


class _Truncated(Exception):
    """A response shorter than the range asked for (a dropped connection): retried."""


class _Changed(Exception):
    """A response of another version of the object than the one opened: never retried."""


#: HTTP statuses of a request that may succeed later (a timeout, too many requests); every
#: other 4xx answer fails at once.
_RETRIED_4XX = frozenset({408, 429})


def _status(error: BaseException) -> int | None:
    """The HTTP status a store's error reports, when its message gives one."""
    text = str(error)
    match = re.search(r"status code: (\d{3})\b", text) or re.search(
        r"\b(4\d\d) (?:Bad Request|Unauthorized|Forbidden|Not Found|Precondition Failed)\b", text
    )
    return None if match is None else int(match.group(1))


def _not_found(error: BaseException) -> bool:
    """Whether the object, or the bucket a listing was asked of, does not exist."""
    from obstore.exceptions import NotFoundError

    return isinstance(error, (NotFoundError, FileNotFoundError)) or _status(error) == 404


def _changed(error: BaseException) -> bool:
    from obstore.exceptions import PreconditionError

    return isinstance(error, (PreconditionError, _Changed)) or _status(error) == 412


def _malformed(error: BaseException) -> bool:
    """Whether the request can never be made: a key the client cannot parse (an empty
    segment, ``.`` or ``..``, a control character), or a request the store answers 400."""
    from obstore.exceptions import InvalidPathError

    return (
        isinstance(error, InvalidPathError)
        or type(error) is ValueError  # obstore's "could not parse path"
        or _status(error) == 400
    )


def _permanent(error: BaseException) -> bool:
    """Whether retrying cannot help: access is refused, or the store says the request is
    wrong (a 4xx answer but a timeout's or a throttle's)."""
    from obstore import exceptions

    status = _status(error)
    if status is not None and 400 <= status < 500 and status not in _RETRIED_4XX:
        return True
    return isinstance(
        error,
        (
            exceptions.PermissionDeniedError,
            exceptions.UnauthenticatedError,
            exceptions.NotSupportedError,
            exceptions.UnknownConfigurationKeyError,
        ),
    )


async def retrying(
    call: Callable[[], Awaitable[T]], what: str, options: RemoteOptions, since: float | None = None
) -> T:
    """``await call()``, retried with exponential backoff and jitter until ``options.deadline``
    seconds after ``since`` (a :func:`time.monotonic` time: when the request was asked for, so
    that time spent queued for a slot counts; by default now). It is tried at least once.

    Raises :class:`RemoteReadError` naming ``what`` (the object and range) with the last error;
    at once, with no retry, what can never succeed: :class:`RemoteNotFoundError` for a missing
    object or bucket, :class:`RemoteChangedError` for an object replaced since it was opened,
    ValueError for a key the client cannot parse or a request the store calls malformed (400),
    :class:`RemoteReadError` for a refused credential or any other 4xx answer. Only what may
    succeed later is retried: 5xx answers, 408 and 429, dropped, short or stalled answers.
    Cancellation passes through.
    """
    first = time.monotonic() if since is None else since
    wait = options.backoff
    attempts = 0
    while True:
        attempts += 1
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - every failure of a request is retried
            if _not_found(error):
                raise RemoteNotFoundError(2, "object not found", what) from None
            if _changed(error):
                raise RemoteChangedError(
                    f"cannot read {what}: the object changed after it was opened (another "
                    f"version is stored now: {_describe(error)}); none of the new version's "
                    "bytes are read beside the old one's: open it again to read it"
                ) from None
            if _malformed(error):
                raise ValueError(f"cannot read {what}: {_describe(error)}") from None
            if _permanent(error):
                raise RemoteReadError(f"cannot read {what}: {_describe(error)}") from None
            elapsed = time.monotonic() - first
            if elapsed + wait > options.deadline:
                raise RemoteReadError(
                    f"cannot read {what}: still failing after {attempts} attempts over "
                    f"{elapsed:.1f} s (deadline {options.deadline:g} s): {_describe(error)}"
                ) from None
        await asyncio.sleep(wait * (0.5 + random.random() / 2))
        wait = min(wait * 2, options.max_backoff)


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
