"""Mixture-of-experts decoders (OLMoE, Mixtral): Llama-style attention with a routed SwiGLU MLP in every layer.

Each layer's MLP is ``num_experts`` SwiGLU experts of width f = ``intermediate_size`` and a linear router; each
token goes to the ``num_experts_per_token`` (k) experts the router scores highest. Memory holds every expert
(:func:`num_parameters` counts all E); a step's FLOPs count only the k experts each token runs and the router
(:func:`flops_per_token`). The module is transformers' own (``OlmoeForCausalLM``, ``MixtralForCausalLM``), routing
as the library does it (its eager experts loop over the experts a batch hits, as the record's
``model_implementation`` says); the load-balancing loss is part of the training loss (``output_router_logits``).
``olmoe`` and ``mixtral`` bind this with their own config classes; OLMoE adds an RMSNorm over all query heads
and one over all key heads (as OLMo 2), Mixtral does not.

Notation as in ``llama``: L layers, h hidden, f expert width, a query heads, k' key/value heads, d head width,
V vocabulary, s sequence length; E experts, k experts per token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orchestrator.models.llama as llama
from orchestrator.models.building import OTHER_FAMILIES_FIELDS, unread_fields

if TYPE_CHECKING:
    from orchestrator.config.schema import ModelConfig

# Bytes a bf16 training step keeps per token of one layer, measured with ``saved_tensors_hooks`` on the real
# module (tests/unit/models/test_moe.py; transformers 5.23, torch 2.13), OLMoE's and Mixtral's alike: see
# activation_bytes_per_token_per_layer.
BYTES_PER_HIDDEN = 16.0
BYTES_PER_ROUTED_HIDDEN = 4.0
BYTES_PER_ROUTED_EXPERT_UNIT = 8.0
BYTES_PER_EXPERT = 4.0
BYTES_PER_ROUTE = 34.0
BYTES_PER_ROW = 8.0
CPU_ONEDNN = False
"""Whether the probe may run this family's CPU matrix products through oneDNN. No: a token's experts change every
step, so every step multiplies matrices of new shapes, and oneDNN (PyTorch's bf16 CPU GEMM) JIT-compiles and caches a
kernel per shape. Its cache then grows by tens of MB a step up to its capacity (olmoe-tiny at micro-batch 16: the
resident set grew 50 MB a step to 0.72 GiB over 20 steps; with oneDNN off it stays at 0.06 GiB), memory that a GPU
does not hold and that the CPU stand-in's "device memory" (the resident set's growth) counted: a CPU cell measured
0.90 GiB where the family's terms predict 0.14. The record says ``cpu_onednn: off``."""
RENORMALISED_BYTES_PER_ROUTE = 6.0
RENORMALISED_BYTES_PER_ROW = 4.0
"""Mixtral divides the top-k weights by their sum, which keeps them and the sum (6 a route and 4 a token)."""


def experts(model: ModelConfig) -> int:
    if model.num_experts is None:
        raise ValueError(f"model {model.name!r} ({model.family}): model.num_experts is required")
    return model.num_experts


def experts_per_token(model: ModelConfig) -> int:
    if model.num_experts_per_token is None:
        raise ValueError(f"model {model.name!r} ({model.family}): model.num_experts_per_token is required")
    return model.num_experts_per_token


def qk_norm_parameters(model: ModelConfig) -> int:
    """OLMoE's q and k norms over all heads: a·d + k'·d."""
    d = llama.head_dim(model)
    return (model.num_heads + llama.num_kv_heads(model)) * d


def num_parameters(model: ModelConfig, qk_norm: bool) -> int:
    """Per layer: attention 2had + 2hk'd, the router hE, every expert 3hf (E·3hf), two RMSNorms 2h and, with
    ``qk_norm``, a·d + k'·d; a final RMSNorm h; embeddings V·h, twice when untied."""
    h, f = model.hidden_size, llama.intermediate_size(model)
    per_layer = llama.attention_parameters(model) + h * experts(model) + experts(model) * 3 * h * f + 2 * h
    if qk_norm:
        per_layer += qk_norm_parameters(model)
    return model.num_layers * per_layer + h + llama.embedding_parameters(model)


def active_parameters(model: ModelConfig, qk_norm: bool) -> int:
    """Parameters a token runs through: all but the experts it is not routed to ((E - k)·3hf a layer)."""
    h, f = model.hidden_size, llama.intermediate_size(model)
    idle = (experts(model) - experts_per_token(model)) * 3 * h * f
    return num_parameters(model, qk_norm) - model.num_layers * idle


def layer_forward_flops_per_token(model: ModelConfig) -> float:
    """Forward FLOPs of one layer per token: the attention's products and scores as ``llama``'s, the router
    2hE, and the k experts a token is routed to, 6hf each."""
    h, f, seq = model.hidden_size, llama.intermediate_size(model), model.seq_length
    attention = 2.0 * llama.attention_parameters(model) + 4.0 * seq * model.num_heads * llama.head_dim(model)
    return attention + 2.0 * h * experts(model) + 6.0 * h * f * experts_per_token(model)


def flops_per_token(model: ModelConfig, recompute: bool = False) -> float:
    """Training FLOPs per token: three times every layer's forward and the logits (2hV); checkpointing reruns each
    layer's whole forward (the routing weights multiply the experts' outputs, so those are kept, as the post-norm
    keeps OLMo 2's)."""
    layer = layer_forward_flops_per_token(model)
    logits = 2.0 * model.hidden_size * model.vocab_size
    return float(model.num_layers * (3.0 + (1.0 if recompute else 0.0)) * layer + 3.0 * logits)


def largest_weight_elements(model: ModelConfig) -> int:
    """The V×h embedding, or one layer's stacked experts (transformers stores all E gate/up projections as one
    E×2f×h parameter), whichever is larger."""
    h, f = model.hidden_size, llama.intermediate_size(model)
    return max(model.vocab_size * h, experts(model) * 2 * f * h)


def implementation(module: object) -> dict[str, str]:
    """How transformers runs the experts (``grouped_mm``: one grouped matrix product over every expert, where torch
    has it; ``eager``: a loop over the experts a batch hits) and routes tokens (top-k of the router's softmax)."""
    config = getattr(module, "config", None)
    chosen = getattr(config, "_experts_implementation_internal", None) or getattr(
        config, "_experts_implementation", None
    )
    return {"moe_experts": str(chosen or "eager"), "moe_routing": "top-k softmax, transformers' router"}


def activation_bytes_per_token_per_layer(
    model: ModelConfig, attention: str, checkpointing: bool, qk_norm: bool, renormalised: bool = False
) -> float:
    """Bytes one layer keeps for backward per token with 16-bit activations, exact at ten shapes of the real
    module (transformers' default ``grouped_mm`` experts): 16h + 4E + 8 (the norms' fp32 inputs and statistics,
    the projections' inputs, the router's fp32 softmax over E), the q/k norms (``qk_norm``, OLMoE's) and the attention as ``llama``'s,
    and per routed copy of a token 4h + 8f + 34 (its gathered input, the SwiGLU's 4 × 2f, its weight and index);
    with ``renormalised`` top-k weights (Mixtral) 6k + 4 more; with checkpointing the layer's input (2h)."""
    h = model.hidden_size
    if checkpointing:
        return float(llama.BYTES_16BIT * h)
    d, heads, kv = llama.head_dim(model), model.num_heads, llama.num_kv_heads(model)
    k, f, e = experts_per_token(model), llama.intermediate_size(model), experts(model)
    qk_norms = llama.rms_norm_bytes(heads * d, 1, 2) + llama.rms_norm_bytes(kv * d, 1, 2) if qk_norm else 0
    routed = k * (BYTES_PER_ROUTED_HIDDEN * h + BYTES_PER_ROUTED_EXPERT_UNIT * f + BYTES_PER_ROUTE)
    dense = BYTES_PER_HIDDEN * h + qk_norms + llama.attention_bytes(model, attention) + BYTES_PER_EXPERT * e
    renormalisation = RENORMALISED_BYTES_PER_ROUTE * k + RENORMALISED_BYTES_PER_ROW if renormalised else 0.0
    return float(dense + routed + BYTES_PER_ROW + renormalisation)


def refusals(model: ModelConfig) -> dict[str, str]:
    """``llama``'s shape rules, the expert fields required, k at most E."""
    own = ("model.num_experts", "model.num_experts_per_token")
    problems = {key: problem for key, problem in llama.refusals(model).items() if key not in own}
    problems.update(unread_fields(model, tuple(k for k in OTHER_FAMILIES_FIELDS if f"model.{k}" not in own)))
    for key in ("num_experts", "num_experts_per_token"):
        if getattr(model, key) is None:
            problems[f"model.{key}"] = f"{key} is required for a mixture of experts"
    if model.num_experts and model.num_experts_per_token and model.num_experts_per_token > model.num_experts:
        problems["model.num_experts_per_token"] = (
            f"num_experts_per_token={model.num_experts_per_token} exceeds num_experts={model.num_experts}"
        )
    return problems
