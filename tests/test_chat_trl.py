"""Side by side with TRL: the same trained (token, label) pairs per conversation.

TRL's own data path is the oracle: ``SFTTrainer`` with ``packing=True, packing_strategy="bfd",
assistant_only_loss=True`` over 1,000 conversations (a tiny causal LM built from a config, on
CPU), its packed ``train_dataset`` split into its sequences. A sequence's trained pairs are
``(input_ids[i], labels[i + 1])`` where the label is not -100 (a causal LM predicts position
``i + 1`` from position ``i``); tokstream's are ``(ids[i], ids[i + 1])`` where the loss mask of
token ``i + 1`` is set, from ``tokstream tokenize --chat``'s documents and masks. Every
conversation fits ``max_length`` here (TRL truncates one that does not; tokstream never cuts a
conversation at tokenize time).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.chat_families import FAMILIES, conversations, make_tokenizer, template_text
from tokstream import open_tokens

pytest.importorskip("jinja2")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
pytest.importorskip("torch")

from tokstream.tokenize import tokenize_files  # noqa: E402

RECORDS = conversations(1000, seed=21)


def tokstream_pairs(directory: Path) -> Counter:
    corpus = open_tokens(directory)
    tokens = np.concatenate([np.asarray(s, dtype=np.int64) for s in corpus.shards])
    mask = np.concatenate(corpus.loss_masks).astype(bool)
    bounds = corpus.document_boundaries
    found: Counter = Counter()
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        ids, trained = tokens[a:b], mask[a:b]
        pairs = tuple((int(ids[i]), int(ids[i + 1])) for i in range(b - a - 1) if trained[i + 1])
        found[(tuple(ids.tolist()), pairs)] += 1
    return found


def trl_pairs(tokenizer_dir: Path, tmp_path: Path) -> Counter:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    )
    args = trl.SFTConfig(
        output_dir=str(tmp_path / "trl"),
        packing=True,
        packing_strategy="bfd",
        assistant_only_loss=True,
        max_length=512,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = trl.SFTTrainer(
        model=transformers.LlamaForCausalLM(config),
        args=args,
        train_dataset=datasets.Dataset.from_list(RECORDS),
        processing_class=tokenizer,
    )
    found: Counter = Counter()
    for row in trainer.train_dataset:
        at = 0
        for length in row["seq_lengths"]:
            ids = row["input_ids"][at : at + length]
            labels = row["labels"][at : at + length]
            at += length
            pairs = tuple(
                (ids[i], labels[i + 1]) for i in range(length - 1) if labels[i + 1] != -100
            )
            found[(tuple(ids), pairs)] += 1
    return found


# TRL's SFTConfig sets an argument transformers has renamed.
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("family", ["qwen2_5", "llama3"])
def test_the_same_trained_pairs_per_conversation_as_trl(tmp_path, family):
    fam = FAMILIES[family]
    directory = make_tokenizer(fam, tmp_path / "tokenizer", template_text(fam.training))
    source = tmp_path / "chats.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    tokenize_files([str(source)], str(directory), tmp_path / "sft", chat=True)
    ours, theirs = tokstream_pairs(tmp_path / "sft"), trl_pairs(directory, tmp_path)
    assert sum(ours.values()) == sum(theirs.values()) == len(RECORDS)
    assert max(len(ids) for ids, _ in ours) <= 512  # nothing TRL truncated
    assert ours == theirs
