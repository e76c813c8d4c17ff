"""Synthetic sweep folders with records of the probe's shape, for tests, golden files and the benchmark.

A synthetic record is an :class:`orchestrator.store.record.Record`, as the job side builds it, written by the same
writer, with figures chosen by the caller. Nothing here runs a probe. :func:`grid` and :func:`perturbed_truth` make
a grid the size of a real benchmark (about 3,000 cells) whose "measurements" come from a perturbed predictor.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.predict.inputs import flat_cell, inputs_from_columns
from analysis.predict.predictor import predict_frame
from analysis.predict.step_time import DEFAULT_COEFFICIENTS, TERMS, step_terms
from analysis.sweeps.records import Catalog
from orchestrator.config.schema import MethodConfig, to_config
from orchestrator.config.values import Container
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import Metrics, Record, write_record
from orchestrator.store.states import RecordStatus

METHOD: Container = asdict(MethodConfig())
"""orchestrator.config.schema.MethodConfig's defaults (as conf/method/default.yaml), the base of every synthetic cell."""


def cell_config(
    model: str,
    gpu: str,
    num_gpus: int = 1,
    num_nodes: int = 1,
    catalog: Catalog | None = None,
    name: str = "synthetic",
    **method: Any,
) -> Container:
    """A resolved cell config (as in ``cell.yaml``) from conf/'s model and GPU and the given method settings."""
    catalog = catalog if catalog is not None else Catalog.load()
    unknown = set(method) - set(METHOD)
    if unknown:
        raise ValueError(f"unknown method settings {sorted(unknown)}; accepted: {sorted(METHOD)}")
    return {
        "model": dict(catalog.models[model]),
        "gpu": dict(catalog.gpus[gpu]),
        "method": {**METHOD, **method},
        "cluster": {"backend": "local"},
        "probe": {"warmup_steps": 2, "min_steps": 5, "max_steps": 50, "memory_limit_gib": None},
        "num_gpus": num_gpus,
        "num_nodes": num_nodes,
        "name": name,
    }


def metrics(
    config: Container,
    step_time_s: float,
    micro_batch_size: int,
    peak_memory_gib: float | None = None,
    ci95_pct: float | None = 1.5,
    steps_timed: int = 12,
) -> Metrics:
    """The probe's metrics for a measured cell, derived from a step time as the probe derives them."""
    cell = to_config(config)
    model, num_gpus = cell.model, cell.num_gpus
    per_gpu_batch = model.global_batch_size // num_gpus
    tokens_per_step = model.global_batch_size * model.seq_length
    return Metrics(
        step_time_s=step_time_s,
        step_time_mean_s=step_time_s,
        step_time_std_s=step_time_s * 0.02,
        step_time_iqr_s=step_time_s * 0.025,
        step_time_ci95_pct=ci95_pct,
        steps_timed=steps_timed,
        micro_batch_size=micro_batch_size,
        grad_accum_steps=max(per_gpu_batch // micro_batch_size, 1),
        per_gpu_batch_size=per_gpu_batch,
        tokens_per_step=tokens_per_step,
        tokens_per_s=tokens_per_step / step_time_s,
        tokens_per_s_per_gpu=tokens_per_step / step_time_s / num_gpus,
        peak_memory_allocated_gib=peak_memory_gib,
        peak_memory_reserved_gib=None if peak_memory_gib is None else peak_memory_gib * 1.05,
        host_rss_gib=3.0,
        num_parameters=model.num_parameters,
        probe_wall_s=60.0,
        startup_s=10.0,
        search_s=20.0,
        warmup_s=5.0,
        timed_s=25.0,
    )


def record(
    cell_id: str,
    config: Container,
    status: str = "ok",
    metrics_: Metrics | None = None,
    reason: str | None = None,
    sweep: str = "synthetic",
    attempt: int = 1,
    finished_at: str = "2026-11-22T00:10:14+00:00",
) -> Record:
    """A whole record as the job side writes it (``status``: a RecordStatus value)."""
    cell = to_config(config)
    return Record(
        cell_id=cell_id,
        sweep=sweep,
        attempt=attempt,
        status=RecordStatus(status),
        reason=reason,
        settings={
            "model": cell.model.name,
            "gpu": cell.gpu.name,
            "num_gpus": cell.num_gpus,
            "num_nodes": cell.num_nodes,
            **asdict(cell.method),
        },
        config=config,
        metrics=metrics_ or Metrics(),
        environment={
            "hostnames": [f"node{i + 1}" for i in range(cell.num_nodes)],
            "device_name": cell.gpu.name,
            "torch": "2.13.0",
            "deepspeed": "0.19.8",
            "slurm_job_id": "1000",
            "slurm_array_job_id": None,
            "slurm_array_task_id": None,
            "world_size": cell.num_gpus,
        },
        started_at="2026-11-22T00:10:00+00:00",
        finished_at=finished_at,
    )


def write_cell(
    sweep_dir: Path, cell_id: str, config: Container, record_: Record | Mapping[str, object] | str | None = None
) -> Path:
    """Write ``cells/<cell_id>/cell.yaml`` and, if given, its record: a Record (through the job side's writer),
    or, to test the reader, a dict or raw text written as they are."""
    paths = SweepPaths(sweep_dir)
    folder = paths.cell_dir(cell_id)
    folder.mkdir(parents=True, exist_ok=True)
    # JSON is valid YAML and about a hundred times faster to write than yaml.safe_dump.
    paths.cell_config(cell_id).write_text(json.dumps(config, indent=1) + "\n")
    if isinstance(record_, Record):
        # The job side's writer, byte for byte; without its fsync, which a made-up folder does not need.
        write_record(paths.record(cell_id), record_, durable=False)
    elif record_ is not None:
        text = record_ if isinstance(record_, str) else json.dumps(record_, indent=1, sort_keys=True)
        paths.record(cell_id).write_text(text)
    return folder


# --------------------------------------------------------------------------------------------------------------
# A synthetic grid whose truth is a perturbed predictor (for the adaptive sweep's tests and benchmark)
# --------------------------------------------------------------------------------------------------------------

GRID_MODELS = (
    "pythia-70m", "pythia-160m", "pythia-410m", "pythia-1b", "pythia-1.4b", "pythia-2.8b", "smollm2-135m",
    "smollm2-360m", "smollm2-1.7b", "qwen3-0.6b", "qwen3-1.7b", "llama-3.2-1b", "olmo2-1b",
)  # fmt: skip
GRID_GPUS = ("a100-80gb", "h100-80gb", "l40s", "a6000")
GRID_LAYOUTS = ((1, 1), (2, 1), (4, 1), (8, 1), (16, 2), (32, 4))
"""(num_gpus, num_nodes) of the grid: one node up to eight GPUs, then two and four nodes of eight."""


@dataclass(frozen=True)
class GridMethod:
    """One engine setting of the synthetic grid."""

    engine: str = "deepspeed"
    zero_stage: int = 0
    fsdp_sharding: str = "full"

    @property
    def label(self) -> str:
        return f"zero{self.zero_stage}" if self.engine == "deepspeed" else f"fsdp-{self.fsdp_sharding}"


GRID_METHODS = (
    *(GridMethod("deepspeed", zero_stage=stage) for stage in (0, 1, 2, 3)),
    GridMethod("fsdp", fsdp_sharding="full"),
    GridMethod("fsdp", fsdp_sharding="grad_op"),
)


@dataclass(frozen=True)
class Perturbation:
    """How far the synthetic truth strays from the uncalibrated predictor (relative standard deviations, log)."""

    coefficient_sd: tuple[float, float, float, float] = (0.15, 0.5, 0.5, 0.3)
    """Per GPU type, each step-time coefficient (compute, communication, offload, micro-steps) is off by this."""
    model_sd: float = 0.04
    """Per model: kernels suit some shapes better (what no coefficient shared by a GPU type can follow)."""
    method_sd: float = 0.03
    """Per engine and sharding setting: hooks and overlap the nominal terms do not model."""
    noise_sd: float = 0.015
    """Per measurement: the probe's timing noise."""
    memory_scale_sd: float = 0.05
    memory_noise_sd: float = 0.01


def grid(
    models: Sequence[str] = GRID_MODELS,
    gpus: Sequence[str] = GRID_GPUS,
    layouts: Sequence[tuple[int, int]] = GRID_LAYOUTS,
    methods: Sequence[GridMethod] = GRID_METHODS,
    checkpointing: Sequence[bool] = (False, True),
    catalog: Catalog | None = None,
) -> pd.DataFrame:
    """Every combination as one flat row of the cells table (no ZeRO or sharding on one GPU: that cell would be
    refused), with a ``cell_id``."""
    catalog = catalog if catalog is not None else Catalog.load()
    rows = []
    for model, gpu, (num_gpus, num_nodes), method, ckpt in itertools.product(
        models, gpus, layouts, methods, checkpointing
    ):
        if num_gpus == 1 and (method.zero_stage > 0 or method.engine == "fsdp"):
            continue
        config = cell_config(
            model,
            gpu,
            num_gpus,
            num_nodes,
            catalog=catalog,
            activation_checkpointing=ckpt,
            engine=method.engine,
            zero_stage=method.zero_stage,
            fsdp_sharding=method.fsdp_sharding,
        )
        row = flat_cell(config)
        row["cell_id"] = f"{model}_{gpu}_{num_gpus}x{num_nodes}_{method.label}_{'ckpt' if ckpt else 'nockpt'}"
        rows.append(row)
    return pd.DataFrame(rows)


def perturbed_truth(cells: pd.DataFrame, seed: int = 0, spread: Perturbation = Perturbation()) -> pd.DataFrame:
    """The cells as if measured: step time and reserved peak from the predictor with every coefficient, model,
    method and measurement perturbed (:class:`Perturbation`), at the micro-batch the predictor picks. Cells
    predicted not to fit get status ``does_not_fit`` and no figures; the rest ``ok``. Columns as
    :func:`analysis.sweeps.records.load_cells` gives them, so that :func:`analysis.predict.calibration.calibrate` reads them."""
    rng = np.random.default_rng(seed)
    x = inputs_from_columns({c: cells[c] for c in cells.columns}, len(cells))
    predicted = predict_frame(cells)
    micro = predicted["predicted_micro_batch_size"].to_numpy(dtype=float)
    accum = predicted["predicted_grad_accum_steps"].to_numpy(dtype=float)
    terms = step_terms(x, np.nan_to_num(accum, nan=1.0))
    coefficients = np.full((len(cells), len(TERMS)), np.nan)
    memory_scale = np.ones(len(cells))
    for gpu in sorted(set(x.gpu.tolist())):
        rows = x.gpu == gpu
        coefficients[rows] = DEFAULT_COEFFICIENTS * np.exp(rng.normal(0.0, spread.coefficient_sd))
        memory_scale[rows] = np.exp(rng.normal(0.0, spread.memory_scale_sd))

    def factor(keys: Sequence[str], sd: float) -> np.ndarray:
        # A setting the row leaves empty (another engine's: FSDP's sharding on a DeepSpeed cell) is its default,
        # as the predictor reads it.
        named = pd.DataFrame({k: cells[k].astype(object).where(cells[k].notna(), METHOD.get(k)) for k in keys})
        labels = named.astype(str).agg("/".join, axis=1)
        by_label = {label: float(rng.normal(0.0, sd)) for label in sorted(set(labels))}
        out: np.ndarray = np.exp(labels.map(by_label).to_numpy(dtype=float))
        return out

    method_keys = ["engine", "zero_stage", "fsdp_sharding", "activation_checkpointing"]
    step = (terms * coefficients).sum(axis=1) * factor(["model"], spread.model_sd)
    step = step * factor(method_keys, spread.method_sd) * np.exp(rng.normal(0.0, spread.noise_sd, len(cells)))
    peak = predicted["predicted_peak_memory_gib"].to_numpy(dtype=float) * memory_scale
    peak = peak * np.exp(rng.normal(0.0, spread.memory_noise_sd, len(cells)))
    fits = predicted["predicted_fits"].fillna(False).to_numpy(dtype=bool) & np.isfinite(step)
    out = cells.copy()
    out["status"] = np.where(fits, "ok", "does_not_fit")
    out["step_time_s"] = np.where(fits, step, np.nan)
    out["micro_batch_size"] = np.where(fits, micro, np.nan)
    out["grad_accum_steps"] = np.where(fits, accum, np.nan)
    out["peak_memory_gib"] = np.where(fits, peak, np.nan)
    out["peak_memory_reserved_gib"] = out["peak_memory_gib"]
    return out
