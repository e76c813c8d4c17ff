"""Submissions cut short: an intent without a job id, found again by its token; and the lock under which one
command at a time submits into a sweep folder.

A submission writes its intent (``orchestrator.store.attempts``) before the scheduler is asked. A command killed before
it wrote the job ids leaves intents whose job may or may not exist. Every later command reconciles them:

- SLURM: the job's name is the token. ``squeue`` and ``sacct`` are asked for it once for all such intents; a job
  found is adopted (its id written as the attempt's, so it is never submitted again), and, where the command was
  killed before submitit moved the job's pickle into place, the pickle is written, so the job finds its cell when
  it starts; a token neither lists never reached the scheduler, and the cell is ``lost`` (``resume`` submits it
  as a new attempt: should the old job exist after all, it starts, sees it is not the cell's current attempt,
  and exits without touching the cell).
- local: the job is the submitit process whose command line names this sweep's job folder; found, it is adopted
  with its process id and start time.

Nothing is written while another command holds the lock: its intents may be on their way to the scheduler.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import shlex
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from orchestrator.cells import cell as cells
from orchestrator.slurm import commands as slurm
from orchestrator.store.attempts import Attempt, append_attempt
from orchestrator.store.durable import WriteFailed, write_with
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import BadCellConfig, read_cell_config


@contextmanager
def sweep_lock(paths: SweepPaths, wait: bool = True, on_wait: Callable[[str], None] | None = None) -> Iterator[bool]:
    """Only one command submits into a sweep folder at a time, so no cell is submitted twice. Yields True once
    held; with ``wait=False``, False at once where another command holds it.

    An flock on ``.submit.lock`` in the folder: held by the process, so a crashed command leaves no stale lock; on
    NFS, Linux turns it into a lock the server holds (NFSv4, or v3 with lockd), which submit hosts share. The
    holder writes who it is into the file; a command that has to wait is told (``on_wait``) whom it waits for.
    """
    paths.root.mkdir(parents=True, exist_ok=True)
    with open(paths.lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                yield False
                return
            if on_wait is not None:
                on_wait(lock_holder(paths))
            fcntl.flock(f, fcntl.LOCK_EX)
        try:  # unbuffered: a write a full disk refused must not come back when the file is closed
            os.ftruncate(f.fileno(), 0)
            os.pwrite(f.fileno(), _whoami().encode(), 0)
        except OSError:  # who holds it is a courtesy to the next command; the lock itself is what matters
            pass
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _whoami() -> str:
    since = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"process {os.getpid()} on {socket.gethostname()} since {since}: {shlex.join(sys.argv)}\n"


def lock_holder(paths: SweepPaths) -> str:
    """Who holds the sweep folder's lock, as the holder wrote it; a plain word where it did not say."""
    try:
        said = paths.lock.read_text(errors="replace").strip()
    except OSError:
        said = ""
    return said[:300] or "another gpudays command"


@dataclass
class Reconciled:
    """The cells' attempts with every intent the scheduler knows adopted, and what is known of the others."""

    attempts: dict[str, list[Attempt]]
    never_submitted: dict[str, str] = field(default_factory=dict)
    """Cell id -> why its latest attempt surely never reached the scheduler."""
    unsure: dict[str, str] = field(default_factory=dict)
    """Cell id -> why nobody can tell yet whether its latest attempt's job exists."""


def open_intents(attempts: Mapping[str, Sequence[Attempt]]) -> dict[str, Attempt]:
    """Each cell whose latest attempt is an intent without a job id."""
    return {cid: a[-1] for cid, a in attempts.items() if a and a[-1].intent_only}


def reconcile(
    paths: SweepPaths, attempts: Mapping[str, Sequence[Attempt]], holding_lock: bool, ask: bool = True
) -> Reconciled:
    """Adopt the jobs of intents without job ids (see the module doc); ``holding_lock``: the caller holds the
    sweep's lock (``sweep``, ``resume``); else the lock is tried without waiting, and while another command holds
    it, its intents are left to it. ``ask=False``: the scheduler is not asked (states from the records alone)."""
    out = Reconciled({cid: list(a) for cid, a in attempts.items()})
    pending = open_intents(attempts)
    if not pending:
        return out
    if not ask:
        out.unsure = dict.fromkeys(pending, "its submission was cut short, and the scheduler was not asked")
        return out
    with sweep_lock(paths, wait=False) if not holding_lock else _held() as mine:
        if not mine:
            out.unsure = dict.fromkeys(pending, "being submitted by another gpudays command")
            return out
        adopted = {**_find_slurm(paths, pending, out), **_find_local(paths, pending, out)}
        if not adopted:
            return out
        from orchestrator.submission.launch import release_held  # submitit and the templates: only to adopt

        recorded = []
        for cid, a in adopted.items():
            try:
                append_attempt(paths, a)
                if a.backend == "slurm":
                    _rescue_pickle(paths, a)
                    recorded.append(slurm.JobId.parse(a.job_id or ""))
            except WriteFailed:
                pass  # adopted for this command; the next one writes it (and releases it)
            out.attempts[cid][-1] = a
        release_held(recorded)  # submitted held: it runs now that its id, folder and pickle are in place
    return out


@contextmanager
def _held() -> Iterator[bool]:
    yield True


def _find_slurm(paths: SweepPaths, pending: Mapping[str, Attempt], out: Reconciled) -> dict[str, Attempt]:
    intents = {cid: a for cid, a in pending.items() if a.backend == "slurm" and a.token}
    if not intents:
        return {}
    since = min((_when(a.submitted_at) for a in intents.values()), default=dt.datetime.now(dt.timezone.utc))
    try:
        named = slurm.jobs_named([a.token for a in intents.values() if a.token], since - dt.timedelta(hours=1))
    except slurm.SlurmUnavailable as e:
        out.unsure.update(
            dict.fromkeys(
                intents, f"its submission was cut short, and the scheduler could not say whether it took it ({e})"
            )
        )
        return {}
    adopted = {}
    for cid, a in intents.items():
        job = named.jobs.get(a.token or "")
        if job is not None:
            adopted[cid] = replace(a, job_id=job if a.index is None else f"{job}_{a.index}")
        elif named.complete:
            out.never_submitted[cid] = (
                f"attempt {a.attempt} was cut short before the scheduler took it (no job named {a.token})"
            )
        else:
            out.unsure[cid] = f"its submission was cut short, and accounting could not be asked for job {a.token}"
    return adopted


def _find_local(paths: SweepPaths, pending: Mapping[str, Attempt], out: Reconciled) -> dict[str, Attempt]:
    intents = {cid: a for cid, a in pending.items() if a.backend == "local"}
    if not intents:
        return {}
    running = local_jobs(paths)
    # Local cells run one at a time: a job of this sweep alive now is that of the newest intent.
    newest = max(intents, key=lambda cid: intents[cid].submitted_at)
    adopted = {}
    for cid, a in intents.items():
        if running and cid == newest:
            adopted[cid] = replace(a, job_id=str(running[0].pid), started=running[0].create_time())
        else:
            out.never_submitted[cid] = f"attempt {a.attempt} was cut short before its process started"
    return adopted


def local_jobs(paths: SweepPaths) -> list[psutil.Process]:
    """The local jobs of this sweep still alive: submitit's controller processes whose command line names the
    sweep's job folder (there is never more than one, unless a gpudays older than this check started them)."""
    folder = str(paths.submitit_folder())
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or ())
        if "submitit.local._local" in cmdline and folder in cmdline:
            found.append(proc)
    return sorted(found, key=lambda p: p.pid)


def process_alive(pid: int, started: float | None) -> bool:
    """Whether process ``pid`` runs, and is the one that started at ``started`` (where known), not a later
    process the system gave the same id."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - started) < 0.05
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def _when(text: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=7)
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def _rescue_pickle(paths: SweepPaths, a: Attempt) -> None:
    """Write the job's pickle where submitit looks for it, if the command that submitted the job was killed before
    moving it there (the job waits a minute for it before failing)."""
    import cloudpickle  # deferred with submitit: ``status`` loads neither unless it adopts a job
    import submitit

    from orchestrator.job.entry import CellJob
    from orchestrator.submission.launch import REQUEUE_BACKSTOP

    assert a.job_id is not None
    target = submitit.core.utils.JobPaths(paths.submitit_folder(), job_id=a.job_id, task_id=0).submitted_pickle
    if target.exists():
        return
    try:
        typed, _ = cells.typed_cell(read_cell_config(paths.cell_config(a.cell_id)))
    except BadCellConfig:
        return
    delayed = submitit.helpers.DelayedSubmission(CellJob(str(paths.root), a.cell_id, a.attempt))
    delayed.set_timeout(cells.time_limit_min(typed) if typed else 60, REQUEUE_BACKSTOP)
    write_with(Path(target), lambda f: cloudpickle.dump(delayed, f))


def pid_of(a: Attempt) -> int | None:
    """A local attempt's process id, where it was written."""
    return int(a.job_id) if a.backend == "local" and a.job_id and a.job_id.isdigit() else None
