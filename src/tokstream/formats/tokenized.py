"""The directory ``tokstream tokenize`` writes: token shards, their documents and a manifest.

``DIR/tokstream.json`` lists the shards in order with their format, dtype, token and document
counts, and the job that made them; it is complete once every shard is made (the shards of a
run that stopped are recorded beside it, see :mod:`tokstream.tokenize.output`, and a rerun keeps
them). Entries may hold more (the input range a shard was made from). Megatron shards hold their
documents in their index; the other formats get a ``.documents.npy`` beside each shard: the
int64 document offsets, from 0 to the shard's token count.

A complete directory also holds ``manifest.json`` (:mod:`tokstream.manifest`, written by the
job last), which :func:`tokstream.open_tokens` reads instead: :func:`read` serves a directory
without one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokstream.formats import llmc, megatron, npy, raw
from tokstream.formats.common import Shard, atomic_writer, check_kind, check_offsets

# The record's dtype rule is the manifests' (shards/remote/_open reads it from here).
from tokstream.formats.common import manifest_dtype as manifest_dtype

MANIFEST = "tokstream.json"
KIND = "tokstream tokenize output"
VERSION = 1
SUFFIXES = {"npy": ".npy", "bin": ".bin", "llmc": ".bin", "megatron": ""}


def shard_file(index: int, format: str) -> str:
    """The file name of shard ``index`` (for Megatron, the prefix of its ``.bin``/``.idx``)."""
    return f"shard_{index:06d}{SUFFIXES[format]}"


def documents_file(index: int) -> str:
    return f"shard_{index:06d}.documents.npy"


def loss_mask_file(index: int) -> str:
    """The loss mask of shard ``index`` (a ``--chat`` run's): one uint8 (0 or 1) per token."""
    return f"shard_{index:06d}.loss_mask.npy"


def is_directory(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def is_documents_file(path: Path) -> bool:
    """Whether ``path`` is the document offsets or the loss mask of a shard in a tokenize
    directory: a file beside the shards, never a token file of its own."""
    for suffix, name in ((".documents.npy", documents_file), (".loss_mask.npy", loss_mask_file)):
        digits = path.name[len("shard_") : -len(suffix)]
        if digits.isdigit() and path.name == name(int(digits)) and is_directory(path.parent):
            return True
    return False


def has_loss_masks(manifest: dict[str, Any]) -> bool:
    """Whether the run that made the directory wrote a loss mask beside each shard."""
    return manifest.get("loss_mask") is True


def read_loss_masks(path: Path, lengths: Sequence[int]) -> list[np.ndarray] | None:
    """Each shard's loss mask (read-only uint8 maps, 1 where the loss trains on the token) in
    the finished directory ``path`` whose shards hold ``lengths`` tokens; None when its run
    wrote none (not ``--chat``).

    Each file is checked against its shard and the manifest's entry: a 1-D uint8 ``.npy`` of
    the shard's token count, holding only 0 and 1, as many 1s as the entry's ``trained``;
    anything else is a ValueError naming the file.
    """
    manifest = load(path)
    if not has_loss_masks(manifest):
        return None
    masks = []
    for index, (entry, length) in enumerate(zip(manifest["shards"], lengths, strict=True)):
        file = path / loss_mask_file(index)
        where = f"loss mask {file}"
        mask = npy.read(file)
        if mask.dtype != np.uint8:
            raise ValueError(f"{where}: holds {mask.dtype}, a loss mask is uint8 (0 or 1)")
        if mask.shape[0] != length:
            raise ValueError(
                f"{where}: {mask.shape[0]} values for the {length} tokens of its shard"
            )
        stray = np.count_nonzero(mask > 1)
        if stray:
            raise ValueError(f"{where}: {stray} values other than 0 and 1")
        trained = np.count_nonzero(mask)
        if trained != entry.get("trained"):
            raise ValueError(
                f"{where}: {trained} tokens trained, the manifest {MANIFEST} says "
                f"{entry.get('trained')!r}"
            )
        masks.append(mask)
    return masks


def load(path: Path) -> dict[str, Any]:
    """The manifest of the directory ``path``; ValueError naming it when it is not one of ours."""
    manifest_path = path / MANIFEST
    return parse(manifest_path.read_bytes(), f"token file {manifest_path}")


def parse(text: bytes, where: str) -> dict[str, Any]:
    """A manifest from its bytes; ValueError starting with ``where`` when it is not one of ours."""
    try:
        manifest = check_kind(json.loads(text.decode("utf-8")), KIND, VERSION, where)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: unreadable JSON: {exc}") from None
    if manifest.get("format") not in SUFFIXES or not isinstance(manifest.get("shards"), list):
        raise ValueError(f"{where}: no valid 'format' and 'shards'")
    return manifest


def save(path: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest under a temporary name and rename it into place."""
    with atomic_writer(path / MANIFEST) as f:
        f.write(json.dumps(manifest, indent=1).encode("utf-8"))


def read(path: Path) -> list[Shard]:
    """The shards of a finished ``tokstream tokenize`` directory, with their documents.

    Every file is checked against the manifest (its dtype, token and document counts) before
    it is used; anything else is a ValueError naming the file (a missing one, an OSError).
    """

    def open_shard(index: int, format: str, dtype: np.dtype) -> Shard:
        file = path / shard_file(index, format)
        if format == "megatron":
            tokens, offsets, _ = megatron.read(file)
            return Shard(tokens, offsets, str(file))
        reader = {"npy": npy.read, "llmc": llmc.read}.get(format, lambda p: raw.read(p, dtype))
        tokens = reader(file)
        documents = path / documents_file(index)
        offsets = check_offsets(npy.read(documents), tokens.shape[0], f"token file {documents}")
        return Shard(tokens, offsets, str(file))

    return shards_of(load(path), f"token file {path / MANIFEST}", open_shard)


def shards_of(
    manifest: dict[str, Any], where: str, open_shard: Callable[[int, str, np.dtype], Shard]
) -> list[Shard]:
    """The shards a manifest lists, each opened by ``open_shard(index, format, dtype)`` (with
    its document offsets) and checked against its entry; ValueError naming ``where``."""
    if manifest.get("complete") is not True:
        raise ValueError(
            f"{where}: the tokenization stopped before it finished; run the same `tokstream "
            "tokenize` command again to complete it"
        )
    format = manifest["format"]
    dtype = manifest_dtype(manifest, where)
    shards = []
    for index, entry in enumerate(manifest["shards"]):
        name = shard_file(index, format)
        if not (
            isinstance(entry, dict)
            and all(_count(entry.get(key)) for key in ("tokens", "documents"))
        ):
            raise ValueError(f"{where}: shard {index} has no valid 'tokens' and 'documents'")
        shard = open_shard(index, format, dtype)
        tokens, offsets = shard.tokens, shard.document_offsets
        assert offsets is not None  # every shard of a tokenize directory records documents
        if tokens.dtype != dtype:
            raise ValueError(f"{where}: shard {name} holds {tokens.dtype} tokens, not {dtype}")
        if entry["tokens"] != tokens.shape[0] or entry["documents"] != offsets.shape[0] - 1:
            raise ValueError(
                f"{where}: shard {name} holds {tokens.shape[0]} tokens in "
                f"{offsets.shape[0] - 1} documents, the manifest says {entry!r}"
            )
        shards.append(shard)
    if not shards:
        raise ValueError(f"{where}: no shards (the inputs held no documents)")
    return shards


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0
