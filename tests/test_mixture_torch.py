"""A mixture through ``tokstream.torch.TokenDataset``: DataLoader workers and torchdata's
``StatefulDataLoader``, with the ``"source"`` extra arriving as a tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tokstream import mix, stream_token_source
from tokstream.torch import TokenDataset

SOURCE_STEP = 10**6


def mixture():
    sources = {
        name: (s * SOURCE_STEP + np.arange(size)).astype(np.int32)
        for s, (name, size) in enumerate([("web", 301), ("code", 77), ("math", 23)])
    }
    return mix(sources, {"web": 0.6, "code": 0.3, "math": 0.1})


def dataset(**options) -> TokenDataset:
    args = dict(epochs=2, seed=5, extras=("source",), targets="shifted")
    args.update(options)
    return TokenDataset(mixture(), 4, 6, **args)


def test_batches_are_dicts_of_tensors_with_each_rows_source():
    batches = list(DataLoader(dataset(), batch_size=None))
    assert len(batches) == len(dataset())
    for batch in batches:
        assert batch["source"].dtype == torch.int64
        assert torch.equal(batch["input_ids"][:, 0] // SOURCE_STEP, batch["source"])


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_two_workers_stream_the_shares_of_two_ranks_of_the_mixture(context):
    loader = DataLoader(
        dataset(num_workers=2), batch_size=None, num_workers=2, multiprocessing_context=context
    )
    seen = sorted(int(x) for batch in loader for x in batch["input_ids"][:, 0])
    ranks = [
        stream_token_source(
            mixture(), 4, 6, epochs=2, seed=5, permutation="implicit", rank=r, world_size=2
        )
        for r in range(2)
    ]
    expected = sorted(int(x) for stream in ranks for windows, _ in stream for x in windows[:, 0])
    # 297 + 73 + 19 = 389 samples an epoch; two workers stream 388 of them (the tail: 1).
    assert seen == expected and len(seen) == 2 * 388


# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates.
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_statefuldataloader_resumes_a_mixture_to_identical_batches(num_workers):
    stateful_dataloader = pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata is not installed"
    )
    StatefulDataLoader = stateful_dataloader.StatefulDataLoader

    def loader():
        return StatefulDataLoader(
            dataset(num_workers=num_workers),
            batch_size=None,
            num_workers=num_workers,
            multiprocessing_context="fork" if num_workers else None,
        )

    uninterrupted = loader()
    iterator = iter(uninterrupted)
    head = [next(iterator) for _ in range(23)]  # mid-epoch of every source
    state = uninterrupted.state_dict()
    rest = list(iterator)
    assert len(head) + len(rest) == len(uninterrupted)

    resumed = loader()
    resumed.load_state_dict(state)
    again = list(resumed)
    assert len(again) == len(rest) > 0
    for batch, want in zip(again, rest, strict=True):
        assert batch.keys() == want.keys()
        assert all(torch.equal(batch[key], want[key]) for key in batch)
