"""Llama-style decoders (SmolLM2, Llama 3.2): parameters, training FLOPs, activation bytes and the module.

The architecture: pre-norm RMSNorm, grouped-query attention without biases, rotary embeddings on every head
dimension, a SwiGLU MLP, and input and output embeddings that are tied or not. ``qwen3`` and ``olmo2`` import this
arithmetic (``num_parameters``'s ``extra_per_layer``, the byte counts of a norm, the attention and the MLP, the
``refusals`` and ``common_config_kwargs`` their ``building.Builder`` takes) and add their own norms.

Notation: L layers, h hidden size, f MLP width, a query heads, k key/value heads, d head width, V vocabulary,
s sequence length. The attention projections are h×ad (queries), 2 × h×kd (keys, values) and ad×h (output).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orchestrator.models.gpt_neox as gpt_neox
import orchestrator.models.sequences as sequences
from orchestrator.models.building import Builder, unread_fields, where

if TYPE_CHECKING:
    from orchestrator.config.schema import ModelConfig
    from orchestrator.config.values import Container

ROPE_THETA = 10_000.0
"""Rotary base when a model file gives none (transformers' LlamaConfig default)."""
NORM_EPS = 1e-5
"""RMSNorm epsilon when a model file gives none (SmolLM2 and Llama 3.2 use 1e-5)."""
BYTES_16BIT = 2
INTERMEDIATE_SIZE_REQUIRED = (
    "intermediate_size is required for this family (the published MLP width, e.g. 1536 for SmolLM2-135M)"
)


def num_kv_heads(model: ModelConfig) -> int:
    """Key/value heads: the config's value, or one per query head."""
    return model.num_kv_heads if model.num_kv_heads is not None else model.num_heads


def head_dim(model: ModelConfig) -> int:
    """Width of one head: the config's value, or h / a."""
    return model.head_dim if model.head_dim is not None else model.hidden_size // model.num_heads


def intermediate_size(model: ModelConfig) -> int:
    """SwiGLU width f. Llama-style models publish it; there is no rule to derive it from h."""
    if model.intermediate_size is None:
        raise ValueError(f"{where(model)}: {INTERMEDIATE_SIZE_REQUIRED}")
    return model.intermediate_size


def attention_parameters(model: ModelConfig) -> int:
    """Weights of one layer's q, k, v and output projections: 2·h·a·d + 2·h·k·d (no biases)."""
    h, d = model.hidden_size, head_dim(model)
    return 2 * h * model.num_heads * d + 2 * h * num_kv_heads(model) * d


def embedding_parameters(model: ModelConfig) -> int:
    """V·h for the input embedding, twice when the output projection is a matrix of its own."""
    return (1 if model.tie_word_embeddings else 2) * model.vocab_size * model.hidden_size


def num_parameters(model: ModelConfig, extra_per_layer: int = 0) -> int:
    """Parameters: per layer attention + 3hf (SwiGLU) + 2h (two RMSNorm weights) + ``extra_per_layer``;
    a final RMSNorm h; embeddings V·h, or 2V·h untied.

    ``extra_per_layer`` is what a derived family adds to every layer (Qwen3's q/k norms).
    """
    h, f = model.hidden_size, intermediate_size(model)
    per_layer = attention_parameters(model) + 3 * h * f + 2 * h + extra_per_layer
    return model.num_layers * per_layer + h + embedding_parameters(model)


def layer_forward_flops_per_token(model: ModelConfig) -> float:
    """Forward FLOPs of one layer per token: 2 per multiply-add of every matrix product.

    Projections 2·(2had + 2hkd), MLP 2·3hf, attention scores QKᵀ and their weighted sum of V 2·2·s·a·d. The scores
    are counted over the full s×s square as in Narayanan et al. 2021 (the Pythia formula here does the same), which
    is also what ``torch.utils.flop_counter`` counts for a causal sdpa call. Norms, rotary, SiLU and the softmax
    are elementwise and left out.
    """
    h, f, seq = model.hidden_size, intermediate_size(model), model.seq_length
    return 2.0 * attention_parameters(model) + 6.0 * h * f + 4.0 * seq * model.num_heads * head_dim(model)


def flops_per_token(model: ModelConfig, recompute: bool = False, recompute_last_product: bool = False) -> float:
    """Training FLOPs (forward and backward) per token of a sequence of the model's ``seq_length``.

    Backward costs twice the forward (a gradient for the input and one for the weight of every product), so a
    step is 3 forwards of every layer plus 3 × 2hV for the logits; a tied output matrix costs the same as an untied
    one. ``recompute=True`` adds what full activation checkpointing reruns (hardware FLOPs): each layer's forward
    again, except its MLP down projection (2hf): PyTorch's non-reentrant checkpoint stops recomputing as soon as it
    has rebuilt the last tensor the backward needs (``torch.utils.checkpoint`` early stop), and nothing keeps the
    down projection's output in a pre-norm layer. ``recompute_last_product=True`` reruns it as well, for a family
    whose post-norm keeps that output (OLMo 2). The logits are not recomputed. Both checked against
    ``torch.utils.flop_counter`` in the tests.
    """
    layer = layer_forward_flops_per_token(model)
    passes = 3 * layer
    if recompute:
        skipped = 0.0 if recompute_last_product else 2.0 * model.hidden_size * intermediate_size(model)
        passes += layer - skipped
    logits = 3 * 2.0 * model.hidden_size * model.vocab_size
    return float(model.num_layers * passes + logits)


def rms_norm_bytes(width: int, rows: int = 1, normalised_bytes: int = BYTES_16BIT) -> int:
    """Bytes per token that one transformers RMSNorm keeps for backward, over ``rows`` rows of ``width`` in all.

    It upcasts its input to fp32 and keeps that copy (4·width), the fp32 reciprocal RMS of each row (4·rows) and the
    normalised tensor that the weight multiplies (``normalised_bytes``·width: 2 where it is cast back to 16 bits
    first, as in Llama and Qwen3; 4 where the weight multiplies in fp32, as in OLMo 2).
    """
    return 4 * width + 4 * rows + normalised_bytes * width


def attention_bytes(model: ModelConfig, attention: str) -> int:
    """Bytes per token the attention itself keeps, from the rotated queries and keys to its output.

    Fused attention (sdpa, flash): queries 2ad, keys and values 2kd each (grouped-query attention reaches sdpa
    unexpanded when there is no padding mask, transformers >= 5), the output 2ad, which the output projection takes
    as it is, and the fp32 log-sum-exp per head 4a. Eager attention expands keys and values to the a query heads and
    keeps the s×s scores of every head twice, as the fp32 softmax and its 16-bit copy (6as), and its output is
    copied to the output projection's layout: 8ad + 6as.
    """
    heads, kv, d, seq = model.num_heads, num_kv_heads(model), head_dim(model), model.seq_length
    if attention == "eager":
        return 4 * BYTES_16BIT * heads * d + (4 + BYTES_16BIT) * heads * seq
    return 2 * BYTES_16BIT * heads * d + 2 * BYTES_16BIT * kv * d + 4 * heads


def mlp_bytes(model: ModelConfig) -> int:
    """SwiGLU keeps the gate and up outputs, the SiLU output and the product the down projection takes: 4 × 2f."""
    return 4 * BYTES_16BIT * intermediate_size(model)


def activation_bytes_per_token_per_layer(model: ModelConfig, attention: str, checkpointing: bool = False) -> float:
    """Bytes one layer keeps for the backward pass per token with 16-bit activations (bf16, fp16).

    Two pre-norms (``rms_norm_bytes(h)`` each), the inputs of the q/k/v and the gate/up projections (2h each), the
    attention (``attention_bytes``: 4ad + 4kd + 4a with sdpa, 8ad + 6as eager) and the MLP (8f); in all, with sdpa,
    ``16h + 8 + 4ad + 4kd + 4a + 8f``. Counted from what transformers' modules save in autograd and checked tensor
    by tensor with ``torch.autograd.graph.saved_tensors_hooks`` in the tests; the rotary cos/sin tables are shared
    by all layers and sequences and left out. With fp32 activations every 2-byte tensor doubles; with activation
    checkpointing a layer keeps only its input (2h) until its backward reruns it.
    """
    h = model.hidden_size
    if checkpointing:
        return float(BYTES_16BIT * h)
    norms = 2 * rms_norm_bytes(h)
    projection_inputs = 2 * BYTES_16BIT * h
    return float(norms + projection_inputs + attention_bytes(model, attention) + mlp_bytes(model))


# Peak bytes per token of the logits and the loss: transformers' causal-LM loss path is the one GPT-NeoX takes
# (16-bit logits, an fp32 copy for the cross-entropy and its gradient), so its measured per-entry figures apply.
logit_bytes_per_token = gpt_neox.logit_bytes_per_token


def largest_weight_elements(model: ModelConfig) -> int:
    """Elements of the largest parameter tensor: the V×h embedding, a h×f MLP matrix or the h×ad query matrix.

    ZeRO stage 3 gathers a whole parameter at once, so this bounds what one gather holds.
    """
    h = model.hidden_size
    return max(model.vocab_size * h, h * intermediate_size(model), h * model.num_heads * head_dim(model))


def refusals(model: ModelConfig) -> dict[str, str]:
    """Shapes the transformers module cannot build, by the key to fix (shared with qwen3 and olmo2)."""
    problems: dict[str, str] = {}
    kv = num_kv_heads(model)
    if kv < 1 or model.num_heads % kv:
        problems["model.num_kv_heads"] = f"num_heads={model.num_heads} is not a multiple of num_kv_heads={kv}"
    if model.head_dim is None and (model.num_heads < 1 or model.hidden_size % model.num_heads):
        problems["model.num_heads"] = f"hidden_size={model.hidden_size} is not a multiple of num_heads; set head_dim"
    if model.rotary_pct != 1.0:
        problems["model.rotary_pct"] = f"rotary_pct={model.rotary_pct}; this family rotates every head dimension (1.0)"
    if model.intermediate_size is None:
        problems["model.intermediate_size"] = INTERMEDIATE_SIZE_REQUIRED
    problems.update(unread_fields(model))
    return problems


def common_config_kwargs(model: ModelConfig, norm_eps: float) -> Container:
    """The keyword arguments every transformers Llama-like config takes (shared with qwen3 and olmo2).

    ``norm_eps`` is the family's RMSNorm epsilon, used where the model file gives none.
    """
    return {
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "intermediate_size": intermediate_size(model),
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": num_kv_heads(model),
        "head_dim": head_dim(model),
        "max_position_embeddings": model.seq_length,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": model.rope_theta if model.rope_theta is not None else ROPE_THETA,
        },
        "rms_norm_eps": model.norm_eps if model.norm_eps is not None else norm_eps,
        "tie_word_embeddings": model.tie_word_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_cache": False,
        # Token ids the random-weight model never uses; None keeps transformers from checking them.
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }


def config_kwargs(model: ModelConfig) -> Container:
    """LlamaConfig's arguments for the cell's model: the common ones and an MLP without biases."""
    return common_config_kwargs(model, NORM_EPS) | {"mlp_bias": False}


def llama_refusals(model: ModelConfig) -> dict[str, str]:
    """``refusals``, and LlamaConfig's own rule (transformers 5.23 validates it; Qwen3's and OLMo 2's configs do not):
    the hidden size is a multiple of the query heads even where ``head_dim`` sets the heads' width."""
    problems = refusals(model)
    if model.head_dim is not None and model.num_heads >= 1 and model.hidden_size % model.num_heads:
        problems.setdefault(
            "model.num_heads", f"hidden_size={model.hidden_size} is not a multiple of num_heads={model.num_heads}"
        )
    return problems


BUILDER = Builder("LlamaConfig", "LlamaForCausalLM", config_kwargs, llama_refusals)
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
