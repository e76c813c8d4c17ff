"""Faults on the real local SLURM cluster, all in one sweep: a cell cancelled with scancel while running, one whose
node's slurmd is killed mid-job, one over its time limit, one requeued with ``scontrol requeue``, one whose probe
raises, and one whose record is damaged on disk after it was written.

``status`` must tell each apart; then, with the faults removed, ``resume`` must end every cell ok exactly once,
with no record lost and one row per cell in cells.csv. Cells that need not measure use ``probe.kind=sleep``; the
failing cell runs the real DeepSpeed probe in an environment torch rejects (``TORCH_DISTRIBUTED_DEBUG=bogus`` in
``cluster.env``: a site's misconfiguration that nothing before submission can see).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
from waiting import wait_until

from orchestrator.cli import main as cli
from orchestrator.cluster import LocalCluster
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import status

pytestmark = [pytest.mark.slurm, pytest.mark.deepspeed]

COMMON = ["cluster=slurm", "model=pythia-tiny", "gpu=cpu", "cluster.cpus_per_gpu=1", "cluster.time_limit_min=5"]
SLEEP = ["probe.kind=sleep"]
# One cell per fault; each differs from the others in a setting that is part of its identity (sequence length),
# and carries its fault in settings that are not (probe and cluster), so that the same cell can be fixed.
FAULTS: dict[str, list[str]] = {
    # A whole node's CPUs, so that no other cell shares the node that is killed.
    "node_fail": [*SLEEP, "model.seq_length=33", "probe.sleep_s=300", "cluster.cpus_per_gpu=8"],
    "cancelled": [*SLEEP, "model.seq_length=34", "probe.sleep_s=300"],
    # Asks to be requeued near its 1-minute limit (cluster.max_requeue_on_timeout=1), then times out for good.
    "timeout": [*SLEEP, "model.seq_length=35", "probe.sleep_s=600", "cluster.time_limit_min=1"],
    "requeued": [*SLEEP, "model.seq_length=36", "probe.sleep_s=15"],
    "corrupt": [*SLEEP, "model.seq_length=37", "probe.sleep_s=1"],
    # DeepSpeed builds its CPU comm op first: minutes on a busy machine. A time-limit warning during that build
    # would make the cell a timeout (the build dies of the signal), so this cell gets room to reach its fault.
    "failed": [
        "probe=quick",
        "method.micro_batch_size=4",
        "+cluster.env.TORCH_DISTRIBUTED_DEBUG=bogus",
        "cluster.time_limit_min=20",
        "probe.profile=false",
    ],
}
FIXES: dict[str, list[str]] = {
    "node_fail": [*FAULTS["node_fail"][:-2], "probe.sleep_s=1", "cluster.cpus_per_gpu=8"],
    "cancelled": [*FAULTS["cancelled"][:-1], "probe.sleep_s=1"],
    "timeout": [*FAULTS["timeout"][:-2], "probe.sleep_s=1", "cluster.time_limit_min=1"],
    "requeued": FAULTS["requeued"],
    "corrupt": FAULTS["corrupt"],
    "failed": ["probe=quick", "method.micro_batch_size=4", "cluster.time_limit_min=20", "probe.profile=false"],
}


@dataclass
class FaultedSweep:
    paths: SweepPaths
    cell: dict[str, str]
    """Fault name -> cell id."""
    states: dict[str, status.CellState]
    """Each cell's state once no cell was pending or running any more."""
    seen: dict[str, set[str]] = field(default_factory=dict)
    """Every ``state: reason`` that ``status`` showed for a cell while the faults happened."""
    status_text: str = ""


def sweep(paths: SweepPaths, overrides: list[str]) -> str:
    """Add one cell to the sweep (or rewrite its config); its id."""
    before = set(paths.cell_ids())
    cli.main(["sweep", "--dir", str(paths.root), "--no-report", *COMMON, *overrides])
    added = set(paths.cell_ids()) - before
    return added.pop() if added else ""


def job_of(paths: SweepPaths, cell_id: str) -> str:
    return status.read_attempts(paths, cell_id)[-1].job_id


def squeue(cluster: LocalCluster, job_id: str, fmt: str) -> str:
    return cluster.run_client(["squeue", "-h", "-j", job_id, "-o", fmt], check=False).strip()


def sacct_runs(cluster: LocalCluster, job_id: str) -> list[str]:
    out = cluster.run_client(["sacct", "-n", "-P", "-X", "-D", "-o", "JobID,State", "-j", job_id.split("_")[0]])
    return [line.split("|")[1].split()[0] for line in out.splitlines() if line.split("|")[0] == job_id]


@pytest.fixture(scope="module")
def faulted(slurm_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> FaultedSweep:
    cluster = slurm_cluster
    paths = SweepPaths(tmp_path_factory.mktemp("faults") / "sweep")
    cell: dict[str, str] = {}
    # The node-fail cell first, so that it holds a node of its own before the others are placed.
    cell["node_fail"] = sweep(paths, FAULTS["node_fail"])
    node_job = job_of(paths, cell["node_fail"])
    wait_until(lambda: squeue(cluster, node_job, "%T") == "RUNNING", 60, "the node-fail cell to start")
    for name in ("cancelled", "timeout", "requeued", "corrupt", "failed"):
        cell[name] = sweep(paths, FAULTS[name])
    assert all(cell.values()) and len(set(cell.values())) == 6, cell
    job = {name: job_of(paths, cid) for name, cid in cell.items()}

    seen: dict[str, set[str]] = {name: set() for name in cell}

    def look() -> dict[str, status.CellState]:
        by_id = {s.cell_id: s for s in status.cell_states(paths)}
        now = {name: by_id[cid] for name, cid in cell.items()}
        for name, s in now.items():
            seen[name].add(f"{s.state}: {s.reason}")
        return now

    # scancel while running.
    wait_until(lambda: squeue(cluster, job["cancelled"], "%T") == "RUNNING", 60, "the cell to cancel to start")
    cluster.run_client(["scancel", job["cancelled"]])
    # scontrol requeue while running: SLURM stops it and starts it again, under the same job id.
    wait_until(lambda: squeue(cluster, job["requeued"], "%T") == "RUNNING", 60, "the cell to requeue to start")
    time.sleep(2)
    cluster.run_client(["scontrol", "requeue", job["requeued"]])
    # Kill the node under the node-fail cell; with requeue off for this job, SLURM ends it as NODE_FAIL instead of
    # requeueing it (the cluster's JobRequeue=1 would, and the cell would then show pending, requeued).
    node = squeue(cluster, node_job, "%N")
    assert node in cluster.node_names, node
    cluster.run_client(["scontrol", "update", f"jobid={node_job}", "requeue=0"])
    cluster.kill_node(node)
    try:
        wait_until(
            lambda: look() and "NODE_FAIL" in sacct_runs(cluster, node_job), 90, f"{node_job} to end NODE_FAIL", 2
        )
    finally:
        cluster.start_node(node)
    # Damage a record after it was written.
    record = paths.record(cell["corrupt"])
    wait_until(record.exists, 60, "the record of the cell to corrupt")
    text = record.read_text()
    record.write_text(text[: len(text) // 2])

    states = wait_until(
        lambda: (lambda now: now if status.is_done(list(now.values())) else None)(look()),
        900,
        "every cell to end",
        interval_s=2,
    )
    cli_out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.main", "status", str(paths.root)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return FaultedSweep(paths, cell, states, seen, cli_out)


def test_status_tells_each_fault_apart(faulted: FaultedSweep) -> None:
    got = {name: s.state for name, s in faulted.states.items()}
    assert got == {
        "node_fail": "node_fail",
        "cancelled": "cancelled",
        "timeout": "timeout",
        "requeued": "ok",
        "corrupt": "corrupt",
        "failed": "failed",
    }, {name: (s.state, s.reason) for name, s in faulted.states.items()}
    for name in ("node_fail", "cancelled", "timeout", "corrupt", "failed"):
        assert faulted.states[name].reason, name
    # One sacct call for the whole sweep and a table: every state and every cell id is on screen.
    for state in ("node_fail 1", "cancelled 1", "timeout 1", "ok 1", "corrupt 1", "failed 1"):
        assert state in faulted.status_text, faulted.status_text
    assert all(cid in faulted.status_text for cid in faulted.cell.values())


def test_requeued_cell_was_shown_pending_again_and_ran_to_the_end_once(faulted: FaultedSweep) -> None:
    shown = faulted.seen["requeued"]
    assert any(s.startswith(("pending:", "running:")) and "requeued" in s for s in shown), shown
    record = faulted.states["requeued"].record
    assert record is not None and record.attempt == 1
    assert record.environment["slurm_restart_count"] == "1"


def test_timed_out_cell_requeued_itself_once_then_ended_as_timeout(faulted: FaultedSweep) -> None:
    state = faulted.states["timeout"]
    assert state.scheduler_state == "TIMEOUT"
    # Its first run asked for a requeue before the limit (max_requeue_on_timeout=1); the second ran out.
    assert state.history == ("REQUEUED",), state
    assert state.log is not None
    log = state.log.read_text()
    assert "requeuing cell" in log and "requeue(s) used: the cell runs on" in log


def test_failed_cell_has_its_exception_and_traceback_in_the_record(faulted: FaultedSweep) -> None:
    record = faulted.states["failed"].record
    assert record is not None and record.status == "failed"
    assert "TORCH_DISTRIBUTED_DEBUG" in (record.reason or "")
    assert record.traceback and "Traceback" in record.traceback and "ValueError" in record.traceback


def test_node_fail_and_corrupt_are_named(faulted: FaultedSweep) -> None:
    assert "NODE_FAIL" in (faulted.states["node_fail"].reason or "")
    assert "not valid JSON" in (faulted.states["corrupt"].reason or "")


def test_resume_with_the_faults_removed_ends_every_cell_ok_exactly_once(faulted: FaultedSweep, capsys) -> None:
    paths, cell = faulted.paths, faulted.cell
    for overrides in FIXES.values():
        sweep(paths, overrides)  # rewrites the cell's config; submits nothing (the cell is known)
    before = {name: len(status.read_attempts(paths, cid)) for name, cid in cell.items()}
    assert before == dict.fromkeys(cell, 1)
    capsys.readouterr()

    code = cli.main(["resume", str(paths.root), "--time-limit", "2", "--wait", "--interval", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "resubmitting 5 cell(s)" in out

    states = {s.cell_id: s for s in status.cell_states(paths)}
    assert {s.state for s in states.values()} == {"ok"}, {c: (s.state, s.reason) for c, s in states.items()}
    for name, cid in cell.items():
        tries = status.read_attempts(paths, cid)
        record = json.loads(paths.record(cid).read_text())
        expected = 1 if name == "requeued" else 2  # an ok cell is never submitted again
        assert [t.attempt for t in tries] == list(range(1, expected + 1)), name
        assert (record["status"], record["attempt"]) == ("ok", expected), name
    # The timed-out cell's new limit, and no record lost: the replaced ones are kept under their attempt.
    assert "time_limit_min: 2" in paths.cell_config(cell["timeout"]).read_text()
    failed_before = json.loads((paths.cell_dir(cell["failed"]) / "record.attempt1.json").read_text())
    assert failed_before["status"] == "failed"
    assert (paths.cell_dir(cell["corrupt"]) / "record.corrupt-attempt1.json").exists()

    table = pd.read_csv(paths.output("cells.csv"))
    assert sorted(table["cell_id"]) == sorted(cell.values())
    assert list(table["status"]) == ["ok"] * 6
