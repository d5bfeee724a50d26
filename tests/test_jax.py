"""tokstream.jax: global jax.Array batches equal the one-process stream, row for row, on 4 CPU
devices in this process and on 2 processes x 2 devices (jax.distributed on 127.0.0.1)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
# Before any test makes JAX's backend: 4 CPU devices in this process.
jax.config.update("jax_num_cpu_devices", 4)

from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from tokstream import Corpus, mix, stream_token_source  # noqa: E402
from tokstream.jax import global_batches  # noqa: E402

RNG = np.random.default_rng(0)
TOKENS = RNG.integers(0, 50_000, 6_000).astype(np.uint16)
DOCUMENTS = Corpus.from_documents(
    [RNG.integers(1, 50_000, n).astype(np.uint16) for n in RNG.integers(3, 90, 150)]
)
PROCESS_SCRIPT = Path(__file__).with_name("jax_processes.py")


@pytest.fixture(scope="module")
def devices():
    devices = jax.devices()
    if len(devices) < 4:
        pytest.skip("JAX's backend was made before this module asked for 4 CPU devices")
    return np.array(devices[:4])


KINDS = {
    "plain": (lambda: TOKENS, dict(seed=3)),
    "shifted": (lambda: TOKENS, dict(targets="shifted", shuffle=False)),
    "packed": (lambda: DOCUMENTS, dict(windows="packed", pad=0, extras=("document_ids",))),
    "within": (lambda: DOCUMENTS, dict(windows="within", extras=("position_ids", "origin"))),
    "mixture": (
        lambda: mix({"a": TOKENS[:4_000], "b": DOCUMENTS}, {"a": 0.7, "b": 0.3}),
        dict(extras=("source",), samples=900),
    ),
}
MESHES = {
    "data": ((4,), ("data",), P("data")),
    "data-model": ((2, 2), ("data", "model"), P("data")),
    "both-axes": ((2, 2), ("replica", "data"), P(("replica", "data"))),
    "sequence": ((2, 2), ("data", "sequence"), P("data", "sequence")),
}


def _reference(source, block, global_batch_size, **options):
    return stream_token_source(
        source, block, global_batch_size, drop_last=True, permutation="implicit",
        out_dtype="int32", **options,
    )  # fmt: skip


def _as_dict(batch):
    return (
        batch if isinstance(batch, dict) else dict(zip(("input_ids", "labels"), batch, strict=True))
    )


def _assert_global_batch(batch, expected, sharding_of):
    batch, expected = _as_dict(batch), _as_dict(expected)
    assert batch.keys() == {k for k, v in expected.items() if isinstance(v, np.ndarray)}
    for name, array in batch.items():
        assert isinstance(array, jax.Array)
        np.testing.assert_array_equal(np.asarray(array), expected[name], err_msg=name)
        assert array.sharding.is_equivalent_to(sharding_of(name, array), array.ndim), name


@pytest.mark.parametrize("mesh_kind", list(MESHES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_global_batch_is_the_one_process_streams_row_for_row(devices, kind, mesh_kind):
    source, options = KINDS[kind]
    shape, axes, spec = MESHES[mesh_kind]
    mesh = Mesh(devices.reshape(shape), axes)
    batches = global_batches(source(), 32, 8, mesh, spec, **options)
    expected = list(_reference(source(), 32, 8, **options))
    assert len(batches) == len(expected) > 0

    def sharding_of(name, array):
        tokens = array.ndim == 2 and array.shape[1] == 32 and name not in ("origin", "source")
        return NamedSharding(mesh, spec if tokens else P(spec[0]))

    for batch, want in zip(batches, expected, strict=True):
        _assert_global_batch(batch, want, sharding_of)


def test_the_state_loads_into_another_global_batch_size_and_the_samples_go_on(devices):
    mesh = Mesh(devices, ("data",))
    batches = global_batches(TOKENS, 16, 8, mesh, seed=2, epochs=2)
    seen = [np.asarray(next(batches)[0]) for _ in range(30)]
    state = json.loads(json.dumps(batches.state_dict()))
    for size in (4, 12):
        resumed = global_batches(TOKENS, 16, size, mesh, seed=2, epochs=2)
        resumed.load_state_dict(state)
        expected = _reference(TOKENS, 16, size, seed=2, epochs=2)
        expected.load_state_dict(state)
        for batch, want in zip(resumed, expected, strict=True):
            np.testing.assert_array_equal(np.asarray(batch[0]), want[0])
    # The first 30 steps were the first 240 samples of the run.
    one = _reference(TOKENS, 16, 240, seed=2, epochs=2)
    np.testing.assert_array_equal(np.concatenate(seen), next(one)[0])


def test_a_bad_state_is_a_value_error_and_changes_nothing(devices):
    mesh = Mesh(devices, ("data",))
    batches = global_batches(TOKENS, 16, 8, mesh, seed=2)
    next(batches)
    before = batches.state_dict()
    other = global_batches(TOKENS, 16, 8, mesh, seed=3)
    with pytest.raises(ValueError, match="seed"):
        batches.load_state_dict(other.state_dict())
    assert batches.state_dict() == before
    expected = _reference(TOKENS, 16, 8, seed=2)
    next(expected)
    np.testing.assert_array_equal(np.asarray(next(batches)[0]), next(expected)[0])


@pytest.mark.parametrize(
    ("arguments", "options", "error", "message"),
    [
        (dict(mesh="mesh"), {}, TypeError, "mesh must be a jax.sharding.Mesh"),
        (dict(spec=("data",)), {}, TypeError, "spec must be a jax.sharding.PartitionSpec"),
        (dict(spec=P("batch")), {}, ValueError, "'batch', which the mesh does not have"),
        (dict(spec=P("data", "seq")), {}, ValueError, "'seq', which the mesh does not have"),
        (dict(global_batch_size=6), {}, ValueError, "not a multiple of the data-parallel size 4"),
        (dict(global_batch_size=0), {}, ValueError, "batch_size"),
        ({}, dict(rank=0), ValueError, "takes no rank"),
        ({}, dict(world_size=2), ValueError, "takes no world_size"),
        ({}, dict(drop_last=False), ValueError, "takes no drop_last"),
        ({}, dict(reuse_buffers=2), ValueError, "takes no reuse_buffers"),
        ({}, dict(extras=("cu_seqlens",)), ValueError, "cu_seqlens"),
        ({}, dict(windows="sideways"), ValueError, "windows"),
    ],
)
def test_bad_arguments_name_what_is_wrong(devices, arguments, options, error, message):
    call = dict(global_batch_size=8, mesh=Mesh(devices, ("data",)), spec=P("data"))
    call.update(arguments)
    with pytest.raises(error, match=message):
        global_batches(TOKENS, 16, **call, **options)


# ---- several processes on this machine


def _no_grain() -> bool:
    return importlib.util.find_spec("grain") is None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(processes: int, devices: int, job: dict) -> list[dict]:
    """Run the job on ``processes`` JAX processes of ``devices`` CPU devices; their reports."""
    port = _free_port()
    command = [sys.executable, str(PROCESS_SCRIPT)]
    running = [
        subprocess.Popen(
            [*command, str(i), str(processes), str(port), str(devices), json.dumps(job)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    reports = []
    for process in running:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return sorted(reports, key=lambda report: report["process"])


JOB = dict(
    seed=0,
    tokens=20_000,
    block=32,
    global_batch_size=8,
    mesh=[4],
    axes=["data"],
    spec=["data"],
    options=dict(seed=5, epochs=2, windows="cross", extras=["position_ids", "origin"]),
    steps=40,
)


def test_two_processes_of_two_devices_read_their_rows_and_resume_on_one_process():
    reports = _run(2, 2, JOB)
    # Each process holds the rows of its two devices, and checked them against the stream.
    assert [r["rows"] for r in reports] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [r["steps"] for r in reports] == [40, 40]
    assert reports[0]["state"] == reports[1]["state"]  # process 0 saves it for all
    # A Grain dataset made after jax.distributed.initialize streams this process' share.
    shares = [f"TokenIterDataset(rank={r}/2, worker=0/1)" for r in (0, 1)]
    assert [r["grain"] for r in reports] == ([None, None] if _no_grain() else shares)
    # The state goes on under one process of 4 devices and another global batch size.
    (resumed,) = _run(1, 4, {**JOB, "global_batch_size": 12, "state": reports[0]["state"]})
    assert resumed["rows"] == list(range(12)) and resumed["steps"] == 40
    # ... and from there under two processes again, with the batch split over two mesh axes.
    mesh = dict(mesh=[2, 2], axes=["replica", "data"], spec=[["replica", "data"]])
    again = _run(2, 2, {**JOB, **mesh, "state": resumed["state"]})
    assert [r["rows"] for r in again] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert again[0]["state"] == again[1]["state"]


def test_a_process_never_reads_the_pages_of_rows_it_does_not_hold(tmp_path):
    # Non-overlapping windows of 2049 uint16 tokens: a window is about one page of its own, so
    # most pages belong to one row's window; each process streams its own copy of the file,
    # evicted from the page cache first, and counts which pages became resident.
    job = {
        **JOB,
        "tokens": 4_000_000,
        "block": 2048,
        "options": dict(seed=1, stride=2048, epochs=1),
        "steps": 30,
        "reads": str(tmp_path),
    }
    reports = _run(2, 2, job)
    for report in reports:
        assert report["pages read"]["own"] >= 30 * 4  # what it streamed was read
        assert report["pages read"]["pages of other rows only"] > 100  # the test can fail
        assert report["pages read"]["other rows' only"] == 0
