"""``TokenDataset``'s data-parallel share from a process group or a ``DeviceMesh`` dimension, on
real gloo processes: 4 processes as 2 data-parallel x 2 tensor-parallel ranks.

The corpus is ``np.arange``, so a window's first token is its start.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from tests.test_torch import ROOT, epoch_order, init_gloo, run_on_ranks
from tokstream.torch import TokenDataset

WINDOWS, SEED, BLOCK, BATCH = 101, 0, 3, 5  # seed 0: the docs example's default
DP, TP = 2, 2


def dataset(**share) -> TokenDataset:
    return TokenDataset(np.arange(WINDOWS + BLOCK), BLOCK, BATCH, seed=SEED, **share)


def error_of(**share) -> list[str]:
    try:
        dataset(**share)
    except (TypeError, ValueError) as exc:
        return [type(exc).__name__, str(exc)]
    return ["accepted"]


def docs_example():
    """``data_parallel_dataset`` of docs/training.md, run as written."""
    text = (ROOT / "docs" / "training.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (code,) = [block for block in blocks if "def data_parallel_dataset(" in block]
    namespace = {"__name__": "docs_example"}
    exec(compile(code, "docs/training.md", "exec"), namespace)
    return namespace["data_parallel_dataset"]


def stream_as_tp_dp(rank: int, world_size: int, port: int, out: str) -> None:
    init_gloo(rank, world_size, port)
    try:
        documented = docs_example()(np.arange(WINDOWS + BLOCK), BLOCK, BATCH, TP, device="cpu")
        # Rank r sits at (r // TP, r % TP): its tensor-parallel peers are r ^ 1.
        mesh = init_device_mesh("cpu", (DP, TP), mesh_dim_names=("dp", "tp"))
        # Every process makes every group, in the same order, as new_group requires.
        dp_groups = [dist.new_group([tp, TP + tp]) for tp in range(TP)]
        shares = {
            "docs/training.md": documented,
            "device_mesh": dataset(device_mesh=mesh, mesh_dim="dp"),
            "mesh_dim index": dataset(device_mesh=mesh, mesh_dim=0),
            "mesh group": dataset(process_group=mesh.get_group("dp")),
            "new_group": dataset(process_group=dp_groups[rank % TP]),
            "default group": dataset(),
        }
        report = {
            name: {
                "share": [data.rank, data.world_size],
                "starts": [x[:, 0].tolist() for x, _ in data],
            }
            for name, data in shares.items()
        }
        report["errors"] = {
            "group and rank": error_of(process_group=dp_groups[rank % TP], rank=0),
            "group and world_size": error_of(process_group=dp_groups[rank % TP], world_size=2),
            "mesh and rank": error_of(device_mesh=mesh, mesh_dim="dp", rank=0),
            "group and mesh": error_of(process_group=dp_groups[0], device_mesh=mesh),
            "no such dim": error_of(device_mesh=mesh, mesh_dim="pp"),
            "dim out of range": error_of(device_mesh=mesh, mesh_dim=2),
            "2-D mesh, no dim": error_of(device_mesh=mesh),
            "not my group": error_of(process_group=dp_groups[1 - rank % TP]),
        }
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_peers_get_identical_batches_data_parallel_ranks_disjoint_ones(
    monkeypatch, tmp_path
):
    run_on_ranks(monkeypatch, stream_as_tp_dp, DP * TP, str(tmp_path))
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(DP * TP)]
    order = epoch_order(WINDOWS, SEED)
    for name in ("device_mesh", "mesh_dim index", "mesh group", "new_group", "docs/training.md"):
        for rank, report in enumerate(reports):
            assert report[name]["share"] == [rank // TP, DP], name
        starts = [report[name]["starts"] for report in reports]
        # Tensor-parallel peers: the same batches, batch by batch.
        assert starts[0] == starts[1] and starts[2] == starts[3], name
        # Data-parallel ranks: positions dp, dp + DP, ... of the order, disjoint.
        for dp in range(DP):
            flat = sum(starts[dp * TP], [])
            assert flat == order[dp : WINDOWS - WINDOWS % DP : DP].tolist(), name
        assert not set(sum(starts[0], [])) & set(sum(starts[2], []))
    # Without a group: the default group's 4 ranks, every one different.
    assert [r["default group"]["share"] for r in reports] == [[r, 4] for r in range(4)]

    errors = reports[0]["errors"]
    assert all(error[0] == "ValueError" for error in errors.values()), errors
    assert "process_group and rank both" in errors["group and rank"][1]
    assert "process_group and world_size both" in errors["group and world_size"][1]
    assert "device_mesh and rank both" in errors["mesh and rank"][1]
    assert "process_group and device_mesh both" in errors["group and mesh"][1]
    assert "mesh_dim='pp' is not a dimension of device_mesh" in errors["no such dim"][1]
    assert "['dp', 'tp']" in errors["no such dim"][1]
    assert "mesh_dim=2 is not a dimension" in errors["dim out of range"][1]
    assert "mesh_dim must name the data-parallel dimension" in errors["2-D mesh, no dim"][1]
    assert "process_group does not include this process" in errors["not my group"][1]


@pytest.mark.parametrize(
    ("share", "error", "match"),
    [
        ({"process_group": "dp"}, TypeError, "process_group must be a torch.distributed"),
        ({"device_mesh": object()}, TypeError, "device_mesh must be a .*DeviceMesh"),
        ({"mesh_dim": "dp"}, ValueError, "mesh_dim='dp' needs device_mesh"),
        ({"process_group": object(), "rank": 0}, ValueError, "process_group and rank both"),
    ],
)
def test_bad_data_parallel_arguments_are_errors_naming_the_argument(share, error, match):
    with pytest.raises(error, match=match):
        dataset(**share)
