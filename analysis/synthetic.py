"""Synthetic sweep folders with records of the probe's shape, for tests, golden files and the benchmark.

A synthetic record is an :class:`orchestrator.record.Record`, as the job side builds it, written by the same
writer, with figures chosen by the caller. Nothing here runs a probe.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from analysis.records import Catalog
from orchestrator.paths import SweepPaths
from orchestrator.record import Metrics, Record, write_record
from orchestrator.schema import MethodConfig, to_config
from orchestrator.states import RecordStatus
from orchestrator.values import Container

METHOD: Container = asdict(MethodConfig())
"""orchestrator.schema.MethodConfig's defaults (as conf/method/default.yaml), the base of every synthetic cell."""


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
