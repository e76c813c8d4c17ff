"""What runs inside a job, on every rank: find the other ranks, run the probe, write the record.

submitit starts one process per rank (srun on SLURM, subprocesses locally) and calls ``run_cell`` in each. Ranks
find each other from the scheduler's environment: rank, world size and local rank from submitit's JobEnvironment
(SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID on SLURM); the rendezvous address is the node srun was launched from
(SLURM_LAUNCH_NODE_IPADDR, the batch host, where rank 0 runs), and the port follows from the job id so that two
jobs on one node do not collide. Nothing here imports torch: the environment must be set before the probe does.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import traceback
from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

from orchestrator import cells
from orchestrator.paths import SweepPaths, write_json_atomic

RECORD_SCHEMA_VERSION = 1
PORT_BASE, PORT_SPAN = 20_000, 20_000


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def rendezvous(job_id: str, hostnames: list[str]) -> tuple[str, int]:
    """Address and port of rank 0, from the scheduler's environment."""
    address = os.environ.get("SLURM_LAUNCH_NODE_IPADDR") or (hostnames[0] if hostnames else "127.0.0.1")
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    return address, PORT_BASE + int(digits) % PORT_SPAN


def scheduler_ids() -> dict[str, str | None]:
    keys = {
        "slurm_job_id": "SLURM_JOB_ID",
        "slurm_array_job_id": "SLURM_ARRAY_JOB_ID",
        "slurm_array_task_id": "SLURM_ARRAY_TASK_ID",
        "slurm_job_partition": "SLURM_JOB_PARTITION",
        "slurm_job_nodelist": "SLURM_JOB_NODELIST",
    }
    return {name: os.environ.get(var) for name, var in keys.items()}


def node_name() -> str:
    """The scheduler's name for this node (several SLURM nodes may share one host name)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


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


def sleep_probe(sleep_s: float) -> dict[str, Any]:
    """No measurement: hold the allocation for ``sleep_s`` and report success (for plumbing checks)."""
    import time

    time.sleep(sleep_s)
    return {"status": "ok", "reason": "probe.kind=sleep: nothing measured", "metrics": {}, "environment": {}}


def run_cell(sweep_root: str, cell_id: str, attempt: int) -> str:
    """Measure one cell on this rank; rank 0 writes the record. Returns the cell's status."""
    import submitit

    started_at = _now()
    paths = SweepPaths(Path(sweep_root))
    cell = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.load(paths.cell_config(cell_id)), resolve=True))
    env = submitit.JobEnvironment()
    rank, world_size, local_rank = env.global_rank, env.num_tasks, env.local_rank
    local_world_size = max(1, world_size // max(1, env.num_nodes))
    addr, port = rendezvous(str(env.job_id), list(env.hostnames))
    set_distributed_env(rank, world_size, local_rank, local_world_size, addr, port)
    if cell["gpu"]["accelerator"] == "cpu":
        # Must precede the first import of deepspeed; one thread per rank unless the scheduler gave more cores.
        os.environ["DS_ACCELERATOR"] = "cpu"
        threads = os.environ.get("SLURM_CPUS_PER_TASK") or str(cell["cluster"]["cpus_per_gpu"])
        os.environ.setdefault("OMP_NUM_THREADS", threads)

    # Each rank says where it runs before any collective: once rank 0 is past the probe's collectives, every
    # rank has written this, so rank 0 can list all ranks' nodes in the record.
    rank_file = paths.cell_dir(cell_id) / "ranks" / f"attempt{attempt}-rank{rank}.json"
    write_json_atomic(
        rank_file,
        {"rank": rank, "node": node_name(), "hostname": socket.gethostname(), "pid": os.getpid(), "job_id": env.job_id},
    )

    try:
        if cell["probe"]["kind"] == "sleep":
            result = sleep_probe(float(cell["probe"]["sleep_s"]))
        else:
            from orchestrator.probe import run_probe

            result = run_probe(cell, rank, world_size, local_rank)
    except BaseException as e:  # noqa: BLE001 - the probe reports its own failures; this is the last resort
        result = {
            "status": "failed",
            "reason": f"{type(e).__name__}: {e}".splitlines()[0],
            "traceback": traceback.format_exc(),
            "metrics": {},
            "environment": {},
        }

    if rank == 0:
        ranks = []
        for p in sorted(rank_file.parent.glob(f"attempt{attempt}-rank*.json")):
            try:
                ranks.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                continue
        ranks.sort(key=lambda r: r.get("rank", 0))
        environment = dict(result.get("environment") or {})
        environment.update(scheduler_ids())
        environment.update(
            {
                "job_id": str(env.job_id),
                "hostnames": list(env.hostnames),
                "rank_nodes": [r.get("node") for r in ranks],
                "world_size": world_size,
                "python": platform.python_version(),
            }
        )
        record = {
            "schema_version": RECORD_SCHEMA_VERSION,
            "cell_id": cell_id,
            "sweep": cell["name"],
            "attempt": attempt,
            "status": result.get("status", "failed"),
            "reason": result.get("reason"),
            "traceback": result.get("traceback"),
            "settings": cells.settings(cell),
            "config": cell,
            "metrics": result.get("metrics") or {},
            "environment": environment,
            "started_at": started_at,
            "finished_at": _now(),
        }
        write_json_atomic(paths.record(cell_id), record)
    return str(result.get("status", "failed"))


def describe(record: dict[str, Any]) -> str:
    """One line for a terminal: id, status, step time."""
    step = (record.get("metrics") or {}).get("step_time_s")
    step_txt = f"{step:.4g} s/step" if isinstance(step, (int, float)) else ""
    return f"{record.get('cell_id')} {record.get('status')} {step_txt} {record.get('reason') or ''}".strip()
