"""What the cluster has and would accept, asked of SLURM before anything is submitted: MaxArraySize, partitions
and their nodes, accounting's QOS and association limits, the user's queued jobs, and ``sbatch --test-only``.

The jobs themselves (sacct, squeue, scontrol on one job) are :mod:`orchestrator.slurm.commands`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.slurm import commands as slurm
from orchestrator.slurm.errors import controller_down, explain_failure


def max_array_size(timeout_s: float = 30) -> int | None:
    """The cluster's MaxArraySize from ``scontrol show config``, or None if it cannot be read."""
    try:
        out = slurm.run(["scontrol", "show", "config"], timeout_s=timeout_s).stdout
    except slurm.SlurmUnavailable:
        return None
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.MULTILINE)
    return int(m.group(1)) if m else None


def private_data(timeout_s: float = 10) -> frozenset[str] | None:
    """What the cluster hides from users (PrivateData in ``scontrol show config``: ``jobs``, ``usage``...; empty
    where nothing is), or None where it cannot be read."""
    try:
        out = slurm.run(["scontrol", "show", "config"], timeout_s=timeout_s).stdout
    except slurm.SlurmUnavailable:
        return None
    m = re.search(r"^PrivateData\s*=\s*(\S*)", out, re.MULTILINE)
    if m is None:
        return None
    return frozenset(x for x in m.group(1).lower().split(",") if x and x != "none")


def partitions() -> list[str]:
    """The partition names ``sinfo`` lists; raises SlurmUnavailable when it fails."""
    return sorted(set(slurm.checked(["sinfo", "-h", "-o", "%R"]).split()))


@dataclass(frozen=True)
class Partition:
    """One line of ``sinfo -e``: a partition and the nodes of one kind in it."""

    name: str
    nodes: str
    cpus: str
    memory_mb: str
    gres: str
    features: str
    time_limit: str

    def describe(self) -> str:
        return (
            f"partition {self.name}: {self.nodes} node(s) of {self.cpus} CPUs, {self.memory_mb} MB, gres {self.gres}, "
            f"features {self.features}, time limit {self.time_limit}"
        )


def parse_sinfo(text: str) -> list[Partition]:
    """``sinfo -h -e -o '%R|%D|%c|%m|%G|%f|%l'`` -> one Partition a line."""
    return [Partition(*(line.split("|") + [""] * 7)[:7]) for line in text.splitlines() if line.strip()]


def partition_summary() -> list[Partition]:
    """Partitions with their nodes, CPUs, memory, GPUs, features and time limit."""
    return parse_sinfo(slurm.run(["sinfo", "-h", "-e", "-o", "%R|%D|%c|%m|%G|%f|%l"]).stdout)


def sacctmgr_rows(args: Sequence[str]) -> list[list[str]] | None:
    """The rows of a ``sacctmgr -n -P`` listing, split at ``|``; None where accounting cannot be asked."""
    try:
        result = slurm.run(["sacctmgr", "-n", "-P", *args], timeout_s=30)
    except slurm.SlurmUnavailable:
        return None
    if result.returncode != 0:
        return None
    return [line.split("|") for line in result.stdout.splitlines() if line.strip()]


def sacctmgr_names(args: Sequence[str]) -> list[str] | None:
    """First column of a ``sacctmgr -n -P`` listing; None where accounting cannot be asked."""
    rows = sacctmgr_rows(args)
    return None if rows is None else sorted({row[0] for row in rows})


def parse_partitions(text: str) -> tuple[dict[str, str], str | None]:
    """``scontrol show partition -o`` -> (partition -> its QOS, for those that have one; the default partition)."""
    qos: dict[str, str] = {}
    default = None
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        fields = {k.lower(): v for k, v in fields.items()}
        name = fields.get("partitionname")
        if not name:
            continue
        if fields.get("qos", "N/A") not in ("N/A", "", "(null)"):
            qos[name] = fields["qos"]
        if fields.get("default", "").upper() == "YES" and default is None:
            default = name
    return qos, default


def partition_qos() -> tuple[dict[str, str], str | None]:
    """Each partition's QOS (``QOS=`` in slurm.conf) and the default partition; empty where scontrol fails."""
    try:
        return parse_partitions(slurm.run(["scontrol", "show", "partition", "-o"], timeout_s=30).stdout)
    except slurm.SlurmUnavailable:
        return {}, None


def queued_jobs(user: str | None) -> list[tuple[str, str, str, str]]:
    """The jobs in the queue (pending, running, completing), each array task one (``squeue -r``), as (user,
    account, QOS, partition): ``user``'s, or everyone's that this user may see where None. Raises
    SlurmUnavailable when squeue fails."""
    out = slurm.checked(["squeue", "-h", "-r", *(["-u", user] if user else []), "-o", "%u|%a|%q|%P"])
    rows = [(line.split("|") + ["", "", "", ""])[:4] for line in out.splitlines() if line.strip()]
    return [(u, a, q, p) for u, a, q, p in rows]


def sbatch_test_only(script: str) -> str | None:
    """``sbatch --test-only`` of a job script: None if SLURM would accept it, else what it said."""
    result = slurm.run(["sbatch", "--test-only"], stdin=script)
    if result.returncode == 0:
        return None
    said = explain_failure("sbatch", result.returncode, result.stderr)
    if controller_down(said):
        raise slurm.SlurmUnavailable(said)  # not the cells' fault: the scheduler could not be asked
    return " ".join(line.strip() for line in result.stderr.splitlines() if line.strip()) or f"exit {result.returncode}"
