"""Device memory of a DeepSpeed training step per GPU: ZeRO model states, activations, and the micro-batch estimate.

Notation: Ψ parameters, N data-parallel GPUs, L layers, h hidden size, a heads, V vocabulary, s sequence length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.models import num_parameters

if TYPE_CHECKING:
    from orchestrator.schema import Config, MethodConfig, ModelConfig

GIB = 2**30


def model_state_bytes_per_gpu(num_parameters: int, method: MethodConfig, num_gpus: int) -> float:
    """Device bytes of parameters, gradients and Adam states per GPU (ZeRO paper, section 5).

    Mixed precision with Adam holds 16 bytes a parameter (2 parameter, 2 gradient, 12 fp32 master and moments);
    fp32 holds 16 too (4 + 4 + 8). Stage 0: 16Ψ; 1: 4Ψ + 12Ψ/N; 2: 2Ψ + 14Ψ/N; 3: 16Ψ/N. Offloading the
    optimizer moves the optimizer part (and, in ZeRO-Offload, the fp32 gradient partition) to the host;
    offloading parameters in stage 3 leaves only the layers in use on the device (counted as zero here).
    """
    psi, n, stage = float(num_parameters), max(int(num_gpus), 1), method.zero_stage
    params, grads, optim = 2.0 * psi, 2.0 * psi, 12.0 * psi
    if method.precision == "fp32":
        params, grads, optim = 4.0 * psi, 4.0 * psi, 8.0 * psi
    if stage >= 1:
        optim /= n
    if stage >= 2:
        grads /= n
    if stage >= 3:
        params /= n
    if method.offload_optimizer:
        optim = 0.0
    if method.offload_params:
        params = 0.0
    return params + grads + optim


def activation_bytes_per_sequence(model: ModelConfig, method: MethodConfig) -> float:
    """Device bytes of activations kept for the backward pass, per sequence (Korthikanti et al. 2022, section 4).

    Per layer ``s*h*(34 + 5*a*s/h)`` bytes in 16-bit; fused attention (sdpa, flash) does not keep the ``a*s²``
    score matrices. With full recomputation each layer keeps only its input (2sh) and one layer at a time is
    rebuilt. The logits are counted at about 16 bytes per entry (16-bit logits, fp32 copy for the loss, its
    gradient). fp32 doubles every activation.
    """
    num_layers, h, heads = model.num_layers, model.hidden_size, model.num_heads
    seq, vocab = model.seq_length, model.vocab_size
    score_bytes = 5.0 * heads * seq / h if method.attention == "eager" else 0.0
    layer = seq * h * (34.0 + score_bytes)
    if method.activation_checkpointing:
        layers = num_layers * 2.0 * seq * h + layer
    else:
        layers = num_layers * layer
    logits = 16.0 * seq * vocab
    scale = 2.0 if method.precision == "fp32" else 1.0
    return scale * (layers + logits)


def estimate_micro_batch_size(cfg: Config, memory_gib: float) -> int:
    """The largest micro-batch that the memory model says fits in ``memory_gib`` per GPU (at least 1).

    The micro-batch search starts here instead of at 1. The model is deliberately a little optimistic (it leaves
    out allocator fragmentation and communication buckets), so the first trial is usually at or just above the
    answer and the search mostly shrinks; what decides is the measured trial, not this number.
    """
    states = model_state_bytes_per_gpu(num_parameters(cfg.model), cfg.method, cfg.num_gpus)
    budget = memory_gib * GIB * 0.9 - states
    per_sequence = activation_bytes_per_sequence(cfg.model, cfg.method)
    return max(1, int(budget // per_sequence)) if budget > 0 else 1
