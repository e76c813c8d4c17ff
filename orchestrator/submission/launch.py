"""Send cells to where they run, through submitit.

On SLURM, cells that ask for the same resources go out as one array job (one sbatch call), split where a group
would exceed the cluster's MaxArraySize (``scontrol show config``) or ``cluster.max_array_size``, with
``cluster.array_parallelism`` as the cap on tasks running at once. Each rank of a cell is one SLURM task:
``num_gpus / num_nodes`` tasks on each of ``num_nodes`` nodes, started by srun. The submitted callable is a
``CellJob`` (orchestrator.job.entry), which requeues itself on preemption and near its time limit.

Before anything is submitted, ``admission.check_slurm`` asks the cluster whether it would take every resource group as
configured (``sbatch --test-only`` of the real job script), so a wrong partition, account or QOS, or a request no
node can meet, stops the sweep with the cells named and nothing submitted.

Cells on this machine run through orchestrator.submission.local.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import secrets
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jinja2
import submitit
import yaml

from orchestrator.cells import cell as cells
from orchestrator.config.places import SBATCH_TEMPLATES_DIR as TEMPLATES_DIR
from orchestrator.config.schema import Config, to_container
from orchestrator.config.values import Container
from orchestrator.job.entry import SIGNAL_DELAY_S, CellJob
from orchestrator.slurm import commands as slurm
from orchestrator.slurm.options import sbatch_options
from orchestrator.store.attempts import Attempt, append_attempt, next_attempt, write_intents
from orchestrator.store.durable import WriteFailed, write_text_atomic
from orchestrator.store.paths import SweepPaths
from orchestrator.store.version import gpudays_version
from orchestrator.submission import faults
from orchestrator.submission.gpu_types import check_gpu_types as check_gpu_types
from orchestrator.submission.gpu_types import gpu_type_problem
from orchestrator.submission.gpu_types import untyped_gpu_notes as untyped_gpu_notes
from orchestrator.submission.refused import SchedulerUnreachable as SchedulerUnreachable
from orchestrator.submission.refused import SubmissionRefused as SubmissionRefused
from orchestrator.submission.refused import name_cells as name_cells
from orchestrator.submission.refused import unsubmitted

REQUEUE_BACKSTOP = 20
"""submitit's own limit on requeues after a timeout (see submit_slurm)."""

try:  # libyaml's dumper where PyYAML was built with it
    _YamlDumper: Any = yaml.CSafeDumper
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _YamlDumper = yaml.SafeDumper


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
    wckey: str | None = None
    exclusive: bool = False
    sbatch_extra: tuple[tuple[str, str | bool], ...] = ()
    srun_args: tuple[str, ...] = ()
    python: str | None = None


def resources(cell: Config) -> Resources:
    """The scheduler request of a cell, from its gpu and cluster configs."""
    gpu, cluster = cell.gpu, cell.cluster
    per_node = cell.num_gpus // cell.num_nodes
    on_cuda = gpu.accelerator == "cuda"
    gres = None
    if on_cuda:
        problem = gpu_type_problem(cell)
        if problem:
            raise SubmissionRefused(problem)
        gres_type = cluster.gres_by_gpu.get(gpu.name)
        gres = f"gpu:{gres_type}:{per_node}" if gres_type else f"gpu:{per_node}"
    constraints = [c for c in (cluster.constraint, cluster.constraint_by_gpu.get(gpu.name)) if c]
    mem = cluster.mem_gb_per_gpu
    return Resources(
        backend=cluster.backend,
        nodes=cell.num_nodes,
        tasks_per_node=per_node,
        gpus_per_node=per_node if on_cuda else 0,
        gres=gres,
        constraint="&".join(f"({c})" if len(constraints) > 1 else c for c in constraints) or None,
        partition=cluster.partition_by_gpu.get(gpu.name, cluster.partition),
        account=cluster.account_by_gpu.get(gpu.name, cluster.account),
        qos=cluster.qos_by_gpu.get(gpu.name, cluster.qos),
        time_limit_min=cells.time_limit_min(cell),
        cpus_per_task=cluster.cpus_per_gpu,
        mem_gb=mem * per_node if mem else None,
        array_parallelism=cluster.array_parallelism,
        max_array_size=cluster.max_array_size,
        accelerator=gpu.accelerator,
        setup=tuple(cluster.setup),
        env=tuple(sorted((str(k), str(v)) for k, v in cluster.env.items())),
        template=cluster.template,
        job_name="gpudays" if cell.name == "gpudays" else f"gpudays-{cell.name}",
        wckey=cluster.wckey,
        exclusive=exclusive(cell),
        sbatch_extra=tuple(sorted(sbatch_options(cluster).items())),
        srun_args=tuple(str(a) for a in cluster.srun_args),
        python=cluster.python,
    )


def exclusive(cell: Config) -> bool:
    """Whether the cell's job asks for whole nodes: only where ``cluster.exclusive`` is true. By default (``null``,
    ``false``) a job asks for exactly its GPUs, CPUs and memory: a whole node for a 1-GPU cell was charged up to a
    node's GPUs to the user's fair share and waited for a node to empty. A cell measured beside other jobs says so
    in its record (``shared_node``) and the report flags it."""
    return bool(cell.cluster.exclusive)


def render_setup(res: Resources) -> list[str]:
    """The sbatch preamble lines (modules, environment, exports) from the cluster's template."""
    # An absolute path is a template planning found in a -cd folder (orchestrator.slurm.templates).
    path = Path(res.template)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(path.parent if path.is_absolute() else TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["shquote"] = lambda v: shlex.quote(str(v))
    try:
        template = env.get_template(path.name if path.is_absolute() else res.template)
    except jinja2.TemplateNotFound as e:
        available = sorted(p.name for p in TEMPLATES_DIR.glob("*.j2"))
        raise SubmissionRefused(
            f"cluster.template: {res.template!r} is not in {TEMPLATES_DIR} nor in a -cd folder's sbatch_templates/; "
            f"available here: {', '.join(available)}"
        ) from e
    text = template.render(
        setup=list(res.setup), env=list(res.env), accelerator=res.accelerator, cpus_per_task=res.cpus_per_task
    )
    return [line for line in text.splitlines() if line.strip()]


EXPORT_NOTE = (
    "the job is submitted with --export=NONE ({where}): its ranks are started with `srun --export=ALL`, which "
    "passes them the job script's environment (cluster.env, cluster.setup, what submitit sets), not this shell's"
)
"""Said at submission where the site asks for ``--export=NONE``: srun inherits ``SLURM_EXPORT_ENV=NONE`` from
such a job, and ranks started without the script's environment cannot run (submitit's own variables are gone)."""

EXPORT_LOG_LINE = (
    'case "${SLURM_EXPORT_ENV:-}" in [Nn][Oo][Nn][Ee]*) echo "gpudays: this job was submitted with '
    "--export=$SLURM_EXPORT_ENV; its ranks are started with srun --export=ALL (this script's environment)\" >&2;; esac"
)
"""The job script's line saying so in the job's log."""


def srun_export(res: Resources) -> list[str]:
    """``--export=ALL`` for the srun that starts the ranks, unless ``cluster.srun_args`` sets ``--export`` itself."""
    if any(str(a).split("=", 1)[0] == "--export" for a in res.srun_args):
        return []
    return ["--export=ALL"]


def export_none(res: Resources, environ: Mapping[str, str] | None = None) -> str | None:
    """Where the site asks for ``--export=NONE`` (``cluster.sbatch_extra.export`` or ``$SBATCH_EXPORT``), the note
    to say at submission; None elsewhere."""
    env = os.environ if environ is None else environ
    asked = dict(res.sbatch_extra).get("export")
    if isinstance(asked, str) and asked.strip().upper().startswith("NONE"):
        where = f"cluster.sbatch_extra.export={asked}"
    elif env.get("SBATCH_EXPORT", "").strip().upper().startswith("NONE"):
        where = f"SBATCH_EXPORT={env['SBATCH_EXPORT']} in this environment"
    else:
        return None
    if not srun_export(res):
        return f"the job is submitted with --export=NONE ({where}); cluster.srun_args sets srun's --export itself"
    return EXPORT_NOTE.format(where=where)


def slurm_parameters(res: Resources) -> Container:
    """Parameters for submitit's SlurmExecutor."""
    params: Container = {
        "job_name": res.job_name,
        "time": res.time_limit_min,
        "nodes": res.nodes,
        "ntasks_per_node": res.tasks_per_node,
        "cpus_per_task": res.cpus_per_task,
        "array_parallelism": res.array_parallelism,
        "setup": [*render_setup(res), *([EXPORT_LOG_LINE] if srun_export(res) else [])],
        "stderr_to_stdout": False,
        # The time-limit warning CellJob acts on (see orchestrator.job.entry).
        "signal_delay_s": SIGNAL_DELAY_S,
        # From SLURM 22.05 srun no longer inherits sbatch's --cpus-per-task: without this each rank gets one CPU,
        # and CPU Adam, data loading and host-bound steps are timed on it. A rank that ends its cell badly has
        # recorded it and exits non-zero (orchestrator.job.entry): srun then ends its peers at once.
        # --export=ALL: the ranks get the job script's environment (SUBMITIT_EXECUTOR, cluster.env, setup) even where
        # the site submits with --export=NONE, which srun would otherwise inherit (see EXPORT_NOTE).
        "srun_args": [
            f"--cpus-per-task={res.cpus_per_task}",
            "--kill-on-bad-exit=1",
            *srun_export(res),
            *res.srun_args,
        ],
        # submitit's default wckey ("submitit") is rejected by sites that enforce wckeys: none unless configured.
        "wckey": res.wckey,
        # A cell that times out or is preempted requeues itself (orchestrator.job.entry), which needs --requeue
        # where the cluster's JobRequeue is 0; then the site's own options (cluster.sbatch_extra).
        # Held until gpudays has written the job ids and submitit has made the job's folder and pickle: a gpudays
        # killed in between leaves a held job that the next command adopts and releases, never one that starts
        # without the folder for its logs (SLURM fails it at once) or its pickle (submitit fails it after 60 s).
        "additional_parameters": {
            "requeue": True,
            "hold": True,
            **({"exclusive": True} if res.exclusive else {}),
            **dict(res.sbatch_extra),
        },
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


def slurm_executor(res: Resources, folder: str | Path, max_num_timeout: int = 3) -> submitit.SlurmExecutor:
    """submitit's executor for one resource group: its parameters, and the job's Python (``cluster.python``, a
    container wrapper, or this interpreter)."""
    python = f"{res.python or shlex.quote(sys.executable)} -u -m orchestrator.job.start"  # see that module
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=max_num_timeout, python=python)
    executor.update_parameters(**slurm_parameters(res))
    return executor


def first_job_script(configs: Mapping[str, Config], folder: str | Path) -> str:
    """What ``sweep --dry-run`` shows: the job script sbatch would get for the first group of SLURM cells (their
    submitit folder ``folder``), or nothing where no cell goes to SLURM."""
    groups = group_by_resources({cid: cfg for cid, cfg in configs.items() if cfg.cluster.backend == "slurm"})
    if not groups:
        return ""
    executor = slurm_executor(next(iter(groups)), folder)
    script = executor._make_submission_file_text(executor._submitit_command_str, "0")
    return f"the job script of the first of {len(groups)} group(s) of cells:\n{script}"


@contextmanager
def submission_environment() -> Iterator[None]:
    """Submit without the SLURM_* variables of an allocation this process may run in (``salloc``, or a job):
    sbatch and srun would take them for the new job's own and fail ("SLURM_MEM_PER_* are mutually exclusive") or
    inherit the wrong size. ``SLURM_CONF`` stays: it names the cluster, not an allocation."""
    conf = os.environ.get("SLURM_CONF")
    with submitit.helpers.clean_env():
        if conf is not None:
            os.environ["SLURM_CONF"] = conf
        yield


def write_cell(paths: SweepPaths, cell_id: str, cell: Config) -> None:
    """Write the resolved config a job will read; the same cell always writes the same text.

    libyaml's dumper, not OmegaConf's, because it is ten times faster and a sweep may write thousands of cells;
    the config is plain data, so ``OmegaConf.load`` reads back the same values.
    """
    target = paths.cell_config(cell_id)
    text = yaml.dump(to_container(cell), Dumper=_YamlDumper, sort_keys=False, default_flow_style=False)
    try:
        if target.read_text() == text:
            return
    except FileNotFoundError:
        pass
    # Written whole and renamed, so a job starting now reads the old config or the new one, never half of one.
    write_text_atomic(target, text)


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def group_by_resources(configs: Mapping[str, Config]) -> dict[Resources, list[str]]:
    """Cells that ask for the same resources, together: each group becomes one array job."""
    groups: dict[Resources, list[str]] = {}
    for cid, cfg in configs.items():
        groups.setdefault(resources(cfg), []).append(cid)
    return groups


# ---- submission ----------------------------------------------------------------------------------------------


def submit_slurm(
    paths: SweepPaths,
    configs: Mapping[str, Config],
    max_array_size: int | None = None,
    on_submitted: Callable[[str], None] | None = None,
) -> list[Attempt]:
    """One sbatch call (an array job) per resource group and array-size chunk; returns without waiting.

    ``max_array_size``: the scheduler's MaxArraySize where known (``scheduler_max_array_size``); a group is split
    at the smaller of it and ``cluster.max_array_size``. Each chunk is a transaction (``orchestrator.store.attempts``):
    its cells' intents, with the job name the array will carry, are on disk before sbatch is called, and their
    job ids once it returns. ``on_submitted`` is called with each cell id after that (``resume`` moves the replaced
    attempt's record aside there, once its replacement is surely on its way).

    Raises WriteFailed where an intent cannot be written (nothing of that chunk is submitted) or the job ids cannot
    (the jobs run, and the next command finds them by their name), and what sbatch raised where it failed.
    """
    paths.check_not_loose()  # before a pickle is written or a job runs
    out: list[Attempt] = []
    for res, cell_ids in group_by_resources(configs).items():
        # CellJob decides how often a timed-out cell is requeued; submitit's own count (which calls every
        # warning of a job under 50 minutes a timeout) is only a backstop against a requeue loop.
        executor = slurm_executor(res, paths.submitit_folder(), max_num_timeout=REQUEUE_BACKSTOP)
        if (note := export_none(res)) is not None:
            print(f"gpudays: note: {note}", file=sys.stderr, flush=True)
        chunk_size = min(res.max_array_size, max_array_size or res.max_array_size)
        for chunk in _chunks(cell_ids, max(1, chunk_size)):
            token = f"{job_name(res, paths)}-{secrets.token_hex(4)}"
            intents = [
                Attempt(cid, next_attempt(paths, cid), None, "slurm", cells.label(configs[cid]), token=token,
                        index=i if len(chunk) > 1 else None, gpudays=gpudays_version())
                for i, cid in enumerate(chunk)
            ]  # fmt: skip
            faults.point("before-intent")
            written = write_intents(paths, intents)
            faults.point("before-sbatch")
            faults.point("during-sbatch")
            executor.update_parameters(job_name=token)
            try:
                # submitit prints sbatch's complaint on stderr before raising it: it is said once, in the refusal.
                with submission_environment(), contextlib.redirect_stderr(io.StringIO()), executor.batch():
                    jobs = [
                        executor.submit(CellJob(str(paths.root), a.cell_id, a.attempt, gpudays_version()))
                        for a in intents
                    ]
            except Exception as e:
                refused = unsubmitted(paths, written, token, e, name_cells(chunk, configs), out)
                if refused is e:
                    raise
                raise refused from e
            faults.point("after-sbatch")
            for intent, job in zip(intents, jobs, strict=True):
                sub = replace(intent, job_id=str(job.job_id), submitted_at=intent.submitted_at)
                try:
                    append_attempt(paths, sub)
                except WriteFailed as e:
                    e.kept = f"job {job.job_id} runs it all the same, and the next gpudays command finds it by its name"
                    raise
                if on_submitted is not None:
                    on_submitted(sub.cell_id)
                out.append(sub)
            release_held([slurm.JobId.parse(str(job.job_id)) for job in jobs])
            faults.point("after-attempt")
    return out


def job_name(res: Resources, paths: SweepPaths) -> str:
    """The name a sweep's jobs carry before their token: ``gpudays-<name>`` where the config sets ``name``, else
    ``gpudays-<the sweep folder's name>``, so that ``squeue`` shows whose they are. Only letters, digits and
    ``._+-`` (a comma would split ``squeue --name``'s list), at most 60 characters."""
    base = res.job_name if res.job_name != "gpudays" else f"gpudays-{paths.root.name}"
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", base)[:60].rstrip("_") or "gpudays"


def release_held(job_ids: Sequence[slurm.JobId]) -> None:
    """Let jobs that were submitted held run (their arrays whole, one call); where SLURM refuses, they stay held,
    and ``status`` shows them so (``resume`` releases a user's hold)."""
    try:
        slurm.release(sorted({slurm.JobId(j.job) for j in job_ids}, key=lambda j: j.job))
    except slurm.SlurmUnavailable:
        pass
