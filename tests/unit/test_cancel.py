"""``gpudays cancel``: the sweep's queued and running jobs (or the named cells'), one scancel, each cell recorded
as cancelled so that ``status`` says so and ``resume`` reruns it. The scheduler is faked: sacct and squeue text as
SLURM prints it, scancel noted."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from orchestrator.cli import main as cli
from orchestrator.cli.errors import Exit
from orchestrator.slurm import commands as slurm
from orchestrator.store.attempts import Attempt
from orchestrator.store.durable import append_jsonl, write_json_atomic
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import Record, read_record
from orchestrator.store.states import State, rerun_selectable
from orchestrator.submission import status

SACCT = "40_0|41|RUNNING|0:0|None\n40_[1-3]|40|PENDING|0:0|None\n"
SQUEUE = "40_0|RUNNING|None\n40_1|PENDING|JobArrayTaskLimit\n40_3|PENDING|JobHeldUser\n"


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[SweepPaths, list[list[str]]]:
    """run: running (40_0); pend: pending (40_1); held: held by its user (40_3); done: ok; new: never submitted.
    Returns the folder and the job ids of each scancel."""
    paths = SweepPaths(tmp_path / "sweep")
    jobs = {"run": "40_0", "pend": "40_1", "held": "40_3", "done": "39"}
    for cid in ("done", "held", "new", "pend", "run"):
        paths.cell_config(cid).parent.mkdir(parents=True)
        paths.cell_config(cid).write_text("name: t\nnum_gpus: 1\n")
        if cid in jobs:
            append_jsonl(paths.attempts(cid), {**asdict(Attempt(cid, 1, jobs[cid], "slurm")), "submitted_at": "x"})
    write_json_atomic(paths.record("done"), {"schema_version": 1, "cell_id": "done", "status": "ok", "attempt": 1})
    monkeypatch.setattr(slurm, "sacct", lambda ids: slurm.parse_sacct(SACCT))
    monkeypatch.setattr(slurm, "squeue", lambda ids: slurm.parse_squeue(SQUEUE))
    scancels: list[list[str]] = []
    monkeypatch.setattr(slurm, "cancel", lambda ids: scancels.append([str(i) for i in ids]))
    return paths, scancels


def test_cancel_scancels_every_queued_and_running_job_and_records_each_cell_cancelled(sweep, capsys) -> None:
    paths, scancels = sweep
    assert cli.main(["cancel", str(paths.root)]) == Exit.OK
    out = capsys.readouterr().out
    assert scancels == [["40_3", "40_1", "40_0"]], "one scancel, for the held, pending and running jobs"
    assert out.startswith(f"cancelled 3 cell(s) of {paths.root}: held (job 40_3, was held), pend (job 40_1, was ")
    assert "run (job 40_0, was running)" in out and f"gpudays resume {paths.root}" in out
    states = {s.cell_id: s for s in status.cell_states(paths)}  # the scheduler still says running: the record wins
    for cid in ("held", "pend", "run"):
        record = read_record(paths.record(cid), cid)
        assert isinstance(record, Record) and record.attempt == 1 and record.config.get("name") == "t"
        assert states[cid].state == "cancelled" and "gpudays cancel" in (states[cid].reason or "")
        assert rerun_selectable(states[cid].state, None), "resume reruns it"
    assert (states["done"].state, states["new"].state) == (State.OK, State.NEW)
    # Nothing left to cancel: said so, and no scancel.
    assert cli.main(["cancel", str(paths.root)]) == Exit.OK
    assert "nothing to cancel" in capsys.readouterr().out and len(scancels) == 1


def test_cancel_of_named_cells_cancels_only_them_and_says_why_it_leaves_the_others(sweep, capsys) -> None:
    paths, scancels = sweep
    assert cli.main(["cancel", str(paths.root), "pe", "done", "new"]) == Exit.OK
    said = capsys.readouterr()
    assert scancels == [["40_1"]] and "cancelled 1 cell(s)" in said.out
    assert "done: not cancelled: ok: no job of it is queued or running" in said.err
    assert "new: not cancelled: new" in said.err
    assert read_record(paths.record("run"), "run") is None, "a cell not named is left alone"
    assert cli.main(["cancel", str(paths.root), "zzz"]) == Exit.BAD_INPUT
    assert "'zzz' matches no cell; nothing was cancelled" in capsys.readouterr().err and len(scancels) == 1


def test_a_record_the_job_wrote_meanwhile_is_kept_and_an_older_attempts_is_moved_aside(
    sweep, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    paths, _ = sweep
    # An older attempt's record left behind (a resume killed before it moved it aside).
    append_jsonl(paths.attempts("pend"), {**asdict(Attempt("pend", 2, "40_1", "slurm")), "submitted_at": "x"})
    write_json_atomic(paths.record("pend"), {"schema_version": 1, "cell_id": "pend", "status": "failed", "attempt": 1})

    def job_ends_first(ids: list[slurm.JobId]) -> None:
        # The running job ended ok just before its cancel; the held one's SIGTERM came first and it recorded itself.
        write_json_atomic(paths.record("run"), {"schema_version": 1, "cell_id": "run", "status": "ok", "attempt": 1})
        write_json_atomic(
            paths.record("held"), {"schema_version": 1, "cell_id": "held", "status": "cancelled", "attempt": 1}
        )

    monkeypatch.setattr(slurm, "cancel", job_ends_first)
    assert cli.main(["cancel", str(paths.root)]) == Exit.OK
    assert "run: its job had ended ok before the cancel reached it" in capsys.readouterr().err
    assert json.loads(paths.record("run").read_text())["status"] == "ok"
    held = read_record(paths.record("held"), "held")
    assert isinstance(held, Record) and held.reason is None, "the job's own record stands"
    kept = read_record(paths.cell_dir("pend") / "record.attempt1.json", "pend")
    assert isinstance(kept, Record) and kept.status.value == "failed"
    new = read_record(paths.record("pend"), "pend")
    assert isinstance(new, Record) and new.attempt == 2 and new.status.value == "cancelled"
    assert not list(paths.cell_dir("pend").glob(".record*")), "nothing left behind"


def test_when_scancel_fails_nothing_is_recorded_and_it_exits_3(sweep, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    paths, _ = sweep

    def refused(ids: list[slurm.JobId]) -> None:
        raise slurm.SlurmUnavailable("scancel failed (exit 1): Unable to contact slurm controller")

    monkeypatch.setattr(slurm, "cancel", refused)
    assert cli.main(["cancel", str(paths.root)]) == Exit.SCHEDULER
    assert "Unable to contact slurm controller" in capsys.readouterr().err
    assert all(read_record(paths.record(c), c) is None for c in ("run", "pend", "held"))
