"""Predict a cell's peak memory per GPU, step time, and the cost of its training run, before it runs.

Memory per GPU is the memory model of the cell's engine (``orchestrator/engines/<engine>/memory.py``, found through
:mod:`orchestrator.engines.registry`; what every engine shares in :mod:`orchestrator.engines.memory`) with the
model's figures from its family module; the micro-batch of an ``auto`` cell is the largest divisor of the per-GPU
batch that is predicted to fit, the rule the probe's search follows. Step time is :mod:`analysis.predict.step_time`'s
model, with the uncalibrated coefficients there or those :func:`analysis.predict.calibration.calibrate` fits per GPU type
to records. Every step time and peak memory comes with a 90% interval (``*_low``, ``*_high``), from the spread
of :mod:`analysis.predict.uncertainty`: the calibration's where the GPU type has one, the prior's (wide) where it has none.

Every formula works element-wise on numpy arrays, so the report predicts thousands of cells at once
(:func:`predict_frame`); :func:`predict_cell` is the same code on one cell.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.predict import estimates as est
from analysis.predict.calibration import Calibration, GpuCalibration, calibrate
from analysis.predict.discrepancy import positions
from analysis.predict.inputs import Inputs, flat_cell, grads_held, inputs_from_columns, memory_terms
from analysis.predict.network import MeasuredProfile
from analysis.predict.step_time import DEFAULT_COEFFICIENTS, TERMS, step_terms
from analysis.predict.uncertainty import Spread, bounds, prior_spread
from orchestrator.config.schema import Config
from orchestrator.engines.memory import (
    DEFAULT_MARGIN,
    GIB,
    allocator_overhead,
    compiles_regionally,
    largest_fitting_divisor,
)
from orchestrator.engines.registry import identity_keys, identity_keys_if_set, sharding_keys

PREDICTOR = (
    "step-time model (analysis/predict/predictor.py: the engine's memory and step-time terms of the cell, calibrated per GPU "
    "type on records where there are any)"
)
"""What ``plan``, ``sweep`` and ``report`` predict with, named beside their figures (``budget``, ``shortest`` and
the offered layouts predict each layout as its cell, with this model: :mod:`analysis.predict.parallelism`)."""

Profiles = Mapping[str, MeasuredProfile] | None
"""A measured profile (``gpudays profile``; ``orchestrator.profile.record.Profile``) by GPU name: the links of
those GPUs' cells are the profile's (:func:`analysis.predict.network.measured_links`); None, or a GPU it does not
name, the cited defaults of :mod:`analysis.predict.network`."""

__all__ = [
    "DEFAULT_MARGIN", "PLAN_COLUMNS", "PREDICTION_COLUMNS", "Calibration", "GpuCalibration", "Prediction",
    "calibrate", "flat_cell", "plan", "predict_cell", "predict_frame", "prediction_detail",
]  # fmt: skip


@dataclass
class _Coefficients:
    """Per cell: step-time coefficients (NaN where no step time can be predicted), memory scale and offset (GiB),
    the number of records its GPU type is calibrated on (0: uncalibrated), and its GPU type's spread."""

    coef: np.ndarray
    scale: np.ndarray
    offset: np.ndarray
    records: np.ndarray
    covariance: np.ndarray
    step_sd: np.ndarray
    memory_sd: np.ndarray
    dof: np.ndarray
    spreads: dict[str, Spread]


def _coefficients(x: Inputs, calibration: Calibration | None, profiled: Collection[str] = ()) -> _Coefficients:
    size = len(x.gpu)
    out = _Coefficients(
        coef=np.full((size, len(TERMS)), np.nan),
        scale=np.ones(size),
        offset=np.zeros(size),
        records=np.zeros(size, dtype=int),
        covariance=np.zeros((size, len(TERMS), len(TERMS))),
        step_sd=np.zeros(size),
        memory_sd=np.zeros(size),
        dof=np.ones(size),
        spreads={},
    )
    out.coef[~np.isnan(x.reference_tflops)] = DEFAULT_COEFFICIENTS
    spreads: dict[str, Spread] = {}
    for name, gcal in calibration.by_gpu.items() if calibration else ():
        rows = x.gpu == name
        out.coef[rows] = gcal.coefficients
        out.scale[rows] = gcal.memory_scale
        out.offset[rows] = gcal.memory_offset_gib
        out.records[rows] = max(gcal.num_records, 1)
        spreads[name] = gcal.spread_for(name)
    for name in set(x.gpu.tolist()):
        spread = spreads.get(name) or prior_spread(str(name), str(name) in profiled)
        rows = x.gpu == name
        out.covariance[rows] = spread.covariance
        out.spreads[name] = spread
        out.memory_sd[rows] = spread.memory_sd
        out.dof[rows] = spread.dof
    return out


def _predict(
    x: Inputs,
    calibration: Calibration | None,
    margin: float,
    micro: np.ndarray | None = None,
    accum: np.ndarray | None = None,
    profiles: Profiles = None,
) -> dict[str, np.ndarray]:
    """Predictions for every cell of ``x``; ``micro`` and ``accum`` (NaN where not given) force those values;
    ``profiles``: the measured links by GPU name (else the calibration's, else the cited defaults)."""
    size = len(x.gpu)
    if profiles is None and calibration is not None:
        profiles = calibration.profiles
    c = _coefficients(x, calibration, tuple(profiles or ()))
    coef, mem_scale, mem_offset = c.coef, c.scale, c.offset
    terms_bytes = memory_terms(x)
    overhead = allocator_overhead(
        x.accelerator, compiles_regionally(x.compile, x.method["compile_scope"]), x.checkpointing, x.expandable
    )
    # Reserved bytes: what is allocated times the allocator's overhead, then any calibrated scale and offset.
    mem = {k: v * overhead * mem_scale / GIB for k, v in terms_bytes.items() if k not in ("offloaded", "build")}
    build = terms_bytes["build"] * overhead / GIB  # before any step: nothing of the step's calibration applies
    mem["buffers"] = mem["buffers"] + mem_offset  # a calibrated fixed cost per GPU counts as buffers
    base = mem["params"] + mem["grads"] + mem["optimizer"] + mem["buffers"]
    usable = np.where(x.limit_gib > 0, x.limit_gib, x.memory_gib * (1.0 - margin))

    per_gpu = x.per_gpu_batch
    # "auto": the probe's rule, the largest divisor of the per-GPU batch that fits. Activations grow linearly
    # with the micro-batch, so the most sequences that fit come straight out (in GiB, after calibration). The
    # whole per-GPU batch in one micro-step holds none of the gradients kept between micro-steps, so it is tried
    # without them first.
    with np.errstate(divide="ignore", invalid="ignore"):
        fitting = np.floor((usable - base) / mem["per_sequence"])
        whole = np.floor((usable - base + mem["accumulated"]) / mem["per_sequence"])
    auto = np.where(whole >= per_gpu, per_gpu, largest_fitting_divisor(per_gpu, fitting))
    forced = micro if micro is not None else np.full(size, np.nan)
    chosen = np.where(forced >= 1, forced, np.where(x.micro_setting >= 1, x.micro_setting, auto))
    steps = np.maximum(np.floor(per_gpu / chosen), 1.0)
    if accum is not None:
        steps = np.where(accum >= 1, accum, steps)
    grads = grads_held(mem, steps)
    base = base - mem["grads"] + grads
    activations = chosen * mem["per_sequence"]
    peak = base + activations
    builds = np.isnan(usable) | ~x.known | (build <= usable)
    fits = builds & (np.isnan(usable) | ~x.known | (peak <= usable))

    terms = step_terms(x, steps, profiles)
    where = positions(x, steps)  # the discrepancy grows with the distance to the records (uncertainty.Spread)
    for name, spread in c.spreads.items():
        c.step_sd[x.gpu == name] = spread.step_sd_at(where.take(x.gpu == name))
    parts = terms * coef
    step_time = parts.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        weighted = np.nan_to_num(terms / step_time[:, None])
        step_sd = np.sqrt(np.einsum("ij,ijk,ik->i", weighted, c.covariance, weighted).clip(min=0.0) + c.step_sd**2)
    step_low, step_high = bounds(step_time, step_sd, c.dof)
    memory_low, memory_high = bounds(peak, c.memory_sd, c.dof)

    unknown = ~x.known
    out = {
        "peak_memory_gib": peak,
        "params_gib": mem["params"],
        "grads_gib": grads,
        "optimizer_gib": mem["optimizer"],
        "activations_gib": activations,
        "buffers_gib": mem["buffers"],
        "offloaded_gib": terms_bytes["offloaded"] / GIB,
        "build_peak_gib": build,
        "usable_memory_gib": usable,
        "micro_batch_size": chosen,
        "grad_accum_steps": steps,
        "step_time_s": step_time,
        "step_time_low_s": step_low,
        "step_time_high_s": step_high,
        "step_time_sd": np.where(np.isnan(step_time), np.nan, step_sd),
        "peak_memory_low_gib": memory_low,
        "peak_memory_high_gib": memory_high,
        "compute_s": parts[:, 0],
        "communication_s": parts[:, 1],
        "offload_s": parts[:, 2],
    }
    for key, value in out.items():
        out[key] = np.where(unknown, np.nan, value)
    out["fits"] = fits
    out["builds"] = builds
    out["calibrated"] = c.records > 0
    out["records"] = c.records
    out["terms"] = terms
    out["known"] = x.known
    return out


def prediction_detail(
    cells: pd.DataFrame, calibration: Calibration | None = None, profiles: Profiles = None, inputs: Inputs | None = None
) -> dict[str, np.ndarray]:
    """The predictor's arrays for every row of a cells table: each figure of :class:`Prediction` by name, the
    step-time ``terms`` (one row per cell, columns :data:`analysis.predict.step_time.TERMS`) and each cell's ``gpu``;
    ``profiles``: a measured profile by GPU name (``gpudays profile``) whose links replace the cited defaults;
    ``inputs``: the table's own (:func:`inputs_from_columns`) where the caller has them already."""
    x = inputs if inputs is not None else inputs_from_columns({c: cells[c] for c in cells.columns}, len(cells))
    out = _predict(x, calibration, DEFAULT_MARGIN, profiles=profiles)
    out["gpu"] = x.gpu
    return out


PREDICTION_COLUMNS = ("predicted_fits", "predicted_micro_batch_size", "predicted_grad_accum_steps",
                      "predicted_peak_memory_gib", "predicted_peak_memory_gib_low", "predicted_peak_memory_gib_high",
                      "predicted_step_time_s", "predicted_step_time_s_low", "predicted_step_time_s_high",
                      "predicted_from_records")  # fmt: skip
"""The predictions of every cell: ``*_low`` and ``*_high`` bound its 90% interval; ``predicted_from_records`` is
how many measured records its GPU type's calibration rests on (0: uncalibrated, and the interval is the prior's)."""


def predict_frame(
    cells: pd.DataFrame,
    calibration: Calibration | None = None,
    margin: float = DEFAULT_MARGIN,
    micro_batch_size: pd.Series | None = None,
    grad_accum_steps: pd.Series | None = None,
    profiles: Profiles = None,
    inputs: Inputs | None = None,
) -> pd.DataFrame:
    """:func:`predict_cell` for every row of a cells table at once (columns: :data:`PREDICTION_COLUMNS`);
    ``inputs``: the table's own (:func:`inputs_from_columns`) where the caller has them already."""
    x = inputs if inputs is not None else inputs_from_columns({c: cells[c] for c in cells.columns}, len(cells))

    def forced(series: pd.Series | None) -> np.ndarray | None:
        if series is None:
            return None
        out: np.ndarray = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        return out

    pred = _predict(x, calibration, margin, forced(micro_batch_size), forced(grad_accum_steps), profiles)
    return pd.DataFrame(
        {
            "predicted_fits": pd.array(np.where(x.known, pred["fits"], True), dtype="boolean"),
            "predicted_micro_batch_size": pred["micro_batch_size"],
            "predicted_grad_accum_steps": pred["grad_accum_steps"],
            "predicted_peak_memory_gib": pred["peak_memory_gib"],
            "predicted_peak_memory_gib_low": pred["peak_memory_low_gib"],
            "predicted_peak_memory_gib_high": pred["peak_memory_high_gib"],
            "predicted_step_time_s": pred["step_time_s"],
            "predicted_step_time_s_low": pred["step_time_low_s"],
            "predicted_step_time_s_high": pred["step_time_high_s"],
            "predicted_from_records": pred["records"],
        },
        index=cells.index,
    )


PLAN_COLUMNS = ("model", "gpu", "num_gpus", "num_nodes", "engine",
                *(k for k in (*identity_keys_if_set(), *identity_keys()) if k in sharding_keys()),
                "activation_checkpointing", "precision", "micro_batch_size_setting", *PREDICTION_COLUMNS,
                "predicted_time_to_train_days", "predicted_time_to_train_days_low",
                "predicted_time_to_train_days_high", "predicted_gpu_hours", "predicted_gpu_hours_low",
                "predicted_gpu_hours_high", "predicted_cost_usd_cloud", "predicted_cost_usd_cloud_low",
                "predicted_cost_usd_cloud_high", "predicted_cost_usd_amortised", "predicted_energy_kwh",
                "goodput", "predicted_wall_clock_days", "predicted_wall_clock_gpu_hours",
                "predicted_fits_at_micro_batch_1", "predicted_build_peak_gib")  # fmt: skip
"""Columns of :func:`plan`: the cell, its engine and how it shards and offloads (each engine's
``EngineSpec.sharding``, the later engines' first), the method's own settings, then the predictions; the last
says whether the cell would fit at micro-batch 1 (whether a smaller or ``auto`` micro-batch is worth offering),
and ``predicted_build_peak_gib`` what building its model takes per GPU (a cell fits only where that fits too)."""


def plan(
    cells: Sequence[Config | Mapping[str, Any]],
    calibration: Calibration | None = None,
    margin: float = DEFAULT_MARGIN,
    profiles: Profiles = None,
) -> pd.DataFrame:
    """Predictions for cells about to be submitted (typed, or their resolved configs), one row each (columns
    :data:`PLAN_COLUMNS`), in order.

    For ``gpudays sweep --dry-run`` and ``gpudays plan``: settings, predicted fit, micro-batch, peak memory per
    GPU (GiB), step time (s), and for the model's own training run at that step time its days, GPU-hours, cost
    renting (``gpu.cloud_usd_per_gpu_hour``) and buying (the hardware written off over five years, as the report
    does), and the GPUs' energy at board power: the training steps' figures (steady state); ``goodput`` (the
    cluster's, or :data:`~analysis.predict.estimates.DEFAULT_GOODPUT`) and the run's wall-clock days and GPU-hours
    beside them. ``profiles``: measured links by GPU name (:data:`Profiles`).
    """
    frame = pd.DataFrame([flat_cell(cell) for cell in cells])
    if frame.empty:
        return pd.DataFrame(columns=list(PLAN_COLUMNS))
    out = frame.join(predict_frame(frame, calibration, margin, profiles=profiles))
    one = pd.Series(1.0, index=frame.index)
    out["predicted_fits_at_micro_batch_1"] = predict_frame(
        frame, calibration, margin, micro_batch_size=one, profiles=profiles
    )["predicted_fits"]
    x = inputs_from_columns({c: frame[c] for c in frame.columns}, len(frame))
    out["predicted_build_peak_gib"] = _predict(x, calibration, margin, profiles=profiles)["build_peak_gib"]
    steps = pd.to_numeric(out["model_train_steps"], errors="coerce")
    step_s = out["predicted_step_time_s"]
    gpus = pd.to_numeric(out["num_gpus"], errors="coerce").fillna(1.0)
    nodes = pd.to_numeric(out["num_nodes"], errors="coerce").fillna(1.0)
    days = est.time_to_train_days(steps, step_s)
    hours = est.gpu_hours(gpus, steps, step_s)

    def gpu_figure(name: str) -> pd.Series:
        return pd.to_numeric(out[f"gpu_{name}"], errors="coerce")

    out["predicted_time_to_train_days"] = days
    out["predicted_gpu_hours"] = hours
    out["predicted_cost_usd_cloud"] = est.cloud_cost_usd(hours, gpu_figure("cloud_usd_per_gpu_hour"))
    purchase = est.purchase_cost_usd(gpus, nodes, gpu_figure("purchase_price_usd"))
    out["predicted_cost_usd_amortised"] = est.amortised_cost_usd(purchase, days)
    out["predicted_energy_kwh"] = est.energy_kwh(hours, gpu_figure("board_power_w"))
    # The whole run's wall-clock figures: the steps' over the cluster's goodput (restarts, evaluations, checkpoints).
    out["goodput"] = est.goodput_of(out["cluster_goodput"] if "cluster_goodput" in out.columns else None)
    out["predicted_wall_clock_days"] = est.wall_clock(days, out["goodput"])
    out["predicted_wall_clock_gpu_hours"] = est.wall_clock(hours, out["goodput"])
    # Days, GPU-hours and dollars are proportional to the step time: its interval carries over as it is.
    for column in ("predicted_time_to_train_days", "predicted_gpu_hours", "predicted_cost_usd_cloud"):
        for end in ("low", "high"):
            out[f"{column}_{end}"] = out[column] * out[f"predicted_step_time_s_{end}"] / step_s
    return out.reindex(columns=list(PLAN_COLUMNS))


# --------------------------------------------------------------------------------------------------------------
# One cell
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Prediction:
    """What a cell is expected to need and take. Memory figures are per GPU, in GiB; None where unknown."""

    peak_memory_gib: float | None
    params_gib: float | None
    grads_gib: float | None
    optimizer_gib: float | None
    activations_gib: float | None
    buffers_gib: float | None
    offloaded_gib: float | None
    """Per GPU, held in host memory instead (not part of the peak)."""
    build_peak_gib: float | None
    """Per GPU, while the model and its engine are built (before the first step); it must fit too."""
    usable_memory_gib: float | None
    """GPU memory less the margin (or the probe's memory limit, where one is set)."""
    micro_batch_size: int | None
    grad_accum_steps: int | None
    step_time_s: float | None
    step_time_low_s: float | None
    step_time_high_s: float | None
    """The 90% interval of the step time (:mod:`analysis.predict.uncertainty`)."""
    peak_memory_low_gib: float | None
    peak_memory_high_gib: float | None
    """The 90% interval of the peak memory per GPU."""
    compute_s: float | None
    communication_s: float | None
    offload_s: float | None
    fits: bool
    """False only when the prediction is that even the smallest micro-batch does not fit."""
    calibrated: bool
    reason: str


_VERDICT = ("fits", "calibrated", "reason")
"""Prediction's fields that are a verdict, not a figure of the frame."""


def predict_cell(
    cell: Config | Mapping[str, Any],
    calibration: Calibration | None = None,
    *,
    margin: float = DEFAULT_MARGIN,
    micro_batch_size: int | None = None,
    grad_accum_steps: int | None = None,
    profiles: Profiles = None,
) -> Prediction:
    """Predict peak memory per GPU and step time of one cell (typed, or its resolved config, as in ``cell.yaml``).

    With ``method.micro_batch_size: auto`` the micro-batch is the largest divisor of the per-GPU batch that is
    predicted to fit, as the probe's search ends; ``micro_batch_size`` forces one (e.g. the measured one).
    ``fits`` compares the reserved peak with ``gpu.memory_gib × (1 − margin)``, or with ``probe.memory_limit_gib`` when the
    cell sets one (the probe's own rule). A cell whose model shape is unknown is reported as fitting, with the
    reason, so that nothing is skipped on a guess.
    """
    row = flat_cell(cell)
    x = inputs_from_columns({k: [v] for k, v in row.items()}, 1)
    forced_micro = np.array([float(micro_batch_size)]) if micro_batch_size else None
    forced_accum = np.array([float(grad_accum_steps)]) if grad_accum_steps else None
    p = {k: v[0] for k, v in _predict(x, calibration, margin, forced_micro, forced_accum, profiles).items()}
    if not p["known"]:
        fields = {name: None for name in Prediction.__dataclass_fields__ if name not in _VERDICT}
        reason = f"model {row.get('model')!r} has no complete shape (layers, hidden size, heads, vocabulary, ...)"
        return Prediction(**fields, fits=True, calibrated=False, reason=reason + "; nothing predicted")

    def value(key: str) -> float | None:
        return None if np.isnan(p[key]) else float(p[key])

    usable = value("usable_memory_gib")
    if x.limit_gib[0] > 0:
        usable_text = f"{usable:.1f} GiB (the probe's memory limit)"
    elif usable is not None:
        usable_text = f"{usable:.1f} GiB usable ({x.memory_gib[0]:g} GiB less {margin:.0%} margin)"
    else:
        usable_text = "unknown GPU memory"
    micro, peak = int(p["micro_batch_size"]), float(p["peak_memory_gib"])
    if not p["builds"]:
        build = float(p["build_peak_gib"])
        reason = f"cannot be built: building the model needs {build:.2f} GiB, {usable_text}"
    elif p["fits"]:
        reason = f"fits at micro-batch {micro}: {peak:.2f} GiB of {usable_text}"
    else:
        reason = f"does not fit even at micro-batch {micro}: needs {peak:.2f} GiB, {usable_text}"
    if value("step_time_s") is None:
        reason += "; no step time: the GPU has no peak throughput for this precision and no calibration"
    elif not p["calibrated"]:
        reason += "; uncalibrated: the intervals are the prior's, wide until records of this GPU type calibrate it"
    computed = {"peak_memory_gib", "usable_memory_gib", "micro_batch_size", "grad_accum_steps", *_VERDICT}
    figures = {name: value(name) for name in Prediction.__dataclass_fields__ if name not in computed}
    return Prediction(
        **figures,
        peak_memory_gib=peak,
        usable_memory_gib=usable,
        micro_batch_size=micro,
        grad_accum_steps=int(p["grad_accum_steps"]),
        fits=bool(p["fits"]),
        calibrated=bool(p["calibrated"]),
        reason=reason,
    )
