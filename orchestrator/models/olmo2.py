"""OLMo 2: a Llama-style decoder with its norms after each sublayer and a q/k norm over all heads.

Per layer (OLMo 2 paper, arXiv 2501.00656, section 3.1): ``h = x + RMSNorm(Attention(x))``,
``out = h + RMSNorm(MLP(h))`` instead of normalising the sublayers' inputs, and one RMSNorm over all query
heads (width a·d) and one over all key heads (k·d) before the rotary embedding. Parameters and matrix products are
``llama``'s plus the q/k norm weights; the activations differ because the norms multiply their weight in fp32.
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
"""RMSNorm epsilon when a model file gives none (``layer_norm_eps`` of OLMo2-1B-stage1.yaml)."""
FP32 = 4


def num_parameters(model: ModelConfig) -> int:
    """``llama.num_parameters`` (its two norms a layer are OLMo 2's two post-norms) plus q and k norms, a·d + k·d."""
    d = llama.head_dim(model)
    return llama.num_parameters(model, extra_per_layer=(model.num_heads + llama.num_kv_heads(model)) * d)


def flops_per_token(model: ModelConfig, recompute: bool = False) -> float:
    """``llama.flops_per_token``: moving the norms changes no matrix product. Recomputation reruns the whole layer,
    down projection included, because the post-MLP norm keeps that projection's output for its backward."""
    return llama.flops_per_token(model, recompute, recompute_last_product=True)


def activation_bytes_per_token_per_layer(model: ModelConfig, attention: str, checkpointing: bool = False) -> float:
    """Bytes one layer keeps for backward per token, 16-bit activations, no checkpointing.

    The layer input as the q/k/v projections' input (2h) and the MLP input (2h); the q and k norms, one row each
    and normalised in fp32 (``rms_norm_bytes(a·d, 1, 4) + rms_norm_bytes(k·d, 1, 4)``); the attention as in
    ``llama.attention_bytes``; the two post-norms, also fp32 (``2 × rms_norm_bytes(h, 1, 4)``); the MLP 8f.
    Checked with ``saved_tensors_hooks`` in the tests, like ``llama``'s.
    """
    if checkpointing:
        return float(llama.BYTES_16BIT * model.hidden_size)
    h, d = model.hidden_size, llama.head_dim(model)
    heads, kv = model.num_heads, llama.num_kv_heads(model)
    inputs = 2 * llama.BYTES_16BIT * h
    qk_norms = llama.rms_norm_bytes(heads * d, 1, FP32) + llama.rms_norm_bytes(kv * d, 1, FP32)
    post_norms = 2 * llama.rms_norm_bytes(h, 1, FP32)
    attention_kept = llama.attention_bytes(model, attention)
    return float(inputs + qk_norms + attention_kept + post_norms + llama.mlp_bytes(model))


def largest_weight_elements(model: ModelConfig) -> int:
    """``llama.largest_weight_elements``: the norms are vectors."""
    return llama.largest_weight_elements(model)


def logit_bytes_per_token(model: ModelConfig, compiled: bool = False) -> float:
    """``llama.logit_bytes_per_token``: the same loss path."""
    return llama.logit_bytes_per_token(model, compiled)


def build_model_config(model: ModelConfig, attention: str) -> PretrainedConfig:
    """A transformers Olmo2Config for the cell's model."""
    from transformers import Olmo2Config

    kwargs = llama.config_kwargs(model)
    if model.norm_eps is None:
        kwargs["rms_norm_eps"] = NORM_EPS
    # Olmo2Config has no head_dim argument of its own; its attention reads the attribute when it is there.
    config = Olmo2Config(**kwargs)
    config._attn_implementation = attention
    return config


def build_model(
    model: ModelConfig,
    attention: str,
    dtype: torch.dtype,
    device: torch.device,
    init_context: Any = None,
) -> torch.nn.Module:
    """A randomly initialised Olmo2ForCausalLM, built as ``building.build_from_config`` builds."""
    from transformers import Olmo2ForCausalLM

    config = build_model_config(model, attention)
    module: torch.nn.Module = build_from_config(config, Olmo2ForCausalLM, attention, dtype, device, init_context)
    return module


def architecture_errors(model: ModelConfig) -> dict[str, str]:
    """``llama.architecture_errors``: the same attention and MLP shapes."""
    return llama.architecture_errors(model)
