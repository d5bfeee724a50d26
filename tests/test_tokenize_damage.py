"""Damaged inputs and damaged outputs of tokstream tokenize: one ValueError naming the file.

A truncated or corrupt ``.gz`` input, and a tokenize directory whose manifests, shards or
document files were cut short, overwritten or edited, must each be a ValueError (or an OSError
for a missing file) whose message names the file, from the library and from ``tokstream
inspect``/``tokenize`` as one line with exit code 1, never a traceback. ``open_tokens(DIR)``
reads ``DIR/manifest.json`` and each shard when it is first read; ``DIR/tokstream.json`` (the
job's record) when the directory has no ``manifest.json``.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from pathlib import Path

import pytest

from tests.conftest import byte_level_bpe
from tokstream import cli, open_tokens
from tokstream.formats import tokenized
from tokstream.manifest import verify_manifest
from tokstream.tokenize import tokenize_files

pytest.importorskip("tokenizers")

TEXTS = [f"line {i} of some text to tokenize, {'more ' * (i % 4)}words" for i in range(60)]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    return byte_level_bpe(TEXTS, path, vocab_size=300)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def gzipped() -> bytes:
    return gzip.compress(("\n".join(TEXTS) + "\n").encode())


def flip_deflate_byte(data: bytes) -> bytes:
    broken = bytearray(data)
    broken[len(data) // 2] ^= 0xFF
    return bytes(broken)


GZ_DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "corrupt deflate data": flip_deflate_byte,
    "bad magic": lambda data: b"\x1f\x8c" + data[2:],
    "bad crc": lambda data: data[:-8] + bytes(4) + data[-4:],
}


@pytest.mark.parametrize("damage", list(GZ_DAMAGE))
def test_a_damaged_gzip_input_is_one_error_naming_it(tmp_path, tokenizer_file, damage):
    path = tmp_path / "in.txt.gz"
    path.write_bytes(GZ_DAMAGE[damage](gzipped()))
    with pytest.raises(ValueError, match=r"input .*in\.txt\.gz: truncated or corrupt gzip"):
        tokenize_files([str(path)], str(tokenizer_file), tmp_path / "out")
    code, _, stderr = run(
        "tokenize",
        str(path),
        "--tokenizer",
        str(tokenizer_file),
        "--output",
        str(tmp_path / "cli"),
        "--quiet",
    )
    assert code == 1 and stderr.count("\n") == 1 and "in.txt.gz" in stderr, stderr


def test_the_gzip_damage_cases_are_really_damaged():
    for damage in GZ_DAMAGE.values():
        with pytest.raises((EOFError, zlib.error, gzip.BadGzipFile)):
            gzip.decompress(damage(gzipped()))


def edit_manifest(directory: Path, edit) -> None:
    manifest = json.loads((directory / tokenized.MANIFEST).read_text())
    edit(manifest)
    (directory / tokenized.MANIFEST).write_text(json.dumps(manifest))


def set_key(key, value):
    return lambda manifest: manifest.__setitem__(key, value)


def set_shard(key, value):
    return lambda manifest: manifest["shards"][0].__setitem__(key, value)


MANIFEST_DAMAGE = {
    "dtype V0": set_key("dtype", "V0"),
    "dtype float32": set_key("dtype", "float32"),
    "dtype structured": set_key("dtype", [["a", "<i4"]]),
    "dtype garbage": set_key("dtype", "no such dtype"),
    "dtype missing": lambda manifest: manifest.pop("dtype"),
    "dtype other width": set_key("dtype", "uint32"),
    "shard entry a list": lambda manifest: manifest["shards"].__setitem__(0, [1, 2]),
    "tokens a string": set_shard("tokens", "12"),
    "documents negative": set_shard("documents", -1),
    "more shards than files": lambda manifest: manifest["shards"].append(manifest["shards"][0]),
    "shards a dict": set_key("shards", {}),
    "complete a string": set_key("complete", "yes"),
    "not an object": lambda manifest: manifest.clear(),
}

FILE_DAMAGE = {
    "empty": lambda data: b"",
    "truncated": lambda data: data[: len(data) // 2],
    "one byte short": lambda data: data[:-1],
    "one byte more": lambda data: data + b"\0",
    "zeroed": lambda data: bytes(len(data)),
    "pickled object array": lambda data: _pickled(),
    "text": lambda data: b"not a token file at all\n",
}


def _pickled() -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, np.array([0, "x"], dtype=object), allow_pickle=True)
    return buffer.getvalue()


def tokenized_directory(tmp_path: Path, tokenizer_file: Path, format: str) -> Path:
    (tmp_path / "in.txt").write_text("\n".join(TEXTS))
    out = tmp_path / "out"
    tokenize_files(
        [str(tmp_path / "in.txt")], str(tokenizer_file), out, format=format, shard_bytes=400
    )
    return out


def assert_clean_refusal(directory: Path, named: list[Path]) -> None:
    """open_tokens either reads the directory (every shard and the documents: through a
    manifest they are read when first needed) or refuses it naming a file; inspect likewise."""
    try:
        corpus = open_tokens(directory)
        assert corpus.has_documents and corpus.document_boundaries.shape[0] > 1
        for shard in corpus.shards:
            assert shard.shape[0] >= 0
    except (ValueError, OSError) as exc:
        assert any(str(path) in str(exc) for path in named), exc
    code, _, stderr = run("inspect", str(directory))
    assert "Traceback" not in stderr
    assert code == 0 or (code == 1 and stderr.count("\n") == 1), stderr
    assert code == 0 or any(str(path) in stderr for path in named), stderr


@pytest.mark.parametrize("format", ["npy", "bin", "llmc", "megatron"])
@pytest.mark.parametrize("damage", list(MANIFEST_DAMAGE))
def test_a_damaged_manifest_is_refused_naming_it(tmp_path, tokenizer_file, format, damage):
    out = tokenized_directory(tmp_path, tokenizer_file, format)
    # Without its table of contents the directory is opened through the job's record.
    (out / "manifest.json").unlink()
    edit_manifest(out, MANIFEST_DAMAGE[damage])
    with pytest.raises((ValueError, OSError)):
        open_tokens(out)
    assert_clean_refusal(out, [out])


@pytest.mark.parametrize("format", ["npy", "bin", "llmc", "megatron"])
@pytest.mark.parametrize("damage", list(FILE_DAMAGE))
def test_a_damaged_shard_or_documents_file_is_refused_naming_it(
    tmp_path, tokenizer_file, format, damage
):
    out = tokenized_directory(tmp_path, tokenizer_file, format)
    for path in sorted(p for p in out.iterdir() if p.name != tokenized.MANIFEST):
        original = path.read_bytes()
        damaged = FILE_DAMAGE[damage](original)
        path.write_bytes(damaged)
        assert_clean_refusal(out, [out, path])
        if path.name.startswith("shard_") and damaged != original:
            # Every damage is found by verifying the manifest, the damaged file named alone.
            problems = verify_manifest(out)
            assert len(problems) == 1 and str(path.with_suffix("")) in problems[0], problems
        path.write_bytes(original)
