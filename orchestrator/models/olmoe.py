"""OLMoE (AI2's OLMoE-1B-7B): a mixture-of-experts decoder, the arithmetic of ``moe`` with OLMo 2's q/k norms.

Muennighoff et al. 2024, "OLMoE: Open Mixture-of-Experts Language Models" (arXiv 2409.02060): 16 layers of
pre-norm attention with an RMSNorm over all query and all key heads, and 64 SwiGLU experts of width 1024, 8 per
token, with a load-balancing loss (coefficient 0.01). Built from the transformers library's ``OlmoeForCausalLM``, the reference
port AI2 publishes its checkpoints for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orchestrator.models.llama as llama
import orchestrator.models.moe as moe
from orchestrator.models import sequences
from orchestrator.models.building import Builder

if TYPE_CHECKING:
    from orchestrator.schema import MethodConfig, ModelConfig

NORM_EPS = 1e-5
"""RMSNorm epsilon of OLMoE-1B-7B's config.json."""
ROUTER_AUX_LOSS = 0.01
"""Load-balancing loss coefficient (OLMoE paper, section 2; ``router_aux_loss_coef`` of its config)."""
# Bytes a bf16 training step keeps per token of one layer, measured with ``saved_tensors_hooks`` on the real
# module (tests/unit/models/test_moe.py; transformers 5.23, torch 2.13): see activation_bytes_per_token_per_layer.
BYTES_PER_HIDDEN = 16.0
BYTES_PER_ROUTED_HIDDEN = 4.0
BYTES_PER_ROUTED_EXPERT_UNIT = 8.0
BYTES_PER_EXPERT = 4.0
BYTES_PER_ROUTE = 34.0
BYTES_PER_ROW = 8.0


def num_parameters(model: ModelConfig) -> int:
    """``moe.num_parameters`` with the q and k norms."""
    return moe.num_parameters(model, qk_norm=True)


flops_per_token = moe.flops_per_token
largest_weight_elements = moe.largest_weight_elements


def activation_bytes_per_token_per_layer(model: ModelConfig, attention: str, checkpointing: bool = False) -> float:
    """Bytes one layer keeps for backward per token with 16-bit activations, exact at ten shapes of the real
    module (transformers' default ``grouped_mm`` experts): 16h + 4E + 8 (the norms' fp32 inputs and statistics,
    the projections' inputs, the router's fp32 softmax over E), the q/k norms and the attention as ``llama``'s,
    and per routed copy of a token 4h + 8f + 34 (its gathered input, the SwiGLU's 4 × 2f, its weight and index);
    with checkpointing the layer's input (2h)."""
    h = model.hidden_size
    if checkpointing:
        return float(llama.BYTES_16BIT * h)
    d, heads, kv = llama.head_dim(model), model.num_heads, llama.num_kv_heads(model)
    k, f, e = moe.experts_per_token(model), llama.intermediate_size(model), moe.experts(model)
    qk_norms = llama.rms_norm_bytes(heads * d, 1, 2) + llama.rms_norm_bytes(kv * d, 1, 2)
    routed = k * (BYTES_PER_ROUTED_HIDDEN * h + BYTES_PER_ROUTED_EXPERT_UNIT * f + BYTES_PER_ROUTE)
    dense = BYTES_PER_HIDDEN * h + qk_norms + llama.attention_bytes(model, attention) + BYTES_PER_EXPERT * e
    return float(dense + routed + BYTES_PER_ROW)


logit_bytes_per_token = llama.logit_bytes_per_token


def config_kwargs(model: ModelConfig) -> dict[str, object]:
    """OlmoeConfig's arguments: ``llama``'s, the experts, and the load-balancing loss in the training loss."""
    out = llama.common_config_kwargs(model, NORM_EPS)
    return out | {
        "num_experts": moe.experts(model),
        "num_experts_per_tok": moe.experts_per_token(model),
        "norm_topk_prob": False,
        "output_router_logits": True,
        "router_aux_loss_coef": ROUTER_AUX_LOSS,
        "clip_qkv": None,
    }


BUILDER = Builder("OlmoeConfig", "OlmoeForCausalLM", config_kwargs, moe.refusals)
architecture_errors = BUILDER.architecture_errors
build_model_config = BUILDER.build_model_config
build_model = BUILDER.build_model

SAMPLE = sequences.SAMPLE
THROUGHPUT_UNIT = sequences.THROUGHPUT_UNIT
tokens_per_sample = sequences.tokens_per_sample
implementation = moe.implementation
synthetic_batch = sequences.synthetic_batch
blocks = sequences.decoder_layers


def flops_per_sample(model: ModelConfig, recompute: bool = False) -> float:
    """Training FLOPs of one sequence, the routed experts only."""
    return sequences.flops_per_sample(flops_per_token, model, recompute)


def activation_bytes_per_sample(model: ModelConfig, method: MethodConfig) -> float:
    """Bytes one sequence adds to a step's peak."""
    return sequences.activation_bytes_per_sample(
        activation_bytes_per_token_per_layer, logit_bytes_per_token, model, method
    )
