"""Send cells to where they run, through submitit.

On SLURM, cells that ask for the same resources go out as one array job (one sbatch call), split where a group
would exceed the cluster's MaxArraySize, with ``cluster.array_parallelism`` as the cap on tasks running at once.
Each rank of a cell is one SLURM task: ``num_gpus / num_nodes`` tasks on each of ``num_nodes`` nodes, started by
srun. Locally, cells run one after another through submitit's local executor, one process per rank.
"""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import submitit
from omegaconf import OmegaConf

from orchestrator.jobside import run_cell
from orchestrator.paths import SweepPaths, append_jsonl

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "sbatch_templates"


@dataclass(frozen=True)
class Resources:
    """What one cell asks of the scheduler; cells with equal Resources share an array job."""

    backend: str
    nodes: int
    tasks_per_node: int
    gpus_per_node: int
    gres: str | None
    constraint: str | None
    partition: str | None
    account: str | None
    qos: str | None
    time_limit_min: int
    cpus_per_task: int
    mem_gb: int | None
    array_parallelism: int
    max_array_size: int
    accelerator: str
    setup: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    template: str = "default.sh.j2"
    job_name: str = "gpudays"


def resources(cell: dict[str, Any]) -> Resources:
    """The scheduler request of a cell, from its gpu and cluster configs."""
    gpu, cluster = cell["gpu"], cell["cluster"]
    num_gpus, num_nodes = int(cell["num_gpus"]), int(cell["num_nodes"])
    per_node = num_gpus // num_nodes
    on_cuda = gpu["accelerator"] == "cuda"
    gres = None
    if on_cuda:
        gres_type = cluster["gres_by_gpu"].get(gpu["name"])
        gres = f"gpu:{gres_type}:{per_node}" if gres_type else f"gpu:{per_node}"
    constraints = [c for c in (cluster["constraint"], cluster["constraint_by_gpu"].get(gpu["name"])) if c]
    mem = cluster["mem_gb_per_gpu"]
    return Resources(
        backend=cluster["backend"],
        nodes=num_nodes,
        tasks_per_node=per_node,
        gpus_per_node=per_node if on_cuda else 0,
        gres=gres,
        constraint="&".join(f"({c})" if len(constraints) > 1 else c for c in constraints) or None,
        partition=cluster["partition"],
        account=cluster["account"],
        qos=cluster["qos"],
        time_limit_min=int(cluster["time_limit_min"]),
        cpus_per_task=int(cluster["cpus_per_gpu"]),
        mem_gb=int(mem) * per_node if mem else None,
        array_parallelism=int(cluster["array_parallelism"]),
        max_array_size=int(cluster["max_array_size"]),
        accelerator=gpu["accelerator"],
        setup=tuple(cluster["setup"]),
        env=tuple(sorted((str(k), str(v)) for k, v in cluster["env"].items())),
        template=cluster["template"],
        job_name="gpudays" if cell["name"] == "gpudays" else f"gpudays-{cell['name']}",
    )


def render_setup(res: Resources) -> list[str]:
    """The sbatch preamble lines (modules, environment, exports) from the cluster's template."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["shquote"] = lambda v: shlex.quote(str(v))
    try:
        template = env.get_template(res.template)
    except jinja2.TemplateNotFound as e:
        available = sorted(p.name for p in TEMPLATES_DIR.glob("*.j2"))
        raise ValueError(
            f"cluster.template: {res.template!r} is not in {TEMPLATES_DIR}; available: {', '.join(available)}"
        ) from e
    text = template.render(setup=list(res.setup), env=list(res.env), accelerator=res.accelerator)
    return [line for line in text.splitlines() if line.strip()]


def slurm_parameters(res: Resources) -> dict[str, Any]:
    """Parameters for submitit's SlurmExecutor."""
    params: dict[str, Any] = {
        "job_name": res.job_name,
        "time": res.time_limit_min,
        "nodes": res.nodes,
        "ntasks_per_node": res.tasks_per_node,
        "cpus_per_task": res.cpus_per_task,
        "array_parallelism": res.array_parallelism,
        "setup": render_setup(res),
        "stderr_to_stdout": False,
    }
    optional = {
        "gres": res.gres,
        "constraint": res.constraint,
        "partition": res.partition,
        "account": res.account,
        "qos": res.qos,
        "mem": f"{res.mem_gb}GB" if res.mem_gb else None,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    return params


@dataclass
class Submission:
    """One attempt of one cell: which job runs it."""

    cell_id: str
    attempt: int
    job_id: str
    backend: str
    submitted_at: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat())


def next_attempt(paths: SweepPaths, cell_id: str) -> int:
    path = paths.attempts(cell_id)
    if not path.is_file():
        return 1
    return sum(1 for line in path.read_text().splitlines() if line.strip()) + 1


def write_cell(paths: SweepPaths, cell_id: str, config: dict[str, Any]) -> None:
    """Write the resolved config a job will read; the same cell always writes the same text."""
    target = paths.cell_config(cell_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = OmegaConf.to_yaml(OmegaConf.create(config))
    if not target.is_file() or target.read_text() != text:
        target.write_text(text)


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def group_by_resources(configs: dict[str, dict[str, Any]]) -> dict[Resources, list[str]]:
    groups: dict[Resources, list[str]] = {}
    for cid, cfg in configs.items():
        groups.setdefault(resources(cfg), []).append(cid)
    return groups


def submit_slurm(paths: SweepPaths, configs: dict[str, dict[str, Any]]) -> list[Submission]:
    """One sbatch call (an array job) per resource group and MaxArraySize chunk; returns without waiting."""
    out: list[Submission] = []
    for res, cell_ids in group_by_resources(configs).items():
        executor = submitit.SlurmExecutor(folder=paths.submitit_folder(), max_num_timeout=3)
        executor.update_parameters(**slurm_parameters(res))
        for chunk in _chunks(cell_ids, max(1, res.max_array_size)):
            attempts = {cid: next_attempt(paths, cid) for cid in chunk}
            with executor.batch():
                jobs = [executor.submit(run_cell, str(paths.root), cid, attempts[cid]) for cid in chunk]
            for cid, job in zip(chunk, jobs, strict=True):
                sub = Submission(cid, attempts[cid], str(job.job_id), "slurm")
                append_jsonl(paths.attempts(cid), sub.__dict__)
                out.append(sub)
    return out


def submit_local(paths: SweepPaths, configs: dict[str, dict[str, Any]], on_done: Any = None) -> list[Submission]:
    """Run cells on this machine one after another (never side by side: they would measure each other)."""
    out: list[Submission] = []
    for cid, cfg in configs.items():
        res = resources(cfg)
        executor = submitit.LocalExecutor(folder=paths.submitit_folder())
        params: dict[str, Any] = {"timeout_min": res.time_limit_min, "tasks_per_node": res.tasks_per_node}
        if res.accelerator == "cuda":
            params["visible_gpus"] = list(range(res.tasks_per_node))
        executor.update_parameters(**params)
        attempt = next_attempt(paths, cid)
        job = executor.submit(run_cell, str(paths.root), cid, attempt)
        sub = Submission(cid, attempt, str(job.job_id), "local")
        append_jsonl(paths.attempts(cid), sub.__dict__)
        out.append(sub)
        try:
            job.results()
        except Exception:  # noqa: BLE001 - a cell's failure is in its record and logs; the others go on
            pass
        if on_done is not None:
            on_done(cid)
    return out
