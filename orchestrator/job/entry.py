"""What runs inside a job, on every rank: find the other ranks, run the probe, write the record.

submitit starts one process per rank (srun on SLURM, subprocesses locally) and calls a ``CellJob`` in each, which
runs ``run_cell``. Ranks find each other from the scheduler's environment: rank, world size and local rank from
submitit's JobEnvironment (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID on SLURM); the rendezvous address is the node
srun was launched from (SLURM_LAUNCH_NODE_IPADDR, the batch host, where rank 0 runs), and the port follows from the
job id so that two jobs on one node do not collide. Nothing here imports torch: the environment must be set before
the probe does.

Requeue. ``CellJob`` is a submitit ``Checkpointable``: its ``checkpoint`` hands submitit a fresh submission of
itself, and submitit's signal handler (``--signal=USR2@SIGNAL_DELAY_S``) saves it and runs ``scontrol requeue``.
A probe has nothing to resume from, so a requeued cell starts again, under the same job id and attempt number.
SLURM sends the warning up to 30 s (its check interval) before ``SIGNAL_DELAY_S``, and at once when the limit is
shorter than that, so the warning alone says little; on it, rank 0 asks SLURM when the job ends and:

- more than ``SIGNAL_DELAY_S`` + 30 s away: the signal is a preemption notice (clusters that send one, with
  ``PreemptParameters=send_user_signal``): requeue now;
- otherwise it is the time limit: if ``cluster.max_requeue_on_timeout`` requeues are used up, do nothing, so the
  cell may still finish, or ends as SLURM's TIMEOUT; else requeue ``REQUEUE_MARGIN_S`` before the end, not at
  once, so that a cell that finishes in time is not run twice.

On clusters that requeue preempted jobs themselves (``PreemptMode=REQUEUE``) or after a node failure
(``JobRequeue=1``), SLURM restarts the job without any of this; where ``scontrol requeue`` is refused, the job runs
on to its limit.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import signal
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, cast

import submitit

from orchestrator.cells import cell as cells
from orchestrator.cells.cell import TIME_LIMIT_WARNING_S
from orchestrator.job import start
from orchestrator.job.env import (
    allocator_settings,
    cpu_threads,
    node_jobs,
    node_name,
    rendezvous,
    say,
    scheduler_ids,
    set_allocator_env,
    set_distributed_env,
)
from orchestrator.job.failures import Ending, Happened, ProbeOutcome, TimeSignal, outcome_of
from orchestrator.job.recorded import answered, claim_record, keep_earlier_record, superseded
from orchestrator.slurm import commands as slurm
from orchestrator.store.durable import write_json_atomic
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import Record, read_cell_config, write_record
from orchestrator.store.states import RecordStatus
from orchestrator.store.version import gpudays_version, same_gpudays, version_mismatch

SIGNAL_DELAY_S = TIME_LIMIT_WARNING_S
"""``--signal=USR2@90``: SLURM warns the job about this long before its time limit (submitit's default); the same
figure that planning keeps free when it checks a probe against the time limit."""
SLURM_CHECK_INTERVAL_S = 30
"""slurmctld checks time limits and sends warnings this often, so a warning may come this much early."""
REQUEUE_MARGIN_S = 15
"""A timed-out cell asks to be requeued this long before its limit, so the requeue wins over the kill."""

ENDS_QUIETLY = frozenset({RecordStatus.OK.value, RecordStatus.DOES_NOT_FIT.value})
"""Statuses every rank reaches together; any other ends the rank with a non-zero exit, and srun its peers."""
PEER_RECORD_DELAY_S = 2.0
"""A rank other than 0 that failed waits this long before claiming the record."""

# Set just before submitit's handler requeues the job and exits: that SystemExit must end the process, not
# become the cell's failure record.
_requeuing = False
# Set once the probe has returned: a requeue now would only run a finished cell again.
_probe_done = False
# Set as the probe's guarded part begins: a Ctrl-C before it is held until then, as nothing could catch it sooner.
_in_probe = False
# When SLURM's time-limit warning, or its SIGTERM at the limit, reached this process (time.time()); a failure
# after it is the time limit's doing, whatever the probe was doing (a compiler killed by the signal included).
_time_limit_signal: TimeSignal | None = None


def time_limit_signal() -> TimeSignal | None:
    """SLURM's time-limit signal, if it reached this process: what the record's status is decided with."""
    return _time_limit_signal


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C in the terminal of a local sweep (SIGINT to every process of its group): the probe ends here, and its
    record says ``cancelled``, interrupted. A second SIGINT (submitit's controller forwards one before its SIGKILL a
    second later) is ignored, as is one after the probe ended: the record is being written."""
    global _time_limit_signal
    if _probe_done or (_time_limit_signal is not None and _time_limit_signal.name == "SIGINT"):
        return
    if _time_limit_signal is None:  # SLURM's own signal, had one come first, keeps deciding the status
        _time_limit_signal = TimeSignal("SIGINT", time.time())
    say("interrupted (SIGINT): the cell ends here and is recorded as cancelled")
    if _in_probe:
        raise KeyboardInterrupt("interrupted by SIGINT (Ctrl-C)")


def _interrupted() -> bool:
    """Whether a Ctrl-C came (before the probe began, it was held until now)."""
    return _time_limit_signal is not None and _time_limit_signal.name == "SIGINT"


def sleep_probe(sleep_s: float) -> ProbeOutcome:
    """No measurement: hold the allocation for ``sleep_s`` and report success (for plumbing checks)."""
    time.sleep(sleep_s)
    return outcome_of(Happened(Ending.COMPLETED, "probe.kind=sleep: nothing measured"), time_signal=time_limit_signal())


class JobCancelled(Exception):
    """Raised in the probe by the SIGTERM of a cancel: the probe ends and its record says ``cancelled``."""


class InjectedFailure(RuntimeError):
    """What ``probe.kind=fail`` raises: a real failure of a job, for checking how failures are handled."""


def fail_probe(sleep_s: float, rank: int = 0, fail_rank: int | None = None) -> NoReturn:
    """No measurement: hold the allocation for ``sleep_s``, then fail the way a probe's bug would; with
    ``fail_rank``, only that rank does, and the others wait for it as a collective would, then fail."""
    if fail_rank is not None and rank != fail_rank:
        wait_s = float(os.environ.get("GPUDAYS_DIST_TIMEOUT_S", "600"))
        time.sleep(wait_s)
        raise InjectedFailure(f"probe.fail_rank={fail_rank}: rank {rank} waited {wait_s:g} s for it, as a collective")
    time.sleep(sleep_s)
    raise InjectedFailure("probe.kind=fail: this cell fails on purpose (set probe.kind=sleep or deepspeed to fix it)")


def run_cell(
    sweep_root: str, cell_id: str, attempt: int, requeues: dict[str, int] | None = None, submitted_by: str | None = None
) -> str:
    """Measure one cell on this rank; rank 0 writes the record. Returns the cell's status.

    ``requeues`` (how often this attempt was requeued, and why) goes into the record's environment.
    ``submitted_by``: the gpudays version that submitted the cell; a job running another refuses before measuring.
    """
    signal.signal(signal.SIGINT, _on_interrupt)  # first: a Ctrl-C while the job sets up still ends in a record
    running = gpudays_version()
    started_at = _now()
    paths = SweepPaths(Path(sweep_root))
    cell = read_cell_config(paths.cell_config(cell_id))
    typed, refusals = cells.typed_cell(cell)
    env = submitit.JobEnvironment()
    rank, world_size, local_rank = env.global_rank, env.num_tasks, env.local_rank
    local_world_size = max(1, world_size // max(1, env.num_nodes))
    addr, port = rendezvous(str(env.job_id), list(env.hostnames))
    set_distributed_env(rank, world_size, local_rank, local_world_size, addr, port)
    set_allocator_env(typed.gpu.accelerator if typed is not None else "cuda")
    if typed is not None and typed.gpu.accelerator == "cpu":
        # Must precede the first import of deepspeed; the cores the scheduler gave each rank, at most those it has.
        os.environ["DS_ACCELERATOR"] = "cpu"
        # The sbatch script exports OMP_NUM_THREADS as the CPUs each task was given; a list (OpenMP's nested
        # levels) is the site's own to keep.
        asked = os.environ.get("OMP_NUM_THREADS", "")
        if "," not in asked:
            first = next((int(v) for v in (asked, os.environ.get("SLURM_CPUS_PER_TASK", "")) if v.isdigit()), 0)
            given = first if first > 0 else typed.cluster.cpus_per_gpu
            os.environ["OMP_NUM_THREADS"] = str(cpu_threads(given, local_world_size))

    # Each rank says where it runs before any collective: once rank 0 is past the probe's collectives, every
    # rank has written this, so rank 0 can list all ranks' nodes in the record.
    rank_file = paths.cell_dir(cell_id) / "ranks" / f"attempt{attempt}-rank{rank}.json"
    write_json_atomic(
        rank_file,
        {
            "rank": rank,
            "node": node_name(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "job_id": env.job_id,
            # The CPUs the scheduler let this rank run on (all of the node's where it binds none).
            "cpus": sorted(os.sched_getaffinity(0)),
        },
    )

    # Who else runs on the nodes while the cell is timed (another user's job, or another cell of the sweep).
    jobs_at_start = node_jobs() if rank == 0 else None
    global _in_probe
    try:
        _in_probe = True
        if _interrupted():
            raise KeyboardInterrupt("interrupted by SIGINT (Ctrl-C), while the job set up")
        if submitted_by is not None and not same_gpudays(submitted_by, running):
            say(mismatch := version_mismatch(submitted_by, running))  # nothing measured: a resume reruns it
            result = outcome_of(Happened(Ending.RAISED, mismatch))
        elif typed is None or refusals:
            # The same config fails the same way on every rerun: nothing is built, and the record says invalid.
            refused = Happened(Ending.REFUSED, f"the cell's config cannot be built: {'; '.join(refusals)}")
            result = outcome_of(refused, time_signal=time_limit_signal())
        elif typed.probe.kind == "sleep":
            result = sleep_probe(typed.probe.sleep_s)
        elif typed.probe.kind == "fail":
            fail_probe(typed.probe.sleep_s, rank, typed.probe.fail_rank)
        else:
            from orchestrator.job.probe import run_probe

            result = run_probe(typed, rank, world_size, local_rank, time_signal=time_limit_signal)
    except BaseException as e:  # noqa: BLE001 - the probe reports its own failures; this is the last resort
        if isinstance(e, SystemExit) and _requeuing:
            raise  # the job is being requeued: this run ends here, without a record
        raised = Happened(Ending.RAISED, f"{type(e).__name__}: {e}".splitlines()[0], traceback.format_exc())
        result = outcome_of(raised, time_signal=time_limit_signal())

    global _probe_done
    _probe_done = True
    signal.setitimer(signal.ITIMER_REAL, 0)  # a requeue armed for the time limit is not needed any more
    quiet = result.status.value in ENDS_QUIETLY
    cancelled = result.status is RecordStatus.CANCELLED  # the job's fate, not the rank's: the same words on any
    if not quiet and rank != 0 and not cancelled:
        time.sleep(PEER_RECORD_DELAY_S)  # where every rank failed alike, rank 0's words are the record
    # Rank 0 writes the record of a cell that ended well; the first rank to fail writes that of a failure, as its
    # peers may be ended (srun --kill-on-bad-exit) before they could.
    if (rank == 0 and quiet) or (not quiet and claim_record(rank_file.parent, attempt)):
        ranks = []
        for p in sorted(rank_file.parent.glob(f"attempt{attempt}-rank*.json")):
            try:
                ranks.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                continue
        ranks.sort(key=lambda r: r.get("rank", 0))
        environment = dict(result.environment)
        host_load = environment.pop("host_load", None)
        if submitted_by is not None:
            environment["gpudays_submitted_by"] = submitted_by
        environment.update(scheduler_ids())
        environment.update(allocator_settings())
        environment.update(
            {
                "job_id": str(env.job_id),
                "hostnames": list(env.hostnames),
                "rank_nodes": [r.get("node") for r in ranks],
                "rank_cpus": [r.get("cpus") for r in ranks],
                "world_size": world_size,
                "python": platform.python_version(),
                "requeued_after_timeout": (requeues or {}).get("timeout", 0),
                "requeued_after_preemption": (requeues or {}).get("preemption", 0),
            }
        )
        environment["recorded_by_rank"] = rank
        jobs_at_end = node_jobs() if rank == 0 else None
        environment["node_jobs_at_start"], environment["node_jobs_at_end"] = jobs_at_start, jobs_at_end
        known = jobs_at_start is not None and jobs_at_end is not None
        environment["shared_node"] = bool(jobs_at_start or jobs_at_end) if known else None
        record = Record(
            cell_id=cell_id,
            sweep=typed.name if typed is not None else str(cell.get("name", "")),
            attempt=attempt,
            status=result.status,
            reason=result.reason if rank == 0 or cancelled or not result.reason else f"rank {rank}: {result.reason}",
            traceback=result.traceback,
            settings=cells.settings(typed) if typed is not None else {},
            config=cell,
            metrics=result.metrics,
            environment=environment,
            started_at=started_at,
            finished_at=_now(),
            gpudays_version=running,
            host_load=host_load if isinstance(host_load, dict) else {},
        )
        if not superseded(paths, cell_id, attempt):
            write_record(keep_earlier_record(paths, cell_id, attempt), record)
    return result.status.value


class RankEnded(RuntimeError):
    """A rank's cell ended badly and is recorded: the rank exits non-zero, so that srun (``--kill-on-bad-exit``)
    ends its peers at once instead of leaving them in a collective until its timeout."""


def seconds_left(job_id: str | None, fallback_end: float) -> float:
    """Seconds until SLURM ends this job (its EndTime, which a requeue resets); ``fallback_end`` if unknown."""
    end = slurm.end_time(job_id) if job_id else None
    return end.timestamp() - time.time() if end is not None else fallback_end - time.time()


def seconds_to_limit(job_id: str | None, fallback_end: float) -> float:
    """Seconds until this job's time limit (start plus limit, which a cancel does not move); ``fallback_end`` if
    SLURM cannot tell."""
    end = slurm.limit_end(job_id) if job_id else None
    return end.timestamp() - time.time() if end is not None else fallback_end - time.time()


class CellJob(submitit.helpers.Checkpointable):
    """The callable submitted for one attempt of one cell; requeued by submitit on preemption and timeout.

    It pickles to its arguments and requeue counts only, and is pickled again by ``checkpoint`` with the counts
    raised, so a requeued run knows how many requeues its attempt has used.
    """

    def __init__(self, sweep_root: str, cell_id: str, attempt: int, submitted_by: str | None = None) -> None:
        self.sweep_root = sweep_root
        self.cell_id = cell_id
        self.attempt = attempt
        self.submitted_by = submitted_by  # the gpudays that submitted it (orchestrator.store.version)
        self.requeues: dict[str, int] = {"timeout": 0, "preemption": 0}
        self._requeue_reason: str | None = None

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_requeue_reason"] = None
        return state

    def __call__(self) -> str:
        paths = SweepPaths(Path(self.sweep_root))
        if superseded(paths, self.cell_id, self.attempt):
            return "superseded"
        if answered(paths, self.cell_id, self.attempt):
            return "answered"
        if os.environ.get("SUBMITIT_EXECUTOR") == "slurm":
            self._guard_time_limit()
        submitted_by = getattr(self, "submitted_by", None)  # a job pickled by an older gpudays has none
        try:
            status = run_cell(self.sweep_root, self.cell_id, self.attempt, dict(self.requeues), submitted_by)
        except JobCancelled:
            # The cancel's SIGTERM reached this rank while it set up, before its probe began (a slow rank, its
            # peer already measuring): it ends here as its peers do, quietly; a rank that measures records it.
            return RecordStatus.CANCELLED.value
        if status == RecordStatus.CANCELLED.value:
            return status  # every rank was told (the cancel's SIGTERM) and ends of it: nothing to end, no traceback
        if os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and status not in ENDS_QUIETLY:
            raise RankEnded(f"cell {self.cell_id} ended {status} on this rank (recorded); its peers are ended")
        return status

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Called by submitit's signal handler right before ``scontrol requeue``: the run to start next."""
        reason = self._requeue_reason or "preemption"
        self.requeues[reason] = self.requeues.get(reason, 0) + 1
        self._requeue_reason = None
        return super().checkpoint(*args, **kwargs)

    def __repr__(self) -> str:
        return f"CellJob({self.cell_id}, attempt {self.attempt}, requeues {self.requeues})"

    # ---- the time-limit warning (see the module docstring) ----------------------------------------------------

    def _guard_time_limit(self) -> None:
        """Put a handler in front of submitit's for the warning signal; called after submitit installed its own."""
        env = submitit.JobEnvironment()
        warning = env._usr_sig()
        submitit_handler = signal.getsignal(warning)
        if not callable(submitit_handler):
            return  # not started by submitit's job runner, which handles both signals first
        typed, _ = cells.typed_cell(read_cell_config(SweepPaths(Path(self.sweep_root)).cell_config(self.cell_id)))
        if typed is None:
            return  # not a cell: run_cell records it as invalid at once, with no time limit to guard
        limit_s = 60.0 * cells.time_limit_min(typed)
        max_timeouts = typed.cluster.max_requeue_on_timeout
        fallback_end = time.time() + limit_s  # the job started a moment before this process
        job_id = os.environ.get("SLURM_JOB_ID")
        array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
        task_id = f"{array}_{task}" if array and task else None  # sacct's -j names a task so, not by its raw id

        def requeue_now(why: str, signum: int, frame: FrameType | None) -> None:
            global _requeuing
            if _probe_done:
                return
            self._requeue_reason = why
            _requeuing = True
            say(f"requeuing cell {self.cell_id} (attempt {self.attempt}) after {why}")
            try:
                cast(Callable[[int, FrameType | None], None], submitit_handler)(signum, frame)
            except SystemExit:
                raise
            except Exception as e:  # noqa: BLE001 - a refused requeue must not fail the probe it interrupts
                say(f"the requeue failed ({type(e).__name__}: {e}); the job runs on")
                _requeuing = False
                self._requeue_reason = None

        def on_warning(signum: int, frame: FrameType | None) -> None:
            global _time_limit_signal
            if _probe_done:
                return
            left_s = seconds_left(job_id, fallback_end)
            if left_s > SIGNAL_DELAY_S + SLURM_CHECK_INTERVAL_S + 5:
                requeue_now("preemption", signum, frame)
                return
            _time_limit_signal = TimeSignal(signal.Signals(signum).name, time.time())
            used = self.requeues.get("timeout", 0)
            if used >= max_timeouts:
                say(
                    f"{left_s:.0f} s left before the time limit and {used} of cluster.max_requeue_on_timeout="
                    f"{max_timeouts} requeue(s) used: the cell runs on, and ends as TIMEOUT if it does not finish"
                )
                return
            delay_s = left_s - REQUEUE_MARGIN_S
            say(f"{left_s:.0f} s left before the time limit: requeue in {max(delay_s, 0):.0f} s unless finished")
            if delay_s <= 0:
                requeue_now("timeout", signum, frame)
                return
            signal.signal(signal.SIGALRM, lambda _s, f: requeue_now("timeout", signum, f))
            signal.setitimer(signal.ITIMER_REAL, delay_s)

        def on_terminate(signum: int, frame: FrameType | None) -> None:
            # SLURM's SIGTERM at the time limit (submitit's own handler only logs it): what dies of it now, a
            # compiler or a peer, is the time limit's doing. Before the limit, the scheduler is asked: a cancel
            # (scancel) has set the job CANCELLED by now, and the probe is ended at once, so that its record says
            # `cancelled` before SLURM's kill (KillWait later) leaves none.
            # One scontrol call first: SLURM kills the job KillWait after this signal (30 s by default, 2 s on the
            # local cluster), and the record must be written before.
            global _time_limit_signal
            cancelled = _time_limit_signal is None and job_id is not None and slurm.was_cancelled(task_id or job_id)
            if cancelled:
                _time_limit_signal = TimeSignal("SIGTERM", time.time(), cancelled=True)
            elif _time_limit_signal is None and seconds_to_limit(job_id, fallback_end) < SLURM_CHECK_INTERVAL_S:
                _time_limit_signal = TimeSignal("SIGTERM", time.time())
            if callable(submitit_terminate):
                submitit_terminate(signum, frame)
            if cancelled and not _probe_done:
                say(f"job {job_id} was cancelled: cell {self.cell_id} ends here")
                raise JobCancelled(f"the scheduler cancelled job {job_id} (scancel)")

        submitit_terminate = signal.getsignal(signal.SIGTERM)
        # A cancel's SIGTERM reaches every rank: each ends its probe, whichever is free to (one waiting in a
        # collective runs no handler until it returns), and the first records the cell cancelled. submitit's own
        # handler only logs it, which left the other ranks running until SLURM killed them, KillWait later.
        signal.signal(signal.SIGTERM, on_terminate)
        if env.global_rank == 0:
            signal.signal(warning, on_warning)  # only rank 0 requeues (submitit's rule too)
            came = start.held_warning()
            if came is not None:  # it came before any handler but orchestrator.job.start's was in place
                say(
                    f"SLURM's time-limit warning came {time.time() - came:.1f} s ago, before this handler: taken up now"
                )
                on_warning(warning, None)
