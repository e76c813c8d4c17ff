"""Memory a training step holds per GPU, by what holds it: model states under ZeRO, activations, buffers.

Model states (bytes, Ψ parameters, N data-parallel GPUs, mixed precision with Adam; Rajbhandari et al. 2020,
"ZeRO", §5): parameters 2Ψ, gradients 2Ψ, optimizer states 12Ψ (fp32 master copy, momentum, variance), so
stage 0: 16Ψ; stage 1: 4Ψ + 12Ψ/N; stage 2: 2Ψ + 14Ψ/N; stage 3: 16Ψ/N. In fp32 the split is 4Ψ + 4Ψ + 8Ψ.
Optimizer offload moves the optimizer states (and, in stages 2 and 3, the gradient partitions) to the host;
parameter offload (stage 3) moves the parameter partitions there too.

Activations per layer and micro-batch b in 16 bits (Korthikanti et al. 2022, §4): ``s·b·h·(34 + 5·a·s/h)``
bytes; SDPA and flash attention do not keep the ``5·a·s²·b`` scores; full checkpointing keeps only each layer's
input (``2·s·b·h``) plus one layer being recomputed. Logits and the loss add about 12 bytes per (token, vocab)
entry: the 16-bit logits, their fp32 copy for the cross-entropy and its fp32 gradient.

DeepSpeed's communication buckets (``reduce_bucket_size`` and ``allgather_bucket_size``, 5e8 elements by default,
and ZeRO-3's gathered layers, about 4 bytes per parameter of the largest layer as in DeepSpeed's own estimator)
are counted as buffers.

Every function takes scalars or numpy arrays (element-wise) and returns the same kind.
"""

from __future__ import annotations

from typing import Any

import numpy as np

GIB = float(1024**3)
BUCKET_ELEMENTS = 5e8
"""DeepSpeed's default ``reduce_bucket_size`` and ``allgather_bucket_size``."""
STAGE3_PREFETCH_ELEMENTS = 5e7
"""DeepSpeed's default ``stage3_prefetch_bucket_size``."""
LOGIT_BYTES_PER_ENTRY = 12.0


def precision_bytes(precision: Any) -> Any:
    """Bytes per parameter of the 16-bit copies (4 in fp32)."""
    return np.where(np.asarray(precision, dtype=object) == "fp32", 4.0, 2.0)


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
    p_bytes = precision_bytes(precision)
    off_opt = np.asarray(offload_optimizer, dtype=bool) & (stage >= 1)
    off_par = np.asarray(offload_params, dtype=bool) & (stage >= 3)
    # Mixed precision: 16-bit parameters and gradients, fp32 master copy + two Adam moments (12 bytes);
    # fp32: 4 + 4 bytes, and the two moments (8 bytes). 16 bytes a parameter either way.
    params = np.where(off_par, 0.0, psi * p_bytes / np.where(stage >= 3, n, 1.0))
    grads = np.where(off_opt & (stage >= 2), 0.0, psi * p_bytes / np.where(stage >= 2, n, 1.0))
    optimizer = np.where(off_opt, 0.0, psi * (16.0 - 2.0 * p_bytes) / np.where(stage >= 1, n, 1.0))
    return _out(params), _out(grads), _out(optimizer)


def activation_bytes(
    seq_length: Any,
    hidden_size: Any,
    num_heads: Any,
    num_layers: Any,
    vocab_size: Any,
    micro_batch_size: Any = 1,
    precision: Any = "bf16",
    activation_checkpointing: Any = False,
    attention: Any = "sdpa",
) -> Any:
    """Bytes of activations kept for the backward pass of one micro-batch, logits and loss included."""
    s, h = np.asarray(seq_length, dtype=float), np.asarray(hidden_size, dtype=float)
    a, L = np.asarray(num_heads, dtype=float), np.asarray(num_layers, dtype=float)
    b = np.asarray(micro_batch_size, dtype=float)
    scale = precision_bytes(precision) / 2.0
    eager = np.asarray(attention, dtype=object) == "eager"
    per_layer = (s * b * h * 34.0 + np.where(eager, 5.0 * a * s * s * b, 0.0)) * scale
    layers = np.where(
        np.asarray(activation_checkpointing, dtype=bool), L * 2.0 * s * b * h * scale + per_layer, L * per_layer
    )
    return _out(layers + s * b * np.asarray(vocab_size, dtype=float) * LOGIT_BYTES_PER_ENTRY)


def buffer_bytes(num_parameters: Any, largest_tensor: Any, zero_stage: Any, num_gpus: Any, precision: Any) -> Any:
    """Bytes of DeepSpeed's communication buckets and of ZeRO-3's gathered layers."""
    psi = np.asarray(num_parameters, dtype=float)
    stage = np.asarray(zero_stage, dtype=float)
    p_bytes = precision_bytes(precision)
    stage3 = (
        2.0 * np.asarray(largest_tensor, dtype=float) * p_bytes + np.minimum(STAGE3_PREFETCH_ELEMENTS, psi) * p_bytes
    )
    buckets = 2.0 * np.minimum(BUCKET_ELEMENTS, psi) * p_bytes
    stage0 = np.where(np.asarray(num_gpus, dtype=float) > 1, np.minimum(BUCKET_ELEMENTS, psi) * p_bytes, 0.0)
    return _out(np.where(stage >= 3, stage3, np.where(stage >= 1, buckets, stage0)))


def _out(value: Any) -> Any:
    # Scalars in, float out; arrays in, arrays out.
    return float(value) if np.ndim(value) == 0 else value
