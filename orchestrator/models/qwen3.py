"""Qwen3 dense models: the Llama-style arithmetic of ``llama`` plus an RMSNorm on each query and key head.

Qwen3 normalises every query and key head (width d) before the rotary embedding ("QK-Norm", Qwen3 technical
report, section 2); that adds 2d parameters a layer and two norms' activations, and no matrix product. Everything
else (grouped-query attention, SwiGLU, pre-norm RMSNorm, tied embeddings in the small models) is ``llama``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orchestrator.models.llama as llama
from orchestrator.models.building import build_from_config

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

    from orchestrator.schema import ModelConfig

NORM_EPS = 1e-6
"""RMSNorm epsilon when a model file gives none (every Qwen3 config.json has 1e-6)."""


def num_parameters(model: ModelConfig) -> int:
    """``llama.num_parameters`` plus the q and k norm weights, d each, in every layer."""
    return llama.num_parameters(model, extra_per_layer=2 * llama.head_dim(model))


def flops_per_token(model: ModelConfig, recompute: bool = False) -> float:
    """``llama.flops_per_token``: the q/k norms are elementwise and add no matrix product."""
    return llama.flops_per_token(model, recompute)


def activation_bytes_per_token_per_layer(model: ModelConfig, attention: str, checkpointing: bool = False) -> float:
    """``llama``'s layer plus the per-head q and k norms: ``rms_norm_bytes(a·d, a) + rms_norm_bytes(k·d, k)``.

    The norms' outputs go into the rotary multiply, which keeps only its cos/sin tables, so nothing else is added.
    """
    if checkpointing:
        return float(llama.BYTES_16BIT * model.hidden_size)
    d, heads, kv = llama.head_dim(model), model.num_heads, llama.num_kv_heads(model)
    qk_norms = llama.rms_norm_bytes(heads * d, heads) + llama.rms_norm_bytes(kv * d, kv)
    return llama.activation_bytes_per_token_per_layer(model, attention) + qk_norms


def largest_weight_elements(model: ModelConfig) -> int:
    """``llama.largest_weight_elements``: the norms are vectors."""
    return llama.largest_weight_elements(model)


def logit_bytes_per_token(model: ModelConfig, compiled: bool = False) -> float:
    """``llama.logit_bytes_per_token``: the same loss path."""
    return llama.logit_bytes_per_token(model, compiled)


def build_model_config(model: ModelConfig, attention: str) -> PretrainedConfig:
    """A transformers Qwen3Config for the cell's model (no sliding window, as in every published Qwen3 model)."""
    from transformers import Qwen3Config

    kwargs = llama.config_kwargs(model)
    if model.norm_eps is None:
        kwargs["rms_norm_eps"] = NORM_EPS
    config = Qwen3Config(**kwargs, use_sliding_window=False)
    config._attn_implementation = attention
    return config


def build_model(
    model: ModelConfig,
    attention: str,
    dtype: torch.dtype,
    device: torch.device,
    init_context: Any = None,
) -> torch.nn.Module:
    """A randomly initialised Qwen3ForCausalLM, built as ``building.build_from_config`` builds."""
    from transformers import Qwen3ForCausalLM

    config = build_model_config(model, attention)
    module: torch.nn.Module = build_from_config(config, Qwen3ForCausalLM, attention, dtype, device, init_context)
    return module


def architecture_errors(model: ModelConfig) -> dict[str, str]:
    """``llama.architecture_errors``: the same attention and MLP shapes."""
    return llama.architecture_errors(model)
