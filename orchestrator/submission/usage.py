"""What a sweep's cells cost in GPU-seconds as SLURM charged them: the GPUs it allocated (sacct's AllocTRES) × the
time each run held them, every attempt and requeued run included, for the budget of an adaptive sweep."""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.slurm import commands as slurm
from orchestrator.store.attempts import read_attempts
from orchestrator.store.paths import SweepPaths


def allocated_gpu_s(paths: SweepPaths, cell_ids: Iterable[str]) -> tuple[dict[str, float], str | None]:
    """GPU-seconds SLURM allocated to each cell's jobs, for the cells every SLURM job of which sacct lists (one
    call); the others are left out, for the caller to count from the probe's own figure. A note says why cells are
    left out (sacct not answering, or not listing some jobs), else None."""
    jobs: dict[str, list[slurm.JobId]] = {}
    for cid in cell_ids:
        ids = []
        for a in read_attempts(paths, cid):
            if a.backend == "slurm" and a.job_id:
                try:
                    ids.append(slurm.JobId.parse(a.job_id))
                except ValueError:
                    continue
        if ids:
            jobs[cid] = ids
    if not jobs:
        return {}, None
    try:
        used = slurm.sacct_usage([j for ids in jobs.values() for j in ids])
    except slurm.SlurmUnavailable as e:
        return {}, f"sacct could not be asked ({e}): GPU-hours spent count the probes' wall time x GPUs"
    out = {cid: sum(used[j] for j in ids) for cid, ids in jobs.items() if all(j in used for j in ids)}
    missing = len(jobs) - len(out)
    note = None
    if missing:
        note = f"sacct lists no allocation for {missing} cell(s): their GPU-hours count the probe's wall time x GPUs"
    return out, note
