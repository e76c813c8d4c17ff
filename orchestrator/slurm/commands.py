"""Every call to a SLURM command, and the parsing of what it prints, in one place.

``sbatch --test-only``, ``sacct``, ``squeue``, ``sinfo``, ``scontrol`` (show, release, requeue), ``sacctmgr`` (names, limits) and
``scancel`` run through :func:`run`, which turns a missing command or one that does not answer into
:class:`SlurmUnavailable`. Job ids are parsed once, into :class:`JobId`: ``12`` (a job), ``12_3`` (task 3 of
array 12), and the ranges that ``sacct`` and ``squeue`` print for array tasks not yet started, ``12_[4-7,9%2]``
(``%2``: at most two at once).

What sacct shows of an array (checked on SLURM 22.05 and 23.02): a task that started has its own line
(``12_3|15|...``, the raw id is the task's own job id; the last task to start reuses the array's, ``12_7|12``);
tasks not started yet share the array's own record, printed as a range (``12_[8-11%2]|12|PENDING``) or, when no
task ever started, as the bare array id (``12|12|CANCELLED by 0`` after ``scancel 12``). A pending task cancelled
by itself (``scancel 12_9``) leaves no line anywhere: it drops out of the range and never gets a record.
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from orchestrator.slurm.errors import explain_failure

DEFAULT_TIMEOUT_S = 60.0


def normalize_slurm_state(raw: str) -> str:
    """``CANCELLED by 1000`` -> ``CANCELLED``; ``RUNNING+`` -> ``RUNNING``; case and spaces ignored."""
    words = raw.strip().split()
    return words[0].rstrip("+").upper() if words else ""


class SlurmUnavailable(RuntimeError):
    """A SLURM command is not installed, did not answer in time, or failed; the message says which and why."""


def run(
    cmd: Sequence[str], stdin: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run one SLURM command and return what it did (a non-zero exit is the caller's to judge).

    Raises SlurmUnavailable when the command is not on PATH or does not answer within ``timeout_s``.
    """
    try:
        return subprocess.run(list(cmd), input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError as e:
        raise SlurmUnavailable(
            f"`{cmd[0]}` is not on PATH: cluster=slurm needs SLURM's commands (sbatch, sacct, squeue, sinfo, scontrol), "
            "so run gpudays on a machine that has them (a login node), or use cluster=local"
        ) from e
    except subprocess.TimeoutExpired as e:
        raise SlurmUnavailable(f"`{' '.join(cmd)}` did not answer within {timeout_s:.0f} s; is slurmctld up?") from e


def checked(cmd: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S, ok_errors: Sequence[str] = ()) -> str:
    result = run(cmd, timeout_s=timeout_s)
    if result.returncode != 0 and not any(e in result.stderr for e in ok_errors):
        raise SlurmUnavailable(explain_failure(cmd[0], result.returncode, result.stderr))
    return result.stdout


# ---- job ids --------------------------------------------------------------------------------------------------

_JOB_ID = re.compile(r"^(\d+)(?:_(\d+))?$")
_RANGE = re.compile(r"^(\d+)_\[([0-9,\-]+)(?:%\d+)?\]$")


@dataclass(frozen=True, order=True)
class JobId:
    """A job (``12``) or one task of an array job (``12_3``)."""

    job: int
    """The job id; for an array task, the array's id."""
    task: int | None = None

    @classmethod
    def parse(cls, text: str) -> JobId:
        """``"12"`` or ``"12_3"``; raises ValueError for anything else (a range is :func:`expand_job_ids`'s)."""
        m = _JOB_ID.match(str(text).strip())
        if not m:
            raise ValueError(f"not a SLURM job id: {text!r} (expected 12 or 12_3)")
        return cls(int(m.group(1)), int(m.group(2)) if m.group(2) is not None else None)

    @property
    def array(self) -> str:
        """The id to ask sacct and squeue about: the array's for a task, else the job's own."""
        return str(self.job)

    def __str__(self) -> str:
        return f"{self.job}_{self.task}" if self.task is not None else str(self.job)


def expand_job_ids(text: str) -> list[JobId]:
    """``12_[3-5,7%2]`` -> 12_3 12_4 12_5 12_7; ``12_3`` -> 12_3; ``12`` -> 12. Raises ValueError otherwise."""
    m = _RANGE.match(text.strip())
    if not m:
        return [JobId.parse(text)]
    job = int(m.group(1))
    out: list[JobId] = []
    for part in m.group(2).split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(JobId(job, i) for i in range(int(lo), int(hi) + 1))
        elif part:
            out.append(JobId(job, int(part)))
    return out


def _arrays(job_ids: Iterable[JobId]) -> str:
    return ",".join(sorted({j.array for j in job_ids}, key=lambda a: (len(a), a)))


# ---- sacct and squeue -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobInfo:
    """What the scheduler says of one job or array task: its newest run, and the runs before it."""

    state: str
    """SLURM's state name, normalized (``CANCELLED``, not ``CANCELLED by 0``)."""
    exit_code: str | None = None
    reason: str | None = None
    """Why a pending job waits (squeue's %r): ``JobHeldUser``, ``launch failed requeued held``..."""
    history: tuple[str, ...] = ()
    """States of earlier runs of the same job id (a requeued job runs again under it), oldest first."""
    raw_state: str = ""
    """The state as printed, e.g. ``CANCELLED by 1000``."""


@dataclass
class Accounting:
    """What sacct and squeue said of some jobs: each task by id, and each array's own record."""

    jobs: dict[JobId, JobInfo] = field(default_factory=dict)
    arrays: dict[str, JobInfo] = field(default_factory=dict)
    """An array's own record (tasks never started: a pending range, or the bare array id), by array id."""
    seen: set[str] = field(default_factory=set)
    """Arrays (and plain jobs) either command listed at all."""
    unconfirmed: set[JobId] = field(default_factory=set)
    """Jobs whose newest run sacct lists as ended in a way SLURM may requeue, which squeue could not be asked
    about: whether they run again is not known."""

    def merge(self, other: Accounting, prefer_other: bool = False) -> None:
        """Add what ``other`` knows; where both know a job, keep ours unless ``prefer_other``."""
        for jid, info in other.jobs.items():
            if prefer_other or jid not in self.jobs:
                self.jobs[jid] = info
        for array, info in other.arrays.items():
            if prefer_other or array not in self.arrays:
                self.arrays[array] = info
        self.seen |= other.seen
        self.unconfirmed |= other.unconfirmed


SACCT_FORMAT = "JobID,JobIDRaw,State,ExitCode,Reason"
SQUEUE_FORMAT = "%i|%T|%r"


def _none(text: str) -> str | None:
    text = text.strip()
    return None if text in ("", "None", "(null)") else text


def parse_sacct(text: str) -> Accounting:
    """``sacct -n -P -X --duplicates -o JobID,JobIDRaw,State,ExitCode,Reason`` -> each task's runs, each array's own
    record. Lines it cannot read are skipped; the three-column form (no JobIDRaw, no Reason) is read too."""
    runs: dict[JobId, list[JobInfo]] = {}
    out = Accounting()
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 5:
            job_text, raw_id, state, exit_code, reason = parts[:5]
        elif len(parts) >= 2:
            job_text, raw_id, state = parts[0], "", parts[1]
            exit_code, reason = (parts[2] if len(parts) > 2 else ""), ""
        else:
            continue
        if not state.strip():
            continue
        try:
            ids = expand_job_ids(job_text)
        except ValueError:
            continue
        info = JobInfo(normalize_slurm_state(state), _none(exit_code), _none(reason), raw_state=state.strip())
        out.seen.add(ids[0].array)
        is_array_record = "[" in job_text or (raw_id.strip() == job_text.strip() and ids[0].task is None)
        if is_array_record:
            out.arrays[ids[0].array] = info
        for jid in ids:
            runs.setdefault(jid, []).append(info)
    for jid, rs in runs.items():
        newest = rs[-1]
        out.jobs[jid] = JobInfo(
            newest.state, newest.exit_code, newest.reason, tuple(r.state for r in rs[:-1]), newest.raw_state
        )
    return out


def parse_squeue(text: str) -> Accounting:
    """``squeue -h -r -t all -o '%i|%T|%r'`` -> each job's state and reason (pending ranges expanded)."""
    out = Accounting()
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[1].strip():
            continue
        try:
            ids = expand_job_ids(parts[0])
        except ValueError:
            continue
        state = parts[1].strip()
        reason = _none(parts[2]) if len(parts) > 2 else None
        info = JobInfo(normalize_slurm_state(state), None, reason, raw_state=state)
        out.seen.add(ids[0].array)
        if "[" in parts[0]:
            out.arrays[ids[0].array] = info
        for jid in ids:
            out.jobs[jid] = info
    return out


def sacct(job_ids: Sequence[JobId], timeout_s: float = DEFAULT_TIMEOUT_S) -> Accounting:
    """One sacct call for the arrays of ``job_ids``; raises SlurmUnavailable when accounting cannot be asked."""
    if not job_ids:
        return Accounting()
    cmd = ["sacct", "-n", "-P", "-X", "--duplicates", "-o", SACCT_FORMAT, "-j", _arrays(job_ids)]
    return parse_sacct(checked(cmd, timeout_s))


USAGE_FORMAT = "JobID,AllocTRES,ElapsedRaw"
_GPU_TRES = re.compile(r"^gres/gpu(?::[^=]+)?=(\d+)$")


def parse_usage(text: str) -> dict[JobId, float]:
    """``sacct -n -P -X --duplicates -o JobID,AllocTRES,ElapsedRaw`` -> GPU-seconds SLURM allocated to each job or
    task, every run of a requeued job counted: the GPUs of AllocTRES (``gres/gpu=4``; the typed counts
    ``gres/gpu:a100=4`` summed where the untyped one is missing) × the elapsed seconds. A run that was never
    allocated (pending, an array's pending range) counts nothing; lines it cannot read are skipped."""
    out: dict[JobId, float] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 3:
            continue
        try:
            jid, elapsed = JobId.parse(fields[0]), float(fields[2])
        except ValueError:
            continue
        untyped, typed = None, 0
        for item in fields[1].split(","):
            m = _GPU_TRES.match(item.strip())
            if m and item.strip().startswith("gres/gpu="):
                untyped = int(m.group(1))
            elif m:
                typed += int(m.group(1))
        out[jid] = out.get(jid, 0.0) + (untyped if untyped is not None else typed) * elapsed
    return out


def sacct_usage(job_ids: Sequence[JobId], timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[JobId, float]:
    """GPU-seconds allocated to each of ``job_ids`` (parse_usage), one sacct call; only the jobs sacct lists.
    Raises SlurmUnavailable when accounting cannot be asked."""
    if not job_ids:
        return {}
    cmd = ["sacct", "-n", "-P", "-X", "--duplicates", "-o", USAGE_FORMAT, "-j", _arrays(job_ids)]
    wanted = set(job_ids)
    return {j: v for j, v in parse_usage(checked(cmd, timeout_s)).items() if j in wanted}


def squeue(job_ids: Sequence[JobId], timeout_s: float = DEFAULT_TIMEOUT_S) -> Accounting:
    """One squeue call (the controller's live view: queued, running, just ended) for the arrays of ``job_ids``."""
    if not job_ids:
        return Accounting()
    cmd = ["squeue", "-h", "-r", "-t", "all", "-o", SQUEUE_FORMAT, "-j", _arrays(job_ids)]
    return parse_squeue(checked(cmd, timeout_s, ok_errors=("Invalid job id",)))


@dataclass(frozen=True)
class Named:
    """What the scheduler has of some job names: the job (an array's own id) of each name it lists."""

    jobs: dict[str, str]
    complete: bool
    """Both the controller and accounting answered, so a name they do not list has no job."""


def parse_named(text: str) -> dict[str, str]:
    """``JOBID|NAME`` lines (squeue's ``%F|%j``, sacct's ``JobID,JobName``) -> name: the job or array's own id."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        job, _, name = line.strip().partition("|")
        job = job.split("_", 1)[0].strip()
        if job.isdigit() and name.strip():
            out.setdefault(name.strip(), job)
    return out


def jobs_named(names: Sequence[str], since: dt.datetime, timeout_s: float = DEFAULT_TIMEOUT_S) -> Named:
    """The jobs named ``names`` (a submission's token): squeue for what the controller holds, sacct for what ran
    since ``since``. Raises SlurmUnavailable when neither answers."""
    found: dict[str, str] = {}
    listing = ",".join(sorted(set(names)))
    answered = 0
    problems = []
    for cmd in (
        ["squeue", "-h", "-t", "all", f"--name={listing}", "-o", "%F|%j"],
        [
            "sacct",
            "-n",
            "-P",
            "-X",
            f"--name={listing}",
            "-S",
            since.astimezone().strftime("%Y-%m-%dT%H:%M:%S"),
            "-o",
            "JobID,JobName",
        ],
    ):
        try:
            found.update({k: v for k, v in parse_named(checked(cmd, timeout_s)).items() if k not in found})
            answered += 1
        except SlurmUnavailable as e:
            problems.append(str(e))
    if not answered:
        raise SlurmUnavailable("; ".join(problems))
    return Named(found, complete=answered == 2)


def end_time(job_id: str, timeout_s: float = 10) -> dt.datetime | None:
    """When SLURM will end a running job (its EndTime, which a requeue resets); None if it cannot tell."""
    try:
        out = run(["squeue", "-h", "-j", job_id, "-o", "%e"], timeout_s=timeout_s).stdout.strip()
        return dt.datetime.fromisoformat(out.splitlines()[0])
    except (SlurmUnavailable, ValueError, IndexError):
        return None


def parse_time_limit(text: str) -> dt.timedelta | None:
    """squeue's ``%l``: ``[days-]hours:minutes:seconds`` or ``minutes:seconds``; None for UNLIMITED or nonsense."""
    days, _, clock = text.strip().rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
        whole_days = int(days) if days else 0
    except ValueError:
        return None
    if len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:  # minutes:seconds, or days-hours:minutes
        hours, minutes, seconds = (parts[0], parts[1], 0) if days else (0, parts[0], parts[1])
    else:
        return None
    return dt.timedelta(days=whole_days, hours=hours, minutes=minutes, seconds=seconds)


def limit_end(job_id: str, timeout_s: float = 10) -> dt.datetime | None:
    """When a running job reaches its time limit: its StartTime (which a requeue resets) plus its TimeLimit.

    Not its EndTime: ``scancel`` sets that to the moment of the cancel, so a job's SIGTERM would look like the
    limit's. None if SLURM cannot tell."""
    try:
        out = run(["squeue", "-h", "-j", job_id, "-o", "%S|%l"], timeout_s=timeout_s).stdout.strip()
        start, _, limit = out.splitlines()[0].partition("|")
        length = parse_time_limit(limit)
        return dt.datetime.fromisoformat(start) + length if length is not None else None
    except (SlurmUnavailable, ValueError, IndexError):
        return None


def was_cancelled(job_id: str, timeout_s: float = 5, tries: int = 3, pause_s: float = 0.2) -> bool:
    """Whether the scheduler says this job was cancelled (``scancel``), asked when its SIGTERM comes.

    ``scancel`` sets the job CANCELLED before SLURM signals it, but ``scontrol`` shows a job being killed as
    COMPLETING (a flag over its state), whatever ended it; accounting (``sacct``) names the state under the flag,
    once slurmctld has sent it (a moment later: asked ``tries`` times). False when neither says CANCELLED, or when
    they cannot be asked."""
    try:
        shown = run(["scontrol", "show", "job", "-o", job_id], timeout_s=timeout_s).stdout
    except SlurmUnavailable:
        return False
    found = re.search(r"\bJobState=(\S+)", shown)
    state = normalize_slurm_state(found.group(1)) if found else ""
    if state != "COMPLETING":
        return state == "CANCELLED"
    for attempt in range(tries):
        try:
            out = run(["sacct", "-n", "-P", "-X", "-o", "State", "-j", job_id], timeout_s=timeout_s).stdout
        except SlurmUnavailable:
            return False
        states = [normalize_slurm_state(line) for line in out.splitlines() if line.strip()]
        if states and states[-1] not in ("RUNNING", "PENDING", "REQUEUED"):
            return states[-1] == "CANCELLED"
        if attempt + 1 < tries:
            time.sleep(pause_s)
    return False


# ---- acting on jobs -------------------------------------------------------------------------------------------


def release(job_ids: Sequence[JobId]) -> None:
    """``scontrol release`` held jobs; raises SlurmUnavailable with SLURM's words when it refuses."""
    if job_ids:
        checked(["scontrol", "release", ",".join(map(str, job_ids))])


def requeue(job_ids: Sequence[JobId]) -> None:
    """``scontrol requeue`` jobs (they keep their ids and run again)."""
    if job_ids:
        checked(["scontrol", "requeue", ",".join(map(str, job_ids))])


def cancel(job_ids: Sequence[JobId]) -> None:
    """``scancel`` jobs; one that already ended is no error."""
    if job_ids:
        checked(["scancel", *map(str, job_ids)], ok_errors=("already completed", "Invalid job id"))


def jobs_on_nodes(nodes: str, timeout_s: float = 10) -> list[tuple[str, str, str]]:
    """The jobs running on ``nodes`` (a host list, ``node[1-2]``): (job id, the id as squeue shows it, user) each;
    raises SlurmUnavailable when squeue fails."""
    out = checked(["squeue", "-h", "-t", "RUNNING", "-w", nodes, "-o", "%A|%i|%u"], timeout_s=timeout_s)
    rows = [(line.split("|") + ["", ""])[:3] for line in out.splitlines() if line.strip()]
    return [(row[0], row[1], row[2]) for row in rows]
