"""A sweep's life on this machine: the submitted callable and its requeue state, what goes to sbatch, and two
commands on one folder at once (real processes, cluster=local, a probe that returns at once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest

from orchestrator import cli, launch
from orchestrator.jobside import SIGNAL_DELAY_S, CellJob
from orchestrator.paths import SweepPaths

REPO = Path(__file__).resolve().parents[2]


def test_cell_job_checkpoint_resubmits_itself_with_the_requeue_counted() -> None:
    job = CellJob("/sweeps/demo", "abc123", attempt=2)
    job._requeue_reason = "timeout"
    delayed = job.checkpoint()
    # What submitit pickles for the next run, read back as the requeued job would.
    again = cloudpickle.loads(cloudpickle.dumps(delayed)).function
    assert isinstance(again, CellJob)
    assert (again.sweep_root, again.cell_id, again.attempt) == ("/sweeps/demo", "abc123", 2)
    assert again.requeues == {"timeout": 1, "preemption": 0}
    assert again._requeue_reason is None
    # A requeue not announced as a timeout is a preemption (SLURM's signal without a near time limit).
    assert again.checkpoint().function.requeues == {"timeout": 1, "preemption": 1}


def test_slurm_jobs_get_the_time_limit_warning_the_job_side_acts_on(make_cell) -> None:
    params = launch.slurm_parameters(launch.resources(make_cell("cluster=slurm")))
    assert params["signal_delay_s"] == SIGNAL_DELAY_S


def test_cell_config_round_trips_through_the_fast_writer(make_cell, tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    cell = make_cell("cluster=slurm", "+cluster.env.NCCL_IB_DISABLE='0'", "model.lr=0.0003")
    paths = SweepPaths(tmp_path)
    launch.write_cell(paths, "c1", cell)
    assert OmegaConf.to_container(OmegaConf.load(paths.cell_config("c1")), resolve=True) == cell
    before = paths.cell_config("c1").stat().st_mtime_ns
    launch.write_cell(paths, "c1", cell)
    assert paths.cell_config("c1").stat().st_mtime_ns == before, "the same config is not written again"


def _gpudays(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_two_resumes_at_once_rerun_each_failed_cell_once(tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "s"
    common = ["--dir", str(sweep_dir), "probe.kind=sleep", "model.seq_length=32,48,64"]
    # time.sleep(-1) raises in the job: three cells fail for real.
    assert cli.main(["sweep", *common, "probe.sleep_s=-1", "--no-report"]) == 1
    paths = SweepPaths(sweep_dir)
    cells = paths.cell_ids()
    assert len(cells) == 3
    assert all(json.loads(paths.record(c).read_text())["status"] == "failed" for c in cells)
    assert "ValueError" in json.loads(paths.record(cells[0]).read_text())["traceback"]
    # Remove the fault: the same sweep again with a good setting rewrites the cells' configs (the probe's settings
    # are not part of a cell's identity) and submits nothing. Then resume twice at once.
    capsys.readouterr()
    assert cli.main(["sweep", *common, "probe.sleep_s=0", "--no-report"]) == 1
    assert "3 cell(s) already in this sweep" in capsys.readouterr().out
    assert all("sleep_s: 0.0" in paths.cell_config(c).read_text() for c in cells)

    procs = [_gpudays("resume", str(sweep_dir)) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sum("resubmitting 3 cell(s)" in out for out in outputs) == 1, outputs
    assert sum("nothing to resume" in out for out in outputs) == 1, outputs
    for c in cells:
        attempts = [json.loads(line) for line in paths.attempts(c).read_text().splitlines()]
        assert [a["attempt"] for a in attempts] == [1, 2]
        record = json.loads(paths.record(c).read_text())
        assert (record["status"], record["attempt"]) == ("ok", 2)
        # The failed attempt's record is kept under its attempt's name.
        assert json.loads(paths.cell_dir(c).joinpath("record.attempt1.json").read_text())["status"] == "failed"


def test_two_sweeps_at_once_into_one_folder_submit_each_cell_once(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "s"
    args = ["sweep", "--dir", str(sweep_dir), "probe.kind=sleep", "model.seq_length=32,48", "--no-report"]
    procs = [_gpudays(*args) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sum("2 cell(s) already in this sweep" in out for out in outputs) == 1, outputs
    paths = SweepPaths(sweep_dir)
    for c in paths.cell_ids():
        assert len(paths.attempts(c).read_text().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--only", "timeout,exploded"], "unknown state(s) exploded"),
        (["--time-limit", "0"], "--time-limit 0"),
        (["--time-factor", "-1"], "--time-factor -1"),
    ],
)
def test_resume_refuses_bad_flags_naming_what_is_accepted(tmp_path: Path, capsys, args, message) -> None:
    (tmp_path / "cells").mkdir()
    assert cli.main(["resume", str(tmp_path), *args]) == cli.EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_status_of_a_folder_that_is_not_a_sweep_says_so(tmp_path: Path, capsys) -> None:
    assert cli.main(["status", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    assert "not a sweep folder" in capsys.readouterr().err
