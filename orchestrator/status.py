"""The state of every cell of a sweep, from its record and the scheduler's accounting together.

A cell's latest attempt is the last line of ``attempts.jsonl``. A record decides when it belongs to that attempt
(or a later one); a record of an older attempt never hides what the scheduler says of the newer one. Otherwise
the scheduler decides: ``sacct`` is asked once for the whole sweep (every array job id in one call), never once
per cell; ``squeue`` is asked once more only for jobs sacct does not know yet (accounting lags submission by a
moment, and some clusters have none). A job neither knows, without a record, is ``lost``, unless it was
submitted a moment ago.

A requeued job (preemption, node failure, ``scontrol requeue``, a timeout requeued by the job itself) keeps its
job id; sacct lists each of its runs, and the state comes from the newest while the reason names the earlier.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.paths import SweepPaths
from orchestrator.schema import to_config

# Every state a cell can be in. "new": written into the sweep but never submitted; "corrupt": its record cannot
# be read (half-written, not JSON, not a record of this cell).
STATES = (
    "new",
    "pending",
    "running",
    "ok",
    "does_not_fit",
    "failed",
    "oom",
    "timeout",
    "preempted",
    "node_fail",
    "cancelled",
    "corrupt",
    "lost",
)
FINAL_GOOD = ("ok", "does_not_fit")
"""An answer about the cell: never run again by ``resume``."""
ACTIVE = ("pending", "running")
# Record statuses written by the probe that are failures of the cell itself; the record's reason says which.
FAILED_STATUSES = ("failed", "comm_error", "compile_error")

SACCT_STATE = {
    "PENDING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_HOLD": "pending",
    "REQUEUE_FED": "pending",
    "RESV_DEL_HOLD": "pending",
    "RESIZING": "running",
    "RUNNING": "running",
    "SUSPENDED": "running",
    "COMPLETING": "running",
    "CONFIGURING": "running",
    "STAGE_OUT": "running",
    "SIGNALING": "running",
    "STOPPED": "running",
    "COMPLETED": "failed",  # finished but left no record: the job died before writing it
    "FAILED": "failed",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "PREEMPTED": "preempted",
    "NODE_FAIL": "node_fail",
    "BOOT_FAIL": "node_fail",
    "CANCELLED": "cancelled",
    "REVOKED": "cancelled",
    "OUT_OF_MEMORY": "oom",
}
# Earlier runs of a requeued job that are worth naming in the reason.
_NOTABLE_HISTORY = ("PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "TIMEOUT", "REQUEUED", "FAILED", "OUT_OF_MEMORY")

LOST_GRACE_S = 120.0
"""A job unknown to the scheduler this soon after its submission is taken as pending, not lost."""


@dataclass
class CellState:
    """What ``status`` knows of one cell."""

    cell_id: str
    state: str
    attempt: int
    """The latest attempt (1 for the first submission; 0 if never submitted)."""
    job_id: str | None
    reason: str | None = None
    scheduler_state: str | None = None
    """The scheduler's raw state of the latest run (``PENDING``, ``TIMEOUT``...), where it was asked."""
    record: dict[str, Any] | None = None
    history: tuple[str, ...] = ()
    """Raw states of earlier runs of the same job (a requeued job runs again under its id), oldest first."""
    label: str | None = None
    log: Path | None = None
    """Standard error of the job's first task, where a traceback without a record would be."""


@dataclass
class SchedulerJob:
    """The scheduler's view of one job id: its newest run and the runs before it."""

    state: str
    exit_code: str | None = None
    history: tuple[str, ...] = field(default_factory=tuple)


class SchedulerUnavailable(RuntimeError):
    """Neither sacct nor squeue answered; the message says what they said."""


def read_attempts(paths: SweepPaths, cell_id: str) -> list[dict[str, Any]]:
    """The submissions of a cell, oldest first; a line cut short by a crash mid-write is skipped."""
    path = paths.attempts(cell_id)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and "job_id" in entry and "attempt" in entry:
            out.append(entry)
    return out


def read_record(path: Path, cell_id: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """The record, or None and why it cannot be used (None, None when there is none)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"record unreadable: {type(e).__name__}: {str(e)[:120]}"
    try:
        record = json.loads(text)
    except ValueError as e:
        return None, f"record is not valid JSON ({len(text)} bytes; half-written or damaged): {str(e)[:120]}"
    if not isinstance(record, dict) or "status" not in record or "cell_id" not in record:
        return None, "record lacks its status or cell id"
    if cell_id is not None and record["cell_id"] != cell_id:
        return None, f"record belongs to cell {record['cell_id']!r}, not to this cell"
    try:
        int(record.get("attempt", 0))
    except (TypeError, ValueError):
        return None, f"record's attempt {record.get('attempt')!r} is not a number"
    return record, None


_ARRAY_RANGE = re.compile(r"^(\d+)_\[(.+)\]$")


def _expand_sacct_id(job_id: str) -> list[str]:
    """``12_[3-5,7%2]`` (pending array tasks, as sacct and squeue show them) -> ``12_3 12_4 12_5 12_7``."""
    m = _ARRAY_RANGE.match(job_id)
    if not m:
        return [job_id]
    base, spec = m.group(1), m.group(2).split("%")[0]
    ids: list[str] = []
    for part in spec.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            ids.extend(f"{base}_{i}" for i in range(int(lo), int(hi) + 1))
        elif part:
            ids.append(f"{base}_{part}")
    return ids


def _parents(job_ids: Sequence[str]) -> str:
    return ",".join(sorted({j.split("_")[0] for j in job_ids}, key=lambda p: (len(p), p)))


def sacct_jobs(job_ids: Sequence[str], timeout_s: float = 60.0) -> dict[str, SchedulerJob]:
    """Each job id's runs (``123`` or ``123_4``) in one sacct call; ids sacct does not know are absent.

    Raises SchedulerUnavailable when sacct fails (not installed, no accounting on this cluster).
    """
    if not job_ids:
        return {}
    cmd = ["sacct", "-n", "-P", "-X", "--duplicates", "-o", "JobID,State,ExitCode", "-j", _parents(job_ids)]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SchedulerUnavailable(f"sacct: {e}") from e
    if result.returncode != 0:
        raise SchedulerUnavailable(f"sacct failed ({result.returncode}): {result.stderr.strip()[:300]}")
    return parse_sacct(result.stdout)


def parse_sacct(text: str) -> dict[str, SchedulerJob]:
    """``sacct -n -P -X --duplicates -o JobID,State,ExitCode`` output -> each job id's newest run and history."""
    runs: dict[str, list[tuple[str, str | None]]] = {}
    # With --duplicates a requeued job shows each of its runs, oldest first.
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 2 or not parts[1]:
            continue
        state = parts[1].split()[0].rstrip("+")
        exit_code = parts[2] if len(parts) > 2 and parts[2] else None
        for jid in _expand_sacct_id(parts[0]):
            runs.setdefault(jid, []).append((state, exit_code))
    return {jid: SchedulerJob(rs[-1][0], rs[-1][1], tuple(state for state, _ in rs[:-1])) for jid, rs in runs.items()}


def squeue_jobs(job_ids: Sequence[str], timeout_s: float = 60.0) -> dict[str, SchedulerJob]:
    """The controller's live view (queued, running, just ended) of the given jobs, in one squeue call."""
    if not job_ids:
        return {}
    cmd = ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", _parents(job_ids)]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SchedulerUnavailable(f"squeue: {e}") from e
    if result.returncode != 0 and "Invalid job id" not in result.stderr:
        raise SchedulerUnavailable(f"squeue failed ({result.returncode}): {result.stderr.strip()[:300]}")
    return parse_squeue(result.stdout)


def parse_squeue(text: str) -> dict[str, SchedulerJob]:
    """``squeue -h -r -o %i|%T`` output -> each job id's state."""
    out: dict[str, SchedulerJob] = {}
    for line in text.splitlines():
        jid, _, state = line.strip().partition("|")
        if state:
            for one in _expand_sacct_id(jid):
                out[one] = SchedulerJob(state.strip())
    return out


def scheduler_jobs(job_ids: Sequence[str]) -> tuple[dict[str, SchedulerJob], str | None]:
    """sacct for every job, squeue for those sacct lacks; and a note when accounting could not be asked."""
    note = None
    try:
        jobs = sacct_jobs(job_ids)
    except SchedulerUnavailable as e:
        jobs, note = {}, str(e)
    missing = [j for j in job_ids if j not in jobs]
    if missing:
        try:
            jobs.update({j: v for j, v in squeue_jobs(missing).items() if j not in jobs})
        except SchedulerUnavailable as e:
            if note is not None:
                raise SchedulerUnavailable(f"{note}; {e}") from e
    return jobs, note


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _age_s(submitted_at: Any, now: dt.datetime) -> float:
    try:
        when = dt.datetime.fromisoformat(str(submitted_at))
    except ValueError:
        return float("inf")
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return (now - when).total_seconds()


def _history_note(history: tuple[str, ...]) -> str | None:
    notable = [h for h in history if h in _NOTABLE_HISTORY]
    if not notable:
        return None
    return f"requeued: earlier run(s) of this job ended {', '.join(notable)}"


def job_log(paths: SweepPaths, job_id: str) -> Path:
    """Standard error of task 0 of a job, as submitit names it (``jobs/<id>/<id>_0_log.err``)."""
    return paths.job_dir(job_id) / f"{job_id}_0_log.err"


def cell_states(paths: SweepPaths, query_scheduler: bool = True, now: dt.datetime | None = None) -> list[CellState]:
    """The state of every cell in the sweep folder, sorted by cell id.

    Raises SchedulerUnavailable when cells need the scheduler and neither sacct nor squeue answers.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    cell_ids = paths.cell_ids()
    attempts = {cid: read_attempts(paths, cid) for cid in cell_ids}
    records = {cid: read_record(paths.record(cid), cid) for cid in cell_ids}

    def decided_by_record(cid: str) -> bool:
        record, problem = records[cid]
        latest = attempts[cid][-1]["attempt"] if attempts[cid] else 0
        return problem is None and record is not None and int(record.get("attempt", 0)) >= int(latest)

    # Only jobs whose cells the records do not decide go to the scheduler.
    slurm_ids = [
        str(a[-1]["job_id"])
        for cid, a in attempts.items()
        if a and a[-1].get("backend") == "slurm" and not decided_by_record(cid)
    ]
    sched: dict[str, SchedulerJob] = {}
    note = None
    if query_scheduler and slurm_ids:
        sched, note = scheduler_jobs(slurm_ids)
    out = []
    for cid in cell_ids:
        latest = attempts[cid][-1] if attempts[cid] else None
        record, problem = records[cid]
        job = sched.get(str(latest["job_id"])) if latest else None
        state = classify(cid, latest, record, problem, job, query_scheduler, note, now)
        if state.state == "new":
            state.label = _label(paths, cid)
        state.log = job_log(paths, state.job_id) if state.job_id else None
        if state.state in ("failed", "oom") and state.record is None and state.log is not None:
            state.reason = f"{state.reason}; see {state.log}" if state.reason else f"see {state.log}"
        out.append(state)
    return out


def classify(
    cell_id: str,
    latest: dict[str, Any] | None,
    record: dict[str, Any] | None,
    problem: str | None,
    job: SchedulerJob | None,
    scheduler_asked: bool = True,
    note: str | None = None,
    now: dt.datetime | None = None,
) -> CellState:
    """One cell's state from its latest submission, its record (or the problem reading it) and the scheduler's
    view of the latest submission's job (None: unknown to the scheduler, or not asked)."""
    job_id = str(latest["job_id"]) if latest else None
    base = CellState(
        cell_id,
        "new",
        attempt=int(latest["attempt"]) if latest else 0,
        job_id=job_id,
        label=latest.get("label") if latest else None,
    )
    if problem is not None:
        # A damaged record cannot say which attempt wrote it; while the latest attempt's job is queued or running,
        # that job decides (it writes a new record when it ends).
        if job is not None and SACCT_STATE.get(job.state) in ACTIVE:
            active = _from_scheduler(base, job, latest or {}, note, now or dt.datetime.now(dt.timezone.utc))
            return replace(active, reason=f"the record on disk is damaged ({problem}); this attempt writes a new one")
        return replace(base, state="corrupt", reason=problem)
    if record is not None and int(record.get("attempt", 0)) >= base.attempt:
        return _from_record(base, record)
    if latest is None:
        return replace(base, reason="written into the sweep, never submitted")
    if latest.get("backend") == "local":
        alive = job_id is not None and job_id.isdigit() and _pid_alive(int(job_id))
        return replace(
            base, state="running" if alive else "lost", reason=None if alive else "no record, and its process is gone"
        )
    if not scheduler_asked:
        return replace(base, state="pending", reason="scheduler not asked")
    return _from_scheduler(base, job, latest, note, now or dt.datetime.now(dt.timezone.utc))


def _label(paths: SweepPaths, cell_id: str) -> str | None:
    """The cell's short name from its config (only for cells never submitted: the others carry it)."""
    import yaml

    from orchestrator import cells

    try:
        return cells.label(to_config(yaml.load(paths.cell_config(cell_id).read_text(), Loader=yaml.CSafeLoader)))
    except Exception:  # noqa: BLE001 - a name for display only
        return None


def _from_scheduler(
    base: CellState, job: SchedulerJob | None, latest: dict[str, Any], note: str | None, now: dt.datetime
) -> CellState:
    if job is None:
        if _age_s(latest.get("submitted_at"), now) < LOST_GRACE_S:
            return replace(base, state="pending", reason="just submitted; not in the scheduler's accounting yet")
        why = "no record, and the scheduler no longer knows the job"
        if note:
            why += f" (accounting could not be asked: {note})"
        return replace(base, state="lost", reason=why)
    state = SACCT_STATE.get(job.state, "failed")
    reasons = []
    if state not in ACTIVE:
        reasons.append(f"SLURM state {job.state}" + (f", exit code {job.exit_code}" if job.exit_code else ""))
    if job.state == "COMPLETED":
        reasons = ["the job completed but wrote no record"]
    if job.state.startswith("REQUEUE"):
        reasons.append("requeued; waits to run again")
    history = _history_note(job.history)
    if history:
        reasons.append(history)
    return replace(base, state=state, reason="; ".join(reasons) or None, scheduler_state=job.state, history=job.history)


def _from_record(base: CellState, record: dict[str, Any]) -> CellState:
    status = str(record.get("status"))
    reason = record.get("reason")
    if status in STATES:
        state = status
    else:
        state = "failed"
        if status not in FAILED_STATUSES:
            reason = f"unknown record status {status!r}" + (f": {reason}" if reason else "")
        elif status != "failed":
            reason = f"{status}: {reason}" if reason else status
    return replace(base, state=state, reason=reason, record=record)


def counts(states: Sequence[CellState]) -> dict[str, int]:
    """How many cells are in each state, in the order of STATES, leaving out states with none."""
    c = Counter(s.state for s in states)
    return {k: c[k] for k in STATES if c[k]}


def needs_rerun(state: str) -> bool:
    """Everything but a final answer and a cell still queued or running (corrupt, lost and new included)."""
    return state not in FINAL_GOOD and state not in ACTIVE


def is_done(states: Sequence[CellState]) -> bool:
    """No cell is queued or running."""
    return all(s.state not in ACTIVE for s in states)


# ---- how states are shown ------------------------------------------------------------------------------------

STATE_STYLE = {
    "new": "white",
    "pending": "cyan",
    "running": "blue",
    "ok": "green",
    "does_not_fit": "yellow",
    "failed": "red",
    "oom": "red",
    "timeout": "magenta",
    "preempted": "magenta",
    "node_fail": "magenta",
    "cancelled": "bright_black",
    "corrupt": "red",
    "lost": "red",
}
# Problems first, then what is still going on, then the answers.
_SHOW_ORDER = {
    s: i
    for i, s in enumerate(
        ("corrupt", "lost", "failed", "oom", "timeout", "node_fail", "preempted", "cancelled", "new")
        + ACTIVE
        + FINAL_GOOD
    )
}


def summary_line(states: Sequence[CellState], markup: bool = True) -> str:
    """``12 cells: ok 9, running 2, failed 1`` (with rich markup colouring each state)."""
    parts = []
    for state, n in counts(states).items():
        parts.append(f"[{STATE_STYLE[state]}]{state} {n}[/]" if markup else f"{state} {n}")
    return f"{len(states)} cell(s): " + (", ".join(parts) if parts else "none")


def table(states: Sequence[CellState], only: set[str] | None = None, max_rows: int | None = None) -> Any:
    """A rich Table of the cells, problems first; ``only`` keeps those states, ``max_rows`` cuts the rest."""
    from rich.table import Table

    shown = [s for s in states if only is None or s.state in only]
    shown.sort(key=lambda s: (_SHOW_ORDER.get(s.state, 99), s.label or "", s.cell_id))
    t = Table(show_edge=False, pad_edge=False, header_style="bold")
    t.add_column("cell", no_wrap=True)
    t.add_column("state", no_wrap=True)
    t.add_column("try", justify="right")
    t.add_column("job", no_wrap=True)
    t.add_column("settings")
    t.add_column("reason", overflow="fold")
    for s in shown[:max_rows] if max_rows is not None else shown:
        reason = s.reason if s.reason and s.state != "ok" else ""
        t.add_row(
            s.cell_id,
            f"[{STATE_STYLE.get(s.state, 'white')}]{s.state}[/]",
            str(s.attempt),
            s.job_id or "-",
            s.label or "",
            reason,
        )
    if max_rows is not None and len(shown) > max_rows:
        t.caption = f"... and {len(shown) - max_rows} more (gpudays status shows all)"
    return t
