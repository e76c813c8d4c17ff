"""The demo sweep end to end on this machine: Hydra grid -> submitit (local) -> DeepSpeed probe -> cells.csv."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.cli import main as cli
from orchestrator.profile import sweep
from orchestrator.profile.record import profiles_in, read_profile
from orchestrator.store.attempts import read_attempts
from orchestrator.store.paths import SweepPaths

pytestmark = pytest.mark.deepspeed


def test_demo_sweep_measures_four_cells_and_writes_cells_csv(tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "demo"
    code = cli.main(["sweep", "--dir", str(sweep_dir)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert not (sweep_dir / "profiles").exists(), "the demo runs with probe.profile=false, to stay short"
    # A line per cell with its own wall time, the table, and every file the report wrote.
    assert [line.split()[0] for line in out.splitlines() if " ok, " in line and " s/step in " in line] == [
        "[1/4]",
        "[2/4]",
        "[3/4]",
        "[4/4]",
    ], out
    written = {Path(line.removeprefix("wrote ").strip()).name for line in out.splitlines() if line.startswith("wrote ")}
    assert {"cells.csv", "best.csv", "frontier.csv", "scaling.csv", "report.md"} <= written, out
    paths = SweepPaths(sweep_dir)
    records = {cid: json.loads(paths.record(cid).read_text()) for cid in paths.cell_ids()}
    assert len(records) == 4
    assert all(r["status"] == "ok" for r in records.values()), {c: r["reason"] for c, r in records.items()}

    table = pd.read_csv(sweep_dir / "cells.csv")
    assert len(table) == 4 and set(table["cell_id"]) == set(records)
    for _, row in table.iterrows():
        rec = records[row["cell_id"]]
        assert row["status"] == "ok"
        assert row["num_gpus"] == rec["settings"]["num_gpus"]
        assert row["activation_checkpointing"] == rec["settings"]["activation_checkpointing"]
        assert row["step_time_s"] == pytest.approx(rec["metrics"]["step_time_s"])
        steps = rec["config"]["model"]["train_steps"]
        assert row["time_to_train_days"] == pytest.approx(steps * rec["metrics"]["step_time_s"] / 86400)
        assert row["gpu_hours"] == pytest.approx(row["time_to_train_days"] * 24 * row["num_gpus"])
    two_rank = [r for r in records.values() if r["settings"]["num_gpus"] == 2]
    assert all(r["environment"]["world_size"] == 2 for r in two_rank)


def test_a_second_run_into_the_same_folder_submits_only_new_cells(tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "grow"
    args = ["sweep", "--dir", str(sweep_dir), "probe=quick", "model=pythia-tiny", "gpu=cpu", "num_gpus=1"]
    assert cli.main(args) == 0
    paths = SweepPaths(sweep_dir)
    (first,) = paths.cell_ids()
    first_record = paths.record(first).read_text()
    # The sweep profiled this machine (one rank, as its cell) before the cell started.
    (profile,) = profiles_in(paths)
    assert read_profile(profile).identity.gpus_per_node == 1
    ended = [r for r in sweep.runs(paths) if r["event"] == "ended"]
    assert [r["outcome"] for r in ended] == ["ok"]
    assert _at(ended[0]["at"]) <= _at(read_attempts(paths, first)[0].submitted_at)
    assert set(sweep.profiles_for(sweep_dir)) == {"cpu"}
    capsys.readouterr()
    assert cli.main([*args, "method.activation_checkpointing=false,true"]) == 0
    out = capsys.readouterr().out
    assert "1 cell(s) already in this sweep" in out
    assert "(reused, not measured again)" in out, out
    assert len(sweep.runs(paths)) == 2 and profiles_in(paths) == [profile]
    assert len(paths.cell_ids()) == 2
    assert paths.record(first).read_text() == first_record, "the measured cell was run again"
    assert len(read_attempts(paths, first)) == 1


def _at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)
