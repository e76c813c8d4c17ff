"""A sweep's life on this machine: the submitted callable and its requeue state, what goes to sbatch, and flags
refused before anything runs. Two commands on one folder at once (real processes, seconds each) are in
tests/integration/test_local_concurrency.py."""

from __future__ import annotations

import os
from pathlib import Path

import cloudpickle
import pytest

from orchestrator.cli import main as cli
from orchestrator.config.schema import to_config
from orchestrator.job.entry import SIGNAL_DELAY_S, CellJob
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import launch


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
    params = launch.slurm_parameters(launch.resources(to_config(make_cell("cluster=slurm"))))
    assert params["signal_delay_s"] == SIGNAL_DELAY_S


def test_a_local_job_leaves_no_literal_job_id_folder(make_cell, tmp_path: Path, monkeypatch) -> None:
    from orchestrator.submission import local

    # The job is a stand-in, print: what is tested is the folder.
    monkeypatch.setattr(local, "CellJob", lambda *args: print)  # a builtin job: it unpickles anywhere
    paths = SweepPaths(tmp_path / "s")
    cell = to_config(make_cell("model=pythia-tiny", "gpu=cpu", "num_gpus=1"))
    launch.write_cell(paths, "c1", cell)
    (attempt,) = local.submit_local(paths, {"c1": cell}, poll_s=0.05)
    assert paths.job_dir(str(attempt.job_id)).is_dir(), "the job's own folder, named by its id"
    assert not paths.submitit_folder().exists(), sorted(p.name for p in paths.jobs_dir.iterdir())


def test_cell_config_round_trips_through_the_fast_writer(make_cell, tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    cell = make_cell("cluster=slurm", "+cluster.env.NCCL_IB_DISABLE='0'", "model.lr=0.0003")
    paths = SweepPaths(tmp_path)
    launch.write_cell(paths, "c1", to_config(cell))
    assert OmegaConf.to_container(OmegaConf.load(paths.cell_config("c1")), resolve=True) == cell
    before = paths.cell_config("c1").stat().st_mtime_ns
    launch.write_cell(paths, "c1", to_config(cell))
    assert paths.cell_config("c1").stat().st_mtime_ns == before, "the same config is not written again"


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


def test_a_command_waiting_for_the_sweep_lock_says_so_and_for_whom(tmp_path: Path) -> None:
    # A second `sweep` on a locked folder waited about 75 s in silence.
    import threading

    from orchestrator.submission import intents

    paths = SweepPaths(tmp_path / "s")
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with intents.sweep_lock(paths):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    said: list[str] = []
    threading.Timer(0.3, release.set).start()
    with intents.sweep_lock(paths, on_wait=said.append) as mine:
        assert mine
    thread.join()
    assert len(said) == 1 and said[0].startswith(f"process {os.getpid()} on ") and " since " in said[0], said
    with intents.sweep_lock(paths, on_wait=said.append):  # a free lock: nothing to say
        pass
    assert len(said) == 1
