"""Submission within the scheduler's job limits: as many cells as the limits leave room for now, the others as
earlier ones end.

SLURM caps how many jobs may be queued at once, each array task counted as a job, by several limits at once (a
QOS's per user, per account and for everyone, the job's QOS and its partition's; an association's and those of the
accounts above it: :mod:`orchestrator.submission.limits`); sbatch refuses a job past any of them
(``QOSMaxSubmitJobPerUserLimit``), and a sweep larger than one would fail half-submitted. So before each submission
the limits are read from the scheduler (``sacctmgr show qos`` and ``show assoc``, ``scontrol show partition``), the
queued jobs they count are counted (``squeue -r``), and only the cells that fit under every limit are submitted; the
others are **held back** and said so, with the limit named. ``--wait`` submits them in waves as earlier jobs leave
the queue; without it, ``gpudays resume`` submits what fits then.

``MaxJobsPerUser`` (jobs *running* at once) needs nothing: jobs past it wait in the queue (reason
``QOSMaxJobsPerUserLimit``) and start as others end. Where accounting cannot be asked, nothing is held back.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.config.schema import Config
from orchestrator.slurm import commands as slurm
from orchestrator.slurm import site as slurm_site
from orchestrator.store.attempts import Attempt
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import admission, intents, launch
from orchestrator.submission.limits import Limit, Queued, Site
from orchestrator.submission.limits import read as read_limits


def cell_limits(configs: Mapping[str, Config], site: Site) -> dict[str, list[Limit]]:
    """Each cell's limits (its account, QOS and partition, or the user's defaults)."""
    out = {}
    for cid, cfg in configs.items():
        res = launch.resources(cfg)
        out[cid] = site.limits(res.account, res.qos, res.partition)
    return out


def split(
    configs: Mapping[str, Config],
    site: Site | None,
    queued: Sequence[Queued],
    limits: Mapping[str, list[Limit]] | None = None,
) -> tuple[dict[str, Config], dict[str, Config], str]:
    """Cells to submit now and cells to hold back, in the order given, and the limits that held them (or "").

    ``queued``: the jobs in the queue the limits count. A cell takes one job of the room of each of its limits; a
    cell that finds no room under one is held back, and so is every later cell that limit counts. ``limits``: each
    cell's (:func:`cell_limits`), where worked out already.
    """
    if site is None:
        return dict(configs), {}, ""
    limits = cell_limits(configs, site) if limits is None else limits
    room: dict[Limit, int] = {}
    for limit in {lim for lims in limits.values() for lim in lims}:
        used = sum(1 for job in queued if limit.counts(job, site.partition_qos))
        room[limit] = limit.size - used
    now: dict[str, Config] = {}
    later: dict[str, Config] = {}
    why: list[str] = []
    for cid, cfg in configs.items():
        full = [lim for lim in limits[cid] if room[lim] <= 0]
        if full:
            why += [f"{lim.name}; {lim.size - room[lim]} are queued, this submission's included" for lim in full]
            later[cid] = cfg
            continue
        now[cid] = cfg
        for lim in limits[cid]:
            room[lim] -= 1
    return now, later, "; ".join(dict.fromkeys(why))


def count_queued(site: Site, limits: Sequence[Limit]) -> list[Queued]:
    """The queued jobs the limits count: the user's own where every limit counts only theirs, else everyone's."""
    everyone = any(lim.user is None for lim in limits)
    return [Queued(*row) for row in slurm_site.queued_jobs(None if everyone else site.user)]


@dataclass
class Waves:
    """One command's submissions to SLURM: what went out, and the cells held back by a per-user limit."""

    paths: SweepPaths
    before_start: Callable[[str], None] | None = None
    """Called with each cell id once its job is accepted (``resume`` moves the replaced record aside there)."""
    held: dict[str, Config] = field(default_factory=dict)
    why: str = ""
    """The limit that held cells back, in words."""
    to_slurm: bool = False

    def submit(self, configs: Mapping[str, Config]) -> list[Attempt]:
        """Submit what the limits leave room for (inside the sweep's lock); hold back the rest."""
        self.to_slurm = self.to_slurm or bool(configs)
        site = read_limits(getpass.getuser())
        per_cell = {} if site is None else cell_limits(configs, site)
        limits = list({lim for ls in per_cell.values() for lim in ls})
        if not limits:
            site = None  # no job limit counts these cells: nothing to count
        try:
            queued = count_queued(site, limits) if site is not None else []
        except slurm.SlurmUnavailable as e:
            raise launch.SubmissionRefused(f"cannot count the queued jobs against the job limits: {e}") from e
        now, self.held, self.why = split(configs, site, queued, per_cell)
        if not now:
            return []
        return launch.submit_slurm(self.paths, now, admission.scheduler_max_array_size(), self.before_start)

    def refill(self) -> list[Attempt]:
        """Submit held cells that fit now, under the sweep's lock; the cells submitted."""
        if not self.held:
            return []
        with intents.sweep_lock(self.paths):
            return self.submit(dict(self.held))

    def summary(self, subs: list[Attempt]) -> str:
        """What was submitted (``submitted 3 cell(s) to SLURM as 1 array job(s): 12``), and what is held back."""
        arrays = sorted({(s.job_id or "").split("_")[0] for s in subs}, key=lambda j: (len(j), j))
        lines = [f"submitted {len(subs)} cell(s) to SLURM as {len(arrays)} array job(s): {', '.join(arrays)}"]
        if self.held:
            lines.append(
                f"{len(self.held)} cell(s) held back, not submitted yet: {self.why}. With --wait they are submitted "
                "as earlier jobs leave the queue; otherwise `gpudays resume` submits what fits then"
            )
        return "\n".join(lines)
