"""Submission within the scheduler's per-user job limits: as many cells as the limits leave room for now, the
others as earlier ones end.

A QOS's ``MaxSubmitJobsPerUser`` and an association's ``MaxSubmitJobs`` cap how many jobs a user may have in the
queue at once, each array task counted as a job; sbatch refuses a job past the cap
(``QOSMaxSubmitJobPerUserLimit``), and a sweep larger than the cap would fail half-submitted. So before each
submission the limits are read from the scheduler (``sacctmgr show qos`` and ``show assoc``), the user's queued
jobs are counted by QOS (``squeue -r``), and only the cells that fit are submitted; the others are **held back**
and said so, with the limit named. ``--wait`` submits them in waves as earlier jobs leave the queue; without it,
``gpudays resume`` submits what fits then.

``MaxJobsPerUser`` (jobs *running* at once) needs nothing: jobs past it wait in the queue (reason
``QOSMaxJobsPerUserLimit``) and start as others end. Where accounting cannot be asked, nothing is held back.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from orchestrator.config.schema import Config
from orchestrator.slurm import commands as slurm
from orchestrator.slurm import site as slurm_site
from orchestrator.store.attempts import Attempt
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import admission, intents, launch

DEFAULT_QOS = "normal"
"""The QOS a job gets where neither the cell nor the user's association names one (SLURM's own default)."""


@dataclass(frozen=True)
class Limits:
    """The per-user job limits that apply to this user's submissions, as ``sacctmgr`` reports them."""

    per_qos: Mapping[str, int]
    """QOS name -> MaxSubmitJobsPerUser, for the QOSes that set one."""
    association: int | None = None
    """The smallest MaxSubmitJobs of the user's associations, where one is set (it counts jobs of every QOS)."""
    default_qos: str = DEFAULT_QOS
    """The QOS of a job that names none: the association's DefaultQOS, else ``normal``."""


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def read_limits(user: str) -> Limits | None:
    """The limits from ``sacctmgr``; None where accounting cannot be asked (nothing is then held back)."""
    qos_rows = slurm_site.sacctmgr_rows(["show", "qos", "format=name,maxsubmitjobsperuser"])
    assoc_rows = slurm_site.sacctmgr_rows(["show", "assoc", "where", f"user={user}", "format=maxsubmitjobs,defaultqos"])
    if qos_rows is None:
        return None
    per_qos = {row[0]: n for row in qos_rows if len(row) > 1 and (n := _int(row[1])) is not None}
    assoc = [n for row in assoc_rows or [] if (n := _int(row[0])) is not None]
    defaults = [row[1] for row in assoc_rows or [] if len(row) > 1 and row[1].strip()]
    return Limits(per_qos, min(assoc) if assoc else None, defaults[0] if defaults else DEFAULT_QOS)


def split(
    configs: Mapping[str, Config], limits: Limits | None, queued: Mapping[str, int]
) -> tuple[dict[str, Config], dict[str, Config], str]:
    """Cells to submit now and cells to hold back, in the order given, and the limit that held them (or "").

    ``queued``: the user's jobs in the queue by QOS. A cell takes one job of its QOS's room and one of the
    association's; a cell that finds no room is held back, and so is every later cell of the same QOS.
    """
    if limits is None:
        return dict(configs), {}, ""
    room_qos = {q: n - queued.get(q, 0) for q, n in limits.per_qos.items()}
    room_all = None if limits.association is None else limits.association - sum(queued.values())
    now: dict[str, Config] = {}
    later: dict[str, Config] = {}
    why: list[str] = []
    for cid, cfg in configs.items():
        qos = launch.resources(cfg).qos or limits.default_qos
        if room_all is not None and room_all <= 0:
            why.append(
                f"your association allows {limits.association} queued jobs (MaxSubmitJobs, `sacctmgr show assoc`) "
                f"and you have {sum(queued.values())} queued"
            )
        elif qos in room_qos and room_qos[qos] <= 0:
            why.append(
                f"QOS {qos!r} allows {limits.per_qos[qos]} queued jobs per user (MaxSubmitJobsPerUser, "
                f"`sacctmgr show qos`) and you have {queued.get(qos, 0)} queued in it"
            )
        else:
            now[cid] = cfg
            room_all = None if room_all is None else room_all - 1
            if qos in room_qos:
                room_qos[qos] -= 1
            continue
        later[cid] = cfg
    return now, later, "; ".join(dict.fromkeys(why))


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
        user = getpass.getuser()
        limits = read_limits(user)
        if limits is not None and not limits.per_qos and limits.association is None:
            limits = None  # accounting, but no per-user job limit: nothing to count
        try:
            queued = slurm_site.user_jobs_by_qos(user) if limits is not None else {}
        except slurm.SlurmUnavailable as e:
            raise launch.SubmissionRefused(f"cannot count your queued jobs against the QOS limits: {e}") from e
        now, self.held, self.why = split(configs, limits, queued)
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
