"""GPT-NeoX (Pythia): parameter count, training FLOPs per token, and the transformers module, from a ModelConfig.

The arithmetic is pure and follows the published formulas; ``build_model`` is the only
function here that allocates a model. Notation: L layers, h hidden size, f MLP width, a heads, V vocabulary,
s sequence length, B sequences per optimizer step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import GPTNeoXConfig

    from orchestrator.schema import ModelConfig

GIB = 2**30
ROPE_THETA = 10_000.0
"""Rotary base of every Pythia model (``rotary_emb_base`` in EleutherAI/pythia models/*.yml)."""


def intermediate_size(model: ModelConfig) -> int:
    """MLP width: the config's value, or 4h as in every Pythia model when it is null."""
    return model.intermediate_size if model.intermediate_size is not None else 4 * model.hidden_size


def num_parameters(model: ModelConfig) -> int:
    """Parameters of a GPT-NeoX model: biases, two LayerNorms per layer, a final LayerNorm, untied embeddings.

    Per layer: QKV 3h² + 3h, attention output h² + h, MLP 2hf + f + h, LayerNorms 4h. With f = 4h this is
    ``L*(12h² + 13h) + 2h + 2*V*h``, which matches the published Pythia counts.
    """
    num_layers, h, vocab = model.num_layers, model.hidden_size, model.vocab_size
    f = intermediate_size(model)
    per_layer = 4 * h * h + 2 * h * f + f + 9 * h
    return num_layers * per_layer + 2 * h + 2 * vocab * h


def flops_per_token(model: ModelConfig, recompute: bool = False) -> float:
    """Training FLOPs (forward and backward) per token of a sequence of the model's ``seq_length``.

    Forward per token and layer: 2*(4h² + 2hf) for the matrix products and 4sh for attention scores and their
    weighted sum; the logits add 2hV; backward costs twice the forward. With f = 4h this is exactly
    ``72*B*s*L*h²*(1 + s/(6h) + V/(12*L*h))`` (Narayanan et al. 2021, eq. 3). ``recompute=True`` counts the extra
    forward of every layer that full activation checkpointing runs (hardware FLOPs): with f = 4h,
    ``96*B*s*L*h²*(1 + s/(6h) + V/(16*L*h))``; the logits are not recomputed.
    """
    num_layers, h, vocab = model.num_layers, model.hidden_size, model.vocab_size
    seq, f = model.seq_length, intermediate_size(model)
    layer_forward_per_token = 8 * h * h + 4 * h * f + 4 * seq * h
    layer_passes = 4 if recompute else 3
    per_token = num_layers * layer_passes * layer_forward_per_token + 3 * 2 * h * vocab
    return float(per_token)


def reference_flops_per_step(model: ModelConfig, sequences: int) -> float:
    """Narayanan et al. 2021's closed form verbatim, ``72*B*s*L*h²*(1 + s/(6h) + V/(12*L*h))``, valid for f = 4h."""
    num_layers, h, vocab = model.num_layers, model.hidden_size, model.vocab_size
    seq = model.seq_length
    return 72.0 * sequences * seq * num_layers * h * h * (1 + seq / (6 * h) + vocab / (12 * num_layers * h))


def build_model_config(model: ModelConfig, attention: str) -> GPTNeoXConfig:
    """A transformers GPT-NeoX config for the cell's model: untied embeddings, parallel residual, partial rotary."""
    from transformers import GPTNeoXConfig

    config = GPTNeoXConfig(
        vocab_size=model.vocab_size,
        hidden_size=model.hidden_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_heads,
        intermediate_size=intermediate_size(model),
        max_position_embeddings=model.seq_length,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "partial_rotary_factor": model.rotary_pct,
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
    model: ModelConfig,
    attention: str,
    dtype: torch.dtype,
    device: torch.device,
    init_context: Any = None,
) -> torch.nn.Module:
    """A randomly initialised GPTNeoXForCausalLM, nothing downloaded.

    It is built directly on ``device`` in the training dtype: initialising a billion parameters on the host in
    fp32 would take minutes of the probe's time and four bytes a parameter on every rank. ``init_context``, e.g.
    a ``deepspeed.zero.Init`` context, builds it already partitioned over the ranks (ZeRO stage 3), so no rank ever
    holds the whole model. A missing attention implementation (flash-attn not installed) raises ImportError.
    """
    from transformers import GPTNeoXForCausalLM

    config = build_model_config(model, attention)
    # transformers sets the default dtype to ``dtype`` while it builds; the context puts every tensor on
    # ``device``, or (zero.Init) partitions each module as soon as it is built.
    with init_context if init_context is not None else device:
        return GPTNeoXForCausalLM._from_config(config, attn_implementation=attention, dtype=dtype)
