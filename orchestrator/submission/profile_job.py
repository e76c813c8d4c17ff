"""A sweep's profile as a SLURM job of its own, submitted ahead of the cells' array.

The job asks for the GPU type, GPUs a node and nodes of the profile's need (``orchestrator.profile.sweep``), with
the cells' partition, account, QOS and setup, and a time limit of the profile's budget and start-up. Each of its
tasks is one rank (started by srun, as a cell's are); rank 0 writes the profile into the sweep folder and says
how the run ended in ``profiles/runs.jsonl``. A job that fails ends there as ``failed`` with its reason; it never
touches a cell.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from dataclasses import replace
from pathlib import Path

from orchestrator.config.schema import Config
from orchestrator.profile import sweep
from orchestrator.profile.runner import Plan
from orchestrator.slurm import commands as slurm
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import launch


class ProfileJob:
    """What each task of a profile job runs (pickled by submitit)."""

    def __init__(self, sweep_root: str, need: sweep.Need, plan: Plan) -> None:
        self.sweep_root, self.need, self.plan = sweep_root, need, plan

    def __call__(self) -> str:
        import submitit

        from orchestrator.job.env import rendezvous, set_distributed_env
        from orchestrator.profile.runner import profile_in_job

        env = submitit.JobEnvironment()
        per_node = max(1, env.num_tasks // max(1, env.num_nodes))
        addr, port = rendezvous(str(env.job_id), list(env.hostnames))
        set_distributed_env(env.global_rank, env.num_tasks, env.local_rank, per_node, addr, port)
        paths, started = SweepPaths(Path(self.sweep_root)), time.perf_counter()
        try:
            profile = profile_in_job(self.plan, self.need.backend)
        except Exception as e:
            if env.global_rank == 0:
                reason = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                wall = time.perf_counter() - started
                sweep.log_run(paths, self.need, "ended", outcome="failed", reason=reason, wall_s=wall)
            raise
        if profile is None:
            return "rank done"
        where = sweep.keep(paths, profile, self.need.gpu)
        sweep.log_run(paths, self.need, "ended", outcome="ok", wall_s=time.perf_counter() - started, file=where.name)
        return str(where)

    def __repr__(self) -> str:
        return f"ProfileJob({self.sweep_root!r}, {self.need.describe()})"


def time_limit_min() -> int:
    """The job's ``--time``: the profile's budget and its start-up, in whole minutes."""
    return math.ceil((sweep.BUDGET_S + sweep.START_S) / 60)


def submit_profile(paths: SweepPaths, need: sweep.Need, cell: Config, plan: Plan) -> str:
    """Submit the profile of ``need`` with ``cell``'s cluster settings; its job id. What sbatch raised where it
    failed (the caller says so and goes on with the cells)."""
    paths.check_not_loose()
    job_cell = replace(
        cell,
        num_gpus=need.gpus,
        num_nodes=need.nodes,
        cluster=replace(cell.cluster, time_limit_min=time_limit_min(), array_parallelism=1),
    )
    res = launch.resources(job_cell)
    executor = launch.slurm_executor(res, paths.submitit_folder(), max_num_timeout=0)
    executor.update_parameters(job_name=f"{launch.job_name(res, paths)}-profile"[:64])
    paths.profiles_dir.mkdir(parents=True, exist_ok=True)
    with launch.submission_environment(), contextlib.redirect_stderr(io.StringIO()):
        job = executor.submit(ProfileJob(str(paths.root), need, plan))
    job_id = str(job.job_id)
    sweep.log_run(paths, need, "started", where="slurm", job_id=job_id, **_plan_size(plan))
    launch.release_held([slurm.JobId.parse(job_id)])
    return job_id


def _plan_size(plan: Plan) -> dict[str, int]:
    local, per_link = plan.figures()
    return {"figures": local, "collective_figures": per_link}
