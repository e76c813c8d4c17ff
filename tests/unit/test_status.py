"""Cell states from records, submissions and the scheduler's accounting (sacct text as SLURM 22.05 prints it)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from orchestrator import status
from orchestrator.paths import SweepPaths, append_jsonl, write_json_atomic

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc)
LONG_AGO = (NOW - dt.timedelta(hours=1)).isoformat()


def submission(attempt: int = 1, job_id: str = "40_3", backend: str = "slurm", at: str = LONG_AGO) -> dict:
    return {"cell_id": "c1", "attempt": attempt, "job_id": job_id, "backend": backend, "submitted_at": at}


def record(status_: str = "ok", attempt: int = 1, **extra: object) -> dict:
    return {"cell_id": "c1", "status": status_, "attempt": attempt, "reason": extra.pop("reason", None), **extra}


def classify(latest, rec=None, problem=None, job=None, asked=True) -> status.CellState:
    return status.classify("c1", latest, rec, problem, job, asked, None, NOW)


# ---- sacct and squeue output ----------------------------------------------------------------------------


def test_sacct_lines_give_each_task_its_newest_run_and_the_runs_before() -> None:
    text = "\n".join(
        [
            "40_0|COMPLETED|0:0",
            "40_1|CANCELLED by 0|0:15",
            "40_2|REQUEUED|0:0",
            "40_2|NODE_FAIL|0:0",
            "40_2|RUNNING|0:0",
            "40_[5-7,9%2]|PENDING|0:0",
            "41|TIMEOUT|0:0",
            "",
        ]
    )
    jobs = status.parse_sacct(text)
    assert jobs["40_0"].state == "COMPLETED" and jobs["40_0"].history == ()
    assert jobs["40_1"].state == "CANCELLED" and jobs["40_1"].exit_code == "0:15"
    assert jobs["40_2"].state == "RUNNING" and jobs["40_2"].history == ("REQUEUED", "NODE_FAIL")
    assert {j for j in jobs if j.startswith("40_")} == {"40_0", "40_1", "40_2", "40_5", "40_6", "40_7", "40_9"}
    assert jobs["40_9"].state == "PENDING"
    assert jobs["41"].state == "TIMEOUT"


def test_squeue_lines_expand_pending_array_ranges() -> None:
    jobs = status.parse_squeue("40_[3-4%16]|PENDING\n40_1|RUNNING\n")
    assert {j: v.state for j, v in jobs.items()} == {"40_3": "PENDING", "40_4": "PENDING", "40_1": "RUNNING"}


# ---- one cell -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sacct_state", "expected"),
    [
        ("PENDING", "pending"),
        ("RUNNING", "running"),
        ("COMPLETING", "running"),
        ("TIMEOUT", "timeout"),
        ("PREEMPTED", "preempted"),
        ("NODE_FAIL", "node_fail"),
        ("CANCELLED", "cancelled"),
        ("OUT_OF_MEMORY", "oom"),
        ("FAILED", "failed"),
        ("COMPLETED", "failed"),
        ("SOMETHING_NEW", "failed"),
    ],
)
def test_without_a_record_the_scheduler_decides(sacct_state: str, expected: str) -> None:
    state = classify(submission(), job=status.SchedulerJob(sacct_state, "0:0"))
    assert state.state == expected
    assert state.scheduler_state == sacct_state
    if expected not in status.ACTIVE:
        assert state.reason and (sacct_state in state.reason or "wrote no record" in state.reason)


def test_a_record_of_the_latest_attempt_decides_whatever_the_scheduler_says() -> None:
    rec = record("does_not_fit", attempt=2, reason="micro-batch 1 does not fit")
    state = classify(submission(attempt=2), rec, job=status.SchedulerJob("FAILED"))
    assert (state.state, state.reason, state.attempt) == ("does_not_fit", "micro-batch 1 does not fit", 2)


def test_a_record_of_an_older_attempt_never_masks_the_new_attempts_job() -> None:
    old = record("failed", attempt=1, reason="ValueError: bad")
    assert classify(submission(attempt=2), old, job=status.SchedulerJob("PENDING")).state == "pending"
    assert classify(submission(attempt=2), old, job=status.SchedulerJob("TIMEOUT")).state == "timeout"


def test_probe_failure_statuses_are_failed_with_the_status_in_the_reason() -> None:
    state = classify(submission(), record("comm_error", reason="rank 1 gone"))
    assert state.state == "failed" and state.reason == "comm_error: rank 1 gone"
    state = classify(submission(), record("exploded"))
    assert state.state == "failed" and "unknown record status 'exploded'" in (state.reason or "")


def test_a_requeued_job_names_its_earlier_runs() -> None:
    job = status.SchedulerJob("PENDING", history=("NODE_FAIL",))
    state = classify(submission(), job=job)
    assert state.state == "pending" and state.reason == "requeued: earlier run(s) of this job ended NODE_FAIL"
    assert state.history == ("NODE_FAIL",)


def test_unknown_to_the_scheduler_is_lost_but_not_right_after_submission() -> None:
    assert classify(submission()).state == "lost"
    just_now = submission(at=(NOW - dt.timedelta(seconds=5)).isoformat())
    assert classify(just_now).state == "pending"


def test_a_damaged_record_is_corrupt_unless_the_latest_attempt_is_still_queued_or_running() -> None:
    assert classify(submission(), problem="record is not valid JSON").state == "corrupt"
    running = classify(submission(attempt=2), problem="record is not valid JSON", job=status.SchedulerJob("RUNNING"))
    assert running.state == "running" and "damaged" in (running.reason or "")
    ended = classify(submission(attempt=2), problem="record is not valid JSON", job=status.SchedulerJob("FAILED"))
    assert ended.state == "corrupt"


def test_never_submitted_is_new_and_not_asking_the_scheduler_leaves_pending() -> None:
    assert classify(None).state == "new"
    assert classify(submission(), asked=False).state == "pending"


@pytest.mark.parametrize("state", status.STATES)
def test_what_resume_reruns(state: str) -> None:
    assert status.needs_rerun(state) == (state not in ("ok", "does_not_fit", "pending", "running"))


# ---- files on disk --------------------------------------------------------------------------------------


@pytest.fixture
def sweep(tmp_path: Path) -> SweepPaths:
    paths = SweepPaths(tmp_path / "sweep")
    for cid in ("aaa", "bbb", "ccc", "ddd", "eee"):
        paths.cell_config(cid).parent.mkdir(parents=True)
        paths.cell_config(cid).write_text("name: t\n")
    return paths


def test_records_on_disk_half_written_foreign_or_unreadable_are_corrupt(sweep: SweepPaths) -> None:
    full = {"cell_id": "aaa", "status": "ok", "attempt": 1, "metrics": {"step_time_s": 1.0}}
    write_json_atomic(sweep.record("aaa"), full)
    text = json.dumps({**full, "cell_id": "bbb"})
    sweep.record("bbb").write_text(text[: len(text) // 2])  # cut short, as by a crash mid-write
    write_json_atomic(sweep.record("ccc"), {**full, "cell_id": "aaa"})  # copied from another cell
    write_json_atomic(sweep.record("ddd"), ["not", "a", "record"])
    for cid in ("aaa", "bbb", "ccc", "ddd"):
        append_jsonl(sweep.attempts(cid), {**submission(), "cell_id": cid, "backend": "local", "job_id": "1"})

    states = {s.cell_id: s for s in status.cell_states(sweep, query_scheduler=False, now=NOW)}
    assert states["aaa"].state == "ok"
    assert states["bbb"].state == "corrupt" and "not valid JSON" in (states["bbb"].reason or "")
    assert states["ccc"].state == "corrupt" and "belongs to cell 'aaa'" in (states["ccc"].reason or "")
    assert states["ddd"].state == "corrupt"
    assert states["eee"].state == "new"
    assert all(status.needs_rerun(states[c].state) for c in ("bbb", "ccc", "ddd", "eee"))
    assert status.counts(list(states.values())) == {"new": 1, "ok": 1, "corrupt": 3}


def test_an_attempt_line_cut_short_is_skipped_and_the_one_before_counts(sweep: SweepPaths) -> None:
    append_jsonl(sweep.attempts("aaa"), {**submission(attempt=1), "cell_id": "aaa"})
    with open(sweep.attempts("aaa"), "a") as f:
        f.write('{"cell_id": "aaa", "attempt": 2, "job_')
    assert [a["attempt"] for a in status.read_attempts(sweep, "aaa")] == [1]


def test_a_local_cell_whose_process_is_gone_without_a_record_is_lost(sweep: SweepPaths) -> None:
    # pid 2**22 + 1 is above Linux's pid_max default, so no process has it.
    append_jsonl(sweep.attempts("aaa"), {**submission(backend="local", job_id=str(2**22 + 1)), "cell_id": "aaa"})
    (state,) = [s for s in status.cell_states(sweep, now=NOW) if s.cell_id == "aaa"]
    assert state.state == "lost"


def test_summary_and_table_show_every_state_present(sweep: SweepPaths) -> None:
    from rich.console import Console

    states = [
        status.CellState("c1", "ok", 1, "1_0", label="pythia-70m a100 x1"),
        status.CellState("c2", "timeout", 2, "2_0", reason="SLURM state TIMEOUT", label="pythia-1b a100 x8"),
    ]
    assert status.summary_line(states, markup=False) == "2 cell(s): ok 1, timeout 1"
    console = Console(width=200, record=True)
    console.print(status.table(states))
    text = console.export_text()
    # Problems first.
    assert text.index("c2") < text.index("c1")
    assert "SLURM state TIMEOUT" in text and "pythia-1b a100 x8" in text
    console = Console(width=200, record=True)
    console.print(status.table(states, only={"ok"}))
    assert "c2" not in console.export_text()
