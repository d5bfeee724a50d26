"""``tokstream tokenize`` directories open through their manifest: ``DIR/manifest.json`` is
written when the job completes, and ``open_tokens(DIR)`` reads only it, mapping each shard when
first read, with the same shards, documents, batches and states as the job's record gives."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

import tokstream
from tests.conftest import byte_level_bpe
from tokstream import files
from tokstream.manifest import MANIFEST_NAME, write_manifest

from .conftest import assert_same_batches
from .test_manifest import STREAMS, CallCounter

pytest.importorskip("tokenizers")
from tokstream.tokenize import tokenize_files  # noqa: E402 (needs the tokenize extra)

TEXTS = [f"doc {i}: a short line of text {'and more ' * (i % 6)}end {i}" for i in range(300)]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    return byte_level_bpe(TEXTS, path, vocab_size=300)


def tokenize(tmp_path: Path, tokenizer_file: Path, shard_bytes: int, **options) -> Path:
    if not (tmp_path / "in.txt").exists():  # a rerun sees the same input
        (tmp_path / "in.txt").write_text("\n".join(TEXTS))
    out = tmp_path / options.pop("name", "out")
    tokenize_files(
        [str(tmp_path / "in.txt")], str(tokenizer_file), out, shard_bytes=shard_bytes, **options
    )
    return out


def opened_by_its_record(out: Path, aside: Path) -> tokstream.Corpus:
    """The directory opened as before it had a manifest: every shard through tokstream.json."""
    shutil.copytree(out, aside)
    (aside / MANIFEST_NAME).unlink()
    (aside / "manifest.documents.npy").unlink()
    return files.open_tokens(aside)


@pytest.mark.parametrize("format", ["npy", "bin", "llmc", "megatron"])
def test_a_tokenize_directory_opens_through_its_manifest_as_its_record_gives_it(
    tmp_path, tokenizer_file, format
):
    out = tokenize(tmp_path, tokenizer_file, 1200, format=format)
    listed = files.open_tokens(out)
    assert listed.source is not None and listed.source.open_maps == 0
    eager = opened_by_its_record(out, tmp_path / "record")
    assert eager.source is None and len(listed.shards) == len(eager.shards) > 3
    np.testing.assert_array_equal(listed.lengths, eager.lengths)
    np.testing.assert_array_equal(listed.document_boundaries, eager.document_boundaries)
    for options in STREAMS:
        ours = tokstream.TokenStream(listed, 8, 4, **options)
        theirs = tokstream.TokenStream(eager, 8, 4, **options)
        assert ours.state_dict() == theirs.state_dict()
        for mine, want in zip(ours, theirs, strict=True):
            mine = mine.values() if isinstance(want, dict) else mine
            want = want.values() if isinstance(want, dict) else want
            for array, expected in zip(mine, want, strict=True):
                np.testing.assert_array_equal(array, expected)


def test_opening_a_tokenize_directory_makes_the_same_few_system_calls_whatever_its_shards(
    tmp_path, tokenizer_file, monkeypatch
):
    counts = []
    for shard_bytes in (4000, 60):
        out = tokenize(tmp_path, tokenizer_file, shard_bytes, name=f"out{shard_bytes}")
        counter = CallCounter(monkeypatch)
        corpus = files.open_tokens(out)
        monkeypatch.undo()
        counts.append((len(corpus.shards), counter.calls))
    (few, small), (many, large) = counts
    assert few < 10 and many >= 200
    # The directory's manifest.json (a stat, its read) and nothing per shard.
    assert len(large) == len(small) <= 4, large


def test_a_shard_that_disagrees_with_the_manifest_is_refused_naming_it_when_first_read(
    tmp_path, tokenizer_file
):
    out = tokenize(tmp_path, tokenizer_file, 1200)
    shard = out / "shard_000002.npy"
    shard.write_bytes(shard.read_bytes()[:-2])
    corpus = files.open_tokens(out)  # reads no shard
    np.asarray(corpus.shards[1])
    with pytest.raises(ValueError, match=f"token file {shard}: .* bytes, the manifest"):
        corpus.shards[2]
    with pytest.raises(ValueError, match="shard_000002.npy"):
        for _ in tokstream.TokenStream(corpus, 8, 64):
            pass


def test_a_rerun_of_a_complete_directory_without_its_manifest_writes_it(tmp_path, tokenizer_file):
    out = tokenize(tmp_path, tokenizer_file, 1200)
    written = {p.name: p.read_bytes() for p in out.iterdir() if p.name.startswith("manifest")}
    assert sorted(written) == ["manifest.documents.npy", "manifest.json"]
    for name in written:
        (out / name).unlink()
    assert files.open_tokens(out).source is None  # the record, every shard read
    tokenize(tmp_path, tokenizer_file, 1200)
    assert {name: (out / name).read_bytes() for name in written} == written


def test_a_replaced_tokenization_replaces_its_manifest(tmp_path, tokenizer_file):
    out = tokenize(tmp_path, tokenizer_file, 1200)
    tokenize(tmp_path, tokenizer_file, 100_000, format="bin", overwrite=True)
    corpus = files.open_tokens(out)
    assert corpus.source is not None and len(corpus.shards) == 1
    assert {p.suffix for p in out.glob("shard_*") if "documents" not in p.name} == {".bin"}
    eager = opened_by_its_record(out, tmp_path / "record")
    np.testing.assert_array_equal(np.concatenate(corpus.shards), np.concatenate(eager.shards))


def test_a_manifest_of_a_tokenize_directorys_shards_by_glob_reads_them_as_the_glob_does(
    tmp_path, tokenizer_file
):
    # A glob over the shard files gives them without their documents; so must its manifest.
    out = tokenize(tmp_path, tokenizer_file, 1200)
    pattern = str(out / "shard_*.npy")
    globbed = files.open_tokens(pattern)
    assert not globbed.has_documents
    listed = files.open_tokens(write_manifest(pattern, tmp_path / "toc.json"))
    for j in range(len(globbed.shards)):
        np.testing.assert_array_equal(listed.shards[j], globbed.shards[j])
    assert_same_batches(
        tokstream.TokenStream(listed, 8, 4, shuffle=True, seed=1),
        tokstream.TokenStream(globbed, 8, 4, shuffle=True, seed=1),
    )


def test_a_corpus_that_checked_documents_pickles_as_its_table_alone(tmp_path, tokenizer_file):
    out = tokenize(tmp_path, tokenizer_file, 60)
    corpus = files.open_tokens(out)
    small = len(pickle.dumps(corpus))
    np.asarray(corpus.shards[3])  # reads and checks the documents of all shards
    assert len(pickle.dumps(corpus)) == small
