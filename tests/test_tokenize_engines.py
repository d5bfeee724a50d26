"""tokstream tokenize's engines: the same bytes from every engine and number of workers.

The Ray tests start a real local Ray (skipped without ray installed), embedded by the job
itself: started for it and stopped after it.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest

from tests.conftest import byte_level_bpe
from tokstream import cli
from tokstream.formats import tokenized
from tokstream.tokenize import job, tokenize_files

pytest.importorskip("tokenizers")

TEXTS = [f"text {i}: {'lorem ipsum ' * (i % 7)}dolor {i * 13} sit amet" for i in range(2000)]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    return byte_level_bpe(TEXTS[:500], path, vocab_size=350)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    directory = tmp_path_factory.mktemp("inputs")
    (directory / "a.txt").write_text("\n".join(TEXTS[:1200]))
    (directory / "b.txt").write_text("\n".join(TEXTS[1200:]))
    return [str(directory / "a.txt"), str(directory / "b.txt")]


@pytest.fixture(scope="module")
def local_hashes(tmp_path_factory, tokenizer_file, inputs) -> dict[str, str]:
    out = tmp_path_factory.mktemp("local") / "out"
    tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=7000)
    return hashes(out)


def hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"engine": "spark"}, r"engine must be one of \('local', 'ray'\), got 'spark'"),
        ({"engine": "local", "ray_address": "127.0.0.1:6379"}, "--ray-address"),
    ],
)
def test_an_unknown_engine_is_one_error_and_writes_nothing(
    tmp_path, tokenizer_file, inputs, options, message
):
    with pytest.raises(ValueError, match=message):
        tokenize_files(inputs, str(tokenizer_file), tmp_path / "out", **options)
    assert not (tmp_path / "out").exists()
    argv = ["--engine", options["engine"]]
    if "ray_address" in options:
        argv += ["--ray-address", options["ray_address"]]
    code, _, stderr = run(
        "tokenize",
        *inputs,
        "--tokenizer",
        str(tokenizer_file),
        "--output",
        str(tmp_path / "o"),
        *argv,
    )
    assert code == 1 and stderr.count("\n") == 1 and "engine" in stderr, stderr
    assert not (tmp_path / "o").exists()


def test_the_local_engine_gives_the_same_bytes_for_any_number_of_workers(
    tmp_path, tokenizer_file, inputs, local_hashes
):
    for workers in (2, 3):
        out = tmp_path / f"out_{workers}"
        tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=7000, workers=workers)
        assert hashes(out) == local_hashes


# ---------------------------------------------------------------------------------------------
# Ray


def test_an_unreachable_ray_address_is_one_error_and_writes_nothing(
    tmp_path, tokenizer_file, inputs
):
    pytest.importorskip("ray")
    with pytest.raises(ValueError, match=r"ray address '127\.0\.0\.1:1' .*unreachable"):
        tokenize_files(
            inputs, str(tokenizer_file), tmp_path / "out", engine="ray", ray_address="127.0.0.1:1"
        )
    assert not (tmp_path / "out").exists()
    code, _, stderr = run(
        "tokenize",
        *inputs,
        "--tokenizer",
        str(tokenizer_file),
        "--output",
        str(tmp_path / "o"),
        "--engine",
        "ray",
        "--ray-address",
        "127.0.0.1:1",
    )
    assert code == 1 and stderr.count("\n") == 1 and "--ray-address" in stderr, stderr
    assert not (tmp_path / "o").exists()


def test_an_embedded_ray_gives_the_local_bytes_and_is_stopped(
    tmp_path, tokenizer_file, inputs, local_hashes
):
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    out = tmp_path / "out"
    tokenize_files(inputs, str(tokenizer_file), out, shard_tokens=7000, engine="ray", workers=2)
    assert not ray.is_initialized()
    assert hashes(out) == local_hashes


def test_ray_finishes_an_interrupted_run_with_the_local_bytes(
    tmp_path, tokenizer_file, inputs, local_hashes, monkeypatch
):
    pytest.importorskip("ray")
    monkeypatch.setattr(job, "BATCH_DOCUMENTS", 100)
    out = tmp_path / "stopped"
    batches = []

    def stop_after_eight_batches(message: str, milestone: bool) -> None:
        batches.append(message)
        if len(batches) == 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_files(
            inputs,
            str(tokenizer_file),
            out,
            shard_tokens=7000,
            engine="ray",
            workers=1,
            progress=stop_after_eight_batches,
        )
    assert len(tokenized.load(out)["shards"]) > 0
    monkeypatch.setattr(job, "BATCH_DOCUMENTS", 1000)
    result = tokenize_files(
        inputs, str(tokenizer_file), out, shard_tokens=7000, engine="ray", workers=3
    )
    assert result.resumed_documents == 800
    assert hashes(out) == local_hashes
