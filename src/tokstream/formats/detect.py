"""Which format a token file is, told by its first (and, for archives, last) bytes.

Names lie (llm.c shards, Megatron data and nanoGPT's raw tokens are all called ``*.bin``), so
the content decides. Files of other well-known kinds (archives, compressed files, Parquet, JSON)
are refused with what they look like instead of being read as raw tokens; raw tokens are the
fallback only when nothing is recognised.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath

from tokstream.formats import arrow, llmc, megatron, npy

#: Bytes read from the start of a file to recognise it.
HEAD_BYTES = 256
#: A zip archive ends with its end-of-central-directory record, at most this far from the end.
_ZIP_TAIL = 22 + 65535

_JSON_SECOND = frozenset(b'"{}[]-0123456789tfn')
_CONTROL = frozenset(range(32)) - {9, 10, 13}


def sniff(path: Path) -> str:
    """The format of the regular file at ``path``: npy, llmc, megatron, arrow or bin.

    Raises
    ------
    ValueError
        The file looks like an archive, a compressed file, Parquet, Feather version 1 or JSON;
        it carries the magic of an llm.c file that holds no tokens; or it is named ``*.npy``
        without NumPy's magic. The message says what the file looks like.
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
        f.seek(max(size - tail_bytes(head), 0))
        tail = f.read()
    return classify(
        head,
        tail,
        size,
        str(path),
        lambda: megatron.is_index(megatron.paths(path)[0]),
    )


def tail_bytes(head: bytes) -> int:
    """How many of a file's last bytes :func:`classify` needs, given its first bytes."""
    return _ZIP_TAIL if head[:2] == b"PK" else 4


def classify(
    head: bytes, tail: bytes, size: int, path: str, megatron_index_beside: Callable[[], bool]
) -> str:
    """:func:`sniff` from a file's first :data:`HEAD_BYTES` bytes, its last
    :func:`tail_bytes` bytes and its size: for files read from anywhere (an object store too).
    ``path`` names it in messages; ``megatron_index_beside()`` says whether ``PREFIX.idx``
    exists beside a ``PREFIX.bin``."""
    if head.startswith(npy.MAGIC):
        return "npy"
    if head.startswith(megatron.MAGIC):
        return "megatron"
    if head.startswith(arrow.FILE_MAGIC):
        return "arrow"
    if head.startswith(arrow.STREAM_MAGIC) and len(head) >= 8:
        metadata = int.from_bytes(head[4:8], "little", signed=True)
        if 0 < metadata <= size - 8:
            return "arrow"
    magic = int.from_bytes(head[:4], "little") if len(head) >= 4 else None
    if magic in llmc.MAGICS:
        return "llmc"
    if magic in llmc.OTHER_MAGICS:
        raise ValueError(
            f"token file {path}: magic {magic} marks {llmc.OTHER_MAGICS[magic]}; tokstream reads "
            f"llm.c token shards ({llmc.describe_kinds()})"
        )
    looks_like = _other_kind(head, tail)
    if looks_like is not None:
        what, hint = looks_like
        raise ValueError(
            f"token file {path} looks like {what}, not token ids{hint}; if it really holds raw "
            "tokens, pass format='bin'"
        )
    suffix = PurePosixPath(path).suffix.lower()
    if suffix == ".npy":
        raise ValueError(
            f"token file {path}: bad magic {head[:6]!r}: a .npy file must start with {npy.MAGIC!r}"
        )
    if suffix == ".bin" and megatron_index_beside():
        return "megatron"
    return "bin"


def _other_kind(head: bytes, tail: bytes) -> tuple[str, str] | None:
    """``(what, hint)`` when the first and last bytes identify a known kind of non-token file."""
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")) and b"PK\x05\x06" in tail:
        return "a zip archive (such as NumPy's .npz)", (
            ": load it with np.load and pass the array of tokens to open_tokens' neighbours "
            "(stream_token_source, Corpus) or write it with write_tokens"
        )
    if head.startswith(b"\x1f\x8b\x08"):
        return "a gzip-compressed file", ": decompress it first"
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        return "a zstd-compressed file", ": decompress it first"
    if head.startswith(b"PAR1") and tail.endswith(b"PAR1"):
        return "a Parquet file", (
            ": read it with pyarrow.parquet.read_table and pass the table to open_tokens, or "
            "tokenize its text with `tokstream tokenize`"
        )
    if head.startswith(b"FEA1"):
        return "a Feather version 1 file", ": rewrite it as Feather version 2 (Arrow IPC)"
    if _is_json(head):
        return "JSON or JSON Lines text", (
            ": tokenize text with `tokstream tokenize`; a save_to_disk directory is opened by "
            "its directory name"
        )
    return None


def _is_json(head: bytes) -> bool:
    if any(byte in _CONTROL for byte in head):
        return False
    text = head.lstrip(b" \t\r\n")
    if len(text) < 2 or text[:1] not in (b"{", b"["):
        return False
    if text[1:].lstrip(b" \t\r\n")[:1] not in [bytes([c]) for c in _JSON_SECOND]:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut by the end of the head is still text.
        return exc.start >= len(head) - 3 and len(head) == HEAD_BYTES
    return True
