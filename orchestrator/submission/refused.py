"""Why the scheduler did not take some cells, in one line: the exceptions submission raises, and what a failed
``sbatch`` leaves behind (``unsubmitted``: the intents taken back where the scheduler surely has no job of the
array's name, else left for the next command to reconcile).

A refusal names the cells and SLURM's own words, as the checks before submission (``orchestrator.submission
.admission``) do: ``sbatch refused 2 cell(s) 1a2b (...), 3c4d (...): QOSMaxSubmitJobPerUserLimit; ...``.
"""

from __future__ import annotations

import datetime as dt
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence

import submitit

from orchestrator.cells import cell as cells
from orchestrator.config.schema import Config
from orchestrator.slurm import commands as slurm
from orchestrator.slurm.errors import controller_down
from orchestrator.store.attempts import Attempt, Written, take_back
from orchestrator.store.durable import refused_write
from orchestrator.store.paths import SweepPaths


class SubmissionRefused(Exception):
    """The scheduler would not accept some cells as configured; nothing was submitted. The message says why."""


class SchedulerUnreachable(SubmissionRefused):
    """The scheduler could not be asked whether it would accept the cells (its controller is down, or SLURM finds
    no configuration): not the cells' fault; nothing was submitted."""


def name_cells(cell_ids: Sequence[str], configs: Mapping[str, Config], shown: int = 3) -> str:
    """``2 cell(s) 1a2b (pythia-70m h100 x8), 3c4d (...) and 5 more``: cells named in one line."""
    names = [f"{cid} ({cells.label(configs[cid])})" for cid in cell_ids[:shown]]
    more = f" and {len(cell_ids) - shown} more" if len(cell_ids) > shown else ""
    return f"{len(cell_ids)} cell(s) " + ", ".join(names) + more


SUBMIT_LIMITS = {
    "QOSMaxSubmitJobPerUserLimit": "a QOS's MaxSubmitJobsPerUser, the job's or its partition's (`sacctmgr show qos`)",
    "QOSMaxSubmitJobPerAccountLimit": "a QOS's MaxSubmitJobsPerAccount (`sacctmgr show qos`)",
    "QOSGrpSubmitJobsLimit": "a QOS's GrpSubmitJobs, counting every user's jobs (`sacctmgr show qos`)",
    "AssocMaxSubmitJobLimit": "your association's MaxSubmitJobs (`sacctmgr show assoc`)",
    "AssocGrpSubmitJobsLimit": "the GrpSubmitJobs of your association or an account above it (`sacctmgr show assoc`)",
}
"""sbatch's name for a limit on queued jobs it refused a job past, and that limit in words: the jobs that limit
counts could not all be seen (another user's, where the site hides them) or changed since they were counted."""


def limit_named(said: str) -> str:
    """``said`` with the submit limit it names said in words, where it names one."""
    named = [words for code, words in SUBMIT_LIMITS.items() if code.lower() in said.lower()]
    return f"{said} (the limit on queued jobs refused: {'; '.join(named)})" if named else said


_SBATCH_PREFIX = re.compile(r"^\s*sbatch:\s*(error|fatal):\s*", re.IGNORECASE)


def sbatch_said(error: BaseException) -> str | None:
    """What sbatch said when it refused a submission, in one line (``sbatch: error:`` prefixes dropped); None when
    ``error`` is not sbatch's refusal. submitit raises its ``FailedJobError`` with sbatch's stderr; a
    ``CalledProcessError`` carries it too."""
    if isinstance(error, submitit.core.utils.FailedJobError):
        text = str(error)
    elif isinstance(error, subprocess.CalledProcessError):
        raw = error.stderr or error.output or ""
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    else:
        return None
    lines = [_SBATCH_PREFIX.sub("", line).strip() for line in text.splitlines()]
    return "; ".join(line for line in lines if line)[:500] or f"sbatch failed ({type(error).__name__})"


def unsubmitted(
    paths: SweepPaths,
    written: Written,
    token: str,
    error: Exception,
    who: str = "the cells",
    before: Sequence[Attempt] = (),
) -> BaseException:
    """What to raise when a chunk's submission failed (submitit could not write its files, or sbatch refused):
    where the scheduler surely has no job of the chunk's name, its intents are taken back, so every cell is as it
    was (an ``ok`` cell stays ``ok``, not ``lost``); else they stay for the next command to reconcile. A write a
    full disk refused becomes WriteFailed naming its file; sbatch's refusal (``who``: the chunk's cells; ``before``:
    what this command submitted before it) a SubmissionRefused in one line (SchedulerUnreachable where sbatch could
    not reach the controller)."""
    taken_back = False
    try:
        named = slurm.jobs_named([token], dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1))
        if named.complete and token not in named.jobs:
            take_back(paths, written)
            taken_back = True
    except slurm.SlurmUnavailable:
        pass
    said = sbatch_said(error)
    if said is None:
        return refused_write(error, paths.jobs_dir, "nothing of it was submitted")
    resume = shlex.join(["gpudays", "resume", str(paths.root)])
    if taken_back:
        after = f"nothing of them was submitted, and they are as they were (`{resume}` submits them)"
    else:
        after = (
            f"the scheduler could not say whether it has job {token}: the next gpudays command asks again, adopts "
            f"it or calls the cells lost (then `{resume}` submits them)"
        )
    if before:
        arrays = sorted({(a.job_id or "").split("_")[0] for a in before}, key=lambda j: (len(j), j))
        after += f"; the {len(before)} cell(s) submitted before it run as job(s) {', '.join(arrays)}"
    said = limit_named(said)
    kind = SchedulerUnreachable if controller_down(said) else SubmissionRefused
    verb = "could not reach the scheduler for" if kind is SchedulerUnreachable else "refused"
    return kind(f"sbatch {verb} {who}: {said}; {after}")
