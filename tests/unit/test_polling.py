"""Waiting for a sweep loads the scheduler and the file system lightly: checks back off while nothing changes, and a
cell whose answer is final is read once per process."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import pytest

from orchestrator.cli import folder
from orchestrator.store import record as record_module
from orchestrator.store.attempts import Attempt
from orchestrator.store.durable import append_jsonl, write_json_atomic
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import BadRecord, Record
from orchestrator.store.states import State
from orchestrator.submission import status


def _state(cid: str, state: State) -> status.CellState:
    return status.CellState(cid, state, 1, "40_0")


def test_waiting_backs_off_while_nothing_changes_and_starts_over_when_something_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, ok, pend = State.RUNNING, State.OK, State.PENDING
    checks = [[pend, pend]] * 6 + [[run, pend]] * 3 + [[run, run]] * 8 + [[ok, ok]]
    answers = iter([[_state(c, s) for c, s in zip("ab", row, strict=True)] for row in checks])
    monkeypatch.setattr(folder, "states_or_records", lambda paths: next(answers))
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    folder.wait_for(SweepPaths(tmp_path), interval_s=5.0)
    assert slept == [
        *(5.0, 10.0, 20.0, 40.0, 60.0, 60.0),  # nothing changes: doubled up to a minute
        *(5.0, 10.0, 20.0),  # a cell started: back to the given interval
        *(5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0, 60.0),  # the second started; then nothing until both end
    ]


def test_a_longer_given_interval_than_a_minute_is_kept() -> None:
    backoff = folder.Backoff(90.0)
    assert [backoff.after(False) for _ in range(3)] == [90.0, 90.0, 90.0]


def test_a_finished_cell_is_read_once_across_checks_until_its_files_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = SweepPaths(tmp_path / "sweep")
    for cid in ("done", "queued"):
        paths.cell_config(cid).parent.mkdir(parents=True)
        paths.cell_config(cid).write_text("name: t\n")
    attempt = Attempt(cell_id="done", attempt=1, job_id="1", submitted_at="2026-11-22T11:00:00+00:00", backend="local")
    append_jsonl(paths.attempts("done"), asdict(attempt))
    rec = {"schema_version": 1, "cell_id": "done", "status": "ok", "attempt": 1, "metrics": {"step_time_s": 1.0}}
    write_json_atomic(paths.record("done"), rec)
    reads: list[str] = []
    real_record, real_attempts = record_module.read_record, status.read_attempts

    def counted_record(path: Path, cell_id: str | None = None) -> Record | BadRecord | None:
        reads.append(f"record {cell_id}")
        return real_record(path, cell_id)

    def counted_attempts(sweep: SweepPaths, cell_id: str) -> list[Attempt]:
        reads.append(f"attempts {cell_id}")
        return real_attempts(sweep, cell_id)

    monkeypatch.setattr(status, "read_record", counted_record)
    monkeypatch.setattr(status, "read_attempts", counted_attempts)

    for _ in range(2):
        states = {s.cell_id: s.state for s in status.cell_states(paths, query_scheduler=False)}
        assert states == {"done": State.OK, "queued": State.NEW}
    assert reads.count("record done") == 1 and reads.count("attempts done") == 1
    assert reads.count("record queued") == 2  # not final: read at every check

    # a rerun: a new attempt, then its record
    append_jsonl(paths.attempts("done"), asdict(Attempt(cell_id="done", attempt=2, job_id="2", backend="local")))
    write_json_atomic(paths.record("done"), {**rec, "status": "oom", "attempt": 2})
    assert {s.cell_id: s.state for s in status.cell_states(paths, query_scheduler=False)}["done"] == State.OOM
    assert reads.count("record done") == 2 and reads.count("attempts done") == 2
