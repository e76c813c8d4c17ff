"""Qwen3 dense models: the Llama-style arithmetic of ``llama`` plus an RMSNorm on each query and key head.

Qwen3 normalises every query and key head (width d) before the rotary embedding ("QK-Norm", Qwen3 technical
report, section 2); that adds 2d parameters a layer and two norms' activations, and no matrix product. Everything
else (grouped-query attention, SwiGLU, pre-norm RMSNorm, tied embeddings in the small models) is ``llama``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orchestrator.models.llama as llama
import orchestrator.models.sequences as sequences
from orchestrator.models.building import Builder

if TYPE_CHECKING:
    from orchestrator.config.schema import ModelConfig
    from orchestrator.config.values import Container

NORM_EPS = 1e-6
"""RMSNorm epsilon when a model file gives none (every Qwen3 config.json has 1e-6)."""


def num_parameters(model: ModelConfig) -> int:
    """``llama.num_parameters`` plus the q and k norm weights, d each, in every layer."""
    return llama.num_parameters(model, extra_per_layer=2 * llama.head_dim(model))


# The q/k norms are elementwise and add no matrix product; Qwen3 is pre-norm like Llama, so recomputation skips
# the same down projection.
flops_per_token = llama.flops_per_token


def activation_bytes_per_token_per_layer(model: ModelConfig, attention: str, checkpointing: bool = False) -> float:
    """``llama``'s layer plus the per-head q and k norms: ``rms_norm_bytes(a·d, a) + rms_norm_bytes(k·d, k)``.

    The norms' outputs go into the rotary multiply, which keeps only its cos/sin tables, so nothing else is added.
    """
    if checkpointing:
        return float(llama.BYTES_16BIT * model.hidden_size)
    d, heads, kv = llama.head_dim(model), model.num_heads, llama.num_kv_heads(model)
    qk_norms = llama.rms_norm_bytes(heads * d, heads) + llama.rms_norm_bytes(kv * d, kv)
    return llama.activation_bytes_per_token_per_layer(model, attention) + qk_norms


# The norms are vectors and the loss path is transformers' causal-LM one, as in ``llama``.
largest_weight_elements = llama.largest_weight_elements
logit_bytes_per_token = llama.logit_bytes_per_token


def config_kwargs(model: ModelConfig) -> Container:
    """Qwen3Config's arguments: ``llama``'s with Qwen3's norm epsilon and no sliding window (as in every published
    Qwen3 model)."""
    return llama.common_config_kwargs(model, NORM_EPS) | {"use_sliding_window": False}


# The attention and MLP shapes, and so what transformers cannot build, are ``llama``'s.
BUILDER = Builder("Qwen3Config", "Qwen3ForCausalLM", config_kwargs, llama.refusals)
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
)
