"""FSDP2 across the local SLURM cluster's two nodes: one rank on node1 and one on node2 for each sharding option,
hybrid included (one shard group per node, replicas across the two), through a real sweep with ``--wait``."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.cli import main as cli
from orchestrator.store.paths import SweepPaths

pytestmark = [pytest.mark.slurm, pytest.mark.fsdp]

SHARDINGS = ("full", "grad_op", "none", "hybrid")


def test_every_fsdp_sharding_across_two_nodes(slurm_cluster, tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "slurm-fsdp"
    args = [
        "sweep", "-m", "--dir", str(sweep_dir), "cluster=slurm", "model=pythia-tiny", "gpu=cpu", "probe=quick",
        "cluster.cpus_per_gpu=1", "cluster.time_limit_min=10", "num_gpus=2", "num_nodes=2", "method.engine=fsdp",
        f"method.fsdp_sharding={','.join(SHARDINGS)}", "method.micro_batch_size=2",
        "probe.profile=false",  # the sweep's profile job is test_slurm_sweep.py's
        "--wait",
    ]  # fmt: skip
    code = cli.main(args)
    out = capsys.readouterr().out
    assert code == 0, out

    paths = SweepPaths(sweep_dir)
    records = {cid: json.loads(paths.record(cid).read_text()) for cid in paths.cell_ids()}
    assert len(records) == len(SHARDINGS)
    assert all(r["status"] == "ok" for r in records.values()), {c: r["reason"] for c, r in records.items()}
    by_sharding = {r["settings"]["fsdp_sharding"]: r for r in records.values()}
    assert set(by_sharding) == set(SHARDINGS)
    for sharding, record in by_sharding.items():
        env = record["environment"]
        assert env["engine"] == "fsdp" and env["fsdp"]["sharding"] == sharding
        assert env["rank_nodes"] == ["node1", "node2"] and env["world_size"] == 2
    assert by_sharding["hybrid"]["environment"]["fsdp"]["mesh_shape"] == [2, 1]  # a shard group per node
    assert by_sharding["full"]["environment"]["fsdp"]["mesh_shape"] == [2]

    table = pd.read_csv(sweep_dir / "cells.csv")
    assert sorted(table["fsdp_sharding"]) == sorted(SHARDINGS) and set(table["engine"]) == {"fsdp"}
    assert table["step_time_s"].gt(0).all() and table["predicted_peak_memory_gib"].notna().all()
