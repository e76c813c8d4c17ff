"""Where a job runs, as the scheduler tells it: rank 0's address and port, the scheduler's ids for the record,
this node's name, the environment torch.distributed reads, and the node's other jobs (whether the probe was
timed on a node it shared)."""

from __future__ import annotations

import os
import socket
import sys

from orchestrator.engines.allocator import ALLOC_CONF_VARIABLES, allocator_conf
from orchestrator.slurm import commands as slurm
from orchestrator.slurm import site as slurm_site

PORT_BASE, PORT_SPAN = 20_000, 12_000
"""Rank 0's port comes from the job id, within 20000-31999: below Linux's ephemeral ports (32768 and up by default),
which the kernel hands to any process's outgoing connection or port-0 bind (as the probe's own collectives do), so
that another job's connection cannot hold the port when rank 0 binds it (EADDRINUSE, seen at port 35970)."""

MAX_NODE_JOBS = 20
"""At most this many of a node's other jobs are listed in a record."""


def say(message: str) -> None:
    """A line in the job's stderr log (signal handlers included: no logging locks)."""
    print(f"gpudays: {message}", file=sys.stderr, flush=True)


def rendezvous(job_id: str, hostnames: list[str]) -> tuple[str, int]:
    """Address and port of rank 0, from the scheduler's environment.

    The port comes from SLURM_JOB_ID where SLURM sets it: one number per job and per array task, the same in every
    task of the job, and different for any two jobs that share a node. submitit's ``job_id`` (``ARRAY_TASK`` for
    an array task) is the fallback: its digits run together, so task 3 of array 12 would take job 123's port.
    """
    address = os.environ.get("SLURM_LAUNCH_NODE_IPADDR") or (hostnames[0] if hostnames else "127.0.0.1")
    job_id = os.environ.get("SLURM_JOB_ID") or job_id
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    return address, PORT_BASE + int(digits) % PORT_SPAN


_HIDDEN: list[bool | None] = []
"""Whether the site hides other users' jobs, once asked (by :func:`node_jobs`)."""


def others_hidden() -> bool | None:
    """Whether SLURM hides other users' jobs from this user (``PrivateData=jobs``), so that a node's list of jobs
    holds only the user's own; None where the configuration cannot be read. Asked once a process."""
    if not _HIDDEN:
        private = slurm_site.private_data()
        _HIDDEN.append(None if private is None else "jobs" in private)
    return _HIDDEN[0]


def scheduler_ids() -> dict[str, str | bool | None]:
    keys = {
        "slurm_job_id": "SLURM_JOB_ID",
        "slurm_array_job_id": "SLURM_ARRAY_JOB_ID",
        "slurm_array_task_id": "SLURM_ARRAY_TASK_ID",
        "slurm_job_partition": "SLURM_JOB_PARTITION",
        "slurm_job_nodelist": "SLURM_JOB_NODELIST",
        "slurm_restart_count": "SLURM_RESTART_COUNT",
    }
    out: dict[str, str | bool | None] = {name: os.environ.get(var) for name, var in keys.items()}
    # Where the node's jobs were listed: whether other users' jobs could be seen in that list.
    out["other_users_jobs_hidden"] = _HIDDEN[0] if _HIDDEN else None
    return out


def node_name() -> str:
    """The scheduler's name for this node (several SLURM nodes may share one host name)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def cpu_threads(given: int, local_ranks: int) -> int:
    """Threads for one CPU rank of a scheduled job: the cores the scheduler gave it (``given``), never more than it
    can run on. A rank whose affinity is narrower than the host's was confined by the scheduler (to its task's cores,
    or to the job's on this node) and may use up to those; an unconfined one shares the host's cores with the
    ``local_ranks`` ranks beside it. On a node whose CPUs are what it claims, both are ``given``; on an overcommitted
    one (a test cluster's nodes claiming 8 CPUs each on a 2-core host) threads beyond the cores would time the
    scheduler, not the step."""
    cores = len(os.sched_getaffinity(0))
    usable = cores if cores < (os.cpu_count() or cores) else max(1, cores // max(1, local_ranks))
    return max(1, min(given, usable))


def set_distributed_env(
    rank: int, world_size: int, local_rank: int, local_world_size: int, addr: str, port: int
) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world_size),
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
        }
    )


def set_allocator_env(accelerator: str) -> None:
    """The allocator setting the predictor assumes (``orchestrator.engines.allocator.allocator_conf``: on a CUDA
    device, ``DEFAULT_CUDA_ALLOC_CONF``) unless the user set either of :data:`ALLOC_CONF_VARIABLES` (theirs wins);
    before torch is imported, as the allocator reads it once."""
    if any(os.environ.get(name) for name in ALLOC_CONF_VARIABLES):
        return
    conf = allocator_conf(None, accelerator)
    if conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf


def allocator_settings() -> dict[str, str | None]:
    """The allocator's settings the probe ran with, for the record's environment (None where unset)."""
    return {name.lower(): os.environ.get(name) for name in ALLOC_CONF_VARIABLES}


def node_jobs() -> list[str] | None:
    """The other jobs running on this job's nodes (``12_3 alice``), at most ``MAX_NODE_JOBS``; None where SLURM
    cannot say (not a SLURM job, squeue failed: a probe is never failed for it; or none is listed where the cluster
    hides other users' jobs, ``PrivateData=jobs``, so that an empty list would claim a node no one shared)."""
    nodes, own = os.environ.get("SLURM_JOB_NODELIST"), os.environ.get("SLURM_JOB_ID")
    if not nodes or not own:
        return None
    try:
        jobs = slurm.jobs_on_nodes(nodes)
    except slurm.SlurmUnavailable as e:
        say(f"the node's other jobs could not be listed ({e}); the record leaves them unknown")
        return None
    others = [f"{shown} {user}" for raw, shown, user in jobs if raw != own][:MAX_NODE_JOBS]
    if not others and others_hidden():
        # Only the user's own jobs are listed: none says nothing of other users' jobs on the node.
        say("this cluster hides other users' jobs (PrivateData=jobs): whether the node was shared is unknown")
        return None
    return others
