"""The state of every cell of a sweep, from its record and the scheduler's accounting together.

A cell's latest attempt is the last line of ``attempts.jsonl``. A record decides when it belongs to that attempt
(or a later one); a record of an older attempt never hides what the scheduler says of the newer one. Otherwise
the scheduler decides: ``sacct`` is asked once for the whole sweep (every array in one call), ``squeue`` once
more for jobs sacct does not list, lists as pending, or lists as ended in a way SLURM may requeue (accounting lags
the controller by seconds, and only the controller knows why a job waits, e.g. that it is held, or that a job
just preempted is queued again).

A cell is ``pending`` or ``running`` only when the scheduler says so. A task neither command lists is gone:
``cancelled`` when the array's own record says it was cancelled before the task started, else ``lost`` (a
pending task cancelled by itself, ``scancel 12_9``, leaves no trace at all). Only a job the scheduler lists
nothing of, array included, is taken as just submitted, for LOST_GRACE_S.

A requeued job (preemption, node failure, ``scontrol requeue``, a timeout requeued by the job itself) keeps its
job id; sacct lists each of its runs, and the state comes from the newest while the reason names the earlier.
For a few seconds after a preemption or a node failure sacct's newest run is the one that ended (``PREEMPTED``,
``NODE_FAIL``) while the controller already has the job queued again: squeue's word wins, so the cell is
``pending``, never ``preempted`` (which ``resume`` would submit a second job for). Where squeue cannot be asked
then, the cell is ``unknown``: a second job must not go out while SLURM may still requeue the first.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.config.schema import to_config
from orchestrator.slurm import commands as slurm
from orchestrator.store.attempts import Attempt, read_attempts
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import BadCellConfig, BadRecord, Record, read_cell_config, read_record
from orchestrator.store.states import ACTIVE, STATES, State, all_done, needs_rerun
from orchestrator.submission import intents
from orchestrator.submission.scheduler_states import (
    NOTABLE_EARLIER_RUNS,
    HeldAction,
    ask_scheduler,
    from_slurm,
    held_action,
)

__all__ = [
    "ACTIVE",
    "STATES",
    "CellState",
    "SchedulerUnavailable",
    "cell_states",
    "classify",
    "counts",
    "is_done",
    "needs_rerun",
    "read_attempts",
]

LOST_GRACE_S = 120.0
"""A job the scheduler lists nothing of (its array included) this soon after submission is taken as pending."""

SchedulerUnavailable = slurm.SlurmUnavailable


@dataclass
class CellState:
    """What ``status`` knows of one cell."""

    cell_id: str
    state: State
    attempt: int
    """The latest attempt (1 for the first submission; 0 if never submitted)."""
    job_id: str | None
    reason: str | None = None
    scheduler_state: str | None = None
    """The scheduler's state of the latest run as printed (``PENDING``, ``CANCELLED by 0``...), where asked."""
    record: Record | None = None
    history: tuple[str, ...] = ()
    """States of earlier runs of the same job (a requeued job runs again under its id), oldest first."""
    label: str | None = None
    log: Path | None = None
    """Standard error of the job's first task, where a traceback without a record would be."""
    held: HeldAction | None = None
    """For a held cell: what ``resume`` does with it."""


def _age_s(submitted_at: Any, now: dt.datetime) -> float:
    try:
        when = dt.datetime.fromisoformat(str(submitted_at))
    except ValueError:
        return float("inf")
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return (now - when).total_seconds()


def job_log(paths: SweepPaths, job_id: str) -> Path:
    """Standard error of task 0 of a job, as submitit names it (``jobs/<id>/<id>_0_log.err``)."""
    return paths.job_dir(job_id) / f"{job_id}_0_log.err"


def job_logs(paths: SweepPaths, job_id: str) -> tuple[Path, Path]:
    """Standard output and standard error of task 0 of a job: a failure may say itself in either (a full disk's
    ``No space left on device`` comes on the output from the job's shell, a traceback on the error)."""
    err = job_log(paths, job_id)
    return err.with_suffix(".out"), err


def cell_states(
    paths: SweepPaths, query_scheduler: bool = True, now: dt.datetime | None = None, holding_lock: bool = False
) -> list[CellState]:
    """The state of every cell in the sweep folder, sorted by cell id.

    A submission cut short (an intent without a job id) is reconciled first (``orchestrator.submission.intents``): its job,
    found by its name, is adopted, written down where this command may (``holding_lock``, or the lock is free).
    Raises SchedulerUnavailable when cells need the scheduler and neither sacct nor squeue answers.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    cell_ids = paths.cell_ids()
    records: dict[str, Record | BadRecord | None] = {}
    found: dict[str, list[Attempt]] = {}
    signatures: dict[str, tuple[_Signature, _Signature]] = {}
    for cid in cell_ids:
        # the record's own stat too: a record damaged or replaced by hand is read again
        signatures[cid] = (_stat(paths.attempts(cid)), _stat(paths.record(cid)))
        kept = _FINAL.get(paths.record(cid))
        if kept is not None and kept[0] == signatures[cid]:
            records[cid], found[cid] = kept[1], list(kept[2])
        else:
            _FINAL.pop(paths.record(cid), None)
            records[cid] = read_record(paths.record(cid), cid)
            found[cid] = read_attempts(paths, cid)
    # Every intent without a job id is reconciled, a cell its record decides included: a job that ran before any
    # command adopted it has its id written all the same, so its attempt names its job (and its logs).
    settled = intents.reconcile(paths, found, holding_lock, ask=query_scheduler)
    attempts = {**found, **settled.attempts}

    # Only jobs whose cells the records do not decide go to the scheduler.
    slurm_ids = [
        a[-1].job_id
        for cid, a in attempts.items()
        if a
        and a[-1].backend == "slurm"
        and a[-1].job_id
        and not _record_decides(records[cid], a, scheduler_may_correct=False)
    ]
    acct: slurm.Accounting | None = None
    note = None
    if query_scheduler and slurm_ids:
        acct, note = ask_scheduler(slurm_ids)
        # A job may write its record and end between the first read and the scheduler's answer: read again, so
        # that a job the scheduler calls COMPLETED is not taken for one that died without writing its record.
        for cid, a in attempts.items():
            if a and a[-1].job_id in slurm_ids:
                records[cid] = read_record(paths.record(cid), cid)
    out = []
    for cid in cell_ids:
        latest = attempts[cid][-1] if attempts[cid] else None
        state = classify(cid, latest, records[cid], acct, note, now)
        if state.state is State.LOST and latest is not None and latest.backend == "local" and latest.job_id:
            # Its process may have written the record and ended since the first read: read again, so that a cell
            # that finished meanwhile is not taken for one that died without a record.
            records[cid] = read_record(paths.record(cid), cid)
            state = classify(cid, latest, records[cid], acct, note, now)
        if latest is not None and latest.intent_only and not _record_decides(records[cid], attempts[cid]):
            state = _cut_short(state, settled.never_submitted.get(cid), settled.unsure.get(cid))
        if state.state is State.NEW:
            state.label = _label(paths, cid)
        state.log = job_log(paths, state.job_id) if state.job_id else None
        if state.state in (State.FAILED, State.HOST_OOM) and state.record is None and state.log is not None:
            state.reason = f"{state.reason}; see {state.log}" if state.reason else f"see {state.log}"
        out.append(state)
        if state.state in FINAL and isinstance(records[cid], Record) and attempts[cid] == found[cid]:
            _FINAL[paths.record(cid)] = (signatures[cid], records[cid], tuple(found[cid]))
    return out


FINAL = frozenset({State.OK, State.DOES_NOT_FIT, State.OOM, State.INVALID})
"""States a cell's files alone decide for good: its record and attempts are not read again in this process while
its attempts.jsonl keeps its inode, size and modification time (a ``--wait`` over a 1,000-cell sweep checks again
and again: one stat a finished cell instead of two files opened and parsed). A final record is replaced only with
a new attempt (``resume --rerun``, ``--time-limit`` append to attempts.jsonl first; a job that runs again after its
record was written keeps the record and writes nothing over it), so the attempts file alone tells a change."""

_Signature = tuple[int, int, int] | None
_FINAL: dict[Path, tuple[tuple[_Signature, _Signature], Record | BadRecord | None, tuple[Attempt, ...]]] = {}


def _stat(path: Path) -> _Signature:
    """Inode, size and modification time (None where missing), taken before the file is read: a line appended
    after the read changes it, so a stale copy is never kept."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


CANCEL_MAY_CORRECT = frozenset({State.FAILED, State.TIMEOUT})
"""Records whose state the scheduler's CANCELLED overrides: a probe that died of a cancel's SIGTERM before it
could ask the scheduler wrote one of these (``resume --time-factor`` must not take a cancel for a timeout)."""


def _record_decides(
    record: Record | BadRecord | None, attempts: Sequence[Attempt], scheduler_may_correct: bool = True
) -> bool:
    """A record of the latest attempt (or a later one) says how the cell ended, whatever the scheduler says;
    not ``scheduler_may_correct``: except a failure or timeout, which the scheduler is asked about (a cancel)."""
    latest = attempts[-1].attempt if attempts else 0
    decides = isinstance(record, Record) and record.attempt >= latest
    if decides and not scheduler_may_correct and isinstance(record, Record):
        return record.state not in CANCEL_MAY_CORRECT or record.attempt > latest
    return decides


def _cut_short(base: CellState, never_submitted: str | None, unsure: str | None) -> CellState:
    """A cell whose latest attempt is an intent no job was found for: never ``new`` (its job may exist)."""
    if never_submitted:
        return replace(base, state=State.LOST, reason=f"{never_submitted}; `gpudays resume` submits it again")
    if unsure == "being submitted by another gpudays command":
        return replace(base, state=State.PENDING, reason=unsure)
    return replace(base, state=State.UNKNOWN, reason=unsure or "its submission was cut short")


def classify(
    cell_id: str,
    latest: Attempt | None,
    record: Record | BadRecord | None,
    acct: slurm.Accounting | None,
    note: str | None = None,
    now: dt.datetime | None = None,
) -> CellState:
    """One cell's state from its latest submission, its record (or why it is bad) and what the scheduler said of
    the latest submission's job (``acct`` None: the scheduler was not asked)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    job_id = latest.job_id if latest else None
    base = CellState(
        cell_id,
        State.NEW,
        attempt=latest.attempt if latest else 0,
        job_id=job_id,
        label=latest.label if latest else None,
    )
    if isinstance(record, BadRecord):
        # A damaged record cannot say which attempt wrote it; while the latest attempt's job is queued or running,
        # that job decides (it writes a new record when it ends).
        if latest is not None and latest.backend == "slurm" and acct is not None:
            active = _from_scheduler(base, latest, acct, note, now)
            if active.state in ACTIVE:
                return replace(
                    active, reason=f"the record on disk is damaged ({record.reason}); this attempt writes a new one"
                )
        return replace(base, state=State.CORRUPT, reason=record.reason)
    if record is not None and record.attempt >= base.attempt:
        decided = replace(base, state=record.state, reason=_record_reason(record), record=record)
        return _cancelled_after_all(decided, latest, acct)
    if latest is None:
        return replace(base, reason="written into the sweep, never submitted")
    if latest.intent_only:
        return replace(base, state=State.UNKNOWN, reason="its submission was cut short")
    if latest.backend == "local":
        alive = job_id is not None and job_id.isdigit() and intents.process_alive(int(job_id), latest.started)
        return replace(
            base,
            state=State.RUNNING if alive else State.LOST,
            reason=None if alive else "no record, and its process is gone",
        )
    if acct is None:
        return replace(base, state=State.UNKNOWN, reason="no record yet, and the scheduler was not asked")
    return _from_scheduler(base, latest, acct, note, now)


def _cancelled_after_all(decided: CellState, latest: Attempt | None, acct: slurm.Accounting | None) -> CellState:
    """A failure or timeout the scheduler says was a cancel (sacct's CANCELLED for the record's own job)."""
    if decided.state not in CANCEL_MAY_CORRECT or acct is None or latest is None or not latest.job_id:
        return decided
    if decided.record is None or decided.record.attempt != latest.attempt:
        return decided
    try:
        job = acct.jobs.get(slurm.JobId.parse(latest.job_id))
    except ValueError:
        return decided
    if job is None or job.state != "CANCELLED":
        return decided
    said = f"; the record said {decided.state.value}: {decided.reason}" if decided.reason else ""
    return replace(
        decided,
        state=State.CANCELLED,
        reason=f"the scheduler cancelled job {latest.job_id} (sacct: {job.raw_state or job.state}){said}",
        scheduler_state=job.raw_state or job.state,
    )


def _record_reason(record: Record) -> str | None:
    status = record.status.value
    if record.state.value != status:  # comm_error, compile_error: failed, and the reason says which
        return f"{status}: {record.reason}" if record.reason else status
    return record.reason


def _label(paths: SweepPaths, cell_id: str) -> str | None:
    """The cell's short name from its config (only for cells never submitted: the others carry it)."""
    from orchestrator.cells import cell as cells

    try:
        return cells.label(to_config(read_cell_config(paths.cell_config(cell_id))))
    except (BadCellConfig, KeyError, TypeError, ValueError):  # a name for display only
        return None


def _from_scheduler(
    base: CellState, latest: Attempt, acct: slurm.Accounting, note: str | None, now: dt.datetime
) -> CellState:
    try:
        jid = slurm.JobId.parse(latest.job_id or "")
    except ValueError:
        return replace(base, state=State.LOST, reason=f"attempts.jsonl names job {latest.job_id!r}, not a SLURM id")
    job = acct.jobs.get(jid)
    if job is None:
        return _unlisted(base, jid, latest, acct, note, now)
    if jid in acct.unconfirmed:
        return replace(
            base,
            state=State.UNKNOWN,
            reason=f"sacct says {job.raw_state or job.state}, and squeue could not be asked whether SLURM queued "
            "it again; `gpudays status` asks again",
            scheduler_state=job.raw_state or job.state,
            history=job.history,
        )
    state = from_slurm(job.state, job.reason)
    reasons = []
    if state is State.HELD:
        held = held_action(job.reason)
        base = replace(base, held=held)
        reasons.append(f"held ({job.reason}): {_held_advice(held, jid)}")
    elif state is State.PENDING and job.reason:
        reasons.append(f"waiting: {job.reason}")  # squeue's reason: Resources, Priority, JobArrayTaskLimit...
    elif state not in ACTIVE:
        reasons.append(
            f"SLURM state {job.raw_state or job.state}" + (f", exit code {job.exit_code}" if job.exit_code else "")
        )
    if job.state == "COMPLETED":
        reasons = ["the job completed but wrote no record"]
    if job.state.startswith("REQUEUE") and state is not State.HELD:
        reasons.append("requeued; waits to run again")
    notable = [h for h in job.history if h in NOTABLE_EARLIER_RUNS]
    if notable:
        reasons.append(f"requeued: earlier run(s) of this job ended {', '.join(notable)}")
    return replace(
        base,
        state=state,
        reason="; ".join(reasons) or None,
        scheduler_state=job.raw_state or job.state,
        history=job.history,
    )


def _held_advice(action: HeldAction | None, jid: slurm.JobId) -> str:
    if action is HeldAction.RESUBMIT:
        return "its launch failed; `gpudays resume` cancels it and submits the cell again"
    if action is HeldAction.ADMIN:
        return f"held by an administrator; only they can `scontrol release {jid}` (or `scancel {jid}`, then resume)"
    return f"`gpudays resume` (or `scontrol release {jid}`) lets it run"


def _unlisted(
    base: CellState,
    jid: slurm.JobId,
    latest: Attempt,
    acct: slurm.Accounting,
    note: str | None,
    now: dt.datetime,
) -> CellState:
    """A job neither sacct nor squeue lists: cancelled, lost, or (only if nothing of its array is known) new."""
    array = acct.arrays.get(jid.array)
    if jid.task is not None and array is not None and array.state in ("CANCELLED", "REVOKED"):
        return replace(
            base,
            state=State.CANCELLED,
            reason=f"array {jid.array} was cancelled before task {jid.task} started (sacct: {array.raw_state})",
            scheduler_state=array.raw_state,
        )
    if jid.array in acct.seen:
        return replace(
            base,
            state=State.LOST,
            reason=f"the scheduler lists array {jid.array} but not task {jid.task}: it never started "
            "(cancelled while pending, or removed)",
        )
    if _age_s(latest.submitted_at or None, now) < LOST_GRACE_S:
        return replace(base, state=State.PENDING, reason="just submitted; the scheduler does not list it yet")
    why = "no record, and the scheduler no longer knows the job"
    if note:
        why += f" (accounting could not be asked: {note})"
    return replace(base, state=State.LOST, reason=why)


def counts(states: Sequence[CellState]) -> dict[str, int]:
    """How many cells are in each state, in the order of STATES, leaving out states with none."""
    c = Counter(s.state for s in states)
    return {k.value: c[k] for k in STATES if c[k]}


def is_done(states: Sequence[CellState]) -> bool:
    """No cell is queued or running (or of a state the scheduler could not be asked about)."""
    return all_done(s.state for s in states)


def settle_held(states: Sequence[CellState]) -> tuple[list[CellState], list[str]]:
    """What ``resume`` does with held cells; returns the cells still to resubmit, and a line for each action.

    A user's hold is released (``scontrol release``): the job keeps its id and attempt, and nothing is submitted
    twice. An administrator's hold is released too where SLURM lets this user (else it is left, and said so).
    A job SLURM held after its launch failed is cancelled and its cell resubmitted: releasing it would retry a
    launch that already failed. Cells in other states pass through unchanged.
    """
    rest: list[CellState] = []
    said: list[str] = []
    for s in states:
        if s.state is not State.HELD or s.job_id is None:
            rest.append(s)
            continue
        jid = slurm.JobId.parse(s.job_id)
        if s.held is HeldAction.RESUBMIT:
            slurm.cancel([jid])
            said.append(f"{s.cell_id}: job {jid} was held after a failed launch; cancelled, resubmitting the cell")
            rest.append(s)
            continue
        try:
            slurm.release([jid])
            said.append(f"{s.cell_id}: released job {jid} (scontrol release); it runs as attempt {s.attempt}")
        except slurm.SlurmUnavailable as e:
            said.append(f"{s.cell_id}: job {jid} stays held: {e}")
    return rest, said
