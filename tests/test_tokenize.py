"""tokstream tokenize: text in, token shards out, exactly the tokenizer's ids plus eos per document.

The tokenizer is a tiny byte-level BPE trained here from the test's own text (no network); the
expected output is computed with the same ``tokenizers`` object, one document at a time.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import byte_level_bpe
from tokstream import cli, open_tokens
from tokstream.formats import tokenized
from tokstream.tokenize import tokenize_files
from tokstream.tokenize.encoders import Encoder

tokenizers = pytest.importorskip("tokenizers")

TEXTS = [f"document {i}: the quick brown fox {'jumps ' * (i % 5)}over {i * 7}" for i in range(240)]
TEXTS[3] = "ünïcödé and emoji 🦊 survive"
EOS = "<|endoftext|>"


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    return byte_level_bpe(TEXTS, path, vocab_size=400)


@pytest.fixture(scope="module")
def expected(tokenizer_file) -> list[list[int]]:
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    eos = tokenizer.token_to_id(EOS)
    return [tokenizer.encode(text).ids + [eos] for text in TEXTS]


@pytest.fixture
def text_inputs(tmp_path) -> list[str]:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part_0.txt").write_text("\n".join(TEXTS[:100]) + "\n\n", encoding="utf-8")
    (tmp_path / "in" / "part_1.txt").write_text("\n".join(TEXTS[100:]), encoding="utf-8")
    return [str(tmp_path / "in" / "part_*.txt")]


def documents_of(corpus) -> list[list[int]]:
    tokens = np.concatenate([np.asarray(s, dtype=np.int64) for s in corpus.shards])
    bounds = corpus.document_boundaries
    return [tokens[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def shard_bytes(directory: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != "tokstream.json"
    }


@pytest.mark.parametrize("format", ["npy", "bin", "llmc", "megatron"])
def test_each_document_is_its_ids_plus_eos_and_open_tokens_gives_them_back(
    tmp_path, tokenizer_file, expected, text_inputs, format
):
    result = tokenize_files(
        text_inputs, str(tokenizer_file), tmp_path / "out", format=format, shard_bytes=1500
    )
    corpus = open_tokens(tmp_path / "out")
    assert documents_of(corpus) == expected
    assert result.documents == len(TEXTS) and result.tokens == sum(map(len, expected))
    assert result.shards == len(corpus.shards) > 1
    # A shard per range of about 1,500 input bytes, whole lines each.
    text_bytes = sum(Path(path).stat().st_size for path in glob.glob(text_inputs[0]))
    assert text_bytes // 1500 <= len(corpus.shards) <= text_bytes // 1500 + 2
    assert corpus.dtype == (np.uint16 if format != "megatron" else np.uint16)


@pytest.mark.parametrize("format", ["npy", "megatron"])
def test_the_output_is_identical_whatever_the_number_of_workers(
    tmp_path, tokenizer_file, expected, text_inputs, format
):
    outputs = []
    for workers in (1, 2, 3):
        out = tmp_path / f"out_{workers}"
        tokenize_files(
            text_inputs, str(tokenizer_file), out, format=format, shard_bytes=1000, workers=workers
        )
        assert documents_of(open_tokens(out)) == expected
        outputs.append(shard_bytes(out))
    assert outputs[0] == outputs[1] == outputs[2]


# A fresh interpreter: tokenize in-process, then the threads it runs and its parallelism setting.
ONE_WORKER = """
import os, sys
from tokstream.tokenize import tokenize_files
os.environ.pop("TOKENIZERS_PARALLELISM", None)
threads = len(os.listdir("/proc/self/task"))  # imports start some (NumPy's BLAS)
tokenize_files(sys.argv[3:], sys.argv[1], sys.argv[2], shard_bytes=1000, workers=1)
print(len(os.listdir("/proc/self/task")) - threads, os.environ.get("TOKENIZERS_PARALLELISM"))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_one_worker_encodes_on_one_thread_and_leaves_the_callers_setting(
    tmp_path, tokenizer_file, text_inputs
):
    """``workers=1`` means one core: tokenizers' own thread pool (every core, unless the
    caller set TOKENIZERS_PARALLELISM) is never started, and the caller's setting is kept."""
    argv = [str(tokenizer_file), str(tmp_path / "out"), *text_inputs]
    done = subprocess.run(
        [sys.executable, "-c", ONE_WORKER, *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["0", "None"]


def test_an_interrupted_run_is_finished_by_running_it_again(
    tmp_path, tokenizer_file, expected, text_inputs
):
    whole = tmp_path / "whole"
    tokenize_files(text_inputs, str(tokenizer_file), whole, shard_bytes=800)
    out = tmp_path / "out"

    def stop_after_two_shards(message: str, milestone: bool) -> None:
        if "2 shards written" in message:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tokenize_files(
            text_inputs, str(tokenizer_file), out, shard_bytes=800, progress=stop_after_two_shards
        )
    assert not tokenized.load(out)["complete"]
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(ValueError, match="run the same `tokstream tokenize` command again"):
        open_tokens(out)
    result = tokenize_files(text_inputs, str(tokenizer_file), out, shard_bytes=800)
    assert result.resumed_documents > 0
    assert documents_of(open_tokens(out)) == expected
    assert shard_bytes(out) == shard_bytes(whole)
    again = tokenize_files(text_inputs, str(tokenizer_file), out, shard_bytes=800)
    assert again.documents == len(TEXTS) and shard_bytes(out) == shard_bytes(whole)


def test_a_directory_of_another_job_or_other_files_is_refused(
    tmp_path, tokenizer_file, text_inputs
):
    tokenize_files(text_inputs, str(tokenizer_file), tmp_path / "out", shard_bytes=800)
    with pytest.raises(ValueError, match="differs in shard_bytes"):
        tokenize_files(text_inputs, str(tokenizer_file), tmp_path / "out", shard_bytes=900)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        tokenize_files(text_inputs, str(tokenizer_file), tmp_path / "busy")


def test_json_lines_gzip_parquet_and_whole_file_documents(tmp_path, tokenizer_file, expected):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    lines = "".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(TEXTS[:80]))
    (tmp_path / "a.jsonl").write_text(lines)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps({"body": t}) + "\n" for t in TEXTS[80:160]))
    pq.write_table(pa.table({"body": TEXTS[160:]}), tmp_path / "c.parquet", row_group_size=30)
    inputs = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl.gz"), str(tmp_path / "c.parquet")]
    tokenize_files(inputs, str(tokenizer_file), tmp_path / "out", text_field="body")
    assert documents_of(open_tokens(tmp_path / "out")) == expected

    (tmp_path / "docs").mkdir()
    for i, text in enumerate(TEXTS[:3]):
        (tmp_path / "docs" / f"{i}.txt").write_text(text + "\nsecond line")
    tokenize_files(
        [str(tmp_path / "docs" / "*.txt")],
        str(tokenizer_file),
        tmp_path / "whole",
        document_per_file=True,
    )
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    eos = tokenizer.token_to_id(EOS)
    assert documents_of(open_tokens(tmp_path / "whole")) == [
        tokenizer.encode(t + "\nsecond line").ids + [eos] for t in TEXTS[:3]
    ]


def test_eos_by_text_by_id_or_none(tmp_path, tokenizer_file, text_inputs, expected):
    eos = expected[0][-1]
    by_id = tokenize_files(text_inputs, str(tokenizer_file), tmp_path / "id", eos=eos)
    assert by_id.tokens == sum(map(len, expected))
    tokenize_files(text_inputs, str(tokenizer_file), tmp_path / "none", eos=None)
    assert documents_of(open_tokens(tmp_path / "none")) == [d[:-1] for d in expected]
    with pytest.raises(ValueError, match="no token '</s>'"):
        tokenize_files(text_inputs, str(tokenizer_file), tmp_path / "x", eos="</s>")
    with pytest.raises(ValueError, match="eos id 1000000 is no token"):
        tokenize_files(text_inputs, str(tokenizer_file), tmp_path / "y", eos=10**6)


BAD_INPUTS = {
    "missing field": ("d.jsonl", '{"text": "a"}\n{"body": "b"}\n', r"d.jsonl, line 2: no 'text'"),
    "not json": ("d.jsonl", '{"text": "a"}\nnot json\n', r"d.jsonl, line 2: not JSON"),
    "field not text": ("d.jsonl", '{"text": 5}\n', r"line 1: field 'text' is int"),
    "not utf-8": ("d.txt", b"fine\n\xff\xfe broken\n", r"d.txt, line 2: not UTF-8"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_a_bad_input_is_a_value_error_naming_the_file_and_line(tmp_path, tokenizer_file, case):
    name, content, message = BAD_INPUTS[case]
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=message):
        tokenize_files([str(path)], str(tokenizer_file), tmp_path / "out")


def test_tokenizers_that_are_missing_or_not_local_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError):
        Encoder(str(tmp_path / "missing.json"))
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ValueError, match="not a tokenizers JSON file"):
        Encoder(str(tmp_path / "junk.json"))
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="tiktoken"):
            Encoder("cl100k_base")
        return
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    with pytest.raises(ValueError, match="not in tiktoken's local cache.*never downloads"):
        Encoder("cl100k_base")
    with pytest.raises(ValueError, match="no such file or tiktoken encoding"):
        Encoder("no_such_encoding")


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_command_line_tokenizes_and_inspect_reports_documents(
    tmp_path, tokenizer_file, text_inputs, expected
):
    out = tmp_path / "out"
    code, stdout, stderr = run(
        "tokenize",
        *text_inputs,
        "--tokenizer",
        str(tokenizer_file),
        "--output",
        str(out),
        "--format",
        "megatron",
        "--shard-bytes",
        "2000",
        "--workers",
        "2",
    )
    assert code == 0, stderr
    assert f"{len(TEXTS):,} documents" in stdout and "megatron shards" in stdout
    assert "tokenize:" in stderr and "shards written" in stderr
    assert documents_of(open_tokens(out)) == expected
    code, stdout, stderr = run("inspect", str(out), "--json", "--vocab-size", "100")
    assert code == 0, stderr
    (summary,) = json.loads(stdout)
    lengths = [len(d) for d in expected]
    assert summary["documents"] == len(TEXTS) and summary["format"] == "megatron"
    assert summary["min_document"] == min(lengths) and summary["max_document"] == max(lengths)
    assert "beyond --vocab-size 100" in stderr
    code, stdout, stderr = run(
        "tokenize",
        *text_inputs,
        "--tokenizer",
        str(tokenizer_file),
        "--output",
        str(out),
        "--eos",
        "</s>",
    )
    assert code == 1 and "error:" in stderr and "'</s>'" in stderr


@pytest.fixture
def gapped_tokenizer(tmp_path) -> Path:
    """A valid tokenizer of four tokens whose largest id, 70000, needs more than 16 bits."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocabulary = {"[UNK]": 0, "a": 1, "b": 2, "far": 70000}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "gapped.json"
    tokenizer.save(str(path))
    return path


def test_the_dtype_fits_the_largest_id_not_the_number_of_tokens(tmp_path, gapped_tokenizer):
    (tmp_path / "in.txt").write_text("a far b\nb a\n")
    inputs = [str(tmp_path / "in.txt")]
    result = tokenize_files(inputs, str(gapped_tokenizer), tmp_path / "out", eos=2)
    assert result.dtype == "uint32"
    assert documents_of(open_tokens(tmp_path / "out")) == [[1, 70000, 2, 2], [2, 1, 2]]
    tokenize_files(inputs, str(gapped_tokenizer), tmp_path / "i64", eos=70000, dtype="int64")
    assert open_tokens(tmp_path / "i64").dtype == np.int64
    with pytest.raises(ValueError, match=r"\[0, 70000\].*does not fit dtype=uint16"):
        tokenize_files(inputs, str(gapped_tokenizer), tmp_path / "u16", eos=2, dtype=np.uint16)
    assert not (tmp_path / "u16").exists()
    with pytest.raises(ValueError, match="eos id 3 is no token"):
        tokenize_files(inputs, str(gapped_tokenizer), tmp_path / "x", eos=3)


def test_the_command_line_takes_a_dtype_and_a_digit_eos_only_in_ascii(tmp_path, gapped_tokenizer):
    (tmp_path / "in.txt").write_text("a far b\n")
    base = ["tokenize", str(tmp_path / "in.txt"), "--tokenizer", str(gapped_tokenizer)]
    code, stdout, stderr = run(
        *base, "--output", str(tmp_path / "o"), "--eos", "2", "--dtype", "int64"
    )
    assert code == 0, stderr
    assert open_tokens(tmp_path / "o").dtype == np.int64
    code, stdout, stderr = run(*base, "--output", str(tmp_path / "p"), "--eos", "²")
    assert code == 1 and "no token '²'" in stderr


def test_a_special_tokens_text_inside_a_document_is_text_not_the_token(
    tmp_path, tokenizer_file, expected
):
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    eos = tokenizer.token_to_id(EOS)
    texts = [f"before {EOS} after", EOS, f"{EOS}{EOS} twice"]
    (tmp_path / "in.txt").write_text("\n".join(texts))
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    for name in ("in.txt", "in.jsonl"):
        out = tmp_path / f"out_{name}"
        tokenize_files([str(tmp_path / name)], str(tokenizer_file), out, workers=1)
        documents = documents_of(open_tokens(out))
        assert len(documents) == len(texts)
        for document, text in zip(documents, texts, strict=True):
            assert document[-1] == eos and eos not in document[:-1]
            assert tokenizer.decode(document[:-1]) == text


def test_an_empty_document_is_skipped_in_every_kind_of_input(tmp_path, tokenizer_file, expected):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = TEXTS[:4]
    with_empty = [texts[0], "", texts[1], "", "", texts[2], texts[3], ""]
    (tmp_path / "a.txt").write_text("\n".join(with_empty) + "\n")
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in with_empty))
    pq.write_table(pa.table({"text": with_empty}), tmp_path / "c.parquet")
    (tmp_path / "docs").mkdir()
    for i, text in enumerate(with_empty):
        (tmp_path / "docs" / f"{i}.txt").write_text(text)
    runs = {
        "text lines": ([tmp_path / "a.txt"], False),
        "json lines": ([tmp_path / "b.jsonl"], False),
        "parquet rows": ([tmp_path / "c.parquet"], False),
        "whole files": ([tmp_path / "docs" / "*.txt"], True),
    }
    for name, (inputs, per_file) in runs.items():
        out = tmp_path / name.replace(" ", "_")
        tokenize_files(
            [str(p) for p in inputs], str(tokenizer_file), out, document_per_file=per_file
        )
        assert documents_of(open_tokens(out)) == expected[:4], name


#: A generous bound on tokenizing a 200 kB line at --shard-bytes 100 (seconds; encoding it is
#: most of it), where one empty shard per --shard-bytes of it (2,000) took superlinear time.
LONG_LINE_SECONDS = 60.0


@pytest.mark.parametrize("kind", ["text", "jsonl", "parquet"])
def test_a_line_longer_than_shard_bytes_is_one_shard_of_its_own(tmp_path, tokenizer_file, kind):
    import time

    long = "the quick brown fox jumps over " * 6_600  # about 200 kB on one line
    texts = [TEXTS[0], TEXTS[1], long, TEXTS[2], long[:150], TEXTS[3]]
    path = tmp_path / f"in.{kind if kind != 'text' else 'txt'}"
    if kind == "text":
        path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    elif kind == "jsonl":
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    else:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": texts}), path, row_group_size=2)
    began = time.monotonic()
    result = tokenize_files([str(path)], str(tokenizer_file), tmp_path / "out", shard_bytes=100)
    assert time.monotonic() - began < LONG_LINE_SECONDS
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    eos = tokenizer.token_to_id(EOS)
    assert documents_of(open_tokens(tmp_path / "out")) == [
        tokenizer.encode(text).ids + [eos] for text in texts
    ]
    # No shard without a document: each long line a shard of its own, the short ones beside.
    counts = [
        np.load(tmp_path / "out" / tokenized.documents_file(i)).shape[0] - 1
        for i in range(result.shards)
    ]
    assert min(counts) >= 1 and sum(counts) == len(texts), counts
    assert result.shards <= len(texts)


@pytest.mark.parametrize("url", ["s3://bucket/data/*.jsonl", "gs://bucket/a.txt"])
def test_an_input_in_object_storage_is_a_value_error_naming_it(tmp_path, tokenizer_file, url):
    with pytest.raises(ValueError, match="tokenize reads local files") as error:
        tokenize_files([url], str(tokenizer_file), tmp_path / "out")
    assert url in str(error.value)
