"""``tokstream.torch.TokenDataset`` with the real engine: DataLoader workers and gloo ranks.

The corpus is ``np.arange``, so a window's first token is its start. Multi-process tests spawn
their processes (``torch.multiprocessing``, start method "spawn") and bound every wait, so a
broken process group fails the test instead of hanging it.
"""

from __future__ import annotations

import copy
import itertools
import json
import pickle
import re
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing
from torch.utils.data import DataLoader

import tokstream.torch as tokstream_torch
from tokstream import open_tokens, stream_token_source, write_tokens
from tokstream.torch import TokenDataset

ROOT = Path(__file__).resolve().parent.parent
SPAWN_TIMEOUT_SECONDS = 120


def epoch_order(num_windows: int, seed: int, epoch: int = 0) -> np.ndarray:
    """The window order of ``epoch`` as one process streams it (the adapter's default order)."""
    stream = stream_token_source(
        np.arange(num_windows + 1),
        1,
        num_windows,
        epochs=epoch + 1,
        seed=seed,
        permutation="implicit",
    )
    return [windows[:, 0] for windows, _ in stream][epoch]


def starts_of(batches) -> list[list[int]]:
    return [windows[:, 0].tolist() for windows, _ in batches]


# ------------------------------------------------------------------ import and tensors


def test_import_tokstream_never_imports_torch_and_the_adapter_names_the_extra():
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "import tokstream, numpy\n"
        "assert len(tokstream.stream_token_source(numpy.arange(9), 2, 3)) == 3\n"
        "try:\n"
        "    import tokstream.torch\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'tokstream[torch]'" in result.stdout
    assert "pip install '.[torch]'" in result.stdout  # for a clone of the repository
    fresh = subprocess.run(
        [sys.executable, "-c", "import sys, tokstream; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert fresh.stdout.strip() == "False"


def test_batches_are_the_stream_batches_as_int64_tensors_without_a_copy(monkeypatch):
    expected = list(
        stream_token_source(np.arange(60), 5, 4, targets="shifted", seed=2, permutation="implicit")
    )
    arrays = []
    original_next = tokstream_torch.TokenStream.__next__

    def recording_next(self):
        batch = original_next(self)
        arrays.append(batch)
        return batch

    monkeypatch.setattr(tokstream_torch.TokenStream, "__next__", recording_next)
    dataset = TokenDataset(np.arange(60, dtype=np.uint16), 5, 4, targets="shifted", seed=2)
    tensors = list(DataLoader(dataset, batch_size=None))
    assert len(tensors) == len(expected) == len(arrays) == 14
    for (x, y), (windows, targets), (raw_x, raw_y) in zip(tensors, expected, arrays, strict=True):
        assert x.dtype == y.dtype == torch.int64
        assert x.data_ptr() == raw_x.ctypes.data and y.data_ptr() == raw_y.ctypes.data
        np.testing.assert_array_equal(x.numpy(), windows)
        np.testing.assert_array_equal(y.numpy(), targets)


def test_without_a_process_group_the_dataset_is_one_process_unless_told_otherwise():
    assert not dist.is_initialized()
    default = TokenDataset(np.arange(30), 3, 2)
    assert (default.rank, default.world_size) == (0, 1)
    explicit = TokenDataset(np.arange(30), 3, 2, rank=1, world_size=3, shuffle=False)
    assert starts_of(explicit)[0] == [1, 4]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rank": 2, "world_size": 2}, ValueError, "rank must be below world_size=2, got 2"),
        ({"world_size": 0}, ValueError, "world_size must be positive, got 0"),
        ({"targets": "all"}, ValueError, "targets must be one of"),
        ({"block": 0}, ValueError, "block must be positive, got 0"),
        ({"shuffle": "no"}, TypeError, "shuffle must be a bool"),
    ],
)
def test_bad_arguments_are_rejected_when_the_dataset_is_built(kwargs, error, match):
    args = {"token_ids": np.arange(30), "block": 3, "batch_size": 2, **kwargs}
    with pytest.raises(error, match=match):
        TokenDataset(**args)


# ------------------------------------------------------------------ DataLoader workers


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_dataloader_with_two_workers_sees_every_window_once_per_epoch(context):
    # 61 windows, 2 workers: each epoch streams the first 60 positions of its order.
    dataset = TokenDataset(np.arange(64), 3, 4, epochs=2, seed=5, targets="shifted")
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context)
    batches = starts_of(loader)
    assert len(batches) == dataset.num_batches(num_workers=2) == 2 * 2 * 8
    for epoch in range(2):
        # Every worker yields 8 batches an epoch, so the loader's first 16 are epoch 0.
        seen = np.concatenate(batches[epoch * 16 : (epoch + 1) * 16])
        assert len(set(seen.tolist())) == seen.size == 60
        assert set(seen.tolist()) == set(epoch_order(61, 5, epoch)[:60].tolist())


def fake_worker(monkeypatch, worker_id: int, num_workers: int) -> None:
    info = SimpleNamespace(id=worker_id, num_workers=num_workers)
    monkeypatch.setattr(tokstream_torch, "get_worker_info", lambda: info)


def test_worker_states_resume_every_worker_as_statefuldataloader_hands_them_back(monkeypatch):
    # StatefulDataLoader keeps one copy of the dataset per worker, takes each copy's
    # state_dict() inside that worker, and on resume calls load_state_dict() on fresh copies
    # before iter(). Here the workers are simulated in-process, taking turns.
    dataset = TokenDataset(np.arange(90), 2, 3, epochs=2, seed=1)
    workers = [copy.deepcopy(dataset) for _ in range(2)]

    def step(copies, iterators, worker):
        fake_worker(monkeypatch, worker, 2)
        if iterators[worker] is None:
            iterators[worker] = iter(copies[worker])
        return next(iterators[worker])[0][:, 0].tolist()

    iterators = [None, None]
    for i in range(9):
        step(workers, iterators, i % 2)
    states = []
    for worker in range(2):
        fake_worker(monkeypatch, worker, 2)
        states.append(json.loads(json.dumps(workers[worker].state_dict())))
    total = dataset.num_batches(num_workers=2)
    assert total == 2 * 2 * 15  # 88 windows, global batches of 6: 14 full, one of 4
    uninterrupted = [step(workers, iterators, i % 2) for i in range(9, total)]
    with pytest.raises(StopIteration):
        step(workers, iterators, 0)

    fresh = [copy.deepcopy(dataset) for _ in range(2)]
    for worker in range(2):
        fake_worker(monkeypatch, worker, 2)
        fresh[worker].load_state_dict(states[worker])
    resumed_iterators = [None, None]
    resumed = [step(fresh, resumed_iterators, i % 2) for i in range(9, total)]
    assert resumed == uninterrupted


def test_a_state_loaded_outside_the_workers_is_refused_inside_one(monkeypatch):
    dataset = TokenDataset(np.arange(90), 2, 3)
    dataset.load_state_dict(dataset.state_dict())
    fake_worker(monkeypatch, 1, 2)
    with pytest.raises(ValueError, match=r"loaded as rank 0 of 1 .* iterated as 1 of 2"):
        next(iter(dataset))


def test_the_dataset_resumes_without_workers_and_begins_a_new_pass_after_a_finished_one():
    dataset = TokenDataset(np.arange(50), 3, 4, epochs=2, seed=8)
    iterator = iter(DataLoader(dataset, batch_size=None))
    first = starts_of(next(iterator) for _ in range(5))
    saved = json.loads(json.dumps(dataset.state_dict()))
    rest = starts_of(iterator)
    resumed = TokenDataset(np.arange(50), 3, 4, epochs=2, seed=8)
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == saved
    assert starts_of(DataLoader(resumed, batch_size=None)) == rest
    # A finished pass: its state is the finished cursor (tests/test_torch_resume.py), and a
    # new iter() begins a new pass from epoch 0.
    assert resumed.state_dict() != TokenDataset(np.arange(50), 3, 4, epochs=2, seed=8).state_dict()
    assert starts_of(DataLoader(resumed, batch_size=None)) == first + rest


def test_a_dataset_state_from_another_configuration_is_a_value_error():
    saved = TokenDataset(np.arange(50), 3, 4).state_dict()
    with pytest.raises(ValueError, match="block=3, but this stream has block=4"):
        TokenDataset(np.arange(50), 4, 4).load_state_dict(saved)


# ------------------------------------------------------------------ tensors as token ids


@pytest.mark.parametrize(
    ("tensor", "named"),
    [
        pytest.param(torch.arange(10.0, requires_grad=True), ".detach()", id="requires_grad"),
        pytest.param(torch.arange(10).to(torch.bfloat16), "BFloat16", id="bfloat16"),
        pytest.param(torch.arange(10).to_sparse(), "Sparse", id="sparse"),
    ],
)
def test_a_tensor_numpy_cannot_read_is_a_type_error_naming_token_ids(tensor, named):
    for build in (stream_token_source, TokenDataset):
        with pytest.raises(TypeError, match="token_ids") as raised:
            build(tensor, 2, 2)
        assert named in str(raised.value)


# ------------------------------------------------------------------ len()

# 10 windows in batches of 4: one process streams 3 batches, two workers 2 each (every worker
# takes a share of the 10 positions), so len() must know the DataLoader's workers.
LEN_CORPUS = np.arange(11)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_len_of_the_dataloader_is_the_number_of_batches_it_yields(num_workers):
    dataset = TokenDataset(LEN_CORPUS, 1, 4, epochs=2, num_workers=num_workers)
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        multiprocessing_context="fork" if num_workers else None,
    )
    assert len(loader) == {0: 2 * 3, 2: 2 * 4}[num_workers]
    assert len(list(loader)) == len(loader) == dataset.num_batches(num_workers)


def test_len_of_a_plain_dataset_counts_one_process_and_a_worker_counts_its_share(monkeypatch):
    dataset = TokenDataset(LEN_CORPUS, 1, 4)
    assert len(dataset) == len(list(dataset)) == 3
    in_a_worker = TokenDataset(LEN_CORPUS, 1, 4)
    fake_worker(monkeypatch, 1, 2)
    assert len(in_a_worker) == len(list(in_a_worker)) == 2


@pytest.mark.parametrize(
    ("told", "call_len", "runs"), [(2, False, 0), (0, False, 2), (None, True, 2)]
)
def test_iterating_with_other_workers_than_len_counted_for_is_a_value_error(told, call_len, runs):
    dataset = TokenDataset(LEN_CORPUS, 1, 4, num_workers=told)
    loader = DataLoader(
        dataset, batch_size=None, num_workers=runs, multiprocessing_context="fork" if runs else None
    )
    if call_len:
        assert len(loader) == 3
    with pytest.raises(ValueError, match=f"pass TokenDataset\\(..., num_workers={runs}\\)"):
        list(loader)


def test_num_workers_is_checked_when_the_dataset_is_built():
    with pytest.raises(ValueError, match="num_workers must be nonnegative"):
        TokenDataset(LEN_CORPUS, 1, 4, num_workers=-1)


# ------------------------------------------------------------------ state with real workers


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_the_main_process_state_of_a_dataset_streamed_by_plain_workers_is_refused(context):
    dataset = TokenDataset(np.arange(200), 3, 4, seed=1)
    assert dataset.state_dict()["position"] == 0  # before any worker: the start, truthfully
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context)
    iterator = iter(loader)
    for _ in range(5):
        next(iterator)
    with pytest.raises(RuntimeError, match="StatefulDataLoader"):
        dataset.state_dict()
    # Drawn to the end rather than dropped mid-epoch: a dropped iterator shuts its workers down
    # from __del__, where torch has been seen to lose a spawned worker to SIGABRT under load.
    assert len(list(iterator)) == 50 - 5
    # Streaming it in this process again makes this process' cursor the one that counts.
    next(iter(DataLoader(dataset, batch_size=None)))
    assert dataset.state_dict()["position"] == 4


# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates.
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_statefuldataloader_resumes_to_identical_batches(num_workers):
    stateful_dataloader = pytest.importorskip(
        "torchdata.stateful_dataloader", reason="torchdata is not installed"
    )
    StatefulDataLoader = stateful_dataloader.StatefulDataLoader

    def loader_of(dataset):
        return StatefulDataLoader(
            dataset,
            batch_size=None,
            num_workers=num_workers,
            multiprocessing_context="fork" if num_workers else None,
        )

    def dataset():
        return TokenDataset(
            np.arange(300), 5, 6, epochs=2, seed=3, targets="shifted", num_workers=num_workers
        )

    loader = loader_of(dataset())
    iterator = iter(loader)
    first = [next(iterator) for _ in range(7)]
    state = loader.state_dict()
    rest = list(iterator)
    assert len(first) + len(rest) == len(loader)

    resumed_loader = loader_of(dataset())
    resumed_loader.load_state_dict(state)
    resumed = list(resumed_loader)
    assert len(resumed) == len(rest) > 0
    for (x, y), (rx, ry) in zip(rest, resumed, strict=True):
        assert torch.equal(x, rx) and torch.equal(y, ry)


# ------------------------------------------------------------------ fork workers, started stream


class StreamSlice(torch.utils.data.IterableDataset):
    """The next ``count`` batches of a stream the caller already started."""

    def __init__(self, stream, count: int) -> None:
        self.stream, self.count = stream, count

    def __iter__(self):
        return itertools.islice(self.stream, self.count)


# Python 3.12+ warns that forking a process with threads may deadlock: the very case tested.
@pytest.mark.filterwarnings("ignore:This process .* fork:DeprecationWarning")
def test_a_fork_worker_continues_a_stream_whose_prefetch_thread_was_running():
    kwargs = {"epochs": 2, "seed": 1}
    expected = [w for w, _ in stream_token_source(np.arange(3000), 8, 16, **kwargs)]
    stream = stream_token_source(np.arange(3000), 8, 16, prefetch=3, **kwargs)
    assert np.array_equal(next(stream)[0], expected[0])
    time.sleep(0.05)  # the thread has filled its queue when the worker is forked
    loader = DataLoader(
        StreamSlice(stream, 5),
        batch_size=None,
        num_workers=1,
        multiprocessing_context="fork",
        timeout=60,
    )
    got = [w.numpy() for w, _ in loader]
    assert len(got) == 5
    assert all(np.array_equal(a, b) for a, b in zip(got, expected[1:6], strict=True))
    assert np.array_equal(next(stream)[0], expected[1])  # the parent's stream is untouched
    stream.close()


# ------------------------------------------------------------------ spawned workers and files


def check_the_worker_maps_the_file(worker_id: int) -> None:
    """worker_init_fn: the worker's corpus maps the file again instead of holding a copy."""
    from tokstream.shards.filemap import file_map_of

    shard = torch.utils.data.get_worker_info().dataset.corpus.shards[0]
    assert file_map_of(shard) is not None, "the worker got a copy of the tokens"


def test_spawned_workers_map_the_token_file_instead_of_unpickling_a_copy(tmp_path):
    path = write_tokens(tmp_path / "t.npy", np.arange(100_000) % 50_000)
    dataset = TokenDataset(open_tokens(path), 8, 64, seed=2, stride=4, num_workers=2)
    assert len(pickle.dumps(dataset)) < 8_000  # the tokens alone are 200 KB or more
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=2,
        multiprocessing_context="spawn",
        worker_init_fn=check_the_worker_maps_the_file,
    )
    # Drawn to the end: an iterator dropped mid-epoch shuts its workers down from __del__,
    # where torch itself has been seen to lose a worker to SIGABRT on a loaded machine.
    got = [x.numpy() for x, _ in loader]
    # Worker w streams as rank w of 2; the loader takes one batch from each in turn.
    workers = [
        TokenDataset(open_tokens(path), 8, 64, seed=2, stride=4, rank=w, world_size=2)
        for w in range(2)
    ]
    per_worker = [[x.numpy() for x, _ in worker] for worker in workers]
    expected = [batch for pair in zip(*per_worker, strict=True) for batch in pair]
    assert len(got) == len(expected) > 6
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


# ------------------------------------------------------------------ gloo process groups


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_on_ranks(monkeypatch, fn, world_size: int, *args) -> None:
    """Run ``fn(rank, world_size, port, *args)`` on ``world_size`` spawned processes."""
    # The children import this module by name (tests.test_torch), from the parent's sys.path.
    monkeypatch.syspath_prepend(str(ROOT))
    context = torch.multiprocessing.start_processes(
        fn, args=(world_size, free_port(), *args), nprocs=world_size, join=False
    )
    deadline = time.monotonic() + SPAWN_TIMEOUT_SECONDS
    try:
        # join() returns False whenever a process is still running; it raises if one failed.
        while not context.join(timeout=max(deadline - time.monotonic(), 0)):
            assert time.monotonic() < deadline, "the ranks did not finish in time"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join()


def init_gloo(rank: int, world_size: int, port: int) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )


DDP_WINDOWS, DDP_SEED = 101, 6


def stream_an_epoch_and_gather_the_starts(rank: int, world_size: int, port: int, out: str):
    init_gloo(rank, world_size, port)
    try:
        dataset = TokenDataset(np.arange(DDP_WINDOWS + 4), 4, 8, seed=DDP_SEED, targets="shifted")
        starts = [x[:, 0] for x, _ in DataLoader(dataset, batch_size=None)]
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
        dist.all_gather(counts, torch.tensor([len(starts)]))
        report = {
            "share": [dataset.rank, dataset.world_size],
            "counts": [int(c) for c in counts],
            "sizes": [len(s) for s in starts],
        }
        if len(set(report["counts"])) == 1:  # same decision on every rank, or all_gather hangs
            gathered = [torch.empty(sum(report["sizes"]), dtype=torch.int64) for _ in counts]
            dist.all_gather(gathered, torch.cat(starts))
            report["starts"] = [g.tolist() for g in gathered]
        explicit = TokenDataset(np.arange(DDP_WINDOWS + 4), 4, 8, rank=0, world_size=1)
        report["explicit_share"] = [explicit.rank, explicit.world_size]
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_split_an_epoch_disjointly_with_equal_batch_counts(monkeypatch, tmp_path):
    run_on_ranks(monkeypatch, stream_an_epoch_and_gather_the_starts, 2, str(tmp_path))
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["share"] for r in reports] == [[0, 2], [1, 2]]  # from the process group
    assert [r["explicit_share"] for r in reports] == [[0, 1], [0, 1]]  # explicit args win
    assert reports[0]["counts"] == reports[1]["counts"] == [7, 7]
    assert reports[0]["sizes"] == reports[1]["sizes"] == [8] * 6 + [2]
    rank0, rank1 = reports[0]["starts"]
    assert reports[1]["starts"] == [rank0, rank1]
    assert not set(rank0) & set(rank1)
    # 101 windows on 2 ranks: the order's first 100 positions, alternately; the last is the tail.
    order = epoch_order(DDP_WINDOWS, DDP_SEED)
    assert rank0 == order[0:100:2].tolist() and rank1 == order[1:100:2].tolist()
    assert set(rank0) | set(rank1) == set(range(DDP_WINDOWS)) - {int(order[100])}


def readme_training_example() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Training integration", 1)[1].split("\n## ", 1)[0]
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "def train(" in b]
    return code


def run_the_readme_example(rank: int, world_size: int, port: int, out: str):
    init_gloo(rank, world_size, port)
    try:
        namespace = {"__name__": "readme_example"}
        exec(compile(readme_training_example(), "README.md", "exec"), namespace)
        train = namespace["train"]
        tokens = np.random.default_rng(0).integers(0, 256, 3_000).astype(np.uint8)
        runs = {
            "uninterrupted": train(tokens, f"{out}/whole.pt", steps=12, save_every=100),
            "stopped": train(tokens, f"{out}/resumed.pt", steps=6, save_every=3),
        }
        dist.barrier()  # rank 0 has written the checkpoint of step 6
        runs["resumed"] = train(tokens, f"{out}/resumed.pt", steps=12, save_every=3)
        dist.barrier()  # rank 0 has written the checkpoint of step 12
        runs["finished, run again"] = train(tokens, f"{out}/resumed.pt", steps=12, save_every=3)
        Path(out, f"rank{rank}.json").write_text(json.dumps(runs))
    finally:
        dist.destroy_process_group()


def test_the_readme_ddp_example_resumes_to_bit_identical_losses(monkeypatch, tmp_path):
    run_on_ranks(monkeypatch, run_the_readme_example, 2, str(tmp_path))
    for rank in range(2):
        runs = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(runs["uninterrupted"]) == 12 and len(runs["stopped"]) == 6
        assert runs["stopped"] + runs["resumed"] == runs["uninterrupted"]
        assert runs["finished, run again"] == []
    # save_every=100 left one checkpoint, at the last step.
    assert torch.load(tmp_path / "whole.pt")["step"] == 12


def test_the_default_order_is_implicit_so_no_worker_draws_an_order_of_every_window():
    dataset = TokenDataset(np.arange(60, dtype=np.uint16), 5, 4)
    assert dataset.options.permutation == "implicit"
    assert TokenDataset(np.arange(60), 5, 4, permutation="materialized").options.permutation == (
        "materialized"
    )


def test_document_extras_arrive_as_a_dict_of_tensors():
    dataset = TokenDataset(
        np.arange(40), 4, 3, eos=5, targets="shifted", extras=("position_ids", "cu_seqlens")
    )
    batch = next(iter(DataLoader(dataset, batch_size=None)))
    assert set(batch) == {"input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen"}
    assert batch["input_ids"].dtype == torch.int64 and batch["cu_seqlens"].dtype == torch.int32
    assert isinstance(batch["max_seqlen"], int)
