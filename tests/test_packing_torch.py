"""Packed batches in PyTorch: ``tokstream.torch.block_mask`` and the adapter over packed rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention
from torch.nn.functional import scaled_dot_product_attention
from torch.utils.data import DataLoader

from tests.test_packing import lognormal_lengths
from tests.test_packing_stream import corpus_of
from tokstream import mix, stream_token_source
from tokstream.torch import TokenDataset, block_mask

# Eager flex_attention on CPU warns that it is not fused; the result is what is tested here.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def packed_batch(extras=("document_ids",), block=32):
    corpus = corpus_of([5, 40, 3, 17, 9, 30, 2, 26, 11, 1, 0, 33])
    stream = stream_token_source(
        corpus, block, 4, windows="packed", pad=0, extras=extras, shuffle=True, seed=2
    )
    return {
        k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in next(stream).items()
    }


def dense_mask(documents: torch.Tensor) -> torch.Tensor:
    block = documents.shape[1]
    causal = torch.ones(block, block, dtype=torch.bool).tril()
    return (documents[:, :, None] == documents[:, None, :]) & causal


@pytest.mark.parametrize("extras", [("document_ids",), ("position_ids",)])
def test_block_mask_attends_as_the_dense_mask_and_as_each_piece_alone(extras):
    batch = packed_batch(extras + ("document_ids",) if extras == ("position_ids",) else extras)
    documents = batch["document_ids"].long()
    if extras == ("position_ids",):
        del batch["document_ids"]
    rows, block = documents.shape
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(rows, 2, block, 8, generator=generator) for _ in range(3))
    out = flex_attention(q, k, v, block_mask=block_mask(batch))
    dense = scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(documents)[:, None])
    torch.testing.assert_close(out, dense)
    for row in range(rows):
        for piece in documents[row].unique().tolist():
            at = (documents[row] == piece).nonzero().flatten()
            span = slice(int(at[0]), int(at[-1]) + 1)
            alone = scaled_dot_product_attention(
                q[row : row + 1, :, span],
                k[row : row + 1, :, span],
                v[row : row + 1, :, span],
                is_causal=True,
            )
            torch.testing.assert_close(out[row : row + 1, :, span], alone)


def test_block_mask_names_what_it_needs():
    with pytest.raises(TypeError, match="dict batch"):
        block_mask((torch.zeros(2, 3), torch.zeros(2, 3)))
    with pytest.raises(ValueError, match="document_ids"):
        block_mask({"input_ids": torch.zeros(2, 3)})


def test_a_dataloader_with_workers_streams_the_packed_rows_once():
    corpus = corpus_of(lognormal_lengths(120, seed=9))
    options = {"windows": "packed", "pad": -1, "extras": ("document_ids",), "shuffle": False}
    dataset = TokenDataset(corpus, 16, 4, num_workers=2, **options)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    labels = sorted(t for batch in loader for t in batch["labels"][batch["loss_mask"]].tolist())
    single = stream_token_source(corpus, 16, 4, world_size=2, rank=0, **options)
    expected = []
    for rank in range(2):
        stream = stream_token_source(corpus, 16, 4, world_size=2, rank=rank, **options)
        expected += [t for b in stream for t in b["labels"][b["loss_mask"]].tolist()]
    assert labels == sorted(expected) and len(single) > 0


def packed_sources():
    """A packed corpus and a packed mixture of two such corpora (tokens are their indices)."""
    return {
        "corpus": corpus_of(lognormal_lengths(40, seed=11)),
        "mixture": mix(
            {"a": corpus_of(lognormal_lengths(30, seed=12)), "b": corpus_of([7, 90, 3] * 10)},
            {"a": 2, "b": 1},
        ),
    }


# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates.
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize("source", ["corpus", "mixture"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_statefuldataloader_resumes_packed_rows_to_identical_batches(source, num_workers):
    stateful_dataloader = pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata is not installed"
    )
    options = {
        "windows": "packed",
        "pad": 0,
        "extras": ("document_ids", "position_ids", "cu_seqlens"),
        "out_dtype": "int32",
        "epochs": 2,
        "seed": 3,
        "num_workers": num_workers,
    }

    def loader():
        dataset = TokenDataset(packed_sources()[source], 64, 4, **options)
        return stateful_dataloader.StatefulDataLoader(
            dataset,
            batch_size=None,
            num_workers=num_workers,
            multiprocessing_context="fork" if num_workers else None,
        )

    def kept(batch):  # out of the workers' shared memory, so no file descriptor stays open
        return {key: torch.as_tensor(value).clone() for key, value in batch.items()}

    uninterrupted = loader()
    iterator = iter(uninterrupted)
    head = [kept(next(iterator)) for _ in range(len(uninterrupted) // 3)]  # inside epoch 0
    state = uninterrupted.state_dict()
    rest = [kept(batch) for batch in iterator]
    assert len(head) + len(rest) == len(uninterrupted)
    assert head[0]["input_ids"].dtype == torch.int32
    resumed = loader()
    resumed.load_state_dict(state)
    again = [kept(batch) for batch in resumed]
    assert len(again) == len(rest) > 0
    for batch, want in zip(again, rest, strict=True):
        assert batch.keys() == want.keys()
        for key in want:
            assert torch.equal(batch[key], want[key]), key
