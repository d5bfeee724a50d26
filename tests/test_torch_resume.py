"""Resuming ``tokstream.torch.TokenDataset`` through torchdata's ``StatefulDataLoader`` at the
end of a run: checkpoints in the last steps, at the final step, after a finished pass, and a
finished run extended with more epochs.

With ``K`` workers the loader takes one batch from each worker in turn, so in its last ``K - 1``
steps some workers have handed out their last batch while others still stream; each worker's
state must then say "done", not "start over".
"""

from __future__ import annotations

from itertools import islice

import numpy as np
import pytest
import torch

from tokstream.torch import TokenDataset

stateful_dataloader = pytest.importorskip(
    "torchdata.stateful_dataloader", reason="torchdata is not installed"
)

# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

# 400 windows in batches of 4: 100 batches a pass with or without two workers.
TOKENS = np.arange(401)


def dataset(num_workers: int, epochs: int = 1) -> TokenDataset:
    return TokenDataset(TOKENS, 1, 4, epochs=epochs, seed=1, num_workers=num_workers)


def loader_of(data: TokenDataset, num_workers: int):
    return stateful_dataloader.StatefulDataLoader(
        data,
        batch_size=None,
        num_workers=num_workers,
        multiprocessing_context="fork" if num_workers else None,
    )


def starts(batches) -> list[list[int]]:
    return [x[:, 0].tolist() for x, _ in batches]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("steps_before", [98, 99, 100])
def test_a_checkpoint_in_the_last_steps_resumes_to_exactly_the_remaining_batches(
    num_workers, steps_before
):
    loader = loader_of(dataset(num_workers), num_workers)
    assert len(loader) == 100
    iterator = iter(loader)
    head = starts(islice(iterator, steps_before))
    state = loader.state_dict()
    rest = starts(iterator)
    assert len(head) + len(rest) == 100

    resumed = loader_of(dataset(num_workers), num_workers)
    resumed.load_state_dict(state)
    assert starts(resumed) == rest  # 100 - steps_before batches: none after the final step


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_final_step_checkpoint_extends_to_the_next_epoch_with_more_epochs(num_workers):
    loader = loader_of(dataset(num_workers, epochs=1), num_workers)
    iterator = iter(loader)
    first_epoch = starts(islice(iterator, 100))  # the training loop's last step, then save
    state = loader.state_dict()

    extended = loader_of(dataset(num_workers, epochs=2), num_workers)
    extended.load_state_dict(state)
    second_epoch = starts(extended)
    assert first_epoch + second_epoch == starts(loader_of(dataset(num_workers, 2), num_workers))
    assert sorted(sum(second_epoch, [])) == list(range(400))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_pass_run_to_its_end_resumes_to_a_new_pass_as_the_loader_does(num_workers):
    # A loader that raised StopIteration is finished; torchdata then begins a new pass, from the
    # first epoch, both for the loader itself and for a loader that loads its state.
    loader = loader_of(dataset(num_workers), num_workers)
    first_pass = starts(loader)
    state = loader.state_dict()
    assert starts(loader) == first_pass

    resumed = loader_of(dataset(num_workers), num_workers)
    resumed.load_state_dict(state)
    assert starts(resumed) == first_pass


def test_the_finished_state_of_a_dataset_resumes_to_nothing_or_to_its_next_epochs():
    data = TokenDataset(np.arange(50), 3, 4, epochs=2, seed=8)
    whole = starts(data)
    finished = data.state_dict()
    assert finished != TokenDataset(np.arange(50), 3, 4, epochs=2, seed=8).state_dict()

    done = TokenDataset(np.arange(50), 3, 4, epochs=2, seed=8)
    done.load_state_dict(finished)
    assert starts(done) == []
    longer = TokenDataset(np.arange(50), 3, 4, epochs=3, seed=8)
    longer.load_state_dict(finished)
    assert whole + starts(longer) == starts(TokenDataset(np.arange(50), 3, 4, epochs=3, seed=8))
    # A new iter() without a loaded state is a new pass from the first epoch.
    assert starts(data) == whole


def test_a_loaded_state_is_taken_by_iter_so_an_unstarted_iterator_uses_it_up():
    data = TokenDataset(np.arange(50), 3, 4, seed=8)
    whole = starts(data)
    data.load_state_dict(data.state_dict())  # finished
    unstarted = iter(data)
    assert starts(data) == whole
    assert starts(unstarted) == []
    assert isinstance(next(iter(data))[0], torch.Tensor)
