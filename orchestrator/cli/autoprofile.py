"""A sweep profiles its hardware before its cells (``probe.profile``, on by default).

For each GPU type and node layout the cells run on (:func:`orchestrator.profile.sweep.needs`) the folder's
profile is reused, or one from ``--profile-from`` copied in (refused, with the fields that differ, where it is of
other hardware); else one is measured: on this machine before the cells run, on SLURM as a job of its own
submitted ahead of the cells' array (so the per-user job limits count it like a cell, and an adaptive sweep's
budget its GPU time). A profile that fails is said, and the cells run all the same: predictions then use the
cited defaults.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cli.display import console
from orchestrator.cli.errors import CommandError, Exit
from orchestrator.config.schema import Config
from orchestrator.profile import sweep
from orchestrator.profile.record import BadProfile, profiles_in
from orchestrator.store.paths import SweepPaths

if TYPE_CHECKING:
    from orchestrator.profile.runner import Plan

FALLBACK = "its cells run all the same, and predictions use the cited defaults for it"


def older_folders(given: Sequence[str] | None) -> list[SweepPaths]:
    """``--profile-from`` folders; CommandError naming one that is not a sweep folder."""
    older = [SweepPaths(Path(d)) for d in given or []]
    if missing := [str(o.root) for o in older if not o.root.is_dir()]:
        raise CommandError(f"--profile-from {', '.join(missing)}: no such sweep folder")
    return older


def decisions(paths: SweepPaths, configs: Mapping[str, Config], older: Sequence[SweepPaths]) -> list[sweep.Decision]:
    """What the sweep does about each of its needs; CommandError for a refused or damaged profile."""
    from orchestrator.profile.identity import this_machine

    out = []
    for need, cells in sweep.needs(configs.values()).items():
        if not older and not sweep.measuring(cells):
            out.append(sweep.Decision(need, "off"))  # this machine's identity (torch's import) is not asked for
            continue
        here = this_machine(need.backend, need.gpus_per_node, 1) if need.cluster == "local" else None
        try:
            out.append(sweep.decide(paths, need, cells, here, older))
        except sweep.RefusedProfile as e:
            raise CommandError(f"{e}; give a sweep profiled on this hardware, or leave --profile-from out") from None
        except BadProfile as e:
            raise CommandError(f"{e}; remove it and the sweep measures a profile anew") from None
    return out


def ensure(paths: SweepPaths, configs: Mapping[str, Config], older: Sequence[SweepPaths] = ()) -> None:
    """Reuse, copy in or measure the profile of each need of ``configs`` (inside the sweep's lock, before the cells
    are submitted); the profile measures the shapes of their models."""
    if not configs:
        return
    cells = sweep.needs(configs.values())
    for d in decisions(paths, configs, older):
        need = d.need
        if d.action == "reuse":
            console.out(f"profile of {need.describe()}: {d.found} (reused, not measured again)")
        elif d.action == "measure" and need.cluster == "local":
            _measure_here(paths, need, _plan(cells[need], need))
        elif d.action == "measure":
            _submit(paths, need, cells[need][0], _plan(cells[need], need))


def _plan(cells: Sequence[Config], need: sweep.Need) -> Plan:
    """What the profile measures: the cells' models' shapes, in their precisions, as ``gpudays profile`` would."""
    from orchestrator.cli.profiling import plan_for

    flags = argparse.Namespace(precision=None, tokens=None, max_message=None, seconds_each=None)
    device = "cuda" if need.backend == "nccl" else "cpu"
    return plan_for([c.model for c in cells], [c.method.precision for c in cells], device, flags)


def _measure_here(paths: SweepPaths, need: sweep.Need, plan: Plan) -> None:
    from orchestrator.profile.runner import ProfileFailed, profile_here

    local, per_link = plan.figures()
    console.out(f"profiling {need.describe()} on this machine before the cells: {local} products, attention and "
                f"memory figures, {per_link} collective figures (`probe.profile=false` leaves it out)")  # fmt: skip
    sweep.log_run(paths, need, "started", where="local")
    started = time.perf_counter()
    try:
        profile = profile_here(plan, need.gpus_per_node, need.backend)
    except (ProfileFailed, ValueError, OSError) as e:
        wall = time.perf_counter() - started
        sweep.log_run(paths, need, "ended", outcome="failed", reason=str(e)[:300], wall_s=wall)
        console.note(f"the profile of {need.describe()} failed ({e}); {FALLBACK}")
        return
    where = sweep.keep(paths, profile, need.gpu)
    wall = time.perf_counter() - started
    sweep.log_run(paths, need, "ended", outcome="ok", wall_s=wall, file=where.name)
    console.out(f"profile of {need.describe()} written in {wall:.0f} s: {where}")


def _submit(paths: SweepPaths, need: sweep.Need, cell: Config, plan: Plan) -> None:
    from orchestrator.submission.profile_job import submit_profile

    try:
        job_id = submit_profile(paths, need, cell, plan)
    except Exception as e:  # noqa: BLE001 - any refusal of the profile's job leaves the cells to go on
        said = (getattr(e, "stderr", None) or str(e) or type(e).__name__).strip().splitlines()
        sweep.log_run(paths, need, "started", where="slurm", job_id=None)
        reason = f"not submitted: {said[-1] if said else e}"
        sweep.log_run(paths, need, "ended", outcome="failed", reason=reason, wall_s=0.0)
        console.note(f"the profile of {need.describe()} could not be submitted ({said[-1] if said else e}); {FALLBACK}")
        return
    console.out(f"profile of {need.describe()}: submitted as job {job_id}, ahead of the cells")


def status_lines(paths: SweepPaths) -> list[str]:
    """``status``'s lines about the sweep's profiles: one a run, with how it stands."""
    rows = sweep.runs(paths)
    lines = []
    for i, row in enumerate(rows):
        need = sweep.need_of(row)
        if need is None or row.get("event") != "started":
            continue
        ended = next((r for r in rows[i + 1 :] if r.get("event") == "ended" and sweep.need_of(r) == need), None)
        job = f"job {row['job_id']}" if row.get("job_id") else "this machine"
        job = "its SLURM job" if row.get("where") == "slurm" and not row.get("job_id") else job
        if ended is None and row.get("job_id"):
            how = f"{_scheduler_state(str(row['job_id'])) or 'submitted'}, no profile written yet"
        elif ended is None:
            how = "under way, or cut short"
        elif ended.get("outcome") == "ok":
            how = f"ok, {ended.get('file')}"
        else:
            how = f"failed: {ended.get('reason')}; {FALLBACK}"
        lines.append(f"profile of {need.describe()} ({job}): {how}")
    return lines


def show(paths: SweepPaths) -> int:
    """``gpudays show SWEEP profile``: each profile run's line, and its SLURM job's log files (a failed run's error
    log's last lines too)."""
    lines = status_lines(paths)
    if not lines:
        console.out(f"{paths.root} has started no profile run (its profiles: {len(profiles_in(paths))})")
        return Exit.OK
    for line, row in zip(lines, [r for r in sweep.runs(paths) if r.get("event") == "started"], strict=False):
        console.out(line)
        job_id = row.get("job_id")
        logs = sorted(paths.job_dir(str(job_id)).glob("*_log.*")) if job_id else []
        for log in logs:
            console.out(f"  {log}")
        if logs and ": ok, " not in line:
            tail = log_tail(logs[0])
            console.out("\n".join(f"    {t}" for t in tail))
    return Exit.OK


def log_tail(path: Path, lines: int = 10) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def _scheduler_state(job_id: str) -> str | None:
    """What SLURM says of the profile's job (``PENDING``, ``RUNNING``, ``TIMEOUT``...); None where it cannot say."""
    from orchestrator.slurm import commands as slurm

    try:
        jid = slurm.JobId.parse(job_id)
        for ask in (slurm.squeue, slurm.sacct):
            info = ask([jid]).jobs.get(jid)
            if info is not None:
                return info.state.lower()
    except (slurm.SlurmUnavailable, ValueError):
        return None
    return None
