"""``tokstream manifest --verify`` (:func:`tokstream.manifest.verify_manifest`): every file a
manifest lists re-read and checked (size, header, documents, content fingerprint); every file
that disagrees named, and nothing else."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

import tokstream
from tokstream import files, manifest, writing
from tokstream.cli import main
from tokstream.manifest import verify_manifest, write_manifest

from .test_manifest import BAD_MANIFESTS, edit, make_inputs


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2 + 1] ^= 0x01  # a token in the middle, header and size unchanged
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-2])


def same_size_other_tokens(path: Path) -> None:
    tokens = np.load(path)
    np.save(path, tokens[::-1].copy())


def remove(path: Path) -> None:
    path.unlink()


DAMAGE = {
    "a token changed": (flip_middle_byte, "another fingerprint"),
    "truncated": (truncate, "bytes, the manifest"),
    "rewritten, same size and header": (same_size_other_tokens, "another fingerprint"),
    "removed": (remove, "No such file"),
}


@pytest.mark.parametrize(
    "kind", ["npy", "bin", "llmc1", "megatron", "arrow", "save_to_disk", "tokenize-npy"]
)
def test_a_manifest_of_unchanged_files_verifies(tmp_path, kind):
    inputs = make_inputs(tmp_path, kind)
    written = write_manifest(
        inputs, tmp_path / "toc.json", dtype=np.uint16 if kind == "bin" else None
    )
    assert verify_manifest(written) == []
    code, out, err = run_cli("manifest", "--verify", str(written))
    assert (code, out, err) == (0, f"{written}: every file agrees with the manifest\n", "")


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_verify_names_each_changed_file_and_no_other(tmp_path, damage):
    make_inputs(tmp_path, "npy")
    written = write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json")
    change, message = DAMAGE[damage]
    for name in ("s1.npy", "s3.npy"):
        change(tmp_path / name)
    problems = verify_manifest(tmp_path)  # the directory holding manifest.json
    assert len(problems) == 2, problems
    for problem, name in zip(problems, ["s1.npy", "s3.npy"], strict=True):
        assert problem.startswith(f"token file {tmp_path / name}: ") and message in problem
    code, out, err = run_cli("manifest", "--verify", str(written))
    assert code == 1 and out.splitlines() == problems
    assert err == f"tokstream manifest: error: 2 files disagree with the manifest {written}\n"


def test_a_changed_token_streams_unnoticed_and_only_verify_finds_it(tmp_path):
    # What a stream checks at first read is the size and the header, not the content.
    make_inputs(tmp_path, "npy")
    written = write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json")
    flip_middle_byte(tmp_path / "s2.npy")
    corpus = files.open_tokens(written)
    np.testing.assert_array_equal(corpus.shards[2], np.load(tmp_path / "s2.npy"))
    (problem,) = verify_manifest(written)
    assert f"{tmp_path / 's2.npy'}: its content is not what the manifest" in problem


def test_a_file_holding_several_shards_is_named_once(tmp_path):
    make_inputs(tmp_path, "arrow")  # one Arrow stream of 5 record batches
    written = write_manifest(str(tmp_path / "data.arrow"), tmp_path / "manifest.json")
    assert len(json.loads(written.read_text())["shards"]["path"]) == 5
    flip_middle_byte(tmp_path / "data.arrow")
    truncate(tmp_path / "data.arrow")
    (problem,) = verify_manifest(written)
    assert problem.startswith(f"token file {tmp_path / 'data.arrow'}: ")


def test_changed_documents_are_named_with_the_file_holding_them(tmp_path):
    make_inputs(tmp_path, "megatron")
    written = write_manifest(str(tmp_path / "part*.bin"), tmp_path / "manifest.json")
    sidecar = tmp_path / "manifest.documents.npy"
    boundaries = np.load(sidecar)
    boundaries[2] += 1
    np.save(sidecar, boundaries)
    problems = verify_manifest(written)
    assert problems and all("documents are not those the manifest" in p for p in problems)
    # A Megatron index rewritten with other documents over the same tokens.
    np.save(sidecar, boundaries - np.eye(1, boundaries.shape[0], 2, dtype=np.int64)[0])
    corpus = tokstream.Corpus.from_documents(
        [np.concatenate([d for d in files.open_tokens(tmp_path / "part1.bin").shards])]
    )
    writing.write_tokens(tmp_path / "part1", corpus, format="megatron")
    (problem,) = verify_manifest(written)
    assert problem.startswith(f"token file {tmp_path / 'part1.bin'}: ")


@pytest.mark.parametrize(("change", "message"), BAD_MANIFESTS[:4])
def test_verify_of_a_malformed_manifest_is_one_line_exit_1(tmp_path, change, message):
    make_inputs(tmp_path, "npy")
    path = edit(write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json"), change)
    with pytest.raises(ValueError, match=message if "kind" not in message else "not a"):
        verify_manifest(tmp_path)
    code, out, err = run_cli("manifest", "--verify", str(tmp_path))
    assert (code, out) == (1, "") and err.count("\n") == 1 and str(path) in err


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--verify", "nope.json"], 1, "manifest not found: 'nope.json'"),
        (["--verify", "s0.npy"], 1, "s0.npy: not a tokstream manifest"),
        (["--verify", "bad.json"], 1, "bad.json: not a tokstream manifest"),
        (["--verify", "fingerprint.json"], 1, "fingerprints of method 'md5'"),
        (["--verify", "manifest.json", "s0.npy"], 2, "--verify MANIFEST takes no FILES"),
        (["--verify", "manifest.json", "--output", "x.json"], 2, "takes no FILES and no --output"),
        ([], 2, "FILES and --output are required"),
    ],
)
def test_bad_verify_arguments_are_one_error(tmp_path, monkeypatch, argv, code, message):
    make_inputs(tmp_path, "npy")
    write_manifest(str(tmp_path / "s*.npy"), tmp_path / "manifest.json")
    edit(
        write_manifest(str(tmp_path / "s0.npy"), tmp_path / "fingerprint.json"),
        lambda b: b.update(fingerprint="md5"),
    )
    (tmp_path / "bad.json").write_text("[1, 2]")
    monkeypatch.chdir(tmp_path)
    got, out, err = run_cli("manifest", *argv)
    assert (got, out) == (code, "") and message in err and "Traceback" not in err
    # An error is one line; a usage error (2) is argparse's: the usage, then one line.
    assert err.count("\n") == 1 or (code == 2 and err.startswith("usage: ")), err
    assert err.splitlines()[-1].startswith("tokstream manifest: error: ")


def test_verify_takes_only_a_path(tmp_path):
    with pytest.raises(TypeError, match="manifest path must be a str"):
        verify_manifest(3)  # type: ignore[arg-type]
    assert manifest.FINGERPRINT == "blake2b-128-sampled-v1"
