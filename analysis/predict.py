"""Predict a cell's peak memory per GPU and its step time before it runs.

Memory per GPU follows :mod:`analysis.memory` (ZeRO model states, activations, DeepSpeed buffers); the
micro-batch of an ``auto`` cell is the largest power of two dividing the per-GPU batch that is predicted to fit,
as the probe would find it.

Step time = compute + communication + offload + a fixed cost per micro-step, where compute is the step's
hardware FLOPs over (GPUs × achieved FLOP/s). Uncalibrated, achieved = 40% of the dense peak and the bandwidths
are the nominal figures below; :func:`analysis.calibration.calibrate` (also importable from here) fits, per GPU
type, the achieved share of the peak and scales for the other terms to measured records.

Every formula works element-wise on numpy arrays, so the report predicts thousands of cells at once
(:func:`predict_frame`); :func:`predict_cell` is the same code on one cell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from analysis.calibration import Calibration, GpuCalibration, calibrate
from analysis.estimates import RECOMPUTE_FLOPS_FACTOR
from analysis.memory import GIB, activation_bytes, buffer_bytes, model_state_bytes, precision_bytes
from orchestrator.schema import MethodConfig

__all__ = [
    "DEFAULT_MARGIN", "PLAN_COLUMNS", "PREDICTION_COLUMNS", "Calibration", "GpuCalibration", "Prediction",
    "calibrate", "flat_cell", "plan", "predict_cell", "predict_frame",
]  # fmt: skip

DEFAULT_MARGIN = 0.10
"""Share of GPU memory kept free for the CUDA context, NCCL and allocator fragmentation."""
DEFAULT_EFFICIENCY = 0.40
"""Achieved share of the dense peak before calibration; well-tuned dense training reaches roughly 35-50%."""

# Nominal bandwidths (GB/s). Orders of magnitude only, for the uncalibrated prediction: calibration rescales
# the communication and offload terms to what the records show.
INTRA_NODE_BUSBW_GBPS: dict[str, float] = {
    "v100-32gb": 130.0,  # NVLink 2 (SXM2), typical NCCL all-reduce bus bandwidth
    "a100-40gb": 230.0,  # NVLink 3 (SXM4)
    "a100-80gb": 230.0,
    "h100-80gb": 360.0,  # NVLink 4 (SXM5)
    "h200": 360.0,
    "rtx3090": 12.0,  # PCIe 4.0 through the host, no NVLink assumed
    "a6000": 12.0,
    "l40s": 12.0,
    "cpu": 2.0,  # gloo over shared memory between processes
}
DEFAULT_INTRA_NODE_BUSBW_GBPS = 12.0
INTER_NODE_BUSBW_GBPS = 12.0
"""About one 100 Gb/s InfiniBand or Ethernet link per node."""
HOST_LINK_GBPS: dict[str, float] = {"volta": 12.0, "ampere": 20.0, "ada": 20.0, "hopper": 40.0, "cpu": 10.0}
DEFAULT_HOST_LINK_GBPS = 12.0
CPU_ADAM_PARAMS_PER_S_PER_NODE = 1e9
"""Parameters a node's CPU-Adam updates per second (DeepSpeed CPU-Adam, order of magnitude)."""

TERMS = ("compute_s_at_reference", "communication_s", "offload_s", "micro_steps")
"""The raw step-time terms the coefficients multiply: seconds of compute at the reference rate (the dense peak,
or 1 TFLOP/s where none is known), nominal seconds of communication and of offload, and micro-steps."""


# --------------------------------------------------------------------------------------------------------------
# Inputs: the flat columns of the cells table, from a table or from one nested cell config
# --------------------------------------------------------------------------------------------------------------

METHOD_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(MethodConfig) if f.name != "compile"}
"""orchestrator.schema.MethodConfig's defaults, for old or partial configs that lack a setting."""

MODEL_FIELDS = ("num_layers", "hidden_size", "num_heads", "vocab_size", "intermediate_size", "seq_length",
                "global_batch_size", "num_parameters", "train_steps")  # fmt: skip
GPU_FIELDS = ("architecture", "memory_gib", "peak_tflops_bf16", "peak_tflops_fp16", "peak_tflops_tf32",
              "peak_tflops_fp32", "supports_tf32")  # fmt: skip


def flat_cell(cell: Mapping[str, Any]) -> dict[str, Any]:
    """A nested cell config (as in ``cell.yaml``, or an OmegaConf config) as one row of the cells table."""
    if not isinstance(cell, Mapping) or hasattr(cell, "_get_node"):
        from omegaconf import OmegaConf  # only needed for configs straight from Hydra

        cell = OmegaConf.to_container(cell, resolve=True)  # type: ignore[assignment]
        if not isinstance(cell, Mapping):
            raise TypeError(f"a cell config must be a mapping, got {type(cell).__name__}")

    def section(key: str) -> Mapping[str, Any]:
        value = cell.get(key)
        return value if isinstance(value, Mapping) else {}

    model, gpu, method, probe = section("model"), section("gpu"), section("method"), section("probe")
    row: dict[str, Any] = {f"model_{k}": model.get(k) for k in MODEL_FIELDS}
    row.update({f"gpu_{k}": gpu.get(k) for k in GPU_FIELDS})
    row.update({k: method.get(k) for k in METHOD_DEFAULTS if k != "micro_batch_size"})
    row.update(
        model=model.get("name"),
        gpu=gpu.get("name"),
        micro_batch_size_setting=method.get("micro_batch_size"),
        num_gpus=cell.get("num_gpus"),
        num_nodes=cell.get("num_nodes"),
        probe_memory_limit_gib=probe.get("memory_limit_gib"),
    )
    return row


@dataclass
class Inputs:
    """The predictor's inputs as arrays, one element per cell."""

    layers: np.ndarray
    hidden: np.ndarray
    heads: np.ndarray
    vocab: np.ndarray
    ffn: np.ndarray
    seq: np.ndarray
    batch: np.ndarray
    params: np.ndarray
    known: np.ndarray
    gpu: np.ndarray
    arch: np.ndarray
    memory_gib: np.ndarray
    limit_gib: np.ndarray
    reference_tflops: np.ndarray
    """The dense peak for the cell's precision; NaN where the device has none."""
    num_gpus: np.ndarray
    num_nodes: np.ndarray
    stage: np.ndarray
    precision: np.ndarray
    attention: np.ndarray
    offload_optimizer: np.ndarray
    offload_params: np.ndarray
    checkpointing: np.ndarray
    micro_setting: np.ndarray
    """The cell's fixed micro-batch; NaN for ``auto``."""

    @property
    def per_gpu_batch(self) -> np.ndarray:
        return np.maximum(np.floor(self.batch / self.num_gpus), 1.0)


def inputs_from_columns(columns: Mapping[str, Any], length: int) -> Inputs:
    """Arrays from table columns (Series or lists); anything missing or malformed becomes NaN or the default."""

    def num(name: str, default: float = np.nan) -> np.ndarray:
        values = columns.get(name)
        if values is None:
            return np.full(length, default)
        series = values if isinstance(values, pd.Series) else pd.Series(values, dtype=object)
        out = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        return np.where(np.isnan(out), default, out)

    def text(name: str, default: str) -> np.ndarray:
        values = columns.get(name)
        if values is None:
            return np.full(length, default, dtype=object)
        return np.array([v if isinstance(v, str) and v else default for v in values], dtype=object)

    def flag(name: str, default: bool) -> np.ndarray:
        values = columns.get(name)
        if values is None:
            return np.full(length, default)
        return np.array([bool(v) if isinstance(v, (bool, np.bool_, int)) else default for v in values], dtype=bool)

    layers, hidden, vocab = num("model_num_layers"), num("model_hidden_size"), num("model_vocab_size")
    heads, seq, batch = num("model_num_heads"), num("model_seq_length"), num("model_global_batch_size")
    ffn = num("model_intermediate_size")
    ffn = np.where(ffn > 0, ffn, 4.0 * hidden)
    formula = layers * (4 * hidden**2 + 2 * hidden * ffn + ffn + 9 * hidden) + 2 * hidden + 2 * vocab * hidden
    published = num("model_num_parameters")
    params = np.where(published > 0, published, formula)
    known = np.all([np.isfinite(x) & (x > 0) for x in (layers, hidden, heads, vocab, seq, batch)], axis=0)

    precision = text("precision", METHOD_DEFAULTS["precision"])
    tf32 = flag("tf32", True) & flag("gpu_supports_tf32", True)
    peak_tf32 = num("gpu_peak_tflops_tf32")
    fp32_peak = np.where(tf32 & (peak_tf32 > 0), peak_tf32, num("gpu_peak_tflops_fp32"))
    reference = np.select(
        [precision == "bf16", precision == "fp16"],
        [num("gpu_peak_tflops_bf16"), num("gpu_peak_tflops_fp16")],
        default=fp32_peak,
    )
    micro_setting = num("micro_batch_size_setting")
    return Inputs(
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab=vocab,
        ffn=ffn,
        seq=seq,
        batch=batch,
        params=params,
        known=known,
        gpu=text("gpu", ""),
        arch=text("gpu_architecture", ""),
        memory_gib=num("gpu_memory_gib"),
        limit_gib=num("probe_memory_limit_gib"),
        reference_tflops=np.where(reference > 0, reference, np.nan),
        num_gpus=np.maximum(num("num_gpus", 1.0), 1.0),
        num_nodes=np.maximum(num("num_nodes", 1.0), 1.0),
        stage=num("zero_stage", 0.0),
        precision=precision,
        attention=text("attention", METHOD_DEFAULTS["attention"]),
        offload_optimizer=flag("offload_optimizer", False),
        offload_params=flag("offload_params", False),
        checkpointing=flag("activation_checkpointing", False),
        micro_setting=np.where(micro_setting >= 1, np.floor(micro_setting), np.nan),
    )


# --------------------------------------------------------------------------------------------------------------
# Memory and step time for many cells at once
# --------------------------------------------------------------------------------------------------------------


def _largest_tensor(x: Inputs) -> np.ndarray:
    """Elements of the largest single weight (the embedding in every Pythia model)."""
    return np.maximum.reduce([x.vocab * x.hidden, x.hidden * x.ffn, 3.0 * x.hidden**2])


def memory_terms(x: Inputs) -> dict[str, np.ndarray]:
    """Bytes per GPU that do not depend on the micro-batch, and the activation bytes per sequence."""
    params, grads, optimizer = model_state_bytes(
        x.params, x.stage, x.num_gpus, x.precision, x.offload_optimizer, x.offload_params
    )
    full = sum(model_state_bytes(x.params, x.stage, x.num_gpus, x.precision))
    per_sequence = activation_bytes(
        x.seq, x.hidden, x.heads, x.layers, x.vocab, 1.0, x.precision, x.checkpointing, x.attention
    )
    buffers = buffer_bytes(x.params, _largest_tensor(x), x.stage, x.num_gpus, x.precision)
    return {
        "params": params,
        "grads": grads,
        "optimizer": optimizer,
        "buffers": buffers,
        "per_sequence": per_sequence,
        "offloaded": full - params - grads - optimizer,
    }


def step_terms(x: Inputs, accum: np.ndarray) -> np.ndarray:
    """The raw terms of one optimizer step, one row per cell, columns as in :data:`TERMS`."""
    n, nodes, psi = x.num_gpus, x.num_nodes, x.params
    per_token = 3.0 * (
        x.layers * (2.0 * (4.0 * x.hidden**2 + 2.0 * x.hidden * x.ffn) + 4.0 * x.seq * x.hidden)
        + 2.0 * x.vocab * x.hidden
    )  # analysis.estimates.model_flops_per_token, element-wise
    flops = x.batch * x.seq * per_token * np.where(x.checkpointing, RECOMPUTE_FLOPS_FACTOR, 1.0)
    reference = np.where(np.isnan(x.reference_tflops), 1.0, x.reference_tflops)
    compute = flops / n / (reference * 1e12)
    # Ring all-reduce moves 2(N-1)/N of the gradients per GPU; ZeRO-1/2's reduce-scatter plus all-gather the
    # same; ZeRO-3 gathers parameters in forward and backward and reduce-scatters gradients: 3(N-1)/N.
    volume = np.where(x.stage >= 3, 3.0, 2.0) * (n - 1.0) / n * psi * precision_bytes(x.precision)
    intra = np.array([INTRA_NODE_BUSBW_GBPS.get(g, DEFAULT_INTRA_NODE_BUSBW_GBPS) for g in x.gpu], dtype=float)
    busbw = np.where(nodes > 1, INTER_NODE_BUSBW_GBPS, intra) * 1e9
    communication = np.where(n > 1, volume / busbw, 0.0)
    host = np.array([HOST_LINK_GBPS.get(a, DEFAULT_HOST_LINK_GBPS) for a in x.arch], dtype=float) * 1e9
    # Optimizer offload: gradients go down, updated 16-bit parameters come back, each node's CPUs update its
    # GPUs' shares. Parameter offload: every micro-step fetches the partition for forward and for backward.
    offload = np.where(
        x.offload_optimizer & (x.stage >= 1), 4.0 * psi / n / host + psi / nodes / CPU_ADAM_PARAMS_PER_S_PER_NODE, 0.0
    ) + np.where(x.offload_params & (x.stage >= 3), accum * 4.0 * psi / n / host, 0.0)
    return np.column_stack([compute, communication, offload, accum.astype(float)])


def _coefficients(x: Inputs, calibration: Calibration | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per cell: step-time coefficients (NaN where no step time can be predicted), memory scale and offset (GiB),
    and whether the cell's GPU type is calibrated."""
    coef = np.full((len(x.gpu), len(TERMS)), np.nan)
    scale = np.ones(len(x.gpu))
    offset = np.zeros(len(x.gpu))
    calibrated = np.zeros(len(x.gpu), dtype=bool)
    default = np.array([1.0 / DEFAULT_EFFICIENCY, 1.0, 1.0, 0.0])
    coef[~np.isnan(x.reference_tflops)] = default
    for name, gcal in calibration.by_gpu.items() if calibration else ():
        rows = x.gpu == name
        coef[rows] = gcal.coefficients
        scale[rows] = gcal.memory_scale
        offset[rows] = gcal.memory_offset_gib
        calibrated[rows] = True
    return coef, scale, offset, calibrated


def _predict(
    x: Inputs,
    calibration: Calibration | None,
    margin: float,
    micro: np.ndarray | None = None,
    accum: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Predictions for every cell of ``x``; ``micro`` and ``accum`` (NaN where not given) force those values."""
    size = len(x.gpu)
    coef, mem_scale, mem_offset, calibrated = _coefficients(x, calibration)
    mem = {k: v * mem_scale / GIB for k, v in memory_terms(x).items() if k != "offloaded"}
    mem["buffers"] = mem["buffers"] + mem_offset  # a calibrated fixed cost per GPU counts as buffers
    base = mem["params"] + mem["grads"] + mem["optimizer"] + mem["buffers"]
    usable = np.where(x.limit_gib > 0, x.limit_gib, x.memory_gib * (1.0 - margin))

    per_gpu = x.per_gpu_batch
    # The probe's search for "auto": powers of two that divide the per-GPU batch, the largest that fits.
    # Activations grow linearly with the micro-batch, so the largest fitting one comes straight out.
    largest_divisor = np.exp2(_trailing_zero_bits(per_gpu))
    with np.errstate(divide="ignore", invalid="ignore"):
        room = np.floor((usable - base) / mem["per_sequence"])
    fitting = np.exp2(np.floor(np.log2(np.maximum(room, 1.0))))
    auto = np.where(np.isnan(usable), largest_divisor, np.where(room >= 1, np.minimum(fitting, largest_divisor), 1.0))
    forced = micro if micro is not None else np.full(size, np.nan)
    chosen = np.where(forced >= 1, forced, np.where(x.micro_setting >= 1, x.micro_setting, auto))
    activations = chosen * mem["per_sequence"]
    peak = base + activations
    fits = np.isnan(usable) | ~x.known | (peak <= usable)

    steps = np.maximum(np.floor(per_gpu / chosen), 1.0)
    if accum is not None:
        steps = np.where(accum >= 1, accum, steps)
    terms = step_terms(x, steps)
    parts = terms * coef
    step_time = parts.sum(axis=1)

    unknown = ~x.known
    out = {
        "peak_memory_gib": peak,
        "params_gib": mem["params"],
        "grads_gib": mem["grads"],
        "optimizer_gib": mem["optimizer"],
        "activations_gib": activations,
        "buffers_gib": mem["buffers"],
        "offloaded_gib": memory_terms(x)["offloaded"] / GIB,
        "usable_memory_gib": usable,
        "micro_batch_size": chosen,
        "grad_accum_steps": steps,
        "step_time_s": step_time,
        "compute_s": parts[:, 0],
        "communication_s": parts[:, 1],
        "offload_s": parts[:, 2],
    }
    for key, value in out.items():
        out[key] = np.where(unknown, np.nan, value)
    out["fits"] = fits
    out["calibrated"] = calibrated
    out["known"] = x.known
    return out


def _trailing_zero_bits(values: np.ndarray) -> np.ndarray:
    """How many times 2 divides each (whole, positive) value; 0 for anything else."""
    whole = np.where(np.isfinite(values) & (values >= 1), values, 1.0).astype(np.int64)
    return np.log2((whole & -whole).astype(float))


PREDICTION_COLUMNS = ("predicted_fits", "predicted_micro_batch_size", "predicted_grad_accum_steps",
                      "predicted_peak_memory_gib", "predicted_step_time_s")  # fmt: skip


def predict_frame(
    cells: pd.DataFrame,
    calibration: Calibration | None = None,
    margin: float = DEFAULT_MARGIN,
    micro_batch_size: pd.Series | None = None,
    grad_accum_steps: pd.Series | None = None,
) -> pd.DataFrame:
    """:func:`predict_cell` for every row of a cells table at once (columns: :data:`PREDICTION_COLUMNS`)."""
    x = inputs_from_columns({c: cells[c] for c in cells.columns}, len(cells))

    def forced(series: pd.Series | None) -> np.ndarray | None:
        if series is None:
            return None
        return pd.to_numeric(series, errors="coerce").to_numpy(dtype=float, na_value=np.nan)

    pred = _predict(x, calibration, margin, forced(micro_batch_size), forced(grad_accum_steps))
    return pd.DataFrame(
        {
            "predicted_fits": pd.array(np.where(x.known, pred["fits"], True), dtype="boolean"),
            "predicted_micro_batch_size": pred["micro_batch_size"],
            "predicted_grad_accum_steps": pred["grad_accum_steps"],
            "predicted_peak_memory_gib": pred["peak_memory_gib"],
            "predicted_step_time_s": pred["step_time_s"],
        },
        index=cells.index,
    )


PLAN_COLUMNS = ("model", "gpu", "num_gpus", "num_nodes", "zero_stage", "offload_optimizer", "offload_params",
                "activation_checkpointing", "precision", "micro_batch_size_setting", *PREDICTION_COLUMNS,
                "predicted_time_to_train_days", "predicted_gpu_hours")  # fmt: skip


def plan(
    cells: Sequence[Mapping[str, Any]], calibration: Calibration | None = None, margin: float = DEFAULT_MARGIN
) -> pd.DataFrame:
    """Predictions for cells about to be submitted, one row each (columns :data:`PLAN_COLUMNS`), in order.

    For ``gpudays sweep --dry-run`` and ``gpudays plan``: settings, predicted fit, micro-batch, peak memory per
    GPU (GiB), step time (s), and the days and GPU-hours of the model's own training run at that step time.
    """
    frame = pd.DataFrame([flat_cell(cell) for cell in cells])
    if frame.empty:
        return pd.DataFrame(columns=list(PLAN_COLUMNS))
    out = frame.join(predict_frame(frame, calibration, margin))
    steps = pd.to_numeric(out["model_train_steps"], errors="coerce")
    out["predicted_time_to_train_days"] = steps * out["predicted_step_time_s"] / 86_400.0
    gpus = pd.to_numeric(out["num_gpus"], errors="coerce").fillna(1.0)
    out["predicted_gpu_hours"] = gpus * steps * out["predicted_step_time_s"] / 3_600.0
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
    usable_memory_gib: float | None
    """GPU memory less the margin (or the probe's memory limit, where one is set)."""
    micro_batch_size: int | None
    grad_accum_steps: int | None
    step_time_s: float | None
    compute_s: float | None
    communication_s: float | None
    offload_s: float | None
    fits: bool
    """False only when the prediction is that even the smallest micro-batch does not fit."""
    calibrated: bool
    reason: str


def predict_cell(
    cell: Mapping[str, Any],
    calibration: Calibration | None = None,
    *,
    margin: float = DEFAULT_MARGIN,
    micro_batch_size: int | None = None,
    grad_accum_steps: int | None = None,
) -> Prediction:
    """Predict peak memory per GPU and step time of one cell (its resolved config, as in ``cell.yaml``).

    With ``method.micro_batch_size: auto`` the micro-batch is the largest power of two dividing the per-GPU batch
    that is predicted to fit, as the probe would find; ``micro_batch_size`` forces one (e.g. the measured one).
    ``fits`` compares the peak with ``gpu.memory_gib × (1 − margin)``, or with ``probe.memory_limit_gib`` when the
    cell sets one (the probe's own rule). A cell whose model shape is unknown is reported as fitting, with the
    reason, so that nothing is skipped on a guess.
    """
    row = flat_cell(cell)
    x = inputs_from_columns({k: [v] for k, v in row.items()}, 1)
    forced_micro = np.array([float(micro_batch_size)]) if micro_batch_size else None
    forced_accum = np.array([float(grad_accum_steps)]) if grad_accum_steps else None
    p = {k: v[0] for k, v in _predict(x, calibration, margin, forced_micro, forced_accum).items()}
    if not p["known"]:
        fields = {
            name: None for name in Prediction.__dataclass_fields__ if name not in ("fits", "calibrated", "reason")
        }
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
    if p["fits"]:
        reason = f"fits at micro-batch {micro}: {peak:.2f} GiB of {usable_text}"
    else:
        reason = f"does not fit even at micro-batch {micro}: needs {peak:.2f} GiB, {usable_text}"
    if value("step_time_s") is None:
        reason += "; no step time: the GPU has no peak throughput for this precision and no calibration"
    return Prediction(
        peak_memory_gib=peak,
        params_gib=value("params_gib"),
        grads_gib=value("grads_gib"),
        optimizer_gib=value("optimizer_gib"),
        activations_gib=value("activations_gib"),
        buffers_gib=value("buffers_gib"),
        offloaded_gib=value("offloaded_gib"),
        usable_memory_gib=usable,
        micro_batch_size=micro,
        grad_accum_steps=int(p["grad_accum_steps"]),
        step_time_s=value("step_time_s"),
        compute_s=value("compute_s"),
        communication_s=value("communication_s"),
        offload_s=value("offload_s"),
        fits=bool(p["fits"]),
        calibrated=bool(p["calibrated"]),
        reason=reason,
    )
