"""tokstream batches in a Hugging Face causal LM and its Trainer.

tokstream's labels are already shifted (``labels[:, i]`` is the token after ``input_ids[:, i]``),
so they go in as ``shift_labels`` too: transformers' causal-LM loss then uses them as they are
instead of shifting ``labels`` once more. The loss must equal the cross-entropy over exactly the
positions the loss mask keeps.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tokstream import Corpus, stream_token_source  # noqa: E402
from tokstream.torch import TokenDataset  # noqa: E402


def masked_corpus(seed: int = 0) -> Corpus:
    rng = np.random.default_rng(seed)
    documents = [rng.integers(1, 100, int(rng.integers(5, 40))) for _ in range(120)]
    masks = [(rng.random(sum(map(len, documents))) < 0.5).astype(np.uint8)]
    return Corpus.from_documents(documents).with_loss_masks(masks)


def tiny_llama() -> object:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM(config).eval()


def hf_inputs(batch: dict) -> dict:
    """A tokstream batch as a causal LM's arguments: shifted labels given as shift_labels."""
    return {
        "input_ids": batch["input_ids"],
        "position_ids": batch["position_ids"],
        "labels": batch["labels"],
        "shift_labels": batch["labels"],
    }


def test_the_models_loss_is_the_cross_entropy_over_the_masked_in_labels():
    model = tiny_llama()
    stream = stream_token_source(
        masked_corpus(),
        64,
        4,
        windows="packed",
        pad=0,
        labels_ignore_index=-100,
        extras=("position_ids",),
    )
    for batch in list(stream)[:3]:
        tensors = {k: torch.from_numpy(v) for k, v in batch.items() if isinstance(v, np.ndarray)}
        with torch.no_grad():
            loss = model(**hf_inputs(tensors)).loss
            logits = model(input_ids=tensors["input_ids"], position_ids=tensors["position_ids"])
        keep = tensors["loss_mask"]
        expected = torch.nn.functional.cross_entropy(
            logits.logits[keep].float(), tensors["labels"][keep]
        )
        assert torch.allclose(loss, expected, atol=1e-5)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_token_dataset_is_a_trainers_train_dataset(tmp_path):
    dataset = TokenDataset(
        masked_corpus(),
        64,
        4,
        windows="packed",
        pad=0,
        labels_ignore_index=-100,
        extras=("position_ids",),
    )

    def collate(items: list) -> dict:
        (batch,) = items  # each item is already a whole batch
        return hf_inputs(batch)

    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=1,
        max_steps=4,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
    )
    trainer = transformers.Trainer(
        model=tiny_llama().train(), args=arguments, train_dataset=dataset, data_collator=collate
    )
    result = trainer.train()
    assert result.global_step == 4 and np.isfinite(result.training_loss)
