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
import orchestrator.models.sequences as sequences
from orchestrator.models.building import Builder

if TYPE_CHECKING:
    from orchestrator.config.schema import ModelConfig
    from orchestrator.config.values import Container

NORM_EPS = 1e-5
"""RMSNorm epsilon of OLMoE-1B-7B's config.json."""
ROUTER_AUX_LOSS = 0.01
"""Load-balancing loss coefficient (OLMoE paper, section 2; ``router_aux_loss_coef`` of its config)."""


def num_parameters(model: ModelConfig) -> int:
    """``moe.num_parameters`` with the q and k norms."""
    return moe.num_parameters(model, qk_norm=True)


flops_per_token = moe.flops_per_token
largest_weight_elements = moe.largest_weight_elements


def activation_bytes_per_token_per_layer(model: ModelConfig, attention: str, checkpointing: bool = False) -> float:
    """``moe.activation_bytes_per_token_per_layer`` with OLMoE's q/k norms."""
    return moe.activation_bytes_per_token_per_layer(model, attention, checkpointing, qk_norm=True)


logit_bytes_per_token = llama.logit_bytes_per_token


def config_kwargs(model: ModelConfig) -> Container:
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
