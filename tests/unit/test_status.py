"""Cell states from records, submissions and the scheduler's accounting (sacct and squeue text as SLURM prints it)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from orchestrator.cli import main as cli
from orchestrator.slurm import commands as slurm
from orchestrator.store.attempts import Attempt
from orchestrator.store.durable import append_jsonl, write_json_atomic
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import BadRecord, Record
from orchestrator.store.states import STATES, RecordStatus, State, rerun_selectable
from orchestrator.submission import status
from orchestrator.submission.scheduler_states import HeldAction

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.timezone.utc)
LONG_AGO = (NOW - dt.timedelta(hours=1)).isoformat()


def submission(attempt: int = 1, job_id: str = "40_3", backend: str = "slurm", at: str = LONG_AGO) -> Attempt:
    return Attempt("c1", attempt, job_id, backend, submitted_at=at)


def record(status_: str = "ok", attempt: int = 1, reason: str | None = None) -> Record:
    return Record("c1", RecordStatus(status_), attempt, reason=reason)


def sacct(*lines: str) -> slurm.Accounting:
    """Accounting as sacct -P -X --duplicates -o JobID,JobIDRaw,State,ExitCode,Reason prints it."""
    return slurm.parse_sacct("\n".join(lines) + "\n")


def classify(latest, rec=None, acct=None, asked=True) -> status.CellState:
    if asked and acct is None:
        acct = slurm.Accounting()
    return status.classify("c1", latest, rec, acct if asked else None, None, NOW)


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
        ("CANCELLED by 1000", "cancelled"),
        ("OUT_OF_MEMORY", "host_oom"),
        ("FAILED", "failed"),
        ("COMPLETED", "failed"),
        ("SOMETHING_NEW", "failed"),
    ],
)
def test_without_a_record_the_scheduler_decides(sacct_state: str, expected: str) -> None:
    state = classify(submission(), acct=sacct(f"40_3|43|{sacct_state}|0:0|None"))
    assert state.state == expected
    assert state.scheduler_state == sacct_state
    if expected not in status.ACTIVE:
        assert state.reason and (sacct_state in state.reason or "wrote no record" in state.reason)


def test_a_record_of_the_latest_attempt_decides_whatever_the_scheduler_says() -> None:
    rec = record("does_not_fit", attempt=2, reason="micro-batch 1 does not fit")
    state = classify(submission(attempt=2), rec, acct=sacct("40_3|43|FAILED|1:0|None"))
    assert (state.state, state.reason, state.attempt) == ("does_not_fit", "micro-batch 1 does not fit", 2)


def test_a_record_of_an_older_attempt_never_masks_the_new_attempts_job() -> None:
    old = record("failed", attempt=1, reason="ValueError: bad")
    assert classify(submission(attempt=2), old, acct=sacct("40_[3-4]|40|PENDING|0:0|None")).state == "pending"
    assert classify(submission(attempt=2), old, acct=sacct("40_3|43|TIMEOUT|0:0|None")).state == "timeout"


@pytest.mark.parametrize("written", ["timeout", "failed", "compile_error"])
def test_a_failure_or_timeout_the_scheduler_says_was_a_cancel_is_cancelled(written: str) -> None:
    # scancel's SIGTERM killed a compiler; the probe wrote timeout (then failed) before it could ask the scheduler.
    rec = record(written, reason="ninja died with <Signals.SIGTERM: 15>")
    state = classify(submission(), rec=rec, acct=sacct("40_3|43|CANCELLED by 0|0:0|None"))
    assert state.state == "cancelled" and state.reason is not None
    assert state.reason.startswith("the scheduler cancelled job 40_3 (sacct: CANCELLED by 0); the record said")
    assert classify(submission(), rec=rec, acct=sacct("40_3|43|TIMEOUT|0:0|None")).state != "cancelled"
    assert classify(submission(), rec=record("ok"), acct=sacct("40_3|43|CANCELLED by 0|0:0|None")).state == "ok"


def test_probe_failure_statuses_are_failed_with_the_status_in_the_reason() -> None:
    state = classify(submission(), record("comm_error", reason="rank 1 gone"))
    assert state.state == "failed" and state.reason == "comm_error: rank 1 gone"
    assert classify(submission(), record("invalid", reason="heads")).state == "invalid"
    assert classify(submission(), record("timeout", reason="SIGUSR2")).state == "timeout"


def test_a_requeued_job_names_its_earlier_runs() -> None:
    state = classify(submission(), acct=sacct("40_3|43|NODE_FAIL|0:0|None", "40_3|43|PENDING|0:0|BeginTime"))
    assert state.state == "pending"
    assert state.reason == "waiting: BeginTime; requeued: earlier run(s) of this job ended NODE_FAIL"
    assert state.history == ("NODE_FAIL",)


def test_unknown_to_the_scheduler_is_lost_but_not_right_after_submission() -> None:
    assert classify(submission()).state == "lost"
    just_now = submission(at=(NOW - dt.timedelta(seconds=5)).isoformat())
    assert classify(just_now).state == "pending"


def test_a_task_cancelled_while_pending_is_lost_as_soon_as_its_array_is_known_however_recent() -> None:
    # Array 24 after `scancel 24_8 24_9 24_10 24_11` while they pended, once the rest ran (SLURM 22.05 output):
    # the cancelled tasks have no line anywhere; the last task to start took the array's own record (24_7|24).
    acct = sacct(*(f"24_{t}|{25 + t}|COMPLETED|0:0|None" for t in range(7)), "24_7|24|COMPLETED|0:0|None")
    acct.merge(slurm.parse_squeue(""))
    just_now = (NOW - dt.timedelta(seconds=5)).isoformat()
    for task in (8, 11):
        state = classify(submission(job_id=f"24_{task}", at=just_now), acct=acct)
        assert state.state == "lost", state
        assert "never started" in (state.reason or "")
        assert status.needs_rerun(state.state)
    # While squeue still shows the others pending as a range, a task missing from it is gone too.
    pending = slurm.parse_squeue("24_[2-7%2]|PENDING|JobArrayTaskLimit\n24_0|RUNNING|None\n24_1|RUNNING|None\n")
    assert classify(submission(job_id="24_9", at=just_now), acct=pending).state == "lost"
    assert classify(submission(job_id="24_5", at=just_now), acct=pending).state == "pending"


def test_a_whole_array_cancelled_before_any_task_started_is_cancelled() -> None:
    # `scancel 30` before any task ran: sacct keeps only the array's own record, under the bare id.
    acct = sacct("30|30|CANCELLED by 0|0:0|None")
    state = classify(submission(job_id="30_2"), acct=acct)
    assert state.state == "cancelled" and "array 30 was cancelled before task 2 started" in (state.reason or "")
    # The pending range form of the same record (tasks 0-1 still pending when the array was cancelled).
    acct = sacct("36_0|38|CANCELLED by 0|0:0|None", "36_[1-2%1]|36|CANCELLED by 0|0:0|None")
    assert classify(submission(job_id="36_2"), acct=acct).state == "cancelled"


@pytest.mark.parametrize(
    ("reason", "action"),
    [
        ("JobHeldUser", HeldAction.RELEASE),
        ("JobHeldAdmin", HeldAction.ADMIN),
        ("launch failed requeued held", HeldAction.RESUBMIT),
        ("job requeued in held state", HeldAction.RELEASE),
    ],
)
def test_a_held_job_is_held_with_what_resume_does(reason: str, action: HeldAction) -> None:
    acct = sacct("36_[1-2%1]|36|PENDING|0:0|None")
    acct.merge(slurm.parse_squeue(f"36_1|PENDING|JobArrayTaskLimit\n36_2|PENDING|{reason}\n"), prefer_other=True)
    held = classify(submission(job_id="36_2"), acct=acct)
    assert held.state == "held" and held.held is action and reason in (held.reason or "")
    assert classify(submission(job_id="36_1"), acct=acct).state == "pending"
    assert status.needs_rerun(held.state) and status.is_done([held])


@pytest.mark.parametrize("reason", ["Resources", "Priority", "JobArrayTaskLimit"])
def test_a_pending_job_says_why_it_waits_as_squeue_does(reason: str) -> None:
    # status and show left the reason blank while squeue said (Resources) or (Priority).
    acct = sacct("36_[1-2]|36|PENDING|0:0|None")
    acct.merge(slurm.parse_squeue(f"36_1|PENDING|{reason}\n36_2|PENDING|None\n"), prefer_other=True)
    waiting = classify(submission(job_id="36_1"), acct=acct)
    assert waiting.state == "pending" and waiting.reason == f"waiting: {reason}"
    assert classify(submission(job_id="36_2"), acct=acct).reason is None


def test_a_damaged_record_is_corrupt_unless_the_latest_attempt_is_still_queued_or_running() -> None:
    bad = BadRecord("record is not valid JSON")
    assert classify(submission(), bad).state == "corrupt"
    running = classify(submission(attempt=2), bad, acct=sacct("40_3|43|RUNNING|0:0|None"))
    assert running.state == "running" and "damaged" in (running.reason or "")
    ended = classify(submission(attempt=2), bad, acct=sacct("40_3|43|FAILED|1:0|None"))
    assert ended.state == "corrupt"


def test_never_submitted_is_new_and_not_asking_the_scheduler_is_unknown_never_pending() -> None:
    assert classify(None).state == "new"
    unknown = classify(submission(), asked=False)
    assert unknown.state == "unknown" and not status.needs_rerun(unknown.state)
    assert not status.is_done([unknown])


@pytest.mark.parametrize("state", STATES)
def test_what_resume_reruns(state: State) -> None:
    expected = state not in ("ok", "does_not_fit", "oom", "pending", "running", "invalid", "unknown")
    assert status.needs_rerun(state) == expected


def test_resume_releases_user_holds_and_resubmits_failed_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(slurm, "release", lambda ids: calls.append(("release", [str(i) for i in ids])))
    monkeypatch.setattr(slurm, "cancel", lambda ids: calls.append(("cancel", [str(i) for i in ids])))
    cells = [
        status.CellState("a", State.HELD, 1, "5_1", held=HeldAction.RELEASE),
        status.CellState("b", State.HELD, 1, "5_2", held=HeldAction.RESUBMIT),
        status.CellState("c", State.LOST, 1, "5_3"),
    ]
    rest, said = status.settle_held(cells)
    assert [c.cell_id for c in rest] == ["b", "c"]
    assert calls == [("release", ["5_1"]), ("cancel", ["5_2"])]
    assert "released job 5_1" in said[0] and "cancelled" in said[1]


# ---- files on disk --------------------------------------------------------------------------------------


@pytest.fixture
def sweep(tmp_path: Path) -> SweepPaths:
    paths = SweepPaths(tmp_path / "sweep")
    for cid in ("aaa", "bbb", "ccc", "ddd", "eee", "fff", "ggg"):
        paths.cell_config(cid).parent.mkdir(parents=True)
        paths.cell_config(cid).write_text("name: t\n")
    return paths


def test_records_on_disk_half_written_foreign_or_unreadable_are_corrupt(sweep: SweepPaths) -> None:
    full = {"schema_version": 1, "cell_id": "aaa", "status": "ok", "attempt": 1, "metrics": {"step_time_s": 1.0}}
    write_json_atomic(sweep.record("aaa"), full)
    text = json.dumps({**full, "cell_id": "bbb"})
    sweep.record("bbb").write_text(text[: len(text) // 2])  # cut short, as by a crash mid-write
    write_json_atomic(sweep.record("ccc"), {**full, "cell_id": "aaa"})  # copied from another cell
    write_json_atomic(sweep.record("ddd"), ["not", "a", "record"])
    write_json_atomic(sweep.record("fff"), {"status": "ok"})
    sweep.record("ggg").write_bytes(b"\x00\xff garbage")
    for cid in ("aaa", "bbb", "ccc", "ddd", "fff", "ggg"):
        append_jsonl(sweep.attempts(cid), {**asdict(submission()), "cell_id": cid, "backend": "local", "job_id": "1"})

    states = {s.cell_id: s for s in status.cell_states(sweep, query_scheduler=False, now=NOW)}
    assert states["aaa"].state == "ok"
    assert states["bbb"].state == "corrupt" and "not valid JSON" in (states["bbb"].reason or "")
    assert states["ccc"].state == "corrupt" and "belongs to cell 'aaa'" in (states["ccc"].reason or "")
    assert states["ddd"].state == "corrupt"
    assert states["eee"].state == "new"
    assert states["fff"].state == "corrupt" and "lacks required field" in (states["fff"].reason or "")
    assert states["ggg"].state == "corrupt" and "not UTF-8" in (states["ggg"].reason or "")
    assert all(status.needs_rerun(states[c].state) for c in ("bbb", "ccc", "ddd", "eee", "fff", "ggg"))
    assert status.counts(list(states.values())) == {"new": 1, "ok": 1, "corrupt": 5}


def test_status_and_report_call_the_same_records_corrupt_without_a_traceback(sweep: SweepPaths, capsys) -> None:
    write_json_atomic(sweep.record("aaa"), {"status": "ok"})
    sweep.record("bbb").write_bytes(b"\x00\xff garbage")
    for cid in ("aaa", "bbb"):
        append_jsonl(sweep.attempts(cid), {**asdict(submission()), "cell_id": cid, "backend": "local", "job_id": "1"})
    assert cli.main(["status", str(sweep.root), "--state", "corrupt"]) == 0
    shown = capsys.readouterr().out
    assert "corrupt 2" in shown and "aaa" in shown and "bbb" in shown
    assert cli.main(["report", str(sweep.root), "--no-plots"]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    import pandas as pd

    table = pd.read_csv(sweep.output("cells.csv")).set_index("cell_id")
    assert table.loc["aaa", "status"] == "corrupt" and "lacks required field" in table.loc["aaa", "reason"]
    assert table.loc["bbb", "status"] == "corrupt" and "not UTF-8" in table.loc["bbb", "reason"]


def test_an_attempt_line_cut_short_is_skipped_and_the_one_before_counts(sweep: SweepPaths) -> None:
    append_jsonl(sweep.attempts("aaa"), {**asdict(submission(attempt=1)), "cell_id": "aaa"})
    with open(sweep.attempts("aaa"), "a") as f:
        f.write('{"cell_id": "aaa", "attempt": 2, "job_')
    assert [a.attempt for a in status.read_attempts(sweep, "aaa")] == [1]


def test_a_local_cell_whose_process_is_gone_without_a_record_is_lost(sweep: SweepPaths) -> None:
    # pid 2**22 + 1 is above Linux's pid_max default, so no process has it.
    append_jsonl(
        sweep.attempts("aaa"), {**asdict(submission(backend="local", job_id=str(2**22 + 1))), "cell_id": "aaa"}
    )
    (state,) = [s for s in status.cell_states(sweep, now=NOW) if s.cell_id == "aaa"]
    assert state.state == "lost"


def _finished(sweep: SweepPaths, cid: str, status_: str, reason: str | None = None, label: str = "") -> None:
    """A cell as a local attempt that ended leaves it: one attempt and its record."""
    rec = {"schema_version": 1, "cell_id": cid, "status": status_, "attempt": 1, "reason": reason, "metrics": {}}
    write_json_atomic(sweep.record(cid), rec)
    append_jsonl(
        sweep.attempts(cid), {**asdict(submission()), "cell_id": cid, "backend": "local", "job_id": "1", "label": label}
    )


def _states_sweep(sweep: SweepPaths) -> None:
    _finished(sweep, "aaa", "ok", label="pythia-70m a100 x1")
    _finished(sweep, "bbb", "timeout", reason="SLURM state TIMEOUT", label="pythia-1b a100 x8")
    _finished(sweep, "ccc", "invalid", reason="heads do not divide the hidden size", label="bad-heads a100 x1")
    _finished(sweep, "ddd", "does_not_fit", reason="micro-batch 1 does not fit", label="pythia-12b a100 x1")
    sweep.record("fff").write_bytes(b"\x00\xff garbage")
    append_jsonl(sweep.attempts("fff"), {**asdict(submission()), "cell_id": "fff", "backend": "local", "job_id": "1"})
    # eee and ggg: never submitted (new).


def _status(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert cli.main(["status", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def test_status_prints_the_counts_then_every_cell_problems_first(sweep: SweepPaths, capsys) -> None:
    _states_sweep(sweep)
    lines = _status(capsys, str(sweep.root))
    # The counts in the order of STATES, then the table's header and a row per cell.
    assert lines[0] == "7 cell(s): new 2, ok 1, does_not_fit 1, invalid 1, timeout 1, corrupt 1"
    assert lines[1].split() == ["cell", "state", "try", "job", "settings", "reason"]
    rows = [line.split()[:2] for line in lines[2:] if line.strip() and not set(line.strip()) <= set("─━-")]
    assert rows == [
        ["fff", "corrupt"],
        ["ccc", "invalid"],
        ["bbb", "timeout"],
        ["eee", "new"],
        ["ggg", "new"],
        ["aaa", "ok"],
        ["ddd", "does_not_fit"],
    ]
    by_cell = {line.split()[0]: line for line in lines[2:] if line.strip()}
    assert "pythia-1b a100 x8" in by_cell["bbb"] and "SLURM state TIMEOUT" in by_cell["bbb"]
    assert "heads do not divide the hidden size (a rerun cannot fix this; not resubmitted)" in by_cell["ccc"]
    assert "not UTF-8" in by_cell["fff"]
    assert "micro-batch 1 does not fit" in by_cell["ddd"], "an answer other than ok keeps its reason"


def test_status_state_filter_and_summary(sweep: SweepPaths, capsys) -> None:
    _states_sweep(sweep)
    lines = _status(capsys, str(sweep.root), "--state", "ok,timeout")
    assert lines[0] == "7 cell(s): new 2, ok 1, does_not_fit 1, invalid 1, timeout 1, corrupt 1", "counts of all"
    assert [line.split()[0] for line in lines[2:] if line.strip()] == ["bbb", "aaa"]
    assert _status(capsys, str(sweep.root), "--summary") == [lines[0]]


def test_status_on_a_terminal_colours_each_state(sweep: SweepPaths, capsys, monkeypatch) -> None:
    import io

    from rich.console import Console

    from orchestrator.cli.display import console

    _states_sweep(sweep)
    screen = Console(file=io.StringIO(), force_terminal=True, color_system="standard", width=200, record=True)
    monkeypatch.setattr(console, "make_console", lambda stderr=False: screen)
    assert cli.main(["status", str(sweep.root)]) == 0
    shown = screen.export_text(styles=True)
    for state, sgr in (("ok", "32"), ("timeout", "35"), ("invalid", "31"), ("corrupt", "31"), ("does_not_fit", "33")):
        assert f"\x1b[{sgr}m{state} 1\x1b[0m" in shown, state  # in the counts
        assert f"\x1b[{sgr}m{state}" in shown.split("\n", 1)[1], state  # in the table


def test_a_task_accounting_still_calls_pending_but_squeue_does_not_list_is_not_pending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # sacct's pending range still holds 24_9 a moment after `scancel 24_9`; squeue, the controller, does not.
    monkeypatch.setattr(slurm, "sacct", lambda ids: sacct("24_0|25|RUNNING|0:0|None", "24_[1-9%2]|24|PENDING|0:0|None"))
    monkeypatch.setattr(
        slurm, "squeue", lambda ids: slurm.parse_squeue("24_0|RUNNING|None\n24_[1-8%2]|PENDING|JobArrayTaskLimit\n")
    )
    acct, note = status.ask_scheduler(["24_9", "24_8", "24_0"])
    assert note is None
    just_now = (NOW - dt.timedelta(seconds=2)).isoformat()
    assert classify(submission(job_id="24_9", at=just_now), acct=acct).state == "lost"
    assert classify(submission(job_id="24_8", at=just_now), acct=acct).state == "pending"
    assert classify(submission(job_id="24_0", at=just_now), acct=acct).state == "running"


def test_an_intent_whose_job_already_wrote_its_record_is_adopted_all_the_same(
    sweep: SweepPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sweep killed after sbatch, before the job ids were written; the job ran and wrote its record before any
    # command looked: its attempt still gets its job id, so that `show` finds its logs.
    intent = Attempt("aaa", 1, None, "slurm", token="gpudays-t", index=1, submitted_at=LONG_AGO)
    append_jsonl(sweep.attempts("aaa"), json.loads(intent.to_line()))
    full = {"schema_version": 1, "cell_id": "aaa", "status": "ok", "attempt": 1, "metrics": {}}
    write_json_atomic(sweep.record("aaa"), full)
    monkeypatch.setattr(slurm, "jobs_named", lambda names, since: slurm.Named({"gpudays-t": "41"}, complete=True))
    monkeypatch.setattr(slurm, "sacct", lambda ids: slurm.Accounting())
    states = {s.cell_id: s for s in status.cell_states(sweep, now=NOW)}
    assert states["aaa"].state == "ok" and states["aaa"].job_id == "41_1"
    assert [a.job_id for a in status.read_attempts(sweep, "aaa")] == ["41_1"]


def test_a_job_that_writes_its_record_while_the_scheduler_is_asked_is_ok_not_failed(
    sweep: SweepPaths, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The record is read, then the job writes it and ends, then sacct says COMPLETED: without a second read the
    # cell would be "failed: ended without a record" for one status call, and `status --wait` could stop on it.
    append_jsonl(sweep.attempts("aaa"), {**asdict(submission(job_id="42_0")), "cell_id": "aaa"})

    def finishes_meanwhile(ids):
        write_json_atomic(sweep.record("aaa"), {"schema_version": 1, "cell_id": "aaa", "status": "ok", "attempt": 1})
        return sacct("42_0|42|COMPLETED|0:0|None")

    monkeypatch.setattr(slurm, "sacct", finishes_meanwhile)
    states = {s.cell_id: s for s in status.cell_states(sweep, now=NOW)}
    assert states["aaa"].state == "ok", states["aaa"]


# ---- a run SLURM may requeue -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ended", "live", "expected"),
    [
        # Seconds after a preemption (PreemptMode=REQUEUE) on the local cluster: sacct's newest run is the one
        # preempted, squeue has the job queued again.
        ("PREEMPTED", "40_3|PENDING|BeginTime", "pending"),
        ("PREEMPTED", "40_3|COMPLETING|None", "running"),
        ("PREEMPTED", "40_3|REQUEUED|None", "pending"),
        ("NODE_FAIL", "40_3|PENDING|BeginTime", "pending"),
        ("BOOT_FAIL", "40_3|PENDING|None", "pending"),
        # Not requeued: squeue lists the same end, or no longer lists the job at all (MinJobAge later).
        ("PREEMPTED", "40_3|PREEMPTED|None", "preempted"),
        ("NODE_FAIL", "", "node_fail"),
    ],
)
def test_a_run_slurm_may_requeue_is_asked_of_squeue_and_queued_again_is_pending(
    monkeypatch: pytest.MonkeyPatch, ended: str, live: str, expected: str
) -> None:
    asked: list[list[str]] = []
    monkeypatch.setattr(slurm, "sacct", lambda ids: sacct(f"40_3|43|{ended}|0:0|None"))

    def squeue(ids: list[slurm.JobId]) -> slurm.Accounting:
        asked.append([str(i) for i in ids])
        return slurm.parse_squeue(live + "\n")

    monkeypatch.setattr(slurm, "squeue", squeue)
    acct, _ = status.ask_scheduler(["40_3"])
    state = classify(submission(), acct=acct)
    assert asked == [["40_3"]], "squeue was not asked about a job sacct lists as ended"
    assert state.state == expected, state
    if expected in status.ACTIVE:
        assert ended in (state.reason or "") and state.history == (ended,), "the run that ended is named"
        assert not status.needs_rerun(state.state)


def test_a_preempted_job_squeue_cannot_be_asked_about_is_unknown_and_resume_leaves_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def down(ids: list[slurm.JobId]) -> slurm.Accounting:
        raise slurm.SlurmUnavailable("squeue: error: slurm_load_jobs error: Socket timed out")

    monkeypatch.setattr(slurm, "sacct", lambda ids: sacct("40_3|43|PREEMPTED|0:0|None", "41|41|FAILED|1:0|None"))
    monkeypatch.setattr(slurm, "squeue", down)
    acct, _ = status.ask_scheduler(["40_3", "41"])
    state = classify(submission(), acct=acct)
    assert state.state == "unknown" and "PREEMPTED" in (state.reason or ""), state
    assert not rerun_selectable(state.state, None) and not rerun_selectable(state.state, [State.PREEMPTED])
    assert classify(submission(job_id="41"), acct=acct).state == "failed", "an ended job needs no squeue"


def test_resume_submits_nothing_for_a_cell_slurm_has_queued_again_after_a_preemption(
    sweep: SweepPaths, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # resume submitted a second job for the cell while SLURM ran the first again under its own id.
    for cid in sweep.cell_ids():
        append_jsonl(sweep.attempts(cid), {**asdict(submission(job_id="40_3")), "cell_id": cid})
        write_json_atomic(sweep.record(cid), {"schema_version": 1, "cell_id": cid, "status": "ok", "attempt": 1})
    sweep.record("aaa").unlink()
    monkeypatch.setattr(slurm, "sacct", lambda ids: sacct("40_3|43|PREEMPTED|0:0|None"))
    monkeypatch.setattr(slurm, "squeue", lambda ids: slurm.parse_squeue("40_3|PENDING|BeginTime\n"))

    def no_submission(*args: object, **kwargs: object) -> None:
        raise AssertionError("a second job was submitted for a cell SLURM requeues")

    from orchestrator.cli import flow

    monkeypatch.setattr(flow, "submit_cells", no_submission)
    assert cli.main(["resume", str(sweep.root)]) == 0
    assert "nothing to resume" in capsys.readouterr().out
