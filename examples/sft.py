"""Fine-tune a tiny causal LM on chat conversations with tokstream batches, resume it mid-run.

    python examples/sft.py                       # 300 steps, resumed at step 150
    python examples/sft.py --steps 40 --resume-at 20 --work /tmp/sft --plot loss.png

What it does, on CPU, with nothing downloaded:

1. makes a tokenizer directory: a byte-level BPE trained on the conversations, with a ChatML
   chat template (no generation spans: tokstream masks it by its rule, docs/fine-tuning.md);
2. ``tokstream tokenize --chat`` of the conversations (``--data``: a JSON Lines file of
   ``{"messages": [...]}`` records; by default a seeded sample made here);
3. trains a small Llama built from a config on packed rows of whole conversations, with
   ``labels_ignore_index=-100`` (the loss only on the assistant's tokens) and the shifted
   labels given as ``shift_labels``;
4. runs again from a checkpoint taken at ``--resume-at`` (the model's, the optimizer's and the
   stream's state): the resumed run's losses must equal the uninterrupted run's, step for step.
   With ``--plot`` (matplotlib) both loss curves go into one figure.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tokstream import open_tokens, stream_token_source
from tokstream.tokenize import tokenize_files

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
COLOURS = "red green blue yellow purple orange black white grey pink brown".split()


def sample_conversations(count: int, seed: int = 0) -> list[dict]:
    """Seeded toy conversations: the assistant names the colour the user asks about."""
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        messages = [{"role": "system", "content": "Answer with one colour."}]
        for _ in range(rng.randint(1, 3)):
            colour = rng.choice(COLOURS)
            messages.append({"role": "user", "content": f"What colour is {colour} paint?"})
            messages.append({"role": "assistant", "content": f"It is {colour}."})
        records.append({"messages": messages})
    return records


def make_tokenizer(records: list[dict], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [m["content"] for r in records for m in r["messages"]]
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"chat_template": TEMPLATE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def new_model(vocab_size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    return transformers.LlamaForCausalLM(config)


def train(
    corpus, vocab_size: int, steps: int, stop_at: int | None = None, resume: dict | None = None
) -> tuple[list[float], dict | None]:
    """Train for ``steps`` steps (from ``resume``'s checkpoint when given); the losses, and the
    checkpoint taken after step ``stop_at`` when asked (the run then stops there)."""
    model = new_model(vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    stream = stream_token_source(
        corpus,
        128,
        8,
        windows="packed",
        pad=0,
        epochs=10**6,
        seed=0,
        labels_ignore_index=-100,
        extras=("position_ids",),
    )
    step = 0
    if resume is not None:
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        stream.load_state_dict(resume["stream"])
        step = resume["step"]
    losses = []
    for batch in stream:
        if step == steps:
            break
        x, y, positions = (
            torch.from_numpy(batch[k]) for k in ("input_ids", "labels", "position_ids")
        )
        loss = model(input_ids=x, position_ids=positions, labels=y, shift_labels=y).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        step += 1
        if step == stop_at:
            state = {
                "model": {k: v.clone() for k, v in model.state_dict().items()},
                "optimizer": optimizer.state_dict(),
                "stream": stream.state_dict(),
                "step": step,
            }
            return losses, state
    return losses, None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--resume-at", type=int, default=150)
    parser.add_argument("--work", type=Path, default=Path("sft_example"))
    parser.add_argument("--data", type=Path, default=None, help="JSON Lines of conversations")
    parser.add_argument("--plot", type=Path, default=None, help="a PNG of both loss curves")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    data = args.data
    if data is None:
        data = args.work / "chats.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in sample_conversations(500)))
    records = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    tokenizer = make_tokenizer(records, args.work / "tokenizer")
    result = tokenize_files([str(data)], str(tokenizer), args.work / "sft", chat=True)
    print(result.summary())
    corpus = open_tokens(args.work / "sft")
    vocab_size = Tokenizer.from_file(str(tokenizer / "tokenizer.json")).get_vocab_size()

    whole, _ = train(corpus, vocab_size, args.steps)
    first, checkpoint = train(corpus, vocab_size, args.steps, stop_at=args.resume_at)
    assert checkpoint is not None
    rest, _ = train(corpus, vocab_size, args.steps, resume=checkpoint)
    resumed = first + rest
    same = "identical" if resumed == whole else "DIFFERENT"
    print(
        f"loss {whole[0]:.3f} -> {whole[-1]:.3f} over {args.steps} steps; resumed at step "
        f"{args.resume_at}: {same}"
    )
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(6, 3.5))
        axes.plot(whole, label="uninterrupted", linewidth=3, alpha=0.5)
        axes.plot(resumed, label=f"resumed at step {args.resume_at}", linestyle="--")
        axes.set_xlabel("step")
        axes.set_ylabel("loss (assistant tokens)")
        axes.legend()
        figure.tight_layout()
        figure.savefig(args.plot)
    return {"whole": whole, "resumed": resumed, "trained": result.trained, "tokens": result.tokens}


if __name__ == "__main__":
    main()
