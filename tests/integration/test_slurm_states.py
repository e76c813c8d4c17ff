"""States and exit codes as the real SLURM commands give them: a cell cancelled while it runs is ``cancelled``
(the job asks the scheduler when the SIGTERM comes), a pending cell says why it waits, ``resume --wait`` waits for
the cell it released, a sweep the scheduler cannot be asked about exits 3, and SLURM without a configuration is
one line naming ``eval $(gpudays cluster env)``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import synthetic
from conftest import require_slurm_packages
from waiting import wait_until

from orchestrator.cli import main as cli
from orchestrator.cluster import LocalCluster
from orchestrator.store.attempts import Attempt, append_attempt
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import Record, read_record
from orchestrator.submission import status

pytestmark = pytest.mark.slurm

COMMON = ["cluster=slurm", "model=pythia-tiny", "gpu=cpu", "cluster.cpus_per_gpu=1", "probe.kind=sleep"]


def _done(paths: SweepPaths) -> list[status.CellState] | None:
    states = status.cell_states(paths)
    return states if status.is_done(states) else None


def test_a_running_cell_cancelled_with_scancel_is_cancelled_and_says_so(
    slurm_cluster: LocalCluster, tmp_path: Path
) -> None:
    # scancel 8 s into a 60-minute limit was recorded as timeout, then failed: resume --time-factor was tempted.
    sweep_dir = tmp_path / "cancelled"
    # Two ranks: rank 1 ran on until SLURM killed it, and rank 0 ended with a traceback in its log.
    assert cli.main(["sweep", "--dir", str(sweep_dir), "--no-report", *COMMON, "probe.sleep_s=120", "num_gpus=2"]) == 0
    paths = SweepPaths(sweep_dir)
    (cid,) = paths.cell_ids()
    running = wait_until(
        lambda: (lambda s: s if s.state == "running" else None)(status.cell_states(paths)[0]), 60, "the cell to run"
    )
    # Both ranks past their handlers (a rank writes its file after them): a SIGTERM before would end a rank
    # without a word, as SLURM's default, and the test would judge the start-up, not the cancel.
    wait_until(lambda: len(list(paths.cell_dir(cid).glob("ranks/*.json"))) == 2, 30, "both ranks to start", 0.2)
    slurm_cluster.run_client(["scancel", str(running.job_id)])
    wait_until(lambda: _done(paths), 60, "the cancel to end the job", 1)
    # sacct says CANCELLED a moment before the job has written its record: wait for the record (or its absence).
    wait_until(lambda: isinstance(read_record(paths.record(cid), cid), Record), 10, "the job's record", 0.2)
    record = read_record(paths.record(cid), cid)
    assert isinstance(record, Record)
    (state,) = status.cell_states(paths)
    assert record.status.value == "cancelled" and state.state == "cancelled", (record.status, record.reason)
    assert (record.reason or "").startswith("the job was cancelled (scancel)"), record.reason

    def logs() -> dict[str, str]:
        return {p.name: p.read_text() for p in paths.jobs_dir.rglob("*_log.err")}

    def both_ended(found: dict[str, str]) -> bool:
        return len(found) == 2 and all("ends here" in text for text in found.values())

    # The record is rank 0's; the other rank's last line can reach its log a moment later (its log was once still
    # empty when the record was read): give it 10 s, then judge the logs as they are.
    deadline = time.monotonic() + 10.0
    while not both_ended(found := logs()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert both_ended(found), found
    assert not any("Traceback" in text or "Timed out waiting" in text for text in found.values()), found


def test_a_pending_cell_says_why_and_resume_wait_waits_for_the_cell_it_released(
    slurm_cluster: LocalCluster, tmp_path: Path, capsys
) -> None:
    sweep_dir = tmp_path / "released"
    # The first cell sleeps 10 s: the second, behind it, stays pending long enough to be seen on a busy machine.
    args = ["--dir", str(sweep_dir), "--no-report", *COMMON, "probe.sleep_s=10", "cluster.array_parallelism=1"]
    assert cli.main(["sweep", *args, "model.seq_length=90,91"]) == 0
    paths = SweepPaths(sweep_dir)
    # status showed no reason where squeue said (JobArrayTaskLimit), (Resources) or (Priority).
    waiting = wait_until(
        lambda: next((s for s in status.cell_states(paths) if (s.reason or "").startswith("waiting: ")), None),
        20,
        "a pending cell with squeue's reason",
    )
    assert waiting.state == "pending"
    slurm_cluster.run_client(["scontrol", "hold", str(waiting.job_id)])
    wait_until(lambda: status.counts(status.cell_states(paths)) == {"ok": 1, "held": 1}, 90, "the other cell to end", 1)
    capsys.readouterr()
    # resume --wait released the held cell, said "nothing to resume", and returned in 1 s with the cell pending.
    assert cli.main(["resume", str(sweep_dir), "--wait", "--interval", "1"]) == 0
    assert f"released job {waiting.job_id}" in capsys.readouterr().out
    assert status.counts(status.cell_states(paths)) == {"ok": 2}


def test_a_sweep_while_the_controller_is_down_exits_3(tmp_path: Path, monkeypatch, capsys) -> None:
    # It exited 2, which the README gives to bad input. A slurm.conf whose controller nobody answers for stands in
    # for a controller that is down (the shared cluster is left alone).
    require_slurm_packages()
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=9\nNodeName=n1 CPUs=1 State=UNKNOWN\n"
        "PartitionName=debug Nodes=n1 Default=YES\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert cli.main(["sweep", "--dir", str(tmp_path / "s"), *COMMON]) == 3
    err = capsys.readouterr().err
    assert "the scheduler could not be asked" in err and "Unable to contact slurm controller" in err
    assert not (tmp_path / "s" / "cells").exists()


def test_forgetting_cluster_env_gives_a_hint_not_slurms_dns_errors(tmp_path: Path, monkeypatch, capsys) -> None:
    # Without SLURM_CONF, status printed seven lines of resolve_ctls_from_dns_srv errors, every cell unknown.
    require_slurm_packages()
    config = synthetic.cell_config("pythia-160m", "h100-80gb")
    synthetic.write_cell(tmp_path, "c1", config)
    append_attempt(SweepPaths(tmp_path), Attempt("c1", 1, "99_0", "slurm"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    assert cli.main(["status", str(tmp_path)]) == 0
    said = capsys.readouterr()
    assert "eval $(gpudays cluster env)" in said.err + said.out
    assert "resolve_ctls_from_dns_srv" not in said.err + said.out
