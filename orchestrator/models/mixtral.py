"""Mixtral (Mistral AI's Mixtral 8x7B): a mixture-of-experts decoder, the arithmetic of ``moe`` without q/k norms.

Jiang et al. 2024, "Mixtral of Experts" (arXiv 2401.04088): Mistral 7B's decoder (grouped-query attention, 32
layers, hidden 4096) with each MLP replaced by 8 SwiGLU experts of width 14,336, 2 per token, the top two's
weights renormalised. Built from the transformers library's ``MixtralForCausalLM``, the reference port Mistral AI
publishes its checkpoints for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orchestrator.models.llama as llama
import orchestrator.models.moe as moe
import orchestrator.models.sequences as sequences
from orchestrator.models.building import Builder

if TYPE_CHECKING:
    from orchestrator.config.schema import ModelConfig
    from orchestrator.config.values import Container

NORM_EPS = 1e-5
"""RMSNorm epsilon of Mixtral-8x7B-v0.1's config.json."""
ROUTER_AUX_LOSS = 0.02
"""``router_aux_loss_coef`` of Mixtral-8x7B-v0.1's config.json."""


def num_parameters(model: ModelConfig) -> int:
    """``moe.num_parameters`` without q/k norms."""
    return moe.num_parameters(model, qk_norm=False)


flops_per_token = moe.flops_per_token
largest_weight_elements = moe.largest_weight_elements
logit_bytes_per_token = llama.logit_bytes_per_token


def activation_bytes_per_token_per_layer(model: ModelConfig, attention: str, checkpointing: bool = False) -> float:
    """``moe.activation_bytes_per_token_per_layer`` without q/k norms, with the renormalised top-k weights."""
    return moe.activation_bytes_per_token_per_layer(model, attention, checkpointing, qk_norm=False, renormalised=True)


def config_kwargs(model: ModelConfig) -> Container:
    """MixtralConfig's arguments: ``llama``'s, the experts, no sliding window, the load-balancing loss in the loss."""
    out = llama.common_config_kwargs(model, NORM_EPS)
    return out | {
        "num_local_experts": moe.experts(model),
        "num_experts_per_tok": moe.experts_per_token(model),
        "output_router_logits": True,
        "router_aux_loss_coef": ROUTER_AUX_LOSS,
        "sliding_window": None,
    }


BUILDER = Builder("MixtralConfig", "MixtralForCausalLM", config_kwargs, moe.refusals)
architecture_errors = BUILDER.architecture_errors
build_model_config = BUILDER.build_model_config
build_model = BUILDER.build_model

FAMILY = sequences.SequenceFamily(
    BUILDER=BUILDER,
    num_parameters=num_parameters,
    flops_per_token=flops_per_token,
    activation_bytes_per_token_per_layer=activation_bytes_per_token_per_layer,
    logit_bytes_per_token=logit_bytes_per_token,
    largest_weight_elements=largest_weight_elements,
    implementation=moe.implementation,
    CPU_ONEDNN=moe.CPU_ONEDNN,
)
