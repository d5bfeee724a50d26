"""tokstream tokenize with a tiktoken encoding, for real and offline.

No encoding is cached on a test machine and nothing may be downloaded, so the tests make one:
the ranks of a byte-level BPE trained here are written into tiktoken's cache (a directory of
their own, ``TIKTOKEN_CACHE_DIR``) under the key of a URL nobody serves, and a tiktoken plugin
module (``tiktoken_ext.*``, tiktoken's own way of adding encodings) names the encoding and
points at that URL. tiktoken then reads the ranks from its cache exactly as it reads a cached
``cl100k_base``: a cache hit; with the cache emptied, the same name is refused, never fetched.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import byte_level_bpe
from tests.test_tokenize import documents_of
from tokstream import cli, open_tokens
from tokstream.tokenize import tokenize_files
from tokstream.tokenize.encoders import Encoder

tiktoken = pytest.importorskip("tiktoken")
pytest.importorskip("tokenizers")

TEXTS = [f"tiktoken {i}: the quick brown fox {'jumps ' * (i % 5)}over {i * 7}" for i in range(300)]
TEXTS[5] = "ünïcödé, emoji 🦊 and a literal <|endoftext|> are text"
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


@pytest.fixture
def encoding(tmp_path, monkeypatch) -> str:
    """The name of a tiktoken encoding found in tiktoken's (test's own) cache."""
    tokenizer_file = byte_level_bpe(TEXTS, tmp_path / "tokenizer.json", vocab_size=400)
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    (cache / hashlib.sha1(URL.encode()).hexdigest()).write_bytes(tiktoken_ranks(tokenizer_file))
    plugins = tmp_path / "plugins"
    (plugins / "tiktoken_ext").mkdir(parents=True)
    (plugins / "tiktoken_ext" / f"{NAME}.py").write_text(PLUGIN)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    # sys.path reaches spawned workers too; tiktoken looks for plugins again.
    monkeypatch.syspath_prepend(str(plugins))
    monkeypatch.setattr(tiktoken.registry, "ENCODING_CONSTRUCTORS", None)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    monkeypatch.delitem(sys.modules, f"tiktoken_ext.{NAME}", raising=False)
    return NAME


@pytest.fixture
def inputs(tmp_path) -> list[str]:
    (tmp_path / "a.txt").write_text("\n".join(TEXTS[:200]))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[200:]))
    return [str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")]


def shard_hashes(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.name.startswith("shard_")
    }


def test_a_cached_tiktoken_encoding_tokenizes_each_document_as_encode_ordinary(
    tmp_path, encoding, inputs
):
    """Each document is tiktoken's ``encode_ordinary`` of its text (a special token's text in
    it is text) and eos; the shards are the same for any number of workers."""
    reference = tiktoken.get_encoding(encoding)
    eos = reference.encode_single_token("<|endoftext|>")
    expected = [reference.encode_ordinary(text) + [eos] for text in TEXTS]
    assert len(set(map(len, expected))) > 5  # real merges, not one id per byte
    outputs = []
    for workers in (1, 2):
        out = tmp_path / f"out_{workers}"
        result = tokenize_files(inputs, encoding, out, shard_bytes=4000, workers=workers)
        assert result.dtype == "uint16" and result.shards > 2
        assert documents_of(open_tokens(out)) == expected
        outputs.append(shard_hashes(out))
    assert outputs[0] == outputs[1]
    assert Encoder(encoding).fingerprint == f"tiktoken:{encoding}"


def test_the_command_line_takes_a_cached_tiktoken_encoding_by_name(tmp_path, encoding, inputs):
    out, err = io.StringIO(), io.StringIO()
    argv = ["tokenize", *inputs, "--tokenizer", encoding, "--output", str(tmp_path / "o")]
    assert cli.main([*argv, "--quiet"], stdout=out, stderr=err) == 0, err.getvalue()
    assert len(documents_of(open_tokens(tmp_path / "o"))) == len(TEXTS)


def test_an_encoding_missing_from_the_cache_is_refused_not_downloaded(
    tmp_path, encoding, inputs, monkeypatch
):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    with pytest.raises(ValueError, match=f"{encoding}.*not in tiktoken's local cache") as caught:
        tokenize_files(inputs, encoding, tmp_path / "out")
    assert URL in str(caught.value) and "never downloads" in str(caught.value)
    assert not (tmp_path / "out").exists()
