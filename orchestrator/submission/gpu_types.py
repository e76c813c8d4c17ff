"""Whether a SLURM cell's GPU type can be requested as the cell names it: a cluster config that maps GPU types must
map the cell's (else it is refused), and one that maps none asks for untyped GPUs (a warning: the cells run on
whatever GPU type the cluster gives)."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.cells import cell as cells
from orchestrator.config.schema import Config
from orchestrator.submission.refused import SubmissionRefused


def gpu_type_problem(cell: Config) -> str | None:
    """Why a SLURM cell's GPU type cannot be requested, or None.

    A cluster config that maps GPU types (``gres_by_gpu`` or ``constraint_by_gpu`` not empty) must map the cell's
    GPU in one of them: a type it does not map would otherwise become an untyped ``--gres=gpu:N``, which any GPU
    satisfies, and the cell would measure whatever GPU the scheduler picked. A cluster config with both maps empty
    asks for untyped GPUs on purpose (a cluster with one GPU type).
    """
    gpu, cluster = cell.gpu, cell.cluster
    if cluster.backend != "slurm" or gpu.accelerator != "cuda":
        return None
    by_gres, by_constraint = cluster.gres_by_gpu, cluster.constraint_by_gpu
    if not (by_gres or by_constraint) or gpu.name in by_gres or gpu.name in by_constraint:
        return None
    mapped = sorted({*by_gres, *by_constraint})
    return (
        f"cell {cells.cell_id(cell)} ({cells.label(cell)}) asks for gpu={gpu.name}, which the cluster config "
        f"maps in neither cluster.gres_by_gpu nor cluster.constraint_by_gpu (it maps {', '.join(mapped)}); "
        f"add `{gpu.name}: <the site's gres type>` to gres_by_gpu (sinfo -o '%P %G' lists them) or a feature "
        "to constraint_by_gpu in your cluster's YAML file, or choose a GPU this cluster has"
    )


def check_gpu_types(configs: Mapping[str, Config]) -> None:
    """Raise SubmissionRefused naming every cell whose GPU type the cluster config does not map."""
    problems = [p for p in (gpu_type_problem(cfg) for cfg in configs.values()) if p]
    if problems:
        raise SubmissionRefused(
            f"{len(problems)} cell(s) ask for a GPU type the cluster config does not map; nothing was submitted:\n  "
            + "\n  ".join(problems)
        )


def untyped_gpu_notes(configs: Mapping[str, Config]) -> list[str]:
    """One line per cluster config and GPU type requested untyped: a cluster config that maps no GPU type asks
    for ``--gres=gpu:N``, so a cell's ``gpu=`` names the GPU it is predicted and reported as, not the one it gets."""
    untyped: dict[str, set[str]] = {}
    for cfg in configs.values():
        cluster = cfg.cluster
        if cluster.backend != "slurm" or cfg.gpu.accelerator != "cuda":
            continue
        if not (cluster.gres_by_gpu or cluster.constraint_by_gpu):
            untyped.setdefault(
                f"partition {cluster.partition}" if cluster.partition else "the default partition", set()
            ).add(cfg.gpu.name)
    return [
        f"the cluster config maps no GPU type (cluster.gres_by_gpu and cluster.constraint_by_gpu are empty): "
        f"{', '.join(f'gpu={g}' for g in sorted(gpus))} is requested as an untyped --gres=gpu:N, so its cells run "
        f"on whatever GPU type {where} gives them, the cluster's only one if it has one, and are predicted and "
        f"reported as {' and '.join(sorted(gpus))}; where it has several types, map each in gres_by_gpu"
        for where, gpus in sorted(untyped.items())
    ]
