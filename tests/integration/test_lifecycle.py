"""A sweep's life on the real local SLURM cluster: requests the cluster refuses stop before anything is submitted,
arrays split at MaxArraySize with one sbatch call each, ``status`` asks sacct once, a preempted cell comes back by
itself (never ``preempted`` while SLURM queues it again), two ``resume`` processes on one folder at the same time
never submit a cell twice, and ``gpudays cancel`` of a pending cell records it cancelled for ``resume``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_until

from orchestrator.cli import main as cli
from orchestrator.cluster import LocalCluster
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import admission, status

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
COMMON = ["cluster=slurm", "model=pythia-tiny", "gpu=cpu", "cluster.cpus_per_gpu=1", "probe.kind=sleep"]


@pytest.fixture
def logged_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sbatch, sacct and squeue on PATH as shims that log each call and run the real command; the log file."""
    calls = tmp_path / "slurm-calls.log"
    shims = tmp_path / "shims"
    shims.mkdir()
    for name in ("sbatch", "sacct", "squeue"):
        real = shutil.which(name)
        assert real, f"{name} is not on PATH"
        shim = shims / name
        shim.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\nexec {real} "$@"\n')
        shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    calls.touch()
    return calls


def test_what_the_cluster_refuses_stops_the_sweep_before_anything_is_written(
    slurm_cluster: LocalCluster, tmp_path: Path, logged_slurm: Path, capsys
) -> None:
    cases = {
        "cluster.partition=gpu-nope": ("'gpu-nope' is not a partition here", "use one of debug, urgent"),
        "cluster.account=nolab": ("'nolab' is not an account of user", "use one of root"),
        "cluster.qos=platinum": ("'platinum' is not a QOS here", "use one of normal"),
        # 8 GPUs on one node of a cluster whose nodes have 4: only the scheduler knows.
        "gpu=a100-80gb": ("Requested node configuration is not available", "gres gpu:a100:4"),
    }
    for override, fragments in cases.items():
        sweep_dir = tmp_path / override.replace("=", "-")
        extra = ["num_gpus=8", "model=pythia-70m"] if override.startswith("gpu=") else []
        code = cli.main(["sweep", "--dir", str(sweep_dir), *COMMON, override, *extra, "model.seq_length=64,65"])
        err = capsys.readouterr().err
        assert code == cli.EXIT_BAD_INPUT, override
        assert "nothing was submitted" in err and "2 cell(s)" in err, err
        for fragment in fragments:
            assert fragment in err, (override, err)
        assert not (sweep_dir / "cells").exists(), "a refused sweep wrote cells"
    assert "sbatch --test-only" in logged_slurm.read_text()
    assert all(
        line.startswith("sbatch --test-only") for line in logged_slurm.read_text().splitlines() if "sbatch" in line
    )


def test_arrays_split_at_max_array_size_one_sbatch_each_and_status_asks_sacct_once(
    slurm_cluster: LocalCluster, tmp_path: Path, logged_slurm: Path, capsys
) -> None:
    assert admission.scheduler_max_array_size() == 1001  # the local cluster's MaxArraySize
    sweep_dir = tmp_path / "arrays"
    # Two resource groups (1 and 2 tasks); the 5 one-task cells split into arrays of 2, 2 and 1.
    code = cli.main(
        ["sweep", "--dir", str(sweep_dir), "--no-report", *COMMON, "cluster.max_array_size=2", "probe.sleep_s=0",
         "model.seq_length=64,65,66,67,68"]
    )  # fmt: skip
    assert code == 0
    code = cli.main(
        ["sweep", "--dir", str(sweep_dir), "--no-report", *COMMON, "probe.sleep_s=0", "num_gpus=2", "num_nodes=2"]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "submitted 5 cell(s) to SLURM as 3 array job(s)" in out
    submits = [
        line
        for line in logged_slurm.read_text().splitlines()
        if line.startswith("sbatch") and "--test-only" not in line
    ]
    assert len(submits) == 4, submits

    paths = SweepPaths(sweep_dir)
    logged_slurm.write_text("")
    assert cli.main(["status", str(sweep_dir)]) == 0
    calls = logged_slurm.read_text().splitlines()
    assert len([c for c in calls if c.startswith("sacct")]) == 1, calls
    assert len(paths.cell_ids()) == 6
    # --watch returns once no cell is pending or running; piped, it prints a line each time the counts change.
    capsys.readouterr()
    assert cli.main(["status", str(sweep_dir), "--watch", "--interval", "1", "--summary"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].endswith("6 cell(s): ok 6"), lines
    assert {s.state for s in status.cell_states(paths)} == {"ok"}


def test_a_preempted_cell_is_requeued_by_the_cluster_and_ends_ok_once(
    slurm_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster = slurm_cluster
    sweep_dir = tmp_path / "preempt"
    # A whole node's CPUs, so that the urgent job below must preempt exactly this cell to run on its node.
    assert cli.main(["sweep", "--dir", str(sweep_dir), "--no-report", *COMMON, "cluster.cpus_per_gpu=8",
                     "probe.sleep_s=10", "model.seq_length=99"]) == 0  # fmt: skip
    paths = SweepPaths(sweep_dir)
    (cid,) = paths.cell_ids()
    job = status.read_attempts(paths, cid)[-1].job_id
    node = wait_until(
        lambda: (lambda out: out.split()[1] if out.startswith("RUNNING") else None)(
            cluster.run_client(["squeue", "-h", "-j", job, "-o", "%T %N"], check=False).strip()
        ),
        60,
        "the cell to start",
    )
    cluster.run_client(
        ["sbatch", "-p", "urgent", "-w", node, "--exclusive", "--time=1", "--output=/dev/null", "--wrap", "sleep 1"]
    )
    observed: list[str] = []

    def look() -> status.CellState:
        state = status.cell_states(paths)[0]
        observed.append(state.state.value)
        return state

    seen = wait_until(
        lambda: (lambda s: s if s.state in status.ACTIVE and "PREEMPTED" in (s.reason or "") else None)(look()),
        60,
        "status to show the preempted cell waiting to run again",
        0.25,
    )
    assert seen.history[0] == "PREEMPTED"
    # Looked at often: for seconds after the preemption sacct's newest run is the preempted one while the
    # controller has the job queued again; status called it `preempted` then, and resume submitted it again.
    final = wait_until(
        lambda: (lambda s: s if s.state not in status.ACTIVE else None)(look()), 120, "the preempted cell to end", 0.25
    )
    assert final.state == "ok", final
    assert "preempted" not in observed, observed
    assert final.record is not None and final.record.environment["slurm_restart_count"] == "1"
    assert len(status.read_attempts(paths, cid)) == 1, "SLURM requeued it; gpudays submitted nothing more"


def test_two_resumes_at_once_never_submit_a_cell_twice(slurm_cluster: LocalCluster, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "twice"
    base = [c for c in COMMON if c != "probe.kind=sleep"]
    args = ["--dir", str(sweep_dir), *base, "model.seq_length=70,71,72"]
    # probe.kind=fail raises in the job: three cells fail for real.
    assert cli.main(["sweep", *args, "probe.kind=fail", "--wait", "--interval", "1", "--no-report"]) == 1
    paths = SweepPaths(sweep_dir)
    assert {s.state for s in status.cell_states(paths)} == {"failed"}
    cli.main(["sweep", *args, "probe.kind=sleep", "probe.sleep_s=0", "--no-report"])  # the fault removed

    procs = [
        subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "resume", str(sweep_dir)], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]  # fmt: skip
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sum("resubmitting 3 cell(s)" in out for out in outputs) == 1, outputs
    assert sum("nothing to resume" in out for out in outputs) == 1, outputs
    for cid in paths.cell_ids():
        assert [a.attempt for a in status.read_attempts(paths, cid)] == [1, 2]
    states = wait_until(
        lambda: (lambda s: s if status.is_done(s) else None)(status.cell_states(paths)), 120, "the reruns to end", 1
    )
    assert {s.state for s in states} == {"ok"}, [(s.cell_id, s.state, s.reason) for s in states]
    for cid in paths.cell_ids():
        assert json.loads(paths.record(cid).read_text())["attempt"] == 2


def test_tasks_cancelled_while_pending_are_lost_at_once_and_resume_reruns_them(
    slurm_cluster: LocalCluster, tmp_path: Path, capsys
) -> None:
    sweep_dir = tmp_path / "scancel"
    code = cli.main(
        ["sweep", "--dir", str(sweep_dir), "--no-report", *COMMON, "probe.sleep_s=3", "cluster.array_parallelism=2",
         "model.seq_length=range(64,76)"]
    )  # fmt: skip
    assert code == 0
    paths = SweepPaths(sweep_dir)
    job_of = {status.read_attempts(paths, cid)[-1].job_id: cid for cid in paths.cell_ids()}
    array = next(iter(job_of)).split("_")[0]
    victims = [f"{array}_{task}" for task in (8, 9, 10, 11)]
    # Two run at a time, three seconds each: tasks 8-11 are still pending, and leave no trace once cancelled.
    slurm_cluster.run_client(["scancel", *victims])
    # Submitted a moment ago, yet not pending: squeue lists the array, and these tasks are not in it.
    now = {s.job_id: s for s in status.cell_states(paths)}
    assert {now[v].state for v in victims} == {"lost"}, [(v, now[v].state, now[v].reason) for v in victims]
    # `gpudays cancel` of one cell still pending (task 7): scancelled, and recorded cancelled, not lost.
    capsys.readouterr()
    assert cli.main(["cancel", str(sweep_dir), job_of[f"{array}_7"][:6]]) == 0
    assert f"cancelled 1 cell(s) of {sweep_dir}: {job_of[f'{array}_7']} (job {array}_7, was pending)" in (
        capsys.readouterr().out
    )
    states = wait_until(
        lambda: (lambda s: s if status.is_done(s) else None)(status.cell_states(paths)), 120, "the others to end", 1
    )
    seen = [(s.job_id, s.state, s.reason) for s in states]
    assert status.counts(states) == {"ok": 7, "cancelled": 1, "lost": 4}, seen
    capsys.readouterr()
    assert cli.main(["resume", str(sweep_dir), "--wait", "--interval", "1"]) == 0
    out = capsys.readouterr().out
    assert "resubmitting 5 cell(s)" in out and out.strip().splitlines()[-1] == "12 cell(s): ok 12", out
    assert sorted(len(status.read_attempts(paths, cid)) for cid in paths.cell_ids()) == [1] * 7 + [2] * 5


def test_a_held_task_is_released_by_resume_and_a_cancelled_array_is_rerun(
    slurm_cluster: LocalCluster, tmp_path: Path, capsys
) -> None:
    sweep_dir = tmp_path / "held"
    args = ["--dir", str(sweep_dir), "--no-report", *COMMON, "probe.sleep_s=2", "cluster.array_parallelism=1"]
    assert cli.main(["sweep", *args, "model.seq_length=80,81,82"]) == 0
    paths = SweepPaths(sweep_dir)
    jobs = sorted(status.read_attempts(paths, cid)[-1].job_id for cid in paths.cell_ids())
    held_job = jobs[-1]
    slurm_cluster.run_client(["scontrol", "hold", held_job])
    held = wait_until(
        lambda: (lambda s: s if s.state == "held" else None)(
            next(s for s in status.cell_states(paths) if s.job_id == held_job)
        ),
        30,
        "status to show the held task",
    )
    assert "JobHeld" in (held.reason or "") and held.held is not None
    # Held waits for a person, not for time: waiting ends once the others are done.
    wait_until(lambda: status.is_done(status.cell_states(paths)), 120, "the other tasks to end", 1)
    assert status.counts(status.cell_states(paths)) == {"held": 1, "ok": 2}
    capsys.readouterr()
    assert cli.main(["resume", str(sweep_dir)]) == 0
    assert f"released job {held_job}" in capsys.readouterr().out
    states = wait_until(
        lambda: (lambda s: s if status.is_done(s) else None)(status.cell_states(paths)), 120, "the released task", 1
    )
    assert status.counts(states) == {"ok": 3}
    assert all(len(status.read_attempts(paths, cid)) == 1 for cid in paths.cell_ids()), "released, not resubmitted"

    # A whole array cancelled before any task started: every cell is cancelled, and resume reruns them.
    assert cli.main(["sweep", *args, "model.seq_length=83,84"]) == 0
    new = [cid for cid in paths.cell_ids() if status.read_attempts(paths, cid)[-1].job_id not in jobs]
    array = status.read_attempts(paths, new[0])[-1].job_id.split("_")[0]
    slurm_cluster.run_client(["scancel", array])
    states = wait_until(
        lambda: (lambda s: s if status.is_done(s) else None)(status.cell_states(paths)), 60, "the cancel to show", 1
    )
    assert {s.state for s in states if s.cell_id in new} == {"cancelled"}, [(s.state, s.reason) for s in states]
    assert cli.main(["resume", str(sweep_dir), "--wait", "--interval", "1"]) == 0
    assert status.counts(status.cell_states(paths)) == {"ok": 5}
