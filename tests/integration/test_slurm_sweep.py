"""A real sweep on the real local SLURM cluster: array jobs through submitit, a 2-node cell, cells.csv."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.cli import main as cli
from orchestrator.store.paths import SweepPaths

pytestmark = [pytest.mark.slurm, pytest.mark.deepspeed]


def test_sweep_of_five_cells_with_a_two_node_cell(slurm_cluster, tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "slurm-sweep"
    common = [
        "--dir",
        str(sweep_dir),
        "cluster=slurm",
        "model=pythia-tiny",
        "gpu=cpu",
        "probe=quick",
        "cluster.cpus_per_gpu=1",
        "cluster.time_limit_min=10",
    ]
    # 4 one-node cells in one array job (same resources: 1 task) ...
    assert (
        cli.main(
            [
                "sweep",
                "-m",
                *common,
                "num_gpus=1",
                "method.activation_checkpointing=false,true",
                "method.precision=bf16,fp32",
                "--no-report",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "submitted 4 cell(s) to SLURM as 1 array job(s)" in out
    # ... and one cell whose 2 ranks run on node1 and node2; --wait blocks until every cell of the sweep ends.
    code = cli.main(["sweep", *common, "num_gpus=2", "num_nodes=2", "--wait"])
    out = capsys.readouterr().out
    assert code == 0, out

    paths = SweepPaths(sweep_dir)
    records = {cid: json.loads(paths.record(cid).read_text()) for cid in paths.cell_ids()}
    assert len(records) == 5
    assert all(r["status"] == "ok" for r in records.values()), {c: r["reason"] for c, r in records.items()}
    (two_node,) = [r for r in records.values() if r["settings"]["num_nodes"] == 2]
    assert two_node["environment"]["rank_nodes"] == ["node1", "node2"]
    assert two_node["environment"]["world_size"] == 2
    array_ids = {r["environment"]["slurm_array_job_id"] for r in records.values() if r["settings"]["num_nodes"] == 1}
    assert len(array_ids) == 1 and None not in array_ids

    table = pd.read_csv(sweep_dir / "cells.csv")
    assert len(table) == 5
    for _, row in table.iterrows():
        rec = records[row["cell_id"]]
        for key in ("model", "gpu", "num_gpus", "num_nodes", "precision", "activation_checkpointing"):
            assert row[key] == rec["settings"][key], key
        assert row["status"] == rec["status"]
        assert row["step_time_s"] == pytest.approx(rec["metrics"]["step_time_s"])
        steps = rec["config"]["model"]["train_steps"]
        assert row["time_to_train_days"] == pytest.approx(steps * rec["metrics"]["step_time_s"] / 86400)
        assert row["gpu_hours"] == pytest.approx(row["time_to_train_days"] * 24 * rec["settings"]["num_gpus"])
