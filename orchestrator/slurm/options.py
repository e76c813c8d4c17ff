"""What a cluster config hands to SLURM as it is: a site's own sbatch options, srun options, and the command that
starts Python in the job (a container wrapper).

A site needs flags gpudays knows nothing of (``--reservation``, ``--exclude``, pyxis' ``--container-image``,
``--spread-job``) and runs jobs inside containers (``apptainer exec --nv image.sif python3``). They are passed
through unchanged, with three rules checked before anything is submitted:

- a flag gpudays sets itself (the job's size, time, output files, array, signal) cannot be passed a second time:
  the refusal names the ``cluster.*`` key that sets it;
- values reach the job script shell-quoted (by submitit), so nothing in them runs as shell code; a newline or NUL
  is refused;
- ``#SBATCH`` lines belong in ``cluster.sbatch_extra``, never in ``cluster.setup``: sbatch stops reading
  directives at the script's first command, so such a line after the environment's exports would be ignored.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from orchestrator.config.refusal import Refusal

if TYPE_CHECKING:
    from orchestrator.config.schema import ClusterConfig

SBATCH_SET_BY_GPUDAYS: dict[str, str] = {
    "job-name": "the sweep's name (name)",
    "time": "cluster.time_limit_min",
    "nodes": "num_nodes",
    "ntasks-per-node": "num_gpus / num_nodes",
    "cpus-per-task": "cluster.cpus_per_gpu",
    "gres": "the GPU count and cluster.gres_by_gpu",
    "gpus-per-node": "the GPU count and cluster.gres_by_gpu",
    "constraint": "cluster.constraint or cluster.constraint_by_gpu",
    "partition": "cluster.partition",
    "account": "cluster.account",
    "qos": "cluster.qos",
    "mem": "cluster.mem_gb_per_gpu",
    "wckey": "cluster.wckey",
    "array": "gpudays (one array job per group of cells)",
    "output": "gpudays (the sweep folder's jobs/)",
    "error": "gpudays (the sweep folder's jobs/)",
    "open-mode": "gpudays (logs appended across requeues)",
    "signal": "gpudays (the time-limit warning the job acts on)",
    "requeue": "gpudays (always --requeue: a timed-out or preempted cell requeues itself)",
    "hold": "gpudays (held until its job ids are written, then released)",
    "exclusive": "cluster.exclusive",
}
"""The sbatch options of every gpudays job, by the key that decides each: not accepted in ``sbatch_extra``."""

SRUN_SET_BY_GPUDAYS: dict[str, str] = {
    "cpus-per-task": "cluster.cpus_per_gpu",
    "c": "cluster.cpus_per_gpu",
    "output": "gpudays (the sweep folder's jobs/)",
    "o": "gpudays (the sweep folder's jobs/)",
    "error": "gpudays (the sweep folder's jobs/)",
    "e": "gpudays (the sweep folder's jobs/)",
    "kill-on-bad-exit": "gpudays (one rank that fails ends its cell, after recording it)",
    "K": "gpudays (one rank that fails ends its cell, after recording it)",
    "unbuffered": "gpudays",
    "u": "gpudays",
}
"""The srun options gpudays (and submitit) put on every job's srun line: not accepted in ``srun_args``."""

_OPTION = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_FLAG_VALUES = ("", "true")


def option_name(key: str) -> str:
    """An option as sbatch spells it: no leading dashes, ``_`` as ``-``."""
    return key.lstrip("-").replace("_", "-")


def sbatch_options(cluster: ClusterConfig) -> dict[str, str | bool]:
    """``cluster.sbatch_extra`` as submitit's ``additional_parameters``: an empty value or ``true`` is a bare flag
    (``spread-job: ""`` is ``#SBATCH --spread-job``)."""
    out: dict[str, str | bool] = {}
    for key, value in cluster.sbatch_extra.items():
        text = "" if value is None else str(value)
        out[option_name(str(key))] = True if text.lower() in _FLAG_VALUES else text
    return out


def problems(cluster: ClusterConfig) -> list[Refusal]:
    """What in the cluster config's pass-through would break the job script or repeat a flag gpudays sets."""
    out: list[Refusal] = []
    for key, value in cluster.sbatch_extra.items():
        where = f"cluster.sbatch_extra.{key}"
        name = option_name(str(key))
        if not _OPTION.match(name):
            out.append(Refusal(where, "is not an sbatch option name; write it as in `sbatch --help`, without dashes"))
        elif name in SBATCH_SET_BY_GPUDAYS:
            out.append(Refusal(where, f"gpudays sets --{name} itself, from {SBATCH_SET_BY_GPUDAYS[name]}; set that"))
        if any(ch in str(value) for ch in "\n\r\0"):
            out.append(Refusal(where, "contains a newline or NUL; use a single-line value"))
    for i, arg in enumerate(cluster.srun_args):
        text = str(arg)
        if any(ch in text for ch in "\n\r\0"):
            out.append(Refusal(f"cluster.srun_args[{i}]", "contains a newline or NUL; give each argument on its own"))
            continue
        if text.startswith("-"):
            # --long[=value], or -x[value] (a short option takes its value attached or as the next argument)
            name = option_name(text.split("=", 1)[0]) if text.startswith("--") else text[1:2]
            if name in SRUN_SET_BY_GPUDAYS:
                out.append(
                    Refusal(
                        f"cluster.srun_args[{i}]",
                        f"{text!r}: gpudays sets srun's --{name} itself, from {SRUN_SET_BY_GPUDAYS[name]}; set that",
                    )
                )
    if cluster.python is not None and (not str(cluster.python).strip() or any(c in cluster.python for c in "\n\r\0")):
        out.append(
            Refusal(
                "cluster.python", "give one command line that starts Python, e.g. `apptainer exec --nv img.sif python3`"
            )
        )
    for i, line in enumerate(cluster.setup):
        if str(line).lstrip().upper().startswith("#SBATCH"):
            out.append(
                Refusal(
                    f"cluster.setup[{i}]",
                    f"{line!r}: an #SBATCH line after the job's first command is ignored by sbatch; "
                    "put the option in cluster.sbatch_extra (e.g. `reservation: lab-week`) instead",
                )
            )
    return out
