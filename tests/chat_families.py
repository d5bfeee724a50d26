"""Chat model families for the chat tests: each a tiny tokenizer made here with the family's
special tokens, its stock chat template and TRL's training variant (``trl/chat_templates``).

Nothing is downloaded: the templates are the exact copies the ``trl`` package ships, and each
tokenizer is a byte-level BPE trained on the tests' own text, saved as a Hugging Face tokenizer
directory (``tokenizer.json`` and ``tokenizer_config.json`` with the chat template).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Family:
    name: str
    #: The stock template's and TRL's training template's file names in trl/chat_templates.
    stock: str
    training: str | None
    #: Special tokens (added, special) and added tokens that are not special.
    special: tuple[str, ...]
    added: tuple[str, ...] = ()
    bos: str | None = None
    eos: str | None = None
    pad: str | None = None
    #: What a conversation's turns alternate as, and whether a system message is allowed.
    system: bool = True


FAMILIES = {
    family.name: family
    for family in (
        Family(
            "llama3",
            "llama3.jinja",
            "llama3_training.jinja",
            (
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
            ),
            bos="<|begin_of_text|>",
            eos="<|eot_id|>",
        ),
        Family(
            "qwen2_5",
            "qwen2_5.jinja",
            "qwen2_5_training.jinja",
            ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
            added=("<tool_call>", "</tool_call>"),
            eos="<|im_end|>",
            pad="<|endoftext|>",
        ),
        Family(
            "gemma3",
            "gemma3.jinja",
            "gemma3_training.jinja",
            ("<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"),
            bos="<bos>",
            eos="<eos>",
            pad="<pad>",
        ),
        Family(
            "qwen3",
            "qwen3.jinja",
            "qwen3_training.jinja",
            ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
            added=("<think>", "</think>", "<tool_call>", "</tool_call>"),
            eos="<|im_end|>",
            pad="<|endoftext|>",
        ),
        Family(
            "phi3",
            "phi3.jinja",
            "phi3_training.jinja",
            ("<s>", "</s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
            bos="<s>",
            eos="<|endoftext|>",
            pad="<|endoftext|>",
        ),
    )
}

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly pack boxes of "
    "liquor and jugs; sphinx of black quartz, judge my vow! How vexingly quick daft zebras "
    "jump. 0123456789 ünïcödé 🦊 colour answer question tell me more please thanks"
).split()


def template_text(file: str) -> str:
    """The text of a template TRL ships."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / file).read_text(encoding="utf-8")


def make_tokenizer(family: Family, directory: Path, template: str | None = None) -> Path:
    """A tokenizer directory for ``family`` (its stock template unless ``template``)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in family.special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(20)) for _ in range(300)]
    tokenizer.train_from_iterator(texts, trainer)
    if family.added:
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.added])
    tokenizer.save(str(directory / "tokenizer.json"))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template if template is not None else template_text(family.stock),
        "model_max_length": 1 << 20,
    }
    for key, value in (
        ("bos_token", family.bos),
        ("eos_token", family.eos),
        ("pad_token", family.pad),
    ):
        if value is not None:
            config[key] = value
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return directory


def conversations(count: int, seed: int, system: bool | None = None) -> list[dict[str, Any]]:
    """``count`` records of alternating user/assistant turns (1-4 exchanges), a system message
    first in about half of them (always with ``system=True``, never with False)."""
    rng = random.Random(seed)

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))

    records = []
    for _ in range(count):
        messages = []
        if system or (system is None and rng.random() < 0.5):
            messages.append({"role": "system", "content": text()})
        for _ in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": text()})
            messages.append({"role": "assistant", "content": text()})
        records.append({"messages": messages})
    return records
