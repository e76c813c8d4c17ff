"""Cells on this machine: one after another through submitit's local executor, one process per rank.

Never side by side, because a probe would measure the other's load. A CUDA cell runs one rank per GPU (1 to 8)
on the GPUs this shell may use, and its ranks talk over NCCL; a CPU cell sees no GPU.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import submitit

from orchestrator.cells import cell as cells
from orchestrator.config.schema import Config
from orchestrator.config.values import Container
from orchestrator.job.entry import CellJob
from orchestrator.store.attempts import Attempt, append_attempt, next_attempt, read_attempts, take_back, write_intents
from orchestrator.store.durable import refused_write
from orchestrator.store.paths import SweepPaths
from orchestrator.store.version import gpudays_version
from orchestrator.submission import faults
from orchestrator.submission.intents import local_jobs, pid_of, process_alive
from orchestrator.submission.launch import Resources, SubmissionRefused, resources

DONE_CHECK_S = 0.1
"""How often a running local cell is checked for its end."""
ORPHAN_CHECK_S = 1.0
"""How often a job left running by an earlier command is checked for its end."""


def local_gpus(num_gpus: int, environ: dict[str, str] | None = None) -> list[str]:
    """The devices a local cell of ``num_gpus`` GPUs gets: the first ``num_gpus`` this process may use.

    Those are the entries of ``CUDA_VISIBLE_DEVICES`` when it is set (indices, ``GPU-<uuid>`` or ``MIG-<uuid>``),
    else devices 0 .. num_gpus-1. Raises SubmissionRefused when fewer are visible than the cell asks for.
    """
    env = os.environ if environ is None else environ
    given = env.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return [str(i) for i in range(num_gpus)]
    visible = [d.strip() for d in given.split(",") if d.strip()]
    if len(visible) < num_gpus:
        raise SubmissionRefused(
            f"a local cell asks for {num_gpus} GPU(s) but CUDA_VISIBLE_DEVICES={given!r} makes only "
            f"{len(visible)} visible; unset it, widen it, or ask for num_gpus={max(1, len(visible))}"
        )
    return visible[:num_gpus]


def check_local_gpus(configs: Mapping[str, Config], device_count: Callable[[], int] | None = None) -> None:
    """Raise SubmissionRefused when a local CUDA cell asks for more GPUs than this machine lets it see.

    ``device_count``: how many CUDA devices this process sees (default: torch's count, which honours
    ``CUDA_VISIBLE_DEVICES``); torch is imported only when some local cell is a CUDA cell.
    """
    wanted = {cid: cfg.num_gpus for cid, cfg in configs.items() if cfg.gpu.accelerator == "cuda"}
    if not wanted:
        return
    if device_count is None:
        device_count = cuda_device_count
    have = device_count()
    short = {cid: n for cid, n in wanted.items() if n > have}
    if short:
        names = ", ".join(f"{cid} ({cells.label(configs[cid])})" for cid in list(short)[:5])
        if have == 0:  # num_gpus=0 is no value: a cell has one GPU at least
            raise SubmissionRefused(
                f"{len(short)} local cell(s) need a GPU, and this machine shows none to CUDA: {names}; on this "
                "machine use gpu=cpu, or submit them with cluster=slurm"
            )
        raise SubmissionRefused(
            f"{len(short)} local cell(s) ask for more GPUs than this machine shows ({have} visible to CUDA): "
            f"{names}; on this machine use num_gpus={have} or less, or gpu=cpu, or submit them with cluster=slurm"
        )


NVIDIA_DEVICES = "/dev/nvidia[0-9]*"
"""The device files NVIDIA's driver makes, one a GPU: none means no GPU for CUDA to show."""


def cuda_device_count(environ: Mapping[str, str] | None = None, devices_glob: str = NVIDIA_DEVICES) -> int:
    """How many CUDA devices this process sees; 0 at once, without importing torch (seconds), where the machine
    has no NVIDIA device file or ``CUDA_VISIBLE_DEVICES`` hides every device."""
    import glob

    env = os.environ if environ is None else environ
    if env.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1") or not glob.glob(devices_glob):
        return 0
    import torch

    return int(torch.cuda.device_count())


def local_parameters(res: Resources, environ: dict[str, str] | None = None) -> Container:
    """Parameters for submitit's LocalExecutor: one process per rank; a CUDA cell's ranks see its GPUs.

    submitit sets ``CUDA_VISIBLE_DEVICES`` of the job to the first ``gpus_per_node`` entries of ``visible_gpus``
    (nothing at all when ``gpus_per_node`` is 0, which hides every GPU), so both are given; rank ``r`` then uses
    device ``r`` of that list (the probe's ``torch.cuda.set_device(local_rank)``) and the ranks talk over NCCL.
    Devices named by UUID cannot go through ``visible_gpus`` (integers only): they are exported by a setup line,
    which submitit runs in the shell that starts the job, after its own setting.
    """
    params: Container = {"timeout_min": res.time_limit_min, "tasks_per_node": res.tasks_per_node}
    if res.accelerator != "cuda":
        return params
    devices = local_gpus(res.tasks_per_node, environ)
    params["gpus_per_node"] = len(devices)
    if all(d.isdigit() for d in devices):
        params["visible_gpus"] = [int(d) for d in devices]
    else:
        params["setup"] = [f"export CUDA_VISIBLE_DEVICES={shlex.quote(','.join(devices))}"]
    return params


@dataclass
class LocalRun:
    """A local cell while it runs: what a progress display needs."""

    cell_id: str
    label: str
    job_id: str
    started_s: float
    logs: tuple[Path, ...]
    """Standard output and error of rank 0 (where submitit, DeepSpeed and the probe say what they are doing)."""


def submit_local(
    paths: SweepPaths,
    configs: Mapping[str, Config],
    on_done: Callable[[str], None] | None = None,
    on_start: Callable[[LocalRun], None] | None = None,
    on_poll: Callable[[LocalRun], None] | None = None,
    poll_s: float = 1.0,
    before_start: Callable[[str], None] | None = None,
    on_wait: Callable[[list[str]], None] | None = None,
) -> list[Attempt]:
    """Run cells on this machine one after another (never side by side: they would measure each other).

    ``on_start`` is called when a cell's job starts, ``on_poll`` about every ``poll_s`` while it runs, and
    ``on_done`` with the cell id when it has ended (its record, if any, is written by then). A cell's job
    still running from an earlier command (whose gpudays was killed) is waited for before each cell starts, and
    ``on_wait`` is told. Each cell's intent is on disk before its job starts, its process id and start time once
    it has.
    """
    paths.check_not_loose()  # before a pickle is written or a job runs
    out: list[Attempt] = []
    for cid, cfg in configs.items():
        res = resources(cfg)
        executor = submitit.LocalExecutor(folder=paths.submitit_folder())
        executor.update_parameters(**local_parameters(res))
        wait_for_orphans(paths, on_wait)
        intent = Attempt(
            cid,
            next_attempt(paths, cid),
            None,
            "local",
            cells.label(cfg),
            token=f"local-{cid}",
            gpudays=gpudays_version(),
        )
        faults.point("before-intent")
        written = write_intents(paths, [intent])
        try:
            with _stderr_to(paths.jobs_dir / "controllers.log"):
                job = executor.submit(CellJob(str(paths.root), cid, intent.attempt, gpudays_version()))
        except Exception as e:  # no process started: the cell is as it was (a record is moved aside only below)
            take_back(paths, written)
            refused = refused_write(e, paths.jobs_dir, "the cell was not started")
            if refused is e:
                raise
            raise refused from e
        if before_start is not None:
            before_start(cid)
        faults.point("local-started")
        sub = replace(intent, job_id=str(job.job_id), started=_start_time(int(job.job_id)))
        append_attempt(paths, sub)
        out.append(sub)
        run = LocalRun(cid, cells.label(cfg), str(job.job_id), time.monotonic(), (job.paths.stdout, job.paths.stderr))
        if on_start is not None:
            on_start(run)
        # The job's end is noticed within DONE_CHECK_S (a waitpid), so the next cell starts at once; on_poll (the
        # progress line, which reads the log) still runs only every poll_s.
        last_poll = time.monotonic()
        while not job.done():
            time.sleep(min(DONE_CHECK_S, poll_s))
            if on_poll is not None and time.monotonic() - last_poll >= poll_s:
                last_poll = time.monotonic()
                on_poll(run)
        try:
            job.results()
        except Exception:  # noqa: BLE001 - a cell's failure is in its record and logs; the others go on
            pass
        _drop_unformatted_folder(paths)
        if on_done is not None:
            on_done(cid)
    return out


def _drop_unformatted_folder(paths: SweepPaths) -> None:
    """Remove the empty ``jobs/%j`` folder submitit's local job controller leaves: it makes the folder it is given
    as named, before it puts its own process id for ``%j`` (the job's files go to ``jobs/<pid>/``). Only an empty
    one goes; a controller starting now (another command's) makes it again, and that command removes it."""
    with contextlib.suppress(OSError):
        paths.submitit_folder().rmdir()


@contextmanager
def _stderr_to(log: Path) -> Iterator[None]:
    """Standard error of what starts in here goes to ``log``: submitit's job controller, a process of its own that
    shares this terminal, would otherwise print its KeyboardInterrupt traceback under gpudays' own line on
    Ctrl-C. The job's ranks write to their own logs whatever this is."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(log, "ab") as f:
            os.dup2(f.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _start_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def running_orphans(paths: SweepPaths) -> list[str]:
    """The local jobs of this sweep still running from an earlier command (a gpudays process killed or stopped
    while its cell ran leaves the job running), one line each: found by the process id and start time each
    attempt recorded, and by the job folder in a job's command line where the command died before recording."""
    out: dict[int, str] = {}
    for cid in paths.cell_ids():
        tries = read_attempts(paths, cid)
        latest = tries[-1] if tries else None
        pid = pid_of(latest) if latest is not None else None
        if latest is not None and pid is not None and process_alive(pid, latest.started):
            out[pid] = f"cell {cid} (attempt {latest.attempt}, process {pid})"
    for proc in local_jobs(paths):
        out.setdefault(proc.pid, f"a job of this sweep (process {proc.pid})")
    return [out[pid] for pid in sorted(out)]


def wait_for_orphans(paths: SweepPaths, on_wait: Callable[[list[str]], None] | None = None) -> None:
    """Block while a local job of this sweep from an earlier command still runs: two cells side by side would
    measure each other. ``on_wait`` is told which, once, before the wait."""
    alive = running_orphans(paths)
    if alive and on_wait is not None:
        on_wait(alive)
    while alive:
        time.sleep(ORPHAN_CHECK_S)
        alive = running_orphans(paths)
