"""The layouts' predictions checked against measurement: for every measured mesh3d cell, what
:func:`analysis.predict.parallelism.estimate_layout` predicts for its layout (the predictor's figures for the cell:
memory per GPU, the bubble, the compute, the communication and the micro-steps' fixed cost, the step) beside what
the probe measured (peak memory, the bubble of the first stage, the
step time).

Calibrated as the predictor's engines are, by measured records, on the cells without model parallelism
(tp = pp = 1) among those checked, so that what is left to check is what tensor and pipeline parallelism add: the
model's compute rate (efficiency × peak) is their achieved hardware TFLOP/s per GPU, and what the process holds
beyond the model (the runtime, the communication buffers: the predictor's calibrated memory offset) is their
measured peak less the predicted one. Where there is no such cell, the device's dense peak at the uncalibrated
efficiency and no offset. On the CPU (no peak) the links are gloo's over shared memory
(``analysis.predict.network``'s measured figure).
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from analysis.predict.network import CPU_GLOO_BUSBW_GBPS, Network, network_for
from analysis.predict.parallelism import Layout, LayoutEstimate, estimate_layout
from analysis.predict.step_time import DEFAULT_EFFICIENCY
from orchestrator.config.schema import Config, to_config
from orchestrator.config.values import Row
from orchestrator.engines.mesh3d.pipeline import stages_per_rank
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import Record, read_record
from orchestrator.store.states import RecordStatus


@dataclass(frozen=True)
class LayoutCheck:
    """One measured mesh3d cell against its layout's prediction."""

    cell_id: str
    model: str
    layout: str
    """``tp2 pp2 dp1 1f1b-m4 mb2x1``: the mesh, the schedule and its micro-batches, the micro-batch × schedules."""
    measured_step_s: float | None
    predicted_step_s: float
    measured_memory_gib: float | None
    predicted_memory_gib: float
    measured_bubble: float | None
    """The first stage's idle share of its schedules (the record's ``mesh3d.bubble_measured``)."""
    predicted_bubble: float
    estimate: LayoutEstimate


def cell_layout(cfg: Config, micro_batch_size: int) -> Layout:
    """The :class:`Layout` for a mesh3d cell run at ``micro_batch_size``."""
    m = cfg.method
    tp, pp = int(m.tp), int(m.pp)
    return Layout(
        data=cfg.num_gpus // (tp * pp),
        tensor=tp,
        pipeline=pp,
        micro_batch_size=micro_batch_size,
        activation_checkpointing=bool(m.activation_checkpointing),
        schedule_micro_batches=int(m.pp_microbatches) if pp > 1 else 0,
        stages_per_rank=stages_per_rank(m.pp_schedule, m.pp_chunks) if pp > 1 else 1,
        schedule=m.pp_schedule,
        engine="mesh3d",
        loss_parallel=bool(m.tp_loss_parallel),
        sequence_parallel=bool(m.tp_sequence_parallel),
        checkpoint_policy=m.checkpoint_policy,
        dp_replicate=int(m.dp_replicate),
    )


def _measured(records: Sequence[Record]) -> list[tuple[Record, Config]]:
    out = []
    for r in records:
        if r.status is not RecordStatus.OK or not r.metrics.micro_batch_size or not r.metrics.step_time_s:
            continue
        method = r.config.get("method")
        if not isinstance(method, Mapping) or method.get("engine") != "mesh3d":
            continue  # told from the stored config: typing every record of a large sweep costs seconds
        out.append((r, to_config(r.config)))
    return out


def achieved_tflops(records: Sequence[Record]) -> float | None:
    """The calibration: the median achieved hardware TFLOP/s per GPU of the measured mesh3d cells without model
    parallelism; None where there is none."""
    rates = [
        r.metrics.hardware_tflops_per_gpu
        for r, cfg in _measured(records)
        if cfg.method.tp == 1 and cfg.method.pp == 1 and r.metrics.hardware_tflops_per_gpu
    ]
    return statistics.median(rates) if rates else None


def memory_offset_gib(records: Sequence[Record], rate: float | None) -> float:
    """The calibration's memory offset: the median of measured less predicted peak memory of the mesh3d cells
    without model parallelism; 0 where there is none."""
    gaps = [
        c.measured_memory_gib - c.predicted_memory_gib
        for c in _checks(records, rate, 0.0)
        if c.measured_memory_gib is not None and c.layout.startswith("tp1 pp1 ")
    ]
    return statistics.median(gaps) if gaps else 0.0


def _network(cfg: Config) -> Network:
    net = network_for(cfg.gpu, cfg.cluster)
    per_node = max(1, cfg.num_gpus // max(cfg.num_nodes, 1))
    intra = CPU_GLOO_BUSBW_GBPS if cfg.gpu.accelerator == "cpu" else net.intra_node_gbytes_s
    return Network(intra, net.inter_node_gbytes_s_per_gpu, per_node, net.source)


def check(records: Sequence[Record]) -> list[LayoutCheck]:
    """Every measured mesh3d cell of ``records`` against its layout's prediction (calibrated on them, see above)."""
    rate = achieved_tflops(records)
    return _checks(records, rate, memory_offset_gib(records, rate))


def _checks(records: Sequence[Record], rate: float | None, offset_gib: float) -> list[LayoutCheck]:
    out = []
    for r, cfg in _measured(records):
        gpu, efficiency = cfg.gpu, DEFAULT_EFFICIENCY
        if rate is not None:  # the achieved rate stands for efficiency × peak
            gpu, efficiency = replace(gpu, peak_tflops_bf16=rate, peak_tflops_fp16=None), 1.0
        elif not (gpu.peak_tflops_bf16 or gpu.peak_tflops_fp16):
            continue  # nothing to predict a step from
        micro = int(r.metrics.micro_batch_size or 1)
        layout = cell_layout(cfg, micro)
        est = estimate_layout(cfg.model, gpu, layout, cfg.model.global_batch_size, _network(cfg), efficiency)
        mesh = r.environment.get("mesh3d")
        bubble = mesh.get("bubble_measured") if isinstance(mesh, dict) else None
        schedule = f" {cfg.method.pp_schedule}-m{layout.schedule_micro_batches}" if layout.pipeline > 1 else ""
        accum = r.metrics.grad_accum_steps or 1
        out.append(
            LayoutCheck(
                cell_id=r.cell_id,
                model=cfg.model.name,
                layout=f"tp{layout.tensor} pp{layout.pipeline} dp{layout.data}{schedule} mb{micro}x{accum}",
                measured_step_s=r.metrics.step_time_s,
                predicted_step_s=est.step_time_s,
                measured_memory_gib=r.metrics.peak_memory_allocated_gib,
                predicted_memory_gib=est.memory_gib + offset_gib,
                measured_bubble=float(bubble) if isinstance(bubble, (int, float)) else None,
                predicted_bubble=est.bubble_fraction,
                estimate=est,
            )
        )
    return out


def check_rows(checks: Sequence[LayoutCheck]) -> list[Row]:
    """The checks as a table's rows: measured and predicted side by side, and the predicted terms of the step."""
    return [
        {
            "cell": c.cell_id,
            "layout": c.layout,
            "step_s": c.measured_step_s,
            "pred_step_s": c.predicted_step_s,
            "mem_gib": c.measured_memory_gib,
            "pred_mem_gib": c.predicted_memory_gib,
            "bubble": c.measured_bubble,
            "pred_bubble": c.predicted_bubble,
            "pred_compute_s": c.estimate.compute_s,
            "pred_comm_s": c.estimate.communication_s,
            "pred_overhead_s": c.estimate.overhead_s,
        }
        for c in checks
    ]


def sweep_records(sweep_dirs: Sequence[Path], cell_ids: Collection[str] | None = None) -> list[Record]:
    """The readable records of the sweep folders, of ``cell_ids`` only where given (unreadable records are the
    report's to list)."""
    found = []
    for sweep in sweep_dirs:
        paths = SweepPaths(Path(sweep))
        for cell_id in paths.cell_ids():
            if cell_ids is not None and cell_id not in cell_ids:
                continue
            r = read_record(paths.record(cell_id), cell_id)
            if isinstance(r, Record):
                found.append(r)
    return found


def check_sweeps(sweep_dirs: Sequence[Path], cell_ids: Collection[str] | None = None) -> list[LayoutCheck]:
    """:func:`check` on the records of the sweep folders (of ``cell_ids`` only, where given: the mesh3d cells)."""
    return check(sweep_records(sweep_dirs, cell_ids))


def layout_efficiency(records: Sequence[Record]) -> dict[str, tuple[float, str]]:
    """The layouts' calibrated efficiency by GPU type, where mesh3d cells were measured on it: the achieved
    hardware TFLOP/s per GPU of its cells without model parallelism (:func:`achieved_tflops`) over the GPU's dense
    bf16 (else fp16) peak, with the cells the layouts were checked on named. What ``budget`` and ``shortest``
    ``--from`` give :func:`analysis.predict.layout_search.best_layout`, so their layouts run at the rate measured with the
    engine that trains them, not the default share of the peak. A GPU without a peak (the CPU) has none."""
    by_gpu: dict[str, list[Record]] = {}
    peaks: dict[str, float] = {}
    for r, cfg in _measured(records):
        peak = cfg.gpu.peak_tflops_bf16 or cfg.gpu.peak_tflops_fp16
        if peak:
            by_gpu.setdefault(cfg.gpu.name, []).append(r)
            peaks[cfg.gpu.name] = float(peak)
    out: dict[str, tuple[float, str]] = {}
    for gpu, found in by_gpu.items():
        rate = achieved_tflops(found)
        if rate is None or not 0.0 < rate / peaks[gpu] <= 1.0:
            continue
        checked = [c for c in check(found) if c.measured_step_s]
        errors = [c.measured_step_s / c.predicted_step_s - 1.0 for c in checked if c.measured_step_s]
        worst = f", step within {max(abs(e) for e in errors):.0%} on {len(errors)} checked cell(s)" if errors else ""
        out[gpu] = (rate / peaks[gpu], f"mesh3d calibration ({len(found)} cell(s){worst})")
    return out
