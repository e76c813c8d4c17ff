"""Device memory of a DeepSpeed training step per GPU: ZeRO model states, buffers, and the micro-batch that fits.
Pure arithmetic; the model's own figures come from its family module, what every engine shares (activations, the
allocator's overhead, the peak) from :mod:`orchestrator.engines.memory`.

Model states (bytes, Ψ parameters, N data-parallel GPUs, mixed precision with Adam; Rajbhandari et al. 2020,
"ZeRO", §5): parameters 2Ψ, gradients 2Ψ, optimizer states 12Ψ (fp32 master copy, momentum, variance), so
stage 0: 16Ψ; stage 1: 4Ψ + 12Ψ/N; stage 2: 2Ψ + 14Ψ/N; stage 3: 16Ψ/N. In fp32 the split is 4Ψ + 4Ψ + 8Ψ.

Offload, as DeepSpeed 0.19 implements it (``runtime/zero/stage_1_and_2.py``, ``stage3.py``): optimizer offload
puts the optimizer states *and the fp32 gradient partition* on the host (the optimizer's ``device`` is ``cpu``;
each reduced bucket is copied there), so in stages 2 and 3 the GPU holds no gradient partition, only the
reduction buckets counted below; stage 1 still accumulates full 16-bit gradients on the GPU until the boundary.
Parameter offload (stage 3) keeps the parameter partitions on the host.

Buffers: the gradient-reduction and all-gather buckets (``reduce_bucket_size`` and ``allgather_bucket_size``, 5e8
elements by default) and ZeRO-3's gathered layers (about two of the largest weights plus the prefetch bucket).

Building (:func:`build_bytes`): the model is built on the device in the training dtype, whole (pΨ) below stage 3;
at stage 3 ``deepspeed.zero.Init`` partitions each module as it is made (pΨ/N, none with parameter offload, and
the module being made, about one largest weight). ``deepspeed.initialize`` then makes the states the step holds.

Every function of arrays works element-wise on numpy arrays as on scalars, so the predictor evaluates thousands
of cells at once with this same arithmetic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.engines.memory import micro_batch_that_fits, precision_bytes
from orchestrator.engines.memory import scalar_or_array as _out
from orchestrator.models import family_module, num_parameters

if TYPE_CHECKING:
    from orchestrator.config.schema import Config, MethodConfig, ModelConfig
    from orchestrator.engines.spec import CellArrays, Terms

__all__ = [
    "BUCKET_ELEMENTS", "STAGE3_PREFETCH_ELEMENTS", "buffer_bytes", "build_bytes", "build_bytes_of", "estimate_micro_batch_size",
    "fixed_bytes", "memory_terms_of", "model_state_bytes",
]  # fmt: skip

BUCKET_ELEMENTS = 5e8
"""DeepSpeed's default ``reduce_bucket_size`` and ``allgather_bucket_size``."""
STAGE3_PREFETCH_ELEMENTS = 5e7
"""DeepSpeed's default ``stage3_prefetch_bucket_size``."""


def model_state_bytes(
    num_parameters: ArrayLike,
    zero_stage: ArrayLike,
    num_gpus: ArrayLike,
    precision: ArrayLike = "bf16",
    offload_optimizer: ArrayLike = False,
    offload_params: ArrayLike = False,
) -> tuple[np.ndarray | float, np.ndarray | float, np.ndarray | float]:
    """Bytes per GPU of (parameters, gradients, optimizer states) under ZeRO, after offload."""
    psi = np.asarray(num_parameters, dtype=float)
    stage = np.asarray(zero_stage, dtype=float)
    n = np.maximum(np.asarray(num_gpus, dtype=float), 1.0)
    p_bytes = np.asarray(precision_bytes(precision), dtype=float)
    off_opt = np.asarray(offload_optimizer, dtype=bool) & (stage >= 1)
    off_par = np.asarray(offload_params, dtype=bool) & (stage >= 3)
    # 16 bytes a parameter either way: 16-bit parameters and gradients with a 12-byte fp32 master copy and two
    # Adam moments, or fp32 parameters and gradients (4 + 4) with the two moments (8).
    params = np.where(off_par, 0.0, psi * p_bytes / np.where(stage >= 3, n, 1.0))
    grads = np.where(off_opt & (stage >= 2), 0.0, psi * p_bytes / np.where(stage >= 2, n, 1.0))
    optimizer = np.where(off_opt, 0.0, psi * (16.0 - 2.0 * p_bytes) / np.where(stage >= 1, n, 1.0))
    return _out(params), _out(grads), _out(optimizer)


def buffer_bytes(
    num_parameters: ArrayLike,
    largest_weight: ArrayLike,
    zero_stage: ArrayLike,
    num_gpus: ArrayLike,
    precision: ArrayLike,
) -> np.ndarray | float:
    """Bytes of DeepSpeed's communication buckets and of ZeRO-3's gathered layers (none on one GPU at stage 0)."""
    psi = np.asarray(num_parameters, dtype=float)
    stage = np.asarray(zero_stage, dtype=float)
    p_bytes = np.asarray(precision_bytes(precision), dtype=float)
    stage3 = (
        2.0 * np.asarray(largest_weight, dtype=float) * p_bytes + np.minimum(STAGE3_PREFETCH_ELEMENTS, psi) * p_bytes
    )
    buckets = 2.0 * np.minimum(BUCKET_ELEMENTS, psi) * p_bytes
    stage0 = np.where(np.asarray(num_gpus, dtype=float) > 1, np.minimum(BUCKET_ELEMENTS, psi) * p_bytes, 0.0)
    return _out(np.where(stage >= 3, stage3, np.where(stage >= 1, buckets, stage0)))


def build_bytes(
    num_parameters: ArrayLike,
    largest_weight: ArrayLike,
    zero_stage: ArrayLike,
    num_gpus: ArrayLike,
    precision: ArrayLike,
    offload_params: ArrayLike,
) -> np.ndarray | float:
    """Allocated bytes per GPU at the build's peak (the module docstring's building)."""
    psi = np.asarray(num_parameters, dtype=float)
    stage = np.asarray(zero_stage, dtype=float)
    p_bytes = np.asarray(precision_bytes(precision), dtype=float)
    n = np.maximum(np.asarray(num_gpus, dtype=float), 1.0)
    partitioned = np.where(np.asarray(offload_params, dtype=bool), 0.0, psi * p_bytes / n)
    stage3 = partitioned + np.asarray(largest_weight, dtype=float) * p_bytes
    return _out(np.where(stage >= 3, stage3, psi * p_bytes))


def build_bytes_of(x: CellArrays) -> np.ndarray | float:
    """:func:`build_bytes` for every cell of the predictor's arrays ``x``."""
    m = x.method
    return build_bytes(x.params, x.largest_weight, m["zero_stage"], x.num_gpus, x.precision, m["offload_params"])


def memory_terms_of(x: CellArrays) -> Terms:
    """Bytes per GPU by holder (``params``, ``grads``, ``optimizer``, ``buffers``) and ``offloaded`` (on the host
    instead), for every cell of ``x`` as the predictor adds them up (analysis/predict/inputs.py), by its ZeRO fields."""
    m = x.method
    stage, offload_optimizer, offload_params = m["zero_stage"], m["offload_optimizer"], m["offload_params"]
    params, grads, optimizer = model_state_bytes(
        x.params, stage, x.num_gpus, x.precision, offload_optimizer, offload_params
    )
    full = sum(model_state_bytes(x.params, stage, x.num_gpus, x.precision))
    return {
        "params": np.asarray(params),
        "grads": np.asarray(grads),
        "optimizer": np.asarray(optimizer),
        "buffers": np.asarray(buffer_bytes(x.params, x.largest_weight, stage, x.num_gpus, x.precision)),
        "offloaded": np.asarray(full - params - grads - optimizer),
    }


def estimate_micro_batch_size(cfg: Config, memory_gib: float) -> int:
    """The most sequences per micro-batch that the memory model says fit in ``memory_gib`` per GPU (at least 1),
    leaving :data:`~orchestrator.engines.memory.DEFAULT_MARGIN` free: where the probe's search starts."""
    return micro_batch_that_fits(cfg, memory_gib, fixed_bytes(cfg.model, cfg.method, cfg.num_gpus))


def fixed_bytes(model: ModelConfig, method: MethodConfig, num_gpus: int) -> float:
    """Allocated bytes per GPU that do not grow with the micro-batch: model states after ZeRO and buffers."""
    psi = num_parameters(model)
    states = model_state_bytes(
        psi, method.zero_stage, num_gpus, method.precision, method.offload_optimizer, method.offload_params
    )
    largest = family_module(model.family).largest_weight_elements(model)
    return float(sum(states) + buffer_bytes(psi, largest, method.zero_stage, num_gpus, method.precision))
