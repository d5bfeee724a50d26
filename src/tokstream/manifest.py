"""A manifest: one file that lists a corpus' token files, so that opening it reads nothing else.

``tokstream manifest FILES... --output DIR/manifest.json`` (:func:`write_manifest`) reads every
file once, in any format :func:`tokstream.open_tokens` reads, and writes what a corpus needs to
know before it reads a token: for each shard its path relative to the manifest, format, token
and document counts, the byte offset of its first token, its file's size and a fingerprint of
its content. The shards' document boundaries, where the files record them, go into one sidecar
(``DIR/manifest.documents.npy``: the int64 :attr:`tokstream.Corpus.document_boundaries`), read
when a stream first needs documents (``windows="within"``/``"packed"``, the document extras).

:func:`open_manifest` (what :func:`tokstream.open_tokens` does with a manifest, or a directory
holding ``manifest.json``) reads that one JSON file: no shard is stat'ed, opened or mapped. A
shard is mapped when a batch (or ``corpus.shards[j]``) first reads it, through the same reader
as a glob would use, and checked against its entry: the file's size, what its header says
(format, dtype, token count, where the tokens start) and its recorded documents; a
disagreement is a ValueError naming the file, raised before any of its tokens is copied. At most
``max_open_maps`` shard maps stay open (least recently used first out). A corpus opened from a
manifest has the same shards, lengths and documents as the files opened by a glob, so its
streams' batches, states and fingerprints are the same.

The fingerprints are not checked at first read (that would read every shard's sampled bytes):
:func:`verify_manifest` (``tokstream manifest --verify MANIFEST``) re-reads every file and
checks its size, header, documents and fingerprint, naming every file that disagrees.

The manifest is JSON with the shard table stored by column (one list per field), which parses
an order of magnitude faster than an object per shard: 100,000 shards in well under a second.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tokstream import _validate
from tokstream._windowing import cumulative
from tokstream.corpus import Corpus
from tokstream.formats import megatron
from tokstream.formats.common import PathLike, Shard, atomic_writer
from tokstream.formats.table import checked_tokens, input_paths, shards_with_formats
from tokstream.shards.filemap import file_map_of
from tokstream.shards.manifest import COLUMNS, KIND, MANIFEST_NAME, VERSION, ManifestShards
from tokstream.shards.source import DEFAULT_CAPACITY

__all__ = [
    "COLUMNS",
    "FINGERPRINT",
    "KIND",
    "MANIFEST_NAME",
    "VERSION",
    "ManifestShards",
    "find",
    "fingerprint",
    "load",
    "open_manifest",
    "verify_manifest",
    "write_manifest",
]

#: The fingerprint: BLAKE2b-128 of the size and of at most this many sampled bytes of the file
#: (its first and last 64 KiB and 16 evenly spaced blocks of 4 KiB), so writing a manifest of
#: terabytes reads a few hundred KiB a file, not the terabytes.
FINGERPRINT = "blake2b-128-sampled-v1"
_EDGE, _BLOCK, _BLOCKS = 1 << 16, 1 << 12, 16


def fingerprint(path: PathLike) -> str:
    """The content fingerprint :func:`write_manifest` records for the file at ``path`` (hex;
    the manifest names the method, :data:`FINGERPRINT`, once)."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        digest.update(size.to_bytes(8, "little"))
        spans = [(0, _EDGE), (max(0, size - _EDGE), _EDGE)]
        spans += [(size * (k + 1) // (_BLOCKS + 1), _BLOCK) for k in range(_BLOCKS)]
        # A small file is read once; the spans are the same bytes either way.
        whole = f.read() if size <= 4 * _EDGE else None
        for start, count in spans:
            if whole is None:
                digest.update(os.pread(f.fileno(), count, start))
            else:
                digest.update(whole[start : start + count])
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Writing


def write_manifest(
    inputs: Any,
    output: PathLike,
    dtype: Any = None,
    *,
    column: str = "input_ids",
) -> Path:
    """Write the manifest of ``inputs`` to ``output`` (and its documents beside it).

    ``inputs``: what :func:`tokstream.open_tokens` takes (a path, a pattern, a list of them);
    ``dtype`` and ``column`` as there. Every file is opened and checked as ``open_tokens``
    would, its fingerprint read, and shard paths are stored relative to ``output``'s
    directory (so the directory can be moved with its files). Both files are written under
    temporary names and renamed into place. Returns ``output``.

    Raises what :func:`tokstream.open_tokens` raises for the inputs; ValueError for an
    ``output`` that is not a ``.json`` file name or that is one of the inputs.
    """
    output = Path(os.fspath(output)) if isinstance(output, (str, os.PathLike)) else output
    if not isinstance(output, Path):
        raise TypeError(f"output must be a str or os.PathLike, got {type(output).__name__}")
    if output.suffix != ".json" or os.path.isdir(output):
        raise ValueError(f"output must name a .json file, got {os.fspath(output)!r}")
    want = None if dtype is None else _validate.integer_dtype(dtype, "dtype")
    table: dict[str, list[Any]] = {name: [] for name in COLUMNS}
    documents: list[np.ndarray] = []
    found: dict[str, str] = {}
    fingerprints: dict[str, str] = {}
    # Absolute paths without resolving links (no system call per shard); relative to where
    # the manifest will be, so the directory can move with its files.
    base, target = os.path.abspath(output.parent), os.path.abspath(output)
    for path in input_paths(inputs):
        for shard, format in shards_with_formats(path, want, column):
            data = _data_file(shard, format)
            key = os.path.abspath(data)
            if key == target:
                raise ValueError(f"output {output} is one of the inputs")
            tokens = checked_tokens(shard, want)
            found.setdefault(str(tokens.dtype), shard.name)
            if key not in fingerprints:
                fingerprints[key] = fingerprint(data)
            mapped = file_map_of(shard.tokens)
            table["path"].append(os.path.relpath(key, base))
            table["format"].append(format)
            table["offset"].append(0 if mapped is None else mapped.offset)
            table["tokens"].append(int(tokens.shape[0]))
            offsets = shard.document_offsets
            table["documents"].append(None if offsets is None else int(offsets.shape[0] - 1))
            table["size"].append(data.stat().st_size if mapped is None else mapped.identity[2])
            table["fingerprint"].append(fingerprints[key])
            table["batch"].append(_batch_index(shard.name) if format == "arrow" else None)
            documents.append(np.zeros(1, np.int64) if offsets is None else offsets[:-1])
    if len(found) > 1:
        examples = ", ".join(f"{n} is {d}" for d, n in found.items())
        raise ValueError(f"the inputs mix token dtypes ({examples}); a corpus has one dtype")
    if not table["path"]:
        raise ValueError("the inputs hold no shards")
    # The directory every path starts with is written once.
    prefix = os.path.commonpath([os.path.dirname(p) or "." for p in table["path"]])
    prefix = "" if prefix in ("", ".") else prefix + "/"
    table["path"] = [p[len(prefix) :] for p in table["path"]]
    manifest: dict[str, Any] = {
        "kind": KIND,
        "version": VERSION,
        "dtype": next(iter(found)),
        "column": column,
        "num_shards": len(table["path"]),
        "num_tokens": sum(table["tokens"]),
        "documents_file": None,
        "fingerprint": FINGERPRINT,
        "path_prefix": prefix,
        "shards": table,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    if any(count is not None for count in table["documents"]):
        starts = cumulative(np.array(table["tokens"], np.int64))
        boundaries = np.concatenate(
            [d + start for d, start in zip(documents, starts[:-1], strict=True)] + [starts[-1:]]
        )
        sidecar = output.with_name(output.stem + ".documents.npy")
        with atomic_writer(sidecar) as f:
            np.save(f, boundaries.astype("<i8"))
        manifest["documents_file"] = sidecar.name
    with atomic_writer(output) as f:
        f.write(json.dumps(manifest, separators=(",", ":")).encode("utf-8"))
    return output


def _data_file(shard: Shard, format: str) -> Path:
    """The file holding ``shard``'s tokens: the one mapped, or named by a reader's message."""
    mapped = file_map_of(shard.tokens)
    if mapped is not None:
        return Path(mapped.path)
    name = shard.name.removeprefix("token file ").split(" (record batch ", 1)[0]
    if format == "megatron":
        return Path(os.fspath(megatron.prefix(name)) + ".bin")
    return Path(name)


def _batch_index(name: str) -> int:
    """The record batch number in a shard name ``'token file X (record batch N)'``."""
    return int(name.rsplit("(record batch ", 1)[1].rstrip(")")) if "(record batch " in name else 0


# ---------------------------------------------------------------------------------------------
# Reading


def find(spec: Any) -> tuple[Path, dict[str, Any]] | None:
    """The manifest ``spec`` names and its parsed content, else None: a ``.json`` file whose
    ``"kind"`` is a manifest's (any other JSON file is left to the format readers, which refuse
    it), or a directory holding ``manifest.json`` (which must then be one). Reads that one
    file; nothing else."""
    if not isinstance(spec, (str, os.PathLike)):
        return None
    path = Path(spec)
    if path.suffix == ".json":
        if not os.path.isfile(path):
            return None
        try:
            body = load(path)
        except ValueError:
            return None
        return (path, body) if isinstance(body, dict) and body.get("kind") == KIND else None
    candidate = path / MANIFEST_NAME
    return (candidate, load(candidate)) if os.path.isfile(candidate) else None


def load(path: Path) -> Any:
    """The parsed JSON of ``path``; ValueError naming it when it is not JSON."""
    try:
        return json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"token file {path}: unreadable JSON: {exc}") from None


def open_manifest(
    path: PathLike,
    dtype: Any = None,
    column: str | None = None,
    max_open_maps: int | None = None,
    *,
    body: dict[str, Any] | None = None,
    source: Callable[[Any, Any, int], ManifestShards] = ManifestShards,
) -> Corpus:
    """The corpus a manifest lists, its shards read on demand (see the module).

    ``body``: the manifest's parsed JSON when the caller read it already; ``source``: what
    reads the shards (a manifest in object storage has its own). Raises ValueError
    naming the manifest when it is not one (wrong kind, version, a missing or malformed column,
    counts that disagree), when ``dtype`` or ``column`` disagree with it.
    """
    capacity = DEFAULT_CAPACITY if max_open_maps is None else max_open_maps
    if source is ManifestShards:
        path = Path(path)
    shards = source(path, load(Path(path)) if body is None else body, capacity)
    if dtype is not None and _validate.integer_dtype(dtype, "dtype") != shards.dtype:
        raise ValueError(f"token file {path} lists {shards.dtype} tokens, dtype={dtype} was asked")
    if column is not None and column != shards.column:
        raise ValueError(f"token file {path} lists column {shards.column!r}, column={column!r}")
    return Corpus._from_source(shards, "token files")


def verify_manifest(path: PathLike) -> list[str]:
    """Check every file a manifest lists against it; one message per file that disagrees.

    ``path``: a manifest, or a directory holding ``manifest.json``. Each shard is read as its
    first read in a stream reads it (the file's size, its header's format, dtype, token count
    and first token's byte, its documents) and its file's content fingerprint is computed again
    (:func:`fingerprint`: every file's sampled bytes are read, so this takes a while for many
    files). Returns the messages, each starting ``token file PATH:``, in the manifest's order,
    one per file (a file holding several shards, or a documents file several shards share, is
    named once); empty when every file agrees.

    Raises FileNotFoundError when ``path`` does not exist; ValueError naming the manifest when
    it is not one (what :func:`tokstream.open_tokens` refuses), or records fingerprints of
    another method than :data:`FINGERPRINT`.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"manifest path must be a str or os.PathLike, got {type(path).__name__}")
    if not os.path.exists(path):
        raise FileNotFoundError(2, "manifest not found", os.fspath(path))
    listed = find(path)
    if listed is None:
        raise ValueError(
            f"token file {os.fspath(path)}: not a {KIND} (a .json file `tokstream manifest` "
            "wrote, or a directory holding manifest.json)"
        )
    manifest_path, body = listed
    source = ManifestShards(manifest_path, body, capacity=1)
    recorded = body["shards"]["fingerprint"]
    where = f"token file {manifest_path}"
    if body.get("fingerprint") != FINGERPRINT:
        raise ValueError(
            f"{where}: fingerprints of method {body.get('fingerprint')!r}, this tokstream "
            f"computes {FINGERPRINT!r}"
        )
    if set(map(type, recorded)) - {str}:
        raise ValueError(f"{where}: every 'fingerprint' must be a string")
    problems: dict[str, str] = {}  # by the file each names, in the order found
    computed: dict[str, str] = {}
    for index in range(len(source)):
        file = os.fspath(source.file(index))
        if file in problems:
            continue
        try:
            source.shard(index)
        except OSError as exc:
            problems[file] = f"token file {exc.filename or file}: {exc.strerror or exc}"
            continue
        except ValueError as exc:
            # The shard's file, or another its check reads (documents, a Megatron index).
            named = str(exc).split(": ", 1)[0].removeprefix("token file ")
            problems.setdefault(named, str(exc))
            if named == file:
                continue
        if file not in computed:
            computed[file] = fingerprint(file)
        if computed[file] != recorded[index]:
            problems[file] = (
                f"token file {file}: its content is not what the manifest {manifest_path} "
                "recorded (another fingerprint: the file changed after the manifest was written)"
            )
    return list(problems.values())
