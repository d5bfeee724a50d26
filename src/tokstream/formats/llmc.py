"""llm.c's token shards, as its ``dev/data`` scripts write them.

A header of 256 little-endian int32 (``header[0]`` the magic, ``header[1]`` the version,
``header[2]`` the token count), then the tokens, little-endian. Two kinds exist: GPT-2 shards
(magic 20240520, version 1, uint16 tokens) and llama-3 shards (magic 20240801, version 7,
uint32 tokens). The shards record no documents.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokstream.formats.common import check_size, map_tokens, read_header

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
#: (magic, version) -> stored token dtype.
KINDS: dict[tuple[int, int], np.dtype] = {
    (20240520, 1): np.dtype("<u2"),
    (20240801, 7): np.dtype("<u4"),
}
MAGICS = frozenset(magic for magic, _ in KINDS)
#: llm.c files that share the header layout but hold no token stream.
OTHER_MAGICS = {20240522: "an llm.c eval file (multiple-choice examples, not a token stream)"}
MAX_TOKENS = int(np.iinfo(np.int32).max)


def describe_kinds() -> str:
    return ", ".join(
        f"magic {magic} version {version} ({dtype.name})"
        for (magic, version), dtype in KINDS.items()
    )


def read(path: Path) -> np.ndarray:
    """Map the tokens of the llm.c shard at ``path``; ValueError naming it when it is bad."""
    head = read_header(path, HEADER_BYTES, "llm.c header", f"token file {path}")
    dtype, count = parse_header(head, f"token file {path}")
    check_size(path, HEADER_BYTES, count, dtype, "its llm.c header")
    return map_tokens(path, dtype, HEADER_BYTES, count)


def parse_header(head: bytes, where: str) -> tuple[np.dtype, int]:
    """``(dtype, count)`` from a shard's :data:`HEADER_BYTES`-byte header; ValueError naming
    ``where`` when it is not an llm.c token shard's."""
    header = np.frombuffer(head, dtype="<i4")
    magic, version, count = (int(v) for v in header[:3])
    if magic not in MAGICS:
        raise ValueError(
            f"{where}: bad magic {magic}, llm.c token shards start with "
            f"{' or '.join(map(str, sorted(MAGICS)))}"
        )
    dtype = KINDS.get((magic, version))
    if dtype is None:
        raise ValueError(
            f"{where}: unknown llm.c version {version} for magic {magic}; "
            f"tokstream reads {describe_kinds()}"
        )
    if count < 0:
        raise ValueError(f"{where}: llm.c header gives a negative token count {count}")
    return dtype, count


def kind_for(dtype: np.dtype) -> tuple[int, int] | None:
    """The (magic, version) whose shards store ``dtype``, or None when llm.c has none."""
    for kind, stored in KINDS.items():
        if stored.newbyteorder("=") == dtype.newbyteorder("="):
            return kind
    return None


def header(count: int, dtype: np.dtype) -> bytes:
    """The 1024-byte header of a shard of ``count`` tokens of ``dtype`` (uint16 or uint32)."""
    kind = kind_for(dtype)
    if kind is None:
        raise ValueError(f"llm.c shards store uint16 or uint32 tokens, not {dtype}")
    values = np.zeros(HEADER_INTS, dtype="<i4")
    values[:3] = (kind[0], kind[1], count)
    return values.tobytes()
