"""mesh3d across the local SLURM cluster's two nodes, through a real sweep with ``--wait``: two pipeline stages,
one on each node (the mesh puts the pipeline outermost), with one rank a node, with two data-parallel replicas
a node, and with a tensor-parallel pair a node; each with the settings of a large run: an uneven split of the
layers, two stages a rank (interleaved 1F1B) and selective checkpointing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main as cli
from orchestrator.store.paths import SweepPaths

pytestmark = [pytest.mark.slurm, pytest.mark.mesh3d]


def test_pipeline_stages_on_different_nodes(slurm_cluster, tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "slurm-mesh3d"
    args = [
        "sweep", "-m", "--dir", str(sweep_dir), "cluster=slurm", "model=pythia-tiny", "gpu=cpu", "probe=quick",
        "cluster.cpus_per_gpu=1", "cluster.time_limit_min=10", "num_gpus=2,4", "num_nodes=2",
        "method.engine=mesh3d", "probe.profile=false", "method.tp=1,2", "method.pp=2", "method.pp_microbatches=4",
        # the settings of a large run: an uneven split (stages of 1, 2, 1 and 1 layers, two a rank), an
        # interleaved schedule and selective checkpointing
        "model.num_layers=5", "model.num_parameters=null", "method.pp_schedule=interleaved_1f1b",
        "method.pp_layers=1+2+1+1", "method.activation_checkpointing=true", "method.checkpoint_policy=selective",
        "--wait",
    ]  # fmt: skip
    code = cli.main(args)
    out = capsys.readouterr().out
    assert code == 0, out

    paths = SweepPaths(sweep_dir)
    records = {cid: json.loads(paths.record(cid).read_text()) for cid in paths.cell_ids()}
    assert len(records) == 3, out  # tp=2 on 2 GPUs is refused: tp x pp = 4
    assert all(r["status"] == "ok" for r in records.values()), {c: r["reason"] for c, r in records.items()}
    by_mesh = {tuple(r["environment"]["mesh3d"]["mesh_shape"]): r["environment"] for r in records.values()}
    assert set(by_mesh) == {(2, 1, 1), (2, 2, 1), (2, 1, 2)}
    assert by_mesh[(2, 1, 1)]["rank_nodes"] == ["node1", "node2"]  # stage 0 on node1, stage 1 on node2
    for mesh in ((2, 2, 1), (2, 1, 2)):  # each node holds one stage: its replicas or its tensor pair
        assert by_mesh[mesh]["rank_nodes"] == ["node1", "node1", "node2", "node2"]
    assert all(env["mesh3d"]["bubble_measured"] is not None for env in by_mesh.values())
    for record in records.values():
        method = record["config"]["method"]
        assert (method["pp_schedule"], method["pp_layers"], method["checkpoint_policy"]) == (
            "interleaved_1f1b", "1+2+1+1", "selective"
        )  # fmt: skip
