"""tokstream tokenize --chat: conversations in, token shards and their loss masks out.

Each conversation is one document whose tokens and mask are the chat encoder's (itself checked
against transformers in test_chat_encoder.py); the masks come back with ``open_tokens``, the
output is byte-identical whatever the workers and interruptions, and bad input is an error
naming its file and line (or, with ``skip_bad``, counted and skipped).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from tests.chat_families import FAMILIES, conversations, make_tokenizer
from tokstream import cli, open_tokens
from tokstream.formats import tokenized

pytest.importorskip("jinja2")
pytest.importorskip("tokenizers")

from tokstream.tokenize import tokenize_files  # noqa: E402
from tokstream.tokenize.chat import ChatEncoder, load_spec  # noqa: E402

RECORDS = conversations(300, seed=11)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    pytest.importorskip("trl")  # the stock templates are TRL's copies
    return make_tokenizer(FAMILIES["qwen2_5"], tmp_path_factory.mktemp("qwen2_5"))


@pytest.fixture(scope="module")
def expected(tokenizer_dir):
    encoder = ChatEncoder(load_spec(str(tokenizer_dir)))
    return [encoder.encode(record) for record in RECORDS]


@pytest.fixture
def chat_inputs(tmp_path) -> list[str]:
    (tmp_path / "in").mkdir()
    for part, records in enumerate((RECORDS[:120], RECORDS[120:])):
        lines = "".join(json.dumps(record) + "\n" for record in records)
        (tmp_path / "in" / f"part_{part}.jsonl").write_text(lines + "\n", encoding="utf-8")
    return [str(tmp_path / "in" / "part_*.jsonl")]


def documents_and_masks(directory: Path) -> tuple[list[list[int]], list[list[int]]]:
    corpus = open_tokens(directory)
    assert corpus.loss_masks is not None
    tokens = np.concatenate([np.asarray(s, dtype=np.int64) for s in corpus.shards])
    mask = np.concatenate(corpus.loss_masks)
    bounds = corpus.document_boundaries
    pairs = list(zip(bounds[:-1], bounds[1:], strict=True))
    return [tokens[a:b].tolist() for a, b in pairs], [mask[a:b].tolist() for a, b in pairs]


def written(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name.endswith(".npy")}


@pytest.mark.parametrize("format", ["npy", "megatron"])
def test_each_conversation_is_one_document_with_its_mask_beside_it(
    tmp_path, tokenizer_dir, expected, chat_inputs, format
):
    result = tokenize_files(
        chat_inputs,
        str(tokenizer_dir),
        tmp_path / "out",
        chat=True,
        shard_bytes=9000,
        format=format,
    )
    documents, masks = documents_and_masks(tmp_path / "out")
    assert documents == [e.ids.tolist() for e in expected]
    assert masks == [e.mask.astype(int).tolist() for e in expected]
    assert result.shards > 2 and result.documents == len(RECORDS)
    assert result.trained == sum(int(e.mask.sum()) for e in expected)
    assert f"trained ({result.trained / result.tokens:.1%})" in result.summary()
    for index in range(result.shards):
        assert (tmp_path / "out" / tokenized.loss_mask_file(index)).is_file()


def test_the_output_is_identical_whatever_the_workers_and_after_an_interruption(
    tmp_path, tokenizer_dir, chat_inputs
):
    outputs = []
    for workers in (1, 2):
        out = tmp_path / f"out_{workers}"
        tokenize_files(
            chat_inputs, str(tokenizer_dir), out, chat=True, shard_bytes=9000, workers=workers
        )
        outputs.append(written(out))

    def stop_after_two_shards(message: str, milestone: bool) -> None:
        if "2 shards written" in message:
            raise KeyboardInterrupt

    resumed = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        tokenize_files(
            chat_inputs,
            str(tokenizer_dir),
            resumed,
            chat=True,
            shard_bytes=9000,
            progress=stop_after_two_shards,
        )
    result = tokenize_files(chat_inputs, str(tokenizer_dir), resumed, chat=True, shard_bytes=9000)
    assert result.resumed_documents > 0
    outputs.append(written(resumed))
    assert outputs[0] == outputs[1] == outputs[2]
    assert any(name.endswith(".loss_mask.npy") for name in outputs[0])


def test_parquet_conversations(tmp_path, tokenizer_dir, expected):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"messages": [r["messages"] for r in RECORDS]})
    pq.write_table(table, tmp_path / "chats.parquet", row_group_size=70)
    tokenize_files(
        [str(tmp_path / "chats.parquet")], str(tokenizer_dir), tmp_path / "out", chat=True
    )
    documents, masks = documents_and_masks(tmp_path / "out")
    assert documents == [e.ids.tolist() for e in expected]
    assert masks == [e.mask.astype(int).tolist() for e in expected]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_command_line_reports_the_share_of_trained_tokens(tmp_path, tokenizer_dir, chat_inputs):
    code, stdout, stderr = run(
        "tokenize",
        *chat_inputs,
        "--chat",
        "--tokenizer",
        str(tokenizer_dir),
        "--output",
        str(tmp_path / "out"),
        "--quiet",
    )
    assert code == 0, stderr
    assert "trained (" in stdout and "300 documents" in stdout


def test_a_refused_template_is_one_line_and_writes_nothing(tmp_path, chat_inputs):
    pytest.importorskip("trl")
    qwen3 = make_tokenizer(FAMILIES["qwen3"], tmp_path / "qwen3")
    code, stdout, stderr = run(
        "tokenize",
        *chat_inputs,
        "--chat",
        "--tokenizer",
        str(qwen3),
        "--output",
        str(tmp_path / "out"),
    )
    assert code != 0 and stdout == ""
    assert len(stderr.strip().splitlines()) == 1
    assert "not prefix-preserving" in stderr and "--chat-template" in stderr
    assert not (tmp_path / "out").exists()


def test_chat_template_overrides_the_tokenizers(tmp_path, tokenizer_dir, chat_inputs):
    from tests.chat_families import template_text

    template = tmp_path / "training.jinja"
    template.write_text(template_text(FAMILIES["qwen2_5"].training))
    result = tokenize_files(
        chat_inputs,
        str(tokenizer_dir / "tokenizer.json"),
        tmp_path / "out",
        chat=True,
        chat_template=template,
    )
    encoder = ChatEncoder(load_spec(str(tokenizer_dir), template))
    assert encoder.has_spans
    assert result.trained == sum(int(encoder.encode(r).mask.sum()) for r in RECORDS)


BAD_LINES = {
    "no messages": ({"text": "hello"}, "no 'messages' list"),
    "unknown role": (
        {"messages": [{"role": "bot", "content": "hi"}]},
        "message 0 has unknown role 'bot'",
    ),
    "template fails": (
        {"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}]},
        "chat template .* failed",
    ),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_a_bad_conversation_names_its_file_and_line_or_is_skipped(
    tmp_path, tokenizer_dir, expected, case
):
    record, match = BAD_LINES[case]
    lines = (
        [json.dumps(r) for r in RECORDS[:5]]
        + [json.dumps(record)]
        + [json.dumps(r) for r in RECORDS[5:10]]
    )
    source = tmp_path / "chats.jsonl"
    source.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=f"input {source}, line 6: {match}"):
        tokenize_files([str(source)], str(tokenizer_dir), tmp_path / "out", chat=True)
    result = tokenize_files(
        [str(source)], str(tokenizer_dir), tmp_path / "skipped", chat=True, skip_bad=True
    )
    assert result.skipped == 1 and result.documents == 10
    assert "1 bad conversations skipped" in result.summary()
    documents, _ = documents_and_masks(tmp_path / "skipped")
    assert documents == [e.ids.tolist() for e in expected[:10]]


def test_refusals_before_anything_is_written(tmp_path, tokenizer_dir, chat_inputs):
    text = tmp_path / "plain.txt"
    text.write_text("hello\n")
    with pytest.raises(ValueError, match="--chat reads conversations from JSON Lines"):
        tokenize_files([str(text)], str(tokenizer_dir), tmp_path / "a", chat=True)
    with pytest.raises(ValueError, match="eos does not apply to chat"):
        tokenize_files(chat_inputs, str(tokenizer_dir), tmp_path / "b", chat=True, eos="<|im_end|>")
    with pytest.raises(ValueError, match="apply to chat=True"):
        tokenize_files(
            chat_inputs, str(tokenizer_dir / "tokenizer.json"), tmp_path / "c", skip_bad=True
        )
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    with pytest.raises(ValueError, match="has no chat template"):
        tokenize_files(chat_inputs, str(bare), tmp_path / "d", chat=True)
    assert not any((tmp_path / name).exists() for name in "abcd")


def damage_shape(path: Path) -> None:
    mask = np.load(path)
    np.save(path, mask[:-1])


def damage_count(path: Path) -> None:
    mask = np.load(path)
    mask[0] ^= 1
    np.save(path, mask)


def damage_value(path: Path) -> None:
    mask = np.load(path)
    mask[np.flatnonzero(mask)[0]] = 2
    np.save(path, mask)


def damage_dtype(path: Path) -> None:
    np.save(path, np.load(path).astype(np.int32))


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (damage_shape, r"\d+ values for the \d+ tokens of its shard"),
        (damage_count, r"\d+ tokens trained, the manifest tokstream.json says"),
        (damage_value, "1 values other than 0 and 1"),
        (damage_dtype, "holds int32, a loss mask is uint8"),
    ],
)
def test_a_mask_file_that_does_not_match_its_tokens_is_a_value_error_naming_it(
    tmp_path, tokenizer_dir, chat_inputs, damage, match
):
    tokenize_files(chat_inputs, str(tokenizer_dir), tmp_path / "out", chat=True, shard_bytes=9000)
    file = tmp_path / "out" / tokenized.loss_mask_file(1)
    damage(file)
    with pytest.raises(ValueError, match=f"loss mask {file}: {match}"):
        open_tokens(tmp_path / "out")


def test_packed_batches_train_exactly_each_conversations_assistant_pairs(
    tmp_path, tokenizer_dir, expected, chat_inputs
):
    """Every (token, label) pair a packed stream trains on, over one epoch, is a pair of one
    conversation whose label token is masked in: the same multiset as the documents give."""
    from collections import Counter

    from tokstream import stream_token_source

    tokenize_files(chat_inputs, str(tokenizer_dir), tmp_path / "out", chat=True, shard_bytes=9000)
    corpus = open_tokens(tmp_path / "out")
    longest = max(e.ids.shape[0] for e in expected)
    stream = stream_token_source(
        corpus,
        longest,
        4,
        windows="packed",
        pad=0,
        labels_ignore_index=-100,
        extras=("document_ids",),
        seed=1,
    )
    trained: Counter = Counter()
    for batch in stream:
        keep = batch["labels"] != -100
        assert np.array_equal(keep, batch["loss_mask"])
        inputs, labels = batch["input_ids"][keep].tolist(), batch["labels"][keep].tolist()
        trained.update(zip(inputs, labels, strict=True))
    wanted: Counter = Counter()
    for e in expected:
        ids = e.ids.tolist()
        wanted.update((ids[i], ids[i + 1]) for i in range(len(ids) - 1) if e.mask[i + 1])
    assert trained == wanted
