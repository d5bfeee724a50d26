"""Opening token files in object storage: URLs, patterns, headers and indexes.

The same formats and the same rules as local files (:mod:`tokstream.formats`): each file's
format is told by its first and last bytes, headers and indexes are checked by the readers'
own functions, and every shard is the object's tokens at the offset its header gives. Opening
reads only headers (a range GET of the first few KiB and of the last bytes), Megatron indexes,
``tokstream tokenize`` manifests and document offsets (whole), all objects at once on the
session's loop; the tokens are fetched when a stream's windows need them.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import io
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tokstream._memory import available_memory
from tokstream.formats import detect, llmc, megatron, npy, raw, tokenized
from tokstream.formats.common import Shard, check_length, check_offsets
from tokstream.shards.manifest import KIND as MANIFEST_KIND
from tokstream.shards.manifest import MANIFEST_NAME
from tokstream.shards.remote._client import Client, RemoteNotFoundError, RemoteOptions
from tokstream.shards.remote._memory import ObjectBytes, tokens_array
from tokstream.shards.remote._session import Session
from tokstream.shards.url import split_url

#: Bytes of each file read at open: enough for every header tokstream reads (a .npy header of
#: a 1-D array is 128 bytes; llm.c's 1024).
HEAD_BYTES = 4096
GLOB_CHARS = frozenset("*?[")


def open_remote(
    spec: str | Sequence[str], want: np.dtype | None, format: str | None, options: RemoteOptions
) -> list[Shard] | Listed:
    """The shards of a URL, a pattern of one or a list of URLs (see :func:`open_tokens`), or
    the manifest a URL names (a ``.json`` object, or a directory holding ``manifest.json``),
    read and parsed only."""
    if options.cache_dir is not None and not os.path.isdir(options.cache_dir):
        raise ValueError(f"cache_dir {options.cache_dir!r} is not a directory")
    free = available_memory()
    if options.cache_dir is None and options.cache_max_bytes and free is not None:
        if options.cache_max_bytes > free // 2:
            raise ValueError(
                f"cache_max_bytes {options.cache_max_bytes} is more than half the memory available "
                f"({free / 2**30:.1f} GiB) to keep fetched bytes in; pass a smaller one, or "
                "cache_dir=... to keep them on disk"
            )
    session = Session(options)
    urls = [spec] if isinstance(spec, str) else list(spec)
    if format == "arrow":
        raise ValueError("Arrow files are not read from object storage; convert them first")

    async def everything() -> list[Shard] | Listed:
        entries = []
        for url in urls:
            entries.extend(await _expand(session, url))
        semaphore = asyncio.Semaphore(options.max_in_flight)

        async def bounded(entry: tuple[str, str, int | None, str | None]) -> Any:
            async with semaphore:
                return await _open_entry(session, *entry, want=want, format=format)

        opened = await asyncio.gather(*(bounded(entry) for entry in entries))
        listed = [found for found in opened if isinstance(found, Listed)]
        if listed and len(opened) > 1:
            raise ValueError(
                f"token file {listed[0].url} is a manifest: open it on its own, not with other "
                "token files"
            )
        if listed:
            return listed[0]
        return [shard for shards in opened for shard in shards]

    try:
        result: list[Shard] | Listed = session.run(everything())
        return result
    finally:
        # Opening leaves no thread or connection behind; the first fetch starts them again.
        session.close()


async def _expand(session: Session, url: str) -> list[tuple[str, str, int | None, str | None]]:
    """``(root, key, size or None, etag or None)`` of each object or dataset ``url`` names.

    A pattern (``*``, ``?``, ``[`` in the key) is matched segment by segment (``*`` stays
    within one ``/`` segment): from the folder before its first pattern character, each level
    is listed on its own (its objects and its folders) and only the folders matching the
    pattern's segment there are descended into, so keys the pattern cannot match (a log
    directory's, another tool's keys the client cannot even parse) are never listed. The
    matches come sorted; a Megatron pair counts once (as its ``.bin``) and a tokenize
    directory's document offsets are left out. Anything else is one entry, resolved when opened.
    """
    root, key = split_url(url)
    if not GLOB_CHARS & set(key):
        return [(root, key, None, None)]
    client = session.client(root)
    parts = key.split("/")
    fixed = next(i for i, part in enumerate(parts) if GLOB_CHARS & set(part))
    folders = ["/".join(parts[:fixed])]
    for depth in range(fixed, len(parts) - 1):
        below: list[str] = []
        for folder in folders:
            _, inside = await client.list_level(folder)
            below.extend(f for f in inside if fnmatch.fnmatchcase(_last(f), parts[depth]))
        folders = below
    found: list[tuple[str, str, int | None, str | None]] = []
    for folder in folders:
        listed, _ = await client.list_level(folder)
        names = {name for name, _, _ in listed}
        manifest = f"{folder}/{tokenized.MANIFEST}" if folder else tokenized.MANIFEST
        for name, size, etag in listed:
            base = _last(name)
            if not fnmatch.fnmatchcase(base, parts[-1]):
                continue
            if name.endswith(".idx") and name[:-4] + ".bin" in names:
                continue  # a Megatron pair counts once, as its .bin
            if re.fullmatch(r"shard_\d+\.documents\.npy", base) and manifest in names:
                continue  # a tokenize directory's document offsets, not tokens
            found.append((root, name, size, etag))
    if not found:
        raise ValueError(f"token file pattern {url!r} matched no objects")
    return sorted(found)


def _last(path: str) -> str:
    """The last segment of a listed key or folder."""
    return path.rstrip("/").rpartition("/")[2]


class Listed(NamedTuple):
    """A manifest at a URL (its parsed JSON), to be opened as the corpus it lists."""

    url: str
    body: Any
    session: Session


async def _open_entry(
    session: Session,
    root: str,
    key: str,
    size: int | None,
    etag: str | None,
    *,
    want: np.dtype | None,
    format: str | None,
) -> list[Shard] | Listed:
    client = session.client(root)
    url = client.url(key)
    try:
        head, size, etag = await client.read_head(key, HEAD_BYTES)
    except RemoteNotFoundError:
        if size is not None:
            raise  # listed a moment ago, gone now
        return await _open_directory(session, client, key.rstrip("/"), format)
    if key.endswith(".json"):
        body = _json(await read_whole(session, client, key), url)
        if isinstance(body, dict) and body.get("kind") == MANIFEST_KIND:
            return Listed(url, body, session)
    found = "bin" if format == "bin" else await _classify(client, key, head, size, etag, format)
    if found == "megatron":
        return [await open_megatron(session, client, megatron.prefix(key).as_posix())]
    if found == "arrow":
        raise ValueError(f"token file {url}: Arrow files are not read from object storage")
    obj = ObjectBytes(session, root, key, size, etag)
    dtype, offset, count = header_tokens(found, head, size, url, want)
    return [Shard(remote_tokens(obj, offset, dtype, count), None, url)]


async def _classify(
    client: Client, key: str, head: bytes, size: int, etag: str | None, format: str | None
) -> str:
    """The object's format from its first bytes (and, only when they name none, its last bytes
    and whether a ``.idx`` is beside it): one request fewer for every object with a magic."""
    url = client.url(key)
    try:
        found = detect.classify(head[: detect.HEAD_BYTES], b"", size, url, lambda: False)
    except ValueError:
        found = None
    if found not in ("npy", "megatron", "arrow", "llmc"):
        tail_start = max(size - detect.tail_bytes(head), 0)
        tail = head[tail_start:] if size <= len(head) else b""
        if size > len(head):
            tail = bytes(await client.read_range(key, tail_start, size, etag, size))
        beside = key.endswith(".bin") and await _exists(client, key[:-4] + ".idx")
        found = detect.classify(head[: detect.HEAD_BYTES], tail, size, url, lambda: beside)
    if format is not None and format != found:
        raise ValueError(
            f"token file {url}: bad magic: format={format!r} was asked, the object's first "
            f"bytes say {found!r}"
        )
    return found


def header_tokens(
    found: str, head: bytes, size: int, url: str, want: np.dtype | None
) -> tuple[np.dtype, int, int]:
    """``(dtype, offset of the first token, count)`` of an npy, llm.c or raw object from its
    first bytes and size, checked as the local readers check them."""
    if found == "npy":
        dtype, count, offset = npy.parse_header(io.BytesIO(head), f"token file {url}")
        check_length(url, size, offset, count, dtype, "its .npy header")
    elif found == "llmc":
        dtype, count = llmc.parse_header(head[: llmc.HEADER_BYTES], f"token file {url}")
        offset = llmc.HEADER_BYTES
        check_length(url, size, offset, count, dtype, "its llm.c header")
    else:
        dtype = raw.DEFAULT_DTYPE if want is None else want
        offset, count = 0, raw.token_count(url, size, dtype)
    return dtype, offset, count


async def _open_directory(
    session: Session, client: Client, directory: str, format: str | None
) -> list[Shard] | Listed:
    """A directory holding a manifest (its ``manifest.json``), a ``tokstream tokenize``
    directory (its ``tokstream.json``), or a Megatron prefix."""
    url = client.url(directory)
    try:
        body = await read_whole(session, client, f"{directory}/{MANIFEST_NAME}")
    except RemoteNotFoundError:
        pass
    else:
        return Listed(f"{url}/{MANIFEST_NAME}", _json(body, f"{url}/{MANIFEST_NAME}"), session)
    try:
        manifest = await read_whole(session, client, f"{directory}/{tokenized.MANIFEST}")
    except RemoteNotFoundError:
        manifest = None
    if manifest is not None:
        return await _open_tokenized(session, client, directory, manifest, format)
    try:
        return [await open_megatron(session, client, directory)]
    except RemoteNotFoundError:
        raise RemoteNotFoundError(2, "token file not found", url) from None


def _json(data: bytes, url: str) -> Any:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"token file {url}: unreadable JSON: {exc}") from None


def remote_tokens(obj: ObjectBytes, offset: int, dtype: np.dtype, count: int) -> np.ndarray:
    if not dtype.isnative:
        raise ValueError(
            f"token file {obj.url} holds byte-swapped {dtype} tokens, which would have to be "
            "read whole to be converted; rewrite it in little-endian order"
        )
    if dtype.kind == "u" and dtype.itemsize == 8:
        # A uint64 file is checked value by value for ids beyond int64: the whole object.
        raise ValueError(
            f"token file {obj.url} holds uint64 tokens, which would have to be read whole to "
            "be checked; store them as int64 (or narrower)"
        )
    return tokens_array(obj, offset, dtype, count)


async def _exists(client: Client, key: str) -> bool:
    try:
        await client.size(key)
    except RemoteNotFoundError:
        return False
    return True


async def read_whole(session: Session, client: Client, key: str) -> bytes:
    """A whole small object (an index, a manifest, document offsets), from the cache directory
    when an earlier run saved the same version of it there (named by its ETag and size, and
    fetched on the condition that it is still that version)."""
    cache = session.cache_dir
    if cache is None:
        return await client.read(key)
    size, etag = await client.size(key)
    name = hashlib.sha256(f"{client.url(key)}\n{size}\n{etag}".encode()).hexdigest()[:32]
    path = Path(cache) / f"{name}.whole"
    if path.is_file() and path.stat().st_size == size:
        return path.read_bytes()
    data = await client.read(key, etag)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
    return data


async def open_megatron(session: Session, client: Client, prefix: str) -> Shard:
    index_key, bin_key = prefix + ".idx", prefix + ".bin"
    where = f"token file {client.url(index_key)}"
    index = await read_whole(session, client, index_key)
    dtype, total, offsets = megatron.parse_index(np.frombuffer(index, np.uint8), where)
    size, etag = await client.size(bin_key)
    megatron.check_tokens_size(size, total, dtype, client.url(bin_key), index_key.rsplit("/")[-1])
    obj = ObjectBytes(session, client.root, bin_key, size, etag)
    return Shard(remote_tokens(obj, 0, dtype, total), offsets, client.url(bin_key))


async def _open_tokenized(
    session: Session, client: Client, directory: str, manifest_bytes: bytes, format: str | None
) -> list[Shard]:
    where = f"token file {client.url(directory)}/{tokenized.MANIFEST}"
    manifest = tokenized.parse(manifest_bytes, where)
    found = manifest["format"]
    if format is not None and format != found:
        raise ValueError(
            f"token file {client.url(directory)}: format={format!r} was asked, it holds {found!r}"
        )
    dtype_wanted = tokenized.manifest_dtype(manifest, where)
    shards: dict[int, Shard] = {}

    async def one(index: int) -> None:
        name = f"{directory}/{tokenized.shard_file(index, found)}"
        if found == "megatron":
            shard = await open_megatron(session, client, name)
            shards[index] = Shard(shard.tokens, shard.document_offsets, client.url(name))
            return
        opened = await _open_entry(
            session, client.root, name, None, None, want=dtype_wanted, format=found
        )
        assert isinstance(opened, list)  # a shard's name is no manifest's
        tokens = opened[0].tokens
        documents = f"{directory}/{tokenized.documents_file(index)}"
        stored = np.load(io.BytesIO(await read_whole(session, client, documents)))
        offsets = check_offsets(stored, tokens.shape[0], f"token file {client.url(documents)}")
        shards[index] = Shard(tokens, offsets, client.url(name))

    count = len(manifest["shards"])
    await asyncio.gather(*(one(index) for index in range(count)))
    return tokenized.shards_of(manifest, where, lambda index, _format, _dtype: shards[index])


def options(remote: Any) -> RemoteOptions:
    """``open_tokens``' ``remote=`` argument, checked: None is the defaults."""
    if remote is None:
        return RemoteOptions()
    if not isinstance(remote, RemoteOptions):
        raise TypeError(
            "remote must be a tokstream.shards.remote.RemoteOptions or None, got "
            f"{type(remote).__name__}"
        )
    return remote
