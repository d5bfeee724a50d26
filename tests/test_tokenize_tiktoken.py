"""tokstream tokenize with a tiktoken encoding, for real and offline.

No encoding is cached on a test machine and nothing may be downloaded, so the tests make one
from a byte-level BPE trained here (:mod:`tests.tiktoken_offline`): tiktoken reads it from its
cache exactly as it reads a cached ``cl100k_base``; with the cache emptied, the same name is
refused, never fetched.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import byte_level_bpe
from tests.test_tokenize import documents_of
from tests.tiktoken_offline import NAME, URL, look_for_plugins_again, write_encoding
from tokstream import cli, open_tokens
from tokstream.tokenize import tokenize_files
from tokstream.tokenize.encoders import Encoder

tiktoken = pytest.importorskip("tiktoken")
pytest.importorskip("tokenizers")

TEXTS = [f"tiktoken {i}: the quick brown fox {'jumps ' * (i % 5)}over {i * 7}" for i in range(300)]
TEXTS[5] = "ünïcödé, emoji 🦊 and a literal <|endoftext|> are text"


@pytest.fixture
def encoding(tmp_path, monkeypatch) -> Iterator[str]:
    """The name of a tiktoken encoding found in tiktoken's (test's own) cache."""
    tokenizer_file = byte_level_bpe(TEXTS, tmp_path / "tokenizer.json", vocab_size=400)
    cache, plugins = write_encoding(tokenizer_file, tmp_path)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    # sys.path reaches spawned workers too; tiktoken looks for plugins again.
    monkeypatch.syspath_prepend(str(plugins))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    monkeypatch.delitem(sys.modules, f"tiktoken_ext.{NAME}", raising=False)
    look_for_plugins_again()
    yield NAME
    look_for_plugins_again()  # without this test's plugin


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
