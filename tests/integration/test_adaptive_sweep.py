"""Adaptive sweeps for real: a grid of tiny CPU cells of which one round is measured by the probe, on this machine
(rounds run to the end) and on the local SLURM cluster (a round is an array job; resume --wait goes on), each ending
with every cell answered: measured, or predicted with a 90% interval."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.cli import main as cli
from orchestrator.store.adaptive_state import read_grid, read_state
from orchestrator.store.paths import SweepPaths

pytestmark = pytest.mark.deepspeed

GRID = [
    "model=pythia-tiny",
    "gpu=cpu",
    "probe=quick",
    "num_gpus=1,2",
    "method.zero_stage=0,1,2",
    "method.activation_checkpointing=false,true",
    "probe.profile=false",  # the sweep's profile is tests/integration/test_local_sweep.py's
]
"""8 cells (ZeRO 1 and 2 on one rank are refused): 2 of one rank, 6 of two."""
ADAPTIVE = ["--adaptive", "--target-pct", "10000", "--round-cells", "2"]
"""Rounds of two cells, and a target the first round is sure to meet: before it the CPU is uncalibrated (no interval
at all), after it every interval is finite, if wide. A budget would stop after a number of cells that depends on how
busy this machine is (the budget stop is unit-tested: tests/unit/test_adaptive.py)."""


def assert_every_cell_answered(paths: SweepPaths) -> set[str]:
    grid = {cid for cid, _ in read_grid(paths.adaptive_grid)}
    measured = set(paths.cell_ids())
    assert len(grid) == 8 and measured <= grid
    assert 1 <= len(measured) < len(grid) / 2, measured
    state = read_state(paths)
    assert state.stopped is not None and state.stopped.reason == "target" and len(state.rounds) == 1
    assert measured == state.chosen()
    table = pd.read_csv(paths.root / "cells.csv").set_index("cell_id")
    assert set(table.index) == grid
    assert set(table.loc[sorted(measured), "answer"]) == {"measured"}
    assert set(table.loc[sorted(measured), "status"]) == {"ok"}
    rest = table.drop(index=sorted(measured))
    assert set(rest["answer"]) == {"predicted"} and set(rest["status"]) == {"unmeasured"}
    for _, row in rest.iterrows():
        low, mid, high = (
            row["predicted_step_time_s_low"],
            row["predicted_step_time_s"],
            row["predicted_step_time_s_high"],
        )
        assert math.isfinite(low) and math.isfinite(high) and 0 < low < mid < high, row
    report = (paths.root / "report.md").read_text()
    assert "## Adaptive sweep" in report and f"{len(measured)} of 8 cells measured" in report
    return measured


def test_an_adaptive_sweep_here_runs_its_rounds_to_the_end(tmp_path: Path, capsys) -> None:
    paths = SweepPaths(tmp_path / "adaptive-local")
    code = cli.main(["sweep", "--dir", str(paths.root), *ADAPTIVE, *GRID])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "round 1: measuring" in out and "adaptive sweep stopped: every unmeasured cell's interval" in out
    assert_every_cell_answered(paths)


@pytest.mark.slurm
def test_an_adaptive_sweep_on_slurm_submits_a_round_and_resume_goes_on(slurm_cluster, tmp_path: Path, capsys) -> None:
    paths = SweepPaths(tmp_path / "adaptive-slurm")
    slurm = ["cluster=slurm", "cluster.cpus_per_gpu=1", "cluster.time_limit_min=10"]
    assert cli.main(["sweep", "--dir", str(paths.root), *ADAPTIVE, *GRID, *slurm]) == 0
    out = capsys.readouterr().out
    assert "round 1: measuring" in out and "submitted" in out and "array job" in out
    first = read_state(paths).rounds[0].cells
    assert set(paths.cell_ids()) == set(first)
    # status names the round, and --check says the sweep is not done
    assert cli.main(["status", str(paths.root), "--summary", "--check"]) == 4
    assert "round 1 is the latest" in capsys.readouterr().out
    # resume --wait waits for the round, then decides and runs the rounds left, until the sweep stops
    code = cli.main(["resume", str(paths.root), "--wait", "--interval", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    measured = assert_every_cell_answered(paths)
    assert set(first) <= measured
    assert cli.main(["status", str(paths.root), "--summary", "--check"]) == 0
