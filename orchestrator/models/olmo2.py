"""OLMo 2: a Llama-style decoder with its norms after each sublayer and a q/k norm over all heads.

Per layer (OLMo 2 paper, arXiv 2501.00656, section 3.1): ``h = x + RMSNorm(Attention(x))``,
``out = h + RMSNorm(MLP(h))`` instead of normalising the sublayers' inputs, and one RMSNorm over all query
heads (width a·d) and one over all key heads (k·d) before the rotary embedding. Parameters and matrix products are
``llama``'s plus the q/k norm weights; the activations differ because the norms multiply their weight in fp32.
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


# The norms are vectors and the loss path is transformers' causal-LM one, as in ``llama``.
largest_weight_elements = llama.largest_weight_elements
logit_bytes_per_token = llama.logit_bytes_per_token


def config_kwargs(model: ModelConfig) -> Container:
    """Olmo2Config's arguments: ``llama``'s with OLMo 2's norm epsilon. Olmo2Config has no head_dim argument of its
    own; its attention reads the attribute when it is there."""
    return llama.common_config_kwargs(model, NORM_EPS)


# The attention and MLP shapes, and so what transformers cannot build, are ``llama``'s.
BUILDER = Builder("Olmo2Config", "Olmo2ForCausalLM", config_kwargs, llama.refusals)
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
