"""GPT-NeoX models from a cell's ``model`` config: construction, parameter count, FLOPs, MFU, a memory estimate.

The arithmetic (parameters, FLOPs, throughput, memory) is pure and follows the published formulas; ``build_model`` is the only
function here that allocates a model. Notation: L layers, h hidden size, f MLP width, a heads, V vocabulary,
s sequence length, B sequences per optimizer step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import GPTNeoXConfig

    from orchestrator.ds_config import BatchPlan

GIB = 2**30
ROPE_THETA = 10_000.0
"""Rotary base of every Pythia model (``rotary_emb_base`` in EleutherAI/pythia models/*.yml)."""


def intermediate_size(model: Mapping[str, Any]) -> int:
    """MLP width: the config's value, or 4h as in every Pythia model when it is null."""
    value = model.get("intermediate_size")
    return int(value) if value is not None else 4 * int(model["hidden_size"])


def count_parameters(model: Mapping[str, Any]) -> int:
    """Parameters of a GPT-NeoX model: biases, two LayerNorms per layer, a final LayerNorm, untied embeddings.

    Per layer: QKV 3h² + 3h, attention output h² + h, MLP 2hf + f + h, LayerNorms 4h. With f = 4h this is
    ``L*(12h² + 13h) + 2h + 2*V*h``, which matches the published Pythia counts.
    """
    num_layers, h, vocab = int(model["num_layers"]), int(model["hidden_size"]), int(model["vocab_size"])
    f = intermediate_size(model)
    per_layer = 4 * h * h + 2 * h * f + f + 9 * h
    return num_layers * per_layer + 2 * h + 2 * vocab * h


def flops_per_step(model: Mapping[str, Any], sequences: int, recompute: bool = False) -> float:
    """Training FLOPs (forward and backward) of one step over ``sequences`` sequences.

    Forward per token and layer: 2*(4h² + 2hf) for the matrix products and 4sh for attention scores and their
    weighted sum; the logits add 2hV; backward costs twice the forward. With f = 4h this is exactly
    ``72*B*s*L*h²*(1 + s/(6h) + V/(12*L*h))`` (Narayanan et al. 2021, eq. 3). ``recompute=True`` counts the extra
    forward of every layer that full activation checkpointing runs (hardware FLOPs): with f = 4h,
    ``96*B*s*L*h²*(1 + s/(6h) + V/(16*L*h))``; the logits are not recomputed.
    """
    num_layers, h, vocab = int(model["num_layers"]), int(model["hidden_size"]), int(model["vocab_size"])
    seq, f = int(model["seq_length"]), intermediate_size(model)
    layer_forward_per_token = 8 * h * h + 4 * h * f + 4 * seq * h
    layer_passes = 4 if recompute else 3
    per_token = num_layers * layer_passes * layer_forward_per_token + 3 * 2 * h * vocab
    return float(sequences) * seq * per_token


def reference_flops_per_step(model: Mapping[str, Any], sequences: int) -> float:
    """Narayanan et al. 2021's closed form verbatim, ``72*B*s*L*h²*(1 + s/(6h) + V/(12*L*h))``, valid for f = 4h."""
    num_layers, h, vocab = int(model["num_layers"]), int(model["hidden_size"]), int(model["vocab_size"])
    seq = int(model["seq_length"])
    return 72.0 * sequences * seq * num_layers * h * h * (1 + seq / (6 * h) + vocab / (12 * num_layers * h))


def model_state_bytes_per_gpu(num_parameters: int, method: Mapping[str, Any], num_gpus: int) -> float:
    """Device bytes of parameters, gradients and Adam states per GPU (ZeRO paper, section 5).

    Mixed precision with Adam holds 16 bytes a parameter (2 parameter, 2 gradient, 12 fp32 master and moments);
    fp32 holds 16 too (4 + 4 + 8). Stage 0: 16Ψ; 1: 4Ψ + 12Ψ/N; 2: 2Ψ + 14Ψ/N; 3: 16Ψ/N. Offloading the
    optimizer moves the optimizer part (and, in ZeRO-Offload, the fp32 gradient partition) to the host;
    offloading parameters in stage 3 leaves only the layers in use on the device (counted as zero here).
    """
    psi, n, stage = float(num_parameters), max(int(num_gpus), 1), int(method["zero_stage"])
    params, grads, optim = 2.0 * psi, 2.0 * psi, 12.0 * psi
    if method["precision"] == "fp32":
        params, grads, optim = 4.0 * psi, 4.0 * psi, 8.0 * psi
    if stage >= 1:
        optim /= n
    if stage >= 2:
        grads /= n
    if stage >= 3:
        params /= n
    if method["offload_optimizer"]:
        optim = 0.0
    if method["offload_params"]:
        params = 0.0
    return params + grads + optim


def activation_bytes_per_sequence(model: Mapping[str, Any], method: Mapping[str, Any]) -> float:
    """Device bytes of activations kept for the backward pass, per sequence (Korthikanti et al. 2022, section 4).

    Per layer ``s*h*(34 + 5*a*s/h)`` bytes in 16-bit; fused attention (sdpa, flash) does not keep the ``a*s²``
    score matrices. With full recomputation each layer keeps only its input (2sh) and one layer at a time is
    rebuilt. The logits are counted at about 16 bytes per entry (16-bit logits, fp32 copy for the loss, its
    gradient). fp32 doubles every activation.
    """
    num_layers, h, heads = int(model["num_layers"]), int(model["hidden_size"]), int(model["num_heads"])
    seq, vocab = int(model["seq_length"]), int(model["vocab_size"])
    score_bytes = 5.0 * heads * seq / h if method["attention"] == "eager" else 0.0
    layer = seq * h * (34.0 + score_bytes)
    if method["activation_checkpointing"]:
        layers = num_layers * 2.0 * seq * h + layer
    else:
        layers = num_layers * layer
    logits = 16.0 * seq * vocab
    scale = 2.0 if method["precision"] == "fp32" else 1.0
    return scale * (layers + logits)


def estimate_micro_batch_size(
    model: Mapping[str, Any], method: Mapping[str, Any], num_gpus: int, memory_gib: float
) -> int:
    """The largest micro-batch that the memory model says fits in ``memory_gib`` per GPU (at least 1).

    The micro-batch search starts here instead of at 1. The model is deliberately a little optimistic (it leaves
    out allocator fragmentation and communication buckets), so the first trial is usually at or just above the
    answer and the search mostly shrinks; what decides is the measured trial, not this number.
    """
    budget = memory_gib * GIB * 0.9 - model_state_bytes_per_gpu(count_parameters(model), method, num_gpus)
    per_sequence = activation_bytes_per_sequence(model, method)
    return max(1, int(budget // per_sequence)) if budget > 0 else 1


def build_model_config(model: Mapping[str, Any], attention: str) -> GPTNeoXConfig:
    """A transformers GPT-NeoX config for the cell's model: untied embeddings, parallel residual, partial rotary."""
    from transformers import GPTNeoXConfig

    config = GPTNeoXConfig(
        vocab_size=int(model["vocab_size"]),
        hidden_size=int(model["hidden_size"]),
        num_hidden_layers=int(model["num_layers"]),
        num_attention_heads=int(model["num_heads"]),
        intermediate_size=intermediate_size(model),
        max_position_embeddings=int(model["seq_length"]),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "partial_rotary_factor": float(model["rotary_pct"]),
        },
        use_parallel_residual=True,
        tie_word_embeddings=False,
        # Pythia trains without dropout; no KV cache in training.
        attention_dropout=0.0,
        hidden_dropout=0.0,
        use_cache=False,
    )
    config._attn_implementation = attention
    return config


def build_model(
    model: Mapping[str, Any],
    attention: str,
    dtype: torch.dtype,
    device: torch.device,
    zero3_init: Any = None,
) -> torch.nn.Module:
    """A randomly initialised GPTNeoXForCausalLM, nothing downloaded.

    It is built directly on ``device`` in the training dtype: initialising a billion parameters on the host in
    fp32 would take minutes of the probe's time and four bytes a parameter on every rank. ``zero3_init``, a
    ``deepspeed.zero.Init`` context, builds it already partitioned over the ranks (ZeRO stage 3), so no rank ever
    holds the whole model. A missing attention implementation (flash-attn not installed) raises ImportError.
    """
    from transformers import GPTNeoXForCausalLM

    config = build_model_config(model, attention)
    # transformers sets the default dtype to ``dtype`` while it builds; the context puts every tensor on
    # ``device``, or (zero.Init) partitions each module as soon as it is built.
    with zero3_init if zero3_init is not None else device:
        return GPTNeoXForCausalLM._from_config(config, attn_implementation=attention, dtype=dtype)


def enable_activation_checkpointing(module: Any) -> None:
    """Recompute each decoder layer in the backward pass (transformers' own checkpointing, non-reentrant).

    ``module`` is a transformers PreTrainedModel.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(module, "activation_checkpointing_enable"):  # transformers >= 5
        module.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def peak_tflops(gpu: Mapping[str, Any], method: Mapping[str, Any]) -> float | None:
    """The GPU's dense peak for the precision the matrix products run in, or None where it has none.

    bf16 and fp16 use the tensor-core peak of that type; fp32 uses the TF32 tensor peak when TF32 is allowed and
    the GPU has it, else the plain fp32 peak.
    """
    precision = method["precision"]
    if precision == "bf16":
        return gpu.get("peak_tflops_bf16")
    if precision == "fp16":
        return gpu.get("peak_tflops_fp16")
    if method.get("tf32") and gpu.get("supports_tf32") and gpu.get("peak_tflops_tf32"):
        return gpu.get("peak_tflops_tf32")
    return gpu.get("peak_tflops_fp32")


def throughput_metrics(
    model: Mapping[str, Any],
    method: Mapping[str, Any],
    gpu: Mapping[str, Any],
    plan: BatchPlan,
    step_time_s: float,
) -> dict[str, Any]:
    """Tokens/s, TFLOP/s per GPU, MFU and HFU of optimizer steps of ``step_time_s`` (PaLM appendix B).

    Model FLOPs count forward and backward once (``flops_per_step``); hardware FLOPs add the recomputed forward
    of activation checkpointing. MFU and HFU are None when the GPU has no peak for the precision (gpu=cpu).
    """
    seq = int(model["seq_length"])
    tokens_per_step = plan.global_batch_size * seq
    model_flops = flops_per_step(model, plan.global_batch_size)
    hardware_flops = flops_per_step(model, plan.global_batch_size, recompute=bool(method["activation_checkpointing"]))
    model_tflops = model_flops / step_time_s / plan.num_gpus / 1e12
    hardware_tflops = hardware_flops / step_time_s / plan.num_gpus / 1e12
    peak = peak_tflops(gpu, method)
    return {
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step / step_time_s,
        "tokens_per_s_per_gpu": tokens_per_step / step_time_s / plan.num_gpus,
        "model_flops_per_step": model_flops,
        "model_tflops_per_gpu": model_tflops,
        "hardware_tflops_per_gpu": hardware_tflops,
        "peak_tflops_per_gpu": peak,
        "mfu": model_tflops / peak if peak else None,
        "hfu": hardware_tflops / peak if peak else None,
    }
