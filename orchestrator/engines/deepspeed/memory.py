"""Device memory of a DeepSpeed training step per GPU: ZeRO model states, buffers, activations, the peak, and the
micro-batch that fits. Pure arithmetic; the model's own figures come from its family module.

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

Every function of arrays works element-wise on numpy arrays as on scalars, so the predictor evaluates thousands
of cells at once with this same arithmetic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.batch import divisors
from orchestrator.models import family_module, num_parameters

if TYPE_CHECKING:
    from orchestrator.schema import Config, MethodConfig, ModelConfig

GIB = 2**30
BUCKET_ELEMENTS = 5e8
"""DeepSpeed's default ``reduce_bucket_size`` and ``allgather_bucket_size``."""
STAGE3_PREFETCH_ELEMENTS = 5e7
"""DeepSpeed's default ``stage3_prefetch_bucket_size``."""
ALLOCATOR_OVERHEAD = 1.12
"""Reserved over allocated bytes of PyTorch's CUDA caching allocator (fragmentation, rounding to blocks): the
median of the six H100 records in tests/data/gpu-records (1.021 to 1.149; the reserved peak is what a GPU runs
out of). Multiplies everything the step allocates."""
DEFAULT_MARGIN = 0.10
"""Share of GPU memory kept free for the CUDA context, NCCL and what the model leaves out."""


def precision_bytes(precision: Any) -> Any:
    """Bytes per parameter of the 16-bit copies (4 in fp32)."""
    out = np.where(np.asarray(precision, dtype=object) == "fp32", 4.0, 2.0)
    return _out(out)


def model_state_bytes(
    num_parameters: Any,
    zero_stage: Any,
    num_gpus: Any,
    precision: Any = "bf16",
    offload_optimizer: Any = False,
    offload_params: Any = False,
) -> tuple[Any, Any, Any]:
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


def buffer_bytes(num_parameters: Any, largest_weight: Any, zero_stage: Any, num_gpus: Any, precision: Any) -> Any:
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


def activation_bytes_per_sequence(model: ModelConfig, method: MethodConfig) -> float:
    """Bytes of the activations one sequence adds to the peak of a training step (logits and loss included).

    Without checkpointing the peak comes at the loss, with every layer's activations still held:
    ``L × layer + logits``. With full checkpointing each layer keeps only its input, and the peak is the larger
    of the loss and one layer being rebuilt in the backward pass (measured on the CPU: the two never coincide).
    fp32 doubles the layers' bytes; the logits' peak is already counted in fp32 entries.
    """
    family = family_module(model.family)
    seq = model.seq_length
    compiled = bool(method.compile)
    kept = family.activation_bytes_per_token_per_layer(model, method.attention, method.activation_checkpointing)
    scale = 2.0 if method.precision == "fp32" else 1.0
    layers = model.num_layers * kept * seq * scale
    logits = family.logit_bytes_per_token(model, compiled) * seq
    if not method.activation_checkpointing:
        return float(layers + logits)
    rebuilt = family.activation_bytes_per_token_per_layer(model, method.attention, False) * seq * scale
    return float(layers + max(logits, rebuilt))


def allocator_overhead(accelerator: Any) -> Any:
    """:data:`ALLOCATOR_OVERHEAD` on a CUDA device; 1 on the CPU, which has no caching allocator."""
    return _out(np.where(np.asarray(accelerator, dtype=object) == "cpu", 1.0, ALLOCATOR_OVERHEAD))


def peak_bytes(fixed_bytes: Any, per_sequence_bytes: Any, micro_batch_size: Any, accelerator: Any = "cuda") -> Any:
    """The reserved peak per GPU: what is allocated (model states, buffers, activations) times the allocator's
    overhead."""
    allocated = np.asarray(fixed_bytes, dtype=float) + np.asarray(per_sequence_bytes, dtype=float) * np.asarray(
        micro_batch_size, dtype=float
    )
    return _out(np.asarray(allocator_overhead(accelerator)) * allocated)


def sequences_that_fit(usable_bytes: Any, fixed_bytes: Any, per_sequence_bytes: Any, accelerator: Any = "cuda") -> Any:
    """The most sequences per micro-batch whose :func:`peak_bytes` is within ``usable_bytes`` (0 if none; NaN
    where the usable memory is unknown)."""
    overhead = np.asarray(allocator_overhead(accelerator))
    with np.errstate(divide="ignore", invalid="ignore"):
        room = (np.asarray(usable_bytes, dtype=float) / overhead - np.asarray(fixed_bytes, dtype=float)) / (
            np.asarray(per_sequence_bytes, dtype=float)
        )
    return _out(np.where(np.isfinite(room), np.maximum(np.floor(room), 0.0), np.nan))


def largest_fitting_divisor(per_gpu_batch: Any, fitting: Any) -> Any:
    """The micro-batch ``auto`` ends at: the largest divisor of the per-GPU batch that is at most ``fitting``
    sequences, or 1 when none fits (every divisor is a candidate, as in the probe's search; not only powers of
    two). ``fitting`` NaN (unknown memory) gives the whole per-GPU batch."""
    per_gpu = np.asarray(per_gpu_batch, dtype=float)
    limit = np.asarray(fitting, dtype=float)
    per_gpu, limit = np.broadcast_arrays(per_gpu, limit)
    out = np.ones(per_gpu.shape)
    for value in np.unique(per_gpu[np.isfinite(per_gpu) & (per_gpu >= 1)]):
        rows = per_gpu == value
        options = np.array(divisors(int(value)), dtype=float)
        index = np.searchsorted(options, np.where(np.isnan(limit[rows]), value, limit[rows]), side="right") - 1
        out[rows] = options[np.maximum(index, 0)]
    return _out(out)


def estimate_micro_batch_size(cfg: Config, memory_gib: float) -> int:
    """The most sequences per micro-batch that the memory model says fit in ``memory_gib`` per GPU (at least 1),
    leaving :data:`DEFAULT_MARGIN` free.

    The probe starts its search at the largest divisor of the per-GPU batch not above this; what decides is the
    measured trial, not this number. The predictor applies the same rule (:func:`largest_fitting_divisor`).
    """
    fixed = fixed_bytes(cfg.model, cfg.method, cfg.num_gpus)
    fitting = sequences_that_fit(
        memory_gib * GIB * (1.0 - DEFAULT_MARGIN), fixed, activation_bytes_per_sequence(cfg.model, cfg.method)
    )
    return max(1, int(fitting))


def fixed_bytes(model: ModelConfig, method: MethodConfig, num_gpus: int) -> float:
    """Allocated bytes per GPU that do not grow with the micro-batch: model states after ZeRO and buffers."""
    psi = num_parameters(model)
    states = model_state_bytes(
        psi, method.zero_stage, num_gpus, method.precision, method.offload_optimizer, method.offload_params
    )
    largest = family_module(model.family).largest_weight_elements(model)
    return float(sum(states) + buffer_bytes(psi, largest, method.zero_stage, num_gpus, method.precision))


def _out(value: Any) -> Any:
    # Scalars in, float out; arrays in, arrays out.
    return float(value) if np.ndim(value) == 0 else value
