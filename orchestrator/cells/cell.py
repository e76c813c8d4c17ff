"""A cell of the grid: its identity and whether it can run at all.

Pure functions over a typed cell (``orchestrator.config.schema.Config``, see ``schema.to_config``).
The rules follow the $100K paper's validity rules (bf16 only on Ampere or newer; no sharding on one GPU unless
offloading; offloading requires sharding) plus what the batch arithmetic and the cluster's shape demand.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, fields, replace
from typing import Any

from orchestrator.config.domains import problems as domain_problems
from orchestrator.config.refusal import Refusal
from orchestrator.config.schema import Config, MethodConfig, ModelConfig, compile_scope_of, to_config
from orchestrator.config.values import Container, Row
from orchestrator.engines.registry import (
    DEFAULT_ENGINE,
    check_batch,
    check_engine_options,
    identity_keys,
    identity_keys_if_set,
    identity_keys_own,
    method_label,
)
from orchestrator.models import config_errors
from orchestrator.slurm.options import problems as passthrough_problems

# The settings that change what a cell measures. The cluster (where it runs) and the probe's patience (how long it
# measures) do not; two runs of the same cell on different partitions are the same cell measured twice.
IDENTITY_MODEL_KEYS = (
    "name",
    "num_layers",
    "hidden_size",
    "num_heads",
    "vocab_size",
    "intermediate_size",
    "rotary_pct",
    "seq_length",
    "global_batch_size",
)
IDENTITY_MODEL_KEYS_IF_SET = (
    "family",
    "num_kv_heads",
    "head_dim",
    "tie_word_embeddings",
    "rope_theta",
    "norm_eps",
    "num_experts",
    "num_experts_per_token",
    "image_size",
    "patch_size",
    "stage_depths",
)
"""Architecture keys that join a cell's identity only where they differ from the schema's default (the Pythia
value), so that every Pythia cell keeps the id it had before these keys existed."""
IDENTITY_METHOD_KEYS = (
    *identity_keys(),
    "activation_checkpointing",
    "precision",
    "micro_batch_size",
    "compile",
    "tf32",
    "attention",
)
"""The engines' keys that joined every cell's identity from the start (DeepSpeed's), then the method's own."""
IDENTITY_METHOD_KEYS_IF_SET = ("engine", "compile_scope", *identity_keys_if_set())
"""Method keys that join a cell's identity only where they differ from the schema's default (DeepSpeed's
values): the engine, and the fields of every engine after the first (``EngineSpec.identity_if_set``), so that
every cell measured before they existed keeps its id."""

TIME_LIMIT_WARNING_S = 90
"""SLURM signals a job this long before its time limit (``--signal=USR2@90``); the job side requeues or stops then,
so a probe must be done by the limit minus this."""
STARTUP_ALLOWANCE_S = 120
"""Time a measuring probe needs besides its timing budget: process start, imports, engine build, micro-batch
search and warm-up. A floor for planning, not a promise: a first DeepSpeed op build or a compile adds to it."""
TIME_LIMIT_MARGIN = 2.0
"""A derived time limit is this many times what the probe needs by plan: the rest is for what the plan cannot see
(a first op build, a slow shared file system, a busy node). A cell that still times out requeues once
(``cluster.max_requeue_on_timeout``), and ``resume --time-factor`` raises its limit."""
MIN_TIME_LIMIT_MIN = 10
"""The shortest derived time limit, in minutes."""


def for_its_gpu(cell: Config) -> Config:
    """The cell with its GPU type's node settings (``cluster.gpus_per_node_by_gpu``, ``cpus_per_gpu_by_gpu``,
    ``mem_gb_per_gpu_by_gpu``) in ``gpus_per_node``, ``cpus_per_gpu`` and ``mem_gb_per_gpu``, where the maps name
    it: every later check, the job script and the job read the plain fields."""
    c, gpu = cell.cluster, cell.gpu.name
    return replace(
        cell,
        cluster=replace(
            c,
            gpus_per_node=c.gpus_per_node_by_gpu.get(gpu, c.gpus_per_node),
            cpus_per_gpu=c.cpus_per_gpu_by_gpu.get(gpu, c.cpus_per_gpu),
            mem_gb_per_gpu=c.mem_gb_per_gpu_by_gpu.get(gpu, c.mem_gb_per_gpu),
        ),
    )


def probe_needs_s(cell: Config) -> float:
    """Seconds a cell's job needs by plan: the probe's budget (a sleep or fail probe's sleep), start-up, and the
    warning before the limit."""
    budget_s = cell.probe.time_budget_s if cell.probe.kind == "deepspeed" else cell.probe.sleep_s
    return budget_s + STARTUP_ALLOWANCE_S + TIME_LIMIT_WARNING_S


def time_limit_min(cell: Config) -> int:
    """The cell's ``--time`` in minutes: ``cluster.time_limit_min``, or (``null``) ``TIME_LIMIT_MARGIN`` times what
    the probe needs, at least ``MIN_TIME_LIMIT_MIN``."""
    if cell.cluster.time_limit_min is not None:
        return int(cell.cluster.time_limit_min)
    return max(MIN_TIME_LIMIT_MIN, math.ceil(TIME_LIMIT_MARGIN * probe_needs_s(cell) / 60))


_MODEL_DEFAULTS = {f.name: f.default for f in fields(ModelConfig)}
_METHOD_DEFAULTS = {f.name: f.default for f in fields(MethodConfig)}


def identity(cell: Config) -> Row:
    """The settings that define what a cell measures, in a canonical flat form."""
    model, method = asdict(cell.model), asdict(cell.method)
    ident: Row = {f"model.{k}": model.get(k) for k in IDENTITY_MODEL_KEYS}
    ident.update({f"model.{k}": model[k] for k in IDENTITY_MODEL_KEYS_IF_SET if model[k] != _MODEL_DEFAULTS[k]})
    ident["gpu"] = cell.gpu.name
    ident["num_gpus"] = cell.num_gpus
    ident["num_nodes"] = cell.num_nodes
    ident.update({f"method.{k}": method.get(k) for k in IDENTITY_METHOD_KEYS})
    ident.update({f"method.{k}": method[k] for k in IDENTITY_METHOD_KEYS_IF_SET if method[k] != _METHOD_DEFAULTS[k]})
    ident.update({f"method.{k}": method.get(k) for k in identity_keys_own(method.get("engine") or DEFAULT_ENGINE)})
    return ident


def cell_id(cell: Config) -> str:
    """A short stable hash of the cell's identity: the same settings give the same id in any sweep, any order."""
    canonical = json.dumps(identity(cell), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def settings(cell: Config) -> Row:
    """The flat settings a record keeps of its cell (``Record.settings``), every engine's as the cell holds them:
    what a report falls back on where the record's config is lost. A table's row is ``orchestrator.cells.row``'s."""
    out: Row = {
        "model": cell.model.name,
        "gpu": cell.gpu.name,
        "num_gpus": cell.num_gpus,
        "num_nodes": cell.num_nodes,
    }
    method = asdict(cell.method)
    out.update({k: method.get(k) for k in (*IDENTITY_METHOD_KEYS, *IDENTITY_METHOD_KEYS_IF_SET)})
    out["compile_scope"] = compile_scope_of(method)
    return out


def label(cell: Config) -> str:
    """A short readable name for messages: ``pythia-1b a100-80gb x4 zero1 bf16``."""
    m = cell.method
    parts = [cell.model.name, f"{cell.gpu.name} x{cell.num_gpus}"]
    if cell.num_nodes > 1:
        parts.append(f"on {cell.num_nodes} nodes")
    parts.append(method_label(vars(m)))  # the engine's part: zero1, fsdp-full offload...
    if m.activation_checkpointing:
        parts.append("ckpt")
    parts.append(str(m.precision))
    parts.append(f"mb={m.micro_batch_size}")
    if m.compile:
        parts.append("compile" if m.compile_scope == MethodConfig.compile_scope else f"compile-{m.compile_scope}")
    return " ".join(parts)


def parse_micro_batch(value: Any) -> int | str | None:
    """``auto`` or a positive integer; ``None`` for anything else."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str) and value.strip().isdigit() and int(value) > 0:
        return int(value)
    return None


# Values that end up in #SBATCH lines or job names: SLURM's own syntax (constraints use & | [ ] ( ) * and commas)
# but nothing a shell would act on: no quotes, $, `, ;, <, >, backslashes, whitespace other than space, newlines.
_SBATCH_VALUE = re.compile(r"^[A-Za-z0-9_.,:+=@/%&|!*()\[\]-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEMPLATE_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.j2$")


def check_scheduler_strings(cell: Config) -> list[Refusal]:
    """Strings that reach the sbatch script: refuse what could run as shell code or break the script."""
    cluster = cell.cluster
    errors: list[Refusal] = []
    if not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", str(cell.name)):
        errors.append(
            Refusal("name", f"{cell.name!r}: a sweep name is a folder and job name; use letters, digits, _ . -")
        )
    fields: list[tuple[str, Any]] = []
    fields += [(f"cluster.{k}", getattr(cluster, k)) for k in ("partition", "account", "qos", "constraint", "wckey")]
    fields += [(f"cluster.gres_by_gpu.{k}", v) for k, v in cluster.gres_by_gpu.items()]
    for by_gpu in ("constraint_by_gpu", "partition_by_gpu", "qos_by_gpu", "account_by_gpu"):
        fields += [(f"cluster.{by_gpu}.{k}", v) for k, v in getattr(cluster, by_gpu).items()]
    for key, value in fields:
        if value is not None and not _SBATCH_VALUE.match(str(value)):
            errors.append(
                Refusal(
                    key,
                    f"{value!r} has characters SLURM names never need (quotes, spaces, $, ;, `, newlines...); "
                    "use letters, digits and _ . , : + = @ / % & | ! * ( ) [ ] -",
                )
            )
    for key in ("gpus_per_node_by_gpu", "cpus_per_gpu_by_gpu", "mem_gb_per_gpu_by_gpu"):
        for gpu_name, count in getattr(cluster, key).items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                errors.append(Refusal(f"cluster.{key}.{gpu_name}", f"{count!r}: use an integer >= 1"))
    for name, value in cluster.env.items():
        if not _ENV_NAME.match(str(name)):
            errors.append(
                Refusal(f"cluster.env.{name}", "is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
            )
        if any(ch in str(value) for ch in "\n\r\0"):
            errors.append(Refusal(f"cluster.env.{name}", "contains a newline or NUL; use a single-line value"))
    for i, line in enumerate(cluster.setup):
        if any(ch in str(line) for ch in "\n\r\0"):
            errors.append(
                Refusal(f"cluster.setup[{i}]", "contains a newline or NUL; give each shell line as its own list item")
            )
    errors.extend(passthrough_problems(cluster))
    template = str(cluster.template)
    # A name, or the absolute path planning gives a template found in a -cd folder (orchestrator.slurm.templates).
    name = template.rsplit("/", 1)[-1] if template.startswith("/") else template
    if not _TEMPLATE_NAME.match(name) or any(ch in template for ch in "\n\r\0"):
        errors.append(
            Refusal(
                "cluster.template",
                f"{cluster.template!r}: use a file name ending in .j2 under sbatch_templates/ (the package's, or a "
                "-cd folder's)",
            )
        )
    return errors


def check_values(cell: Config) -> list[Refusal]:
    """Values outside their fields' domains (declared beside each field in ``orchestrator.config.schema``), model shapes
    their family cannot build, and strings that would break the job script: input errors, not impossible cells."""
    errors = [Refusal(key, problem) for key, _, problem in domain_problems(cell)]
    if not any(r.key.startswith("model.") for r in errors):  # a family's shape rules assume sane numbers
        errors.extend(Refusal(key, problem) for key, problem in config_errors(cell.model).items())
    errors.extend(check_scheduler_strings(cell))
    return errors


def typed_cell(container: Container) -> tuple[Config | None, list[str]]:
    """A cell read back from disk (cell.yaml, written by the sweep) as the schema's dataclasses, and every value
    outside its domain: the checks planning ran, run again, since the file may have been edited or written by an
    older gpudays. None where it is not a cell at all (the reason is the one problem)."""
    try:
        typed = to_config(container)
    except ValueError as e:
        return None, [str(e)]
    return typed, [str(r) for r in check_values(typed)]


def check_runnable(cell: Config, submitting: bool = True) -> list[Refusal]:
    """Reasons this well-formed cell cannot run; empty when it can. Call ``check_values`` first.

    Not ``submitting`` (``gpudays plan``): what only a submission needs of the cluster config (one node on
    ``cluster=local``) is not asked, since a plan costs the cell and runs nothing."""
    m, gpu, cluster = cell.method, cell.gpu, cell.cluster
    num_gpus, num_nodes = cell.num_gpus, cell.num_nodes
    out: list[Refusal] = []
    on_cuda = gpu.accelerator == "cuda"

    no_bf16 = m.precision == "bf16" and not gpu.supports_bf16
    no_tf32 = m.tf32 and on_cuda and not gpu.supports_tf32
    if no_bf16 and no_tf32:  # the defaults on a V100: one message with both changes, not one try for each
        out.append(
            Refusal(
                "method.precision",
                f"{gpu.name} has neither bf16 nor TF32 (Ampere or newer); use method.precision=fp16 "
                "method.tf32=false (or method.precision=fp32 method.tf32=false)",
            )
        )
    elif no_bf16:
        out.append(Refusal("method.precision", f"{gpu.name} has no bf16; use method.precision=fp16 or fp32"))
    elif no_tf32:
        out.append(Refusal("method.tf32", f"{gpu.name} has no TF32 (Ampere or newer); use method.tf32=false"))
    if m.precision == "fp16" and not on_cuda:
        out.append(Refusal("method.precision", "fp16 runs on CUDA GPUs only; on gpu=cpu use bf16 or fp32"))
    if gpu.mig_profile and num_gpus > 1:
        out.append(
            Refusal(
                "num_gpus",
                f"{gpu.name} is a MIG instance ({gpu.mig_profile}): a process sees one instance, and NCCL runs no "
                f"collective between instances, so {num_gpus} ranks cannot train together; use num_gpus=1",
            )
        )
    if m.attention == "flash_attention_2" and not on_cuda:
        out.append(Refusal("method.attention", "flash_attention_2 needs a CUDA GPU; use sdpa or eager"))
    if m.compile_scope != MethodConfig.compile_scope and not m.compile:
        out.append(
            Refusal(
                "method.compile_scope",
                f"{m.compile_scope} says how much of the model torch.compile compiles, and this cell compiles "
                "nothing; add method.compile=true or leave method.compile_scope at its default",
            )
        )
    out.extend(check_engine_options(cell))

    if num_gpus % num_nodes:
        out.append(Refusal("num_gpus", f"{num_gpus} GPUs cannot be split evenly over {num_nodes} nodes"))
    elif num_gpus // num_nodes > cluster.gpus_per_node:
        nodes = -(-num_gpus // cluster.gpus_per_node)
        # On this machine more nodes are refused too: say at once what runs (one try, not two).
        use = (
            f"num_gpus={cluster.gpus_per_node} or fewer, or cluster=slurm num_nodes={nodes}"
            if submitting and cluster.backend == "local"
            else f"num_nodes={nodes} or more"
        )
        out.append(
            Refusal(
                "num_gpus",
                f"{num_gpus // num_nodes} GPUs per node, but a node of this cluster has "
                f"{cluster.gpus_per_node} (cluster.gpus_per_node); use {use}",
            )
        )
    if submitting and cluster.backend == "local" and num_nodes > 1:
        out.append(Refusal("num_nodes", "cluster=local runs on this machine only; use num_nodes=1 or cluster=slurm"))

    out.extend(_check_time_limit(cell))
    out.extend(check_batch(cell))  # over the GPUs, or what the engine splits a micro-step into
    return out


def _check_time_limit(cell: Config) -> list[Refusal]:
    """A measuring probe whose budget plus start-up cannot end before the job's time-limit warning is refused.

    The sleep probe is exempt: sleeping past the limit is how a cluster's timeout handling is checked.
    """
    if cell.probe.kind != "deepspeed":
        return []
    limit_s = 60 * time_limit_min(cell)
    needed_s = probe_needs_s(cell)
    if needed_s <= limit_s:
        return []
    budget_fits_s = limit_s - STARTUP_ALLOWANCE_S - TIME_LIMIT_WARNING_S
    lower = f", or lower probe.time_budget_s to {budget_fits_s:g} or less" if budget_fits_s > 0 else ""
    return [
        Refusal(
            "cluster.time_limit_min",
            f"{time_limit_min(cell)} min cannot hold the probe: probe.time_budget_s={cell.probe.time_budget_s:g}"
            f" plus about {STARTUP_ALLOWANCE_S} s of start-up and the {TIME_LIMIT_WARNING_S} s warning before the "
            f"limit need {needed_s:g} s; use cluster.time_limit_min={math.ceil(needed_s / 60)} or more{lower}",
        )
    ]
