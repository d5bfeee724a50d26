"""A tiktoken encoding made offline from a byte-level BPE trained here (tests and benchmarks).

No encoding is cached on a test machine and nothing may be downloaded, so one is made: the
ranks of a byte-level BPE trained here are written into a tiktoken cache directory under the
key of a URL nobody serves, and a tiktoken plugin module (``tiktoken_ext.*``, tiktoken's own way
of adding encodings) names the encoding and points at that URL. With that cache directory as
``TIKTOKEN_CACHE_DIR`` and the plugins' directory on ``sys.path``, tiktoken reads the ranks
from its cache exactly as it reads a cached ``cl100k_base``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

NAME = "tokstream_test_bpe"
#: Where the plugin says the ranks live: never fetched, only its cache key is used.
URL = "https://tokstream.invalid/tokstream_test_bpe.tiktoken"
# GPT-2's pre-tokenizer pattern, as the byte-level BPE's ByteLevel pre-tokenizer splits.
PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

PLUGIN = f"""
from tiktoken.load import load_tiktoken_bpe


def {NAME}():
    return {{
        "name": {NAME!r},
        "pat_str": {PATTERN!r},
        "mergeable_ranks": load_tiktoken_bpe({URL!r}),
        "special_tokens": {{"<|endoftext|>": 0}},
    }}


ENCODING_CONSTRUCTORS = {{{NAME!r}: {NAME}}}
"""


def gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, reversed (a byte-level BPE's
    vocabulary spells its tokens' bytes with them)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    stand_ins = printable + [256 + n for n in range(256 - len(printable))]
    return {
        chr(c): b
        for c, b in zip(
            stand_ins, printable + sorted(set(range(256)) - set(printable)), strict=True
        )
    }


def tiktoken_ranks(tokenizer_file: Path) -> bytes:
    """The byte-level BPE's tokens as a ``.tiktoken`` file: base64 of each token's bytes and
    its id (its rank: a trained BPE numbers its merges in the order it learnt them); its
    special token is the encoding's, not a mergeable one."""
    saved = json.loads(tokenizer_file.read_text())
    special = {token["content"] for token in saved["added_tokens"]}
    vocabulary = {t: i for t, i in saved["model"]["vocab"].items() if t not in special}
    decoder = gpt2_byte_decoder()
    lines = [
        base64.b64encode(bytes(decoder[c] for c in token)) + b" " + str(rank).encode()
        for token, rank in sorted(vocabulary.items(), key=lambda item: item[1])
    ]
    return b"\n".join(lines) + b"\n"


def write_encoding(tokenizer_file: Path, root: Path) -> tuple[Path, Path]:
    """The encoding :data:`NAME` made from the byte-level BPE ``tokenizer_file`` under
    ``root``: its cache directory (for ``TIKTOKEN_CACHE_DIR``) and its plugins' directory (for
    ``sys.path``, or ``PYTHONPATH`` for processes started elsewhere)."""
    cache = root / "tiktoken-cache"
    cache.mkdir(parents=True)
    (cache / hashlib.sha1(URL.encode()).hexdigest()).write_bytes(tiktoken_ranks(tokenizer_file))
    plugins = root / "plugins"
    (plugins / "tiktoken_ext").mkdir(parents=True)
    (plugins / "tiktoken_ext" / f"{NAME}.py").write_text(PLUGIN)
    return cache, plugins


def look_for_plugins_again() -> None:
    """Make tiktoken in this process find plugins added since it last looked (it caches both
    the plugin modules it found and the encodings they name)."""
    import tiktoken.registry

    tiktoken.registry._available_plugin_modules.cache_clear()
    tiktoken.registry.ENCODING_CONSTRUCTORS = None
