"""A real sweep on the real local SLURM cluster: array jobs through submitit, a 2-node cell, cells.csv."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.cli import main as cli
from orchestrator.profile import sweep
from orchestrator.store.attempts import read_attempts
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

    # The sweep's profiles: a job ahead of each submission's cells, one node for the first, two for the 2-node
    # cell (the inter-node link); each ends on its own, whatever --wait waited for.
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len([r for r in sweep.runs(paths) if r["event"] == "ended"]) < 2:
        time.sleep(2)
    runs = sweep.runs(paths)
    started = [r for r in runs if r["event"] == "started"]
    assert [(r["nodes"], r["where"]) for r in started] == [(1, "slurm"), (2, "slurm")], runs
    assert [r["outcome"] for r in runs if r["event"] == "ended"] == ["ok", "ok"], runs
    cell_jobs = {cid: int(read_attempts(paths, cid)[0].job_id.split("_")[0]) for cid in paths.cell_ids()}
    two_node_id = next(cid for cid, r in records.items() if r["settings"]["num_nodes"] == 2)
    assert int(started[0]["job_id"]) < min(j for c, j in cell_jobs.items() if c != two_node_id)
    assert int(started[0]["job_id"]) < int(started[1]["job_id"]) < cell_jobs[two_node_id]
    profile = sweep.profiles_for(sweep_dir)["cpu"]
    assert profile.identity.nodes == 2 and "inter" in {c.link for c in profile.collectives}, profile.collectives
    capsys.readouterr()
    assert cli.main(["status", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert f"profile of 1 x cpu on 2 nodes (job {started[1]['job_id']}): ok" in out, out
