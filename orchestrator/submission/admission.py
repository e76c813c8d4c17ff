"""Before submission: does the cluster accept what the cells ask for?

Each group of cells with the same resources is checked against the cluster as it is: its partitions (comma lists
partition by partition), the user's accounts, the QOS names, and ``sbatch --test-only`` of the very script the
group would get. Every problem names the cells and what the cluster has; nothing is submitted if any is found.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from orchestrator.config.schema import Config
from orchestrator.slurm import commands as slurm
from orchestrator.slurm import site as slurm_site
from orchestrator.slurm.errors import controller_down
from orchestrator.submission.launch import Resources, group_by_resources, slurm_executor, submission_environment
from orchestrator.submission.refused import SchedulerUnreachable, SubmissionRefused, name_cells


def scheduler_max_array_size() -> int | None:
    """The cluster's MaxArraySize from ``scontrol show config``, or None if it cannot be read."""
    return slurm_site.max_array_size()


def _partitions() -> list[str]:
    try:
        return slurm_site.partitions()
    except slurm.SlurmUnavailable as e:
        raise _unavailable(e) from e


def _unavailable(e: slurm.SlurmUnavailable) -> SubmissionRefused:
    """A controller that does not answer (or that SLURM cannot find) is the scheduler's; SLURM's commands missing
    here, or one that refused, is this setup's (bad input)."""
    return SchedulerUnreachable(str(e)) if controller_down(str(e)) else SubmissionRefused(str(e))


def _user() -> str:
    import pwd

    return os.environ.get("USER") or pwd.getpwuid(os.getuid()).pw_name


def _sacctmgr_names(args: Sequence[str]) -> list[str] | None:
    """First column of a sacctmgr listing; None where accounting cannot be asked (then sbatch alone judges)."""
    return slurm_site.sacctmgr_names(args)


def _what_the_cluster_has() -> str:
    """Partitions with their nodes, CPUs, memory, GPUs, features and time limit."""
    try:
        return "\n    ".join(p.describe() for p in slurm_site.partition_summary())
    except slurm.SlurmUnavailable as e:
        return f"(sinfo could not be asked: {e})"


def check_slurm(configs: Mapping[str, Config]) -> None:
    """Ask the cluster, before anything is submitted, whether it would accept every cell as configured.

    One ``sinfo`` for the partition names; one ``sacctmgr`` for the user's accounts and one for the QOS names,
    where cells name them (some clusters accept any name without enforcing it, and charge nobody); and one
    ``sbatch --test-only`` of each resource group's real job script, which checks partition, account, QOS, node
    counts, GPUs, CPUs, memory, features and time limit as a submission would, and submits nothing. Raises
    SubmissionRefused naming the cells, what was refused and what the cluster has.
    """
    groups = group_by_resources(configs)
    if not groups:
        return
    problems: list[str] = []
    partitions = _partitions()
    accounts = qos_names = None
    if any(res.account is not None for res in groups):
        accounts = _sacctmgr_names(["show", "assoc", "where", f"user={_user()}", "format=account"])
    if any(res.qos is not None for res in groups):
        qos_names = _sacctmgr_names(["show", "qos", "format=name"])
    for res, cell_ids in groups.items():
        who = name_cells(cell_ids, configs)
        wrong = []
        # A comma list lets SLURM start the job in whichever of them can run it first.
        unknown = [p for p in (res.partition or "").split(",") if p and p not in partitions]
        if unknown:
            wrong.append(
                f"cluster.partition={res.partition!r}: {', '.join(map(repr, unknown))} is not a partition here; "
                f"use one of {', '.join(partitions)} (or a comma list of them)"
            )
        if res.account is not None and accounts is not None and res.account not in accounts:
            wrong.append(
                f"cluster.account={res.account!r} is not an account of user {_user()}; "
                f"use one of {', '.join(accounts) or '(none)'}"
            )
        if res.qos is not None and qos_names is not None and res.qos not in qos_names:
            wrong.append(f"cluster.qos={res.qos!r} is not a QOS here; use one of {', '.join(qos_names) or '(none)'}")
        if wrong:
            problems.append(f"{who}: " + "; ".join(wrong))
            continue
        executor = slurm_executor(res, "/tmp/gpudays-test-only/%j")
        script = executor._make_submission_file_text("true", "test-only")
        try:
            with submission_environment():
                said = slurm_site.sbatch_test_only(script)
        except slurm.SlurmUnavailable as e:
            raise _unavailable(e) from e
        if said is not None:
            problems.append(f"{who}: the cluster refuses {describe_request(res)}: {said[:400]}")
    if problems:
        raise SubmissionRefused(
            f"{len(problems)} group(s) of cells cannot be submitted as configured; nothing was submitted:\n  "
            + "\n  ".join(problems)
            + "\n  This cluster has:\n    "
            + _what_the_cluster_has()
        )


def describe_request(res: Resources) -> str:
    """A short account of a resource request, in sbatch's words."""
    parts = [f"--nodes={res.nodes}", f"--ntasks-per-node={res.tasks_per_node}", f"--cpus-per-task={res.cpus_per_task}"]
    optional = {
        "--gres": res.gres,
        "--constraint": res.constraint,
        "--partition": res.partition,
        "--account": res.account,
        "--qos": res.qos,
        "--mem": f"{res.mem_gb}GB" if res.mem_gb else None,
    }
    parts += [f"{k}={v}" for k, v in optional.items() if v is not None]
    parts.append(f"--time={res.time_limit_min}")
    return " ".join(parts)
