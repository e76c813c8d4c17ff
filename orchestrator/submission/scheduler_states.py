"""SLURM's job states read as a cell's states: asking ``sacct`` and ``squeue`` about a sweep's jobs, their spelling
of states, and what ``resume`` does with a held job (a user's hold, a failed launch, an administrator's hold)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from enum import Enum

from orchestrator.slurm import commands as slurm
from orchestrator.slurm.commands import normalize_slurm_state
from orchestrator.store.states import State

_SLURM = {
    "PENDING": State.PENDING,
    "REQUEUED": State.PENDING,
    "REQUEUE_FED": State.PENDING,
    "RESV_DEL_HOLD": State.HELD,
    "REQUEUE_HOLD": State.HELD,
    "SPECIAL_EXIT": State.HELD,
    "RESIZING": State.RUNNING,
    "RUNNING": State.RUNNING,
    "SUSPENDED": State.RUNNING,
    "COMPLETING": State.RUNNING,
    "CONFIGURING": State.RUNNING,
    "STAGE_OUT": State.RUNNING,
    "SIGNALING": State.RUNNING,
    "STOPPED": State.RUNNING,
    "COMPLETED": State.FAILED,  # ended well but left no record: the job died before writing it
    "FAILED": State.FAILED,
    "TIMEOUT": State.TIMEOUT,
    "DEADLINE": State.TIMEOUT,
    "PREEMPTED": State.PREEMPTED,
    "NODE_FAIL": State.NODE_FAIL,
    "BOOT_FAIL": State.NODE_FAIL,
    "LAUNCH_FAILED": State.FAILED,
    "CANCELLED": State.CANCELLED,
    "REVOKED": State.CANCELLED,
    "OUT_OF_MEMORY": State.HOST_OOM,
}
SLURM_STATE_NAMES = frozenset(_SLURM)

NOTABLE_EARLIER_RUNS = frozenset(
    {"PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "TIMEOUT", "REQUEUED", "FAILED", "OUT_OF_MEMORY"}
)
"""Earlier runs of a requeued job worth naming in its reason."""


class HeldAction(str, Enum):
    """What ``resume`` does with a held cell."""

    RELEASE = "release"
    """A user's hold (``scontrol hold``, ``sbatch -H``, ``scontrol requeuehold``): release it; same job, same attempt."""
    RESUBMIT = "resubmit"
    """SLURM held it after its launch failed: releasing would try the same broken launch; cancel and resubmit."""
    ADMIN = "admin"
    """An administrator's hold: a user cannot release it; ``resume`` leaves it and says so."""


# squeue's %r (sacct's Reason) for a held pending job.
_HELD_REASONS = {
    "jobheldadmin": HeldAction.ADMIN,
    "jobhelduser": HeldAction.RELEASE,
    "job requeued in held state": HeldAction.RELEASE,
    "requeuehold": HeldAction.RELEASE,
    "launch failed requeued held": HeldAction.RESUBMIT,
    "held state on launch failure": HeldAction.RESUBMIT,
}


def held_action(reason: str | None) -> HeldAction | None:
    """What to do with a pending job held for ``reason`` (squeue's %r); None when the reason is no hold."""
    if not reason:
        return None
    key = reason.strip().lower()
    if key in _HELD_REASONS:
        return _HELD_REASONS[key]
    if "held" in key:  # an unlisted hold: a person released it before, so can the user
        return HeldAction.RESUBMIT if "fail" in key else HeldAction.RELEASE
    return None


def from_slurm(raw: str, reason: str | None = None) -> State:
    """A cell's state from SLURM's state of its job (``sacct``/``squeue`` spelling) and, for pending jobs, why.

    ``PENDING`` with a hold reason is ``held`` (``BeginTime``, the short delay before a requeued job may start, is
    no hold). A state this module does not know is ``failed`` (the reason shows it).
    """
    name = normalize_slurm_state(raw)
    state = _SLURM.get(name, State.FAILED)
    if state is State.PENDING and held_action(reason) is not None:
        return State.HELD
    return state


MAY_BE_REQUEUED = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})
"""sacct states of a run that SLURM may follow with another run of the same job (``PreemptMode=REQUEUE``,
``JobRequeue=1`` or ``--requeue``): the controller alone says at once whether it did."""


def ask_scheduler(job_ids: Sequence[str]) -> tuple[slurm.Accounting, str | None]:
    """sacct for every job; squeue for those sacct lacks, lists as pending or as ended in a way SLURM may requeue
    (MAY_BE_REQUEUED); a note when sacct could not answer.

    Raises ``slurm.SlurmUnavailable`` (``status.SchedulerUnavailable``) when neither answers.
    """
    ids = []
    for text in job_ids:
        try:
            ids.append(slurm.JobId.parse(text))
        except ValueError:
            continue
    note = None
    try:
        acct = slurm.sacct(ids)
    except slurm.SlurmUnavailable as e:
        acct, note = slurm.Accounting(), str(e)
    unsure = [j for j in ids if j not in acct.jobs or acct.jobs[j].state in ("PENDING", *MAY_BE_REQUEUED)]
    if unsure:
        try:
            live = slurm.squeue(unsure)
        except slurm.SlurmUnavailable as e:
            if note is not None:
                raise slurm.SlurmUnavailable(note if str(e) == note else f"{note}; {e}") from e
            acct.unconfirmed |= {j for j in unsure if j in acct.jobs and acct.jobs[j].state in MAY_BE_REQUEUED}
        else:
            # squeue lists every queued job; one accounting still calls pending but squeue does not list was
            # cancelled while it waited (sacct's pending range lags). squeue's word is the newer one, and it
            # alone says why a job waits. A run that ended as one SLURM may requeue stands where squeue no
            # longer lists the job (MinJobAge later); where it lists it queued or running again, that wins.
            for j in unsure:
                if j not in live.jobs and j in acct.jobs and acct.jobs[j].state == "PENDING":
                    del acct.jobs[j]
            for j, info in live.jobs.items():
                if j in acct.jobs and info.state != acct.jobs[j].state and acct.jobs[j].state in MAY_BE_REQUEUED:
                    live.jobs[j] = replace(info, history=(*acct.jobs[j].history, acct.jobs[j].state))
            acct.merge(live, prefer_other=True)
    return acct, note
