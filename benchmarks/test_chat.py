"""``tokstream tokenize --chat``: a stock template (no generation spans) against the same
template with spans added, both in one run.

A template without ``{% generation %}`` spans is masked by rendering each assistant turn's
leading messages again (docs/fine-tuning.md, rule 2); with spans the mask comes from the one
render. Target: the stock template costs at most 1.5x its spanned twin (a rate ratio of at
least 0.67). The twins are each family's stock template and TRL's ``*_training.jinja`` of it
(``trl/chat_templates``), over tiny tokenizers with the family's special tokens
(``tests/chat_families.py``) and the same seeded conversations (1-4 exchanges, a system message
in half). Two groups a family:

- ``chat encode FAMILY``: the encoder alone (render, tokenize once, mask), conversations already
  parsed;
- ``tokenize --chat FAMILY``: the whole job, JSON Lines in, shards and masks out, one worker.

A third group, ``SFT data to the first batch``, times the whole way from the JSON Lines to the
first packed batch with assistant-only labels: ``tokstream tokenize --chat`` and a packed
stream, against TRL's ``SFTTrainer`` data path (``packing_strategy="bfd"``,
``assistant_only_loss=True``) and its first batch; the same conversations and training
template (tests/test_chat_trl.py checks that both train the same pairs).

Needs ``jinja2``, ``tokenizers`` and ``trl`` (skipped without them; the TRL group also needs
``torch``, ``transformers`` and ``datasets``). Before timing, the two template sides are checked
to render the same tokens for every conversation and to train the same content and end-of-turn
tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.chat_families import FAMILIES, conversations, make_tokenizer, template_text

pytest.importorskip("jinja2")
pytest.importorskip("tokenizers")
pytest.importorskip("trl")

FAMILY_NAMES = ["llama3", "qwen2_5", "gemma3", "phi3"]
SIDES = ["stock template", "generation spans"]


@pytest.fixture(scope="module")
def chats(settings: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    count = settings.size(4000, 50)
    records = conversations(count, seed=0)
    root = tmp_path_factory.mktemp("chat_bench")
    source = root / "chats.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    return {"records": records, "root": root, "source": source, "runs": iter(range(10**6))}


def tokenizer_of(chats: dict[str, Any], family: str, side: str) -> Path:
    spans = side == "generation spans"
    where = chats["root"] / f"{family}_{'spans' if spans else 'stock'}"
    if not where.exists():
        fam = FAMILIES[family]
        make_tokenizer(fam, where, template_text(fam.training) if spans else None)
    return where


def encode_all(encoder: Any, records: list[dict[str, Any]]) -> int:
    return sum(encoder.encode(record).ids.shape[0] for record in records)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_chat_encode(measure, chats, family, side) -> None:
    from tokstream.tokenize.chat import ChatEncoder, load_spec

    encoder = ChatEncoder(load_spec(str(tokenizer_of(chats, family, side))))
    other = ChatEncoder(load_spec(str(tokenizer_of(chats, family, SIDES[side == SIDES[0]]))))
    for record in chats["records"]:
        a, b = encoder.encode(record), other.encode(record)
        assert a.ids.tolist() == b.ids.tolist()
        # Only the spanned twin trains the whitespace after the end-of-turn token (and Phi-3's
        # final end-of-text): on every token the stock side trains, both agree.
        stock = a if side == SIDES[0] else b
        spanned = b if side == SIDES[0] else a
        assert np.all(spanned.mask[stock.mask])
    measure(
        encode_all,
        args=(encoder, chats["records"]),
        group=f"chat encode {family} ({len(chats['records'])} conversations)",
        side=side,
        subject=SIDES[0],
        units=encode_all(encoder, chats["records"]),
        unit="Mtok/s",
    )


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("family", ["qwen2_5"])
def test_tokenize_chat(measure, settings, chats, family, side) -> None:
    from tokstream.tokenize import tokenize_files

    tokenizer = str(tokenizer_of(chats, family, side))

    def job() -> int:
        out = chats["root"] / f"out_{family}_{side.replace(' ', '_')}_{next(chats['runs'])}"
        return tokenize_files([str(chats["source"])], tokenizer, out, chat=True).tokens

    measure(
        job,
        group=f"tokenize --chat {family} ({len(chats['records'])} conversations)",
        side=side,
        subject=SIDES[0],
        units=lambda tokens: tokens,
        unit="Mtok/s",
        rounds=settings.size(3, 1),
    )


# ---------------------------------------------------------------------------------------------
# Side by side with TRL: JSON Lines of conversations to the first packed, masked batch.


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("side", ["tokstream", "TRL"])
def test_sft_first_batch(measure, settings, chats, side) -> None:
    """Conversations to the first packed batch with assistant-only labels (qwen2_5's training
    template, rows of 512 tokens, 8 a batch): tokstream tokenize --chat then a packed stream,
    against TRL's SFTTrainer data path (packing_strategy="bfd", assistant_only_loss=True) then
    its first batch. The rate is the conversations' tokens over the time to the first batch."""
    import datasets
    import transformers
    import trl

    from tokstream import open_tokens, stream_token_source
    from tokstream.tokenize import tokenize_files

    tokenizer_dir = tokenizer_of(chats, "qwen2_5", "generation spans")
    records = chats["records"]

    def tokstream_path() -> int:
        out = chats["root"] / f"sft_{next(chats['runs'])}"
        result = tokenize_files([str(chats["source"])], str(tokenizer_dir), out, chat=True)
        stream = stream_token_source(
            open_tokens(out),
            512,
            8,
            windows="packed",
            pad=0,
            labels_ignore_index=-100,
            extras=("position_ids",),
        )
        next(iter(stream))
        return result.tokens

    def trl_path() -> int:
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
            output_dir=str(chats["root"] / "trl"),
            packing=True,
            packing_strategy="bfd",
            assistant_only_loss=True,
            max_length=512,
            per_device_train_batch_size=8,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        )
        trainer = trl.SFTTrainer(
            model=transformers.LlamaForCausalLM(config),
            args=args,
            train_dataset=datasets.Dataset.from_list(records),
            processing_class=tokenizer,
        )
        next(iter(trainer.get_train_dataloader()))
        return int(sum(len(ids) for ids in trainer.train_dataset["input_ids"]))

    measure(
        tokstream_path if side == "tokstream" else trl_path,
        group=f"SFT data to the first batch ({len(records)} conversations)",
        side=side,
        units=lambda tokens: tokens,
        unit="Mtok/s",
        rounds=settings.size(3, 1),
    )
