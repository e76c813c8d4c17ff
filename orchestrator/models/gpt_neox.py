"""GPT-NeoX (Pythia): parameters, training FLOPs, activation bytes, and the transformers module, from a ModelConfig.

The arithmetic is pure and follows the published formulas, each checked against the real transformers module in
``tests/unit/models/`` (parameters against ``numel`` on the meta device, FLOPs against
``torch.utils.flop_counter.FlopCounterMode``, activation bytes against the tensors a training step keeps). The
module itself is built by ``building.Builder`` from the classes, config arguments and refusals named here.
Notation: L layers, h hidden size, f MLP width, a heads, V vocabulary, s sequence length, B sequences per
optimizer step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orchestrator.models.sequences as sequences
from orchestrator.models.building import Builder, unread_fields

if TYPE_CHECKING:
    from orchestrator.config.schema import ModelConfig
    from orchestrator.config.values import Container

ROPE_THETA = 10_000.0
"""Rotary base of every Pythia model (``rotary_emb_base`` in EleutherAI/pythia models/*.yml)."""

# Bytes a bf16 training step keeps for the backward pass, per token of one layer, as measured on the real
# module (tests/unit/models/test_activation_memory.py: saved tensors of a 2- and a 4-layer model, h=128, a=4,
# s=256, transformers 5.23, torch 2.13): 36.19*h with SDPA, i.e. 36 bytes per hidden unit plus the attention
# kernel's fp32 log-sum-exp and its bookkeeping (6 bytes per head). Korthikanti et al.'s 34*h has two 1-byte
# dropout masks Pythia does not have and lacks the partial-rotary copies of q and k (4 bytes).
LAYER_BYTES_PER_HIDDEN = 36.0
LAYER_BYTES_PER_HEAD_SDPA = 6.0
EAGER_BYTES_PER_SCORE = 5.25
"""Eager attention keeps the a·s attention probabilities of each token (fp32 softmax output, its bf16 copy, less
the kernel's log-sum-exp): 78.06*h measured against 36.19*h with SDPA at a=4, s=256, h=128."""
CHECKPOINT_BYTES_PER_HIDDEN = 2.0
"""With full activation checkpointing a layer keeps only its 16-bit input (measured: 2.00*h)."""
LOGIT_BYTES_PER_ENTRY = 12.0
"""Peak bytes per (token, vocabulary) entry of the logits and the loss, eager: the 16-bit logits (2), their fp32
copy for the cross-entropy (4) and its log-softmax (4) in the forward; log-softmax, its gradient and the gradient of
the logits in the backward. Measured 12.0 (peak with V=4096 minus V=1024, bf16); 16 overcounts by a third."""
COMPILED_LOGIT_BYTES_PER_ENTRY = 6.0
"""Under torch.compile the fp32 cast and the log-softmax are fused: the 16-bit logits (2; the OOM messages of the
H100 records ask for exactly 2 bytes per entry) and one fp32 buffer (4). Fitted to the allocated peaks of the
H100 records of pythia-160m, 410m and 1b with the layer bytes above fixed (6.05; 160m within 0.5%)."""


REGIONAL_LOGIT_BYTES_PER_ENTRY = 4.0
"""With the loss compiled as a region of its own (``compile_scope: regional``): the 16-bit logits and their
16-bit gradient, the fp32 cast and log-softmax fused away. Set by the H200 records (tests/data/gpu-records/h200):
with 6, the allocated peaks of pythia-160m (DeepSpeed, FSDP2), 410m and 1.4b compiled were predicted 6.0, 6.0, 3.1
and 3.1 GiB over, where 2 bytes an entry fewer come to 6.1, 6.1, 3.1 and 3.1 GiB."""


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


def layer_forward_flops_per_token(model: ModelConfig) -> float:
    """Forward FLOPs of one layer per token: 2*(4h² + 2hf) for the weight products, 4sh for QKᵀ and scores×V."""
    h, f, seq = model.hidden_size, intermediate_size(model), model.seq_length
    return float(8 * h * h + 4 * h * f + 4 * seq * h)


def recompute_flops_per_token(model: ModelConfig) -> float:
    """FLOPs that full activation checkpointing adds per token: each layer's forward less its last product.

    transformers checkpoints each decoder layer with torch's non-reentrant checkpoint, which stops recomputing
    as soon as every tensor the backward needs is rebuilt (``early_stop``). In a GPT-NeoX layer the last product,
    the MLP's output projection (2hf per token), feeds only the residual sum, which saves nothing, so it is not
    rerun. FlopCounterMode on the real module measures exactly this (tests/unit/models/test_flops.py): a third
    more for QKV, attention and the MLP's first product, nothing more for the output projection or the logits.
    """
    f = intermediate_size(model)
    return float(model.num_layers * (layer_forward_flops_per_token(model) - 2 * model.hidden_size * f))


def flops_per_token(model: ModelConfig, recompute: bool = False) -> float:
    """Training FLOPs (forward and backward) per token of a sequence of the model's ``seq_length``.

    Forward per token: every layer's :func:`layer_forward_flops_per_token` and 2hV for the logits; backward costs
    twice the forward. With f = 4h this is exactly ``72*B*s*L*h²*(1 + s/(6h) + V/(12*L*h))`` (Narayanan et al.
    2021, eq. 3). ``recompute=True`` adds what activation checkpointing reruns (hardware FLOPs):
    :func:`recompute_flops_per_token`, which with f = 4h is ``L*(16h² + 4sh)``, not the ``L*(24h² + 4sh)`` of a
    whole extra forward.
    """
    forward = model.num_layers * layer_forward_flops_per_token(model) + 2.0 * model.hidden_size * model.vocab_size
    return 3.0 * forward + (recompute_flops_per_token(model) if recompute else 0.0)


def reference_flops_per_step(model: ModelConfig, sequences: int) -> float:
    """Narayanan et al. 2021's closed form verbatim, ``72*B*s*L*h²*(1 + s/(6h) + V/(12*L*h))``, valid for f = 4h."""
    num_layers, h, vocab = model.num_layers, model.hidden_size, model.vocab_size
    seq = model.seq_length
    return 72.0 * sequences * seq * num_layers * h * h * (1 + seq / (6 * h) + vocab / (12 * num_layers * h))


def activation_bytes_per_token_per_layer(model: ModelConfig, attention: str, checkpointing: bool) -> float:
    """Bytes one layer keeps per token for the backward pass, in 16-bit training (twice that in fp32).

    SDPA and flash attention keep no attention scores; eager keeps the a·s probabilities of each token. With
    activation checkpointing only the layer's input is kept (the rebuilt layer is :func:`activation_bytes_per_token_per_layer`
    without checkpointing, counted once by the engine's memory model).
    """
    h, heads = model.hidden_size, model.num_heads
    if checkpointing:
        return CHECKPOINT_BYTES_PER_HIDDEN * h
    if attention == "eager":
        return LAYER_BYTES_PER_HIDDEN * h + EAGER_BYTES_PER_SCORE * heads * model.seq_length
    return LAYER_BYTES_PER_HIDDEN * h + LAYER_BYTES_PER_HEAD_SDPA * heads


def logit_bytes_per_token(model: ModelConfig, compiled: bool | str | None = False) -> float:
    """Peak bytes per token of the logits and the cross-entropy loss: eager (``compiled`` false or None), fused by a
    regional compile (``"regional"``) or by a whole-model one (``True``, ``"whole"``)."""
    if compiled == "regional":
        per_entry = REGIONAL_LOGIT_BYTES_PER_ENTRY
    else:
        per_entry = COMPILED_LOGIT_BYTES_PER_ENTRY if compiled else LOGIT_BYTES_PER_ENTRY
    return per_entry * model.vocab_size


def largest_weight_elements(model: ModelConfig) -> int:
    """Elements of the largest single weight: an embedding (V·h) in every Pythia model."""
    h = model.hidden_size
    return max(model.vocab_size * h, h * intermediate_size(model), 3 * h * h)


def config_kwargs(model: ModelConfig) -> Container:
    """GPTNeoXConfig's arguments for the cell's model: untied embeddings, parallel residual, partial rotary."""
    return {
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "intermediate_size": intermediate_size(model),
        "max_position_embeddings": model.seq_length,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "partial_rotary_factor": model.rotary_pct,
        },
        "use_parallel_residual": True,
        "tie_word_embeddings": False,
        # Pythia trains without dropout; no KV cache in training.
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "use_cache": False,
    }


def refusals(model: ModelConfig) -> dict[str, str]:
    """Shapes transformers' GPT-NeoX cannot build, or fields of other families it would silently ignore, by key."""
    problems: dict[str, str] = {}
    if model.num_heads < 1 or model.hidden_size % model.num_heads:
        problems["model.num_heads"] = (
            f"hidden_size={model.hidden_size} is not a multiple of num_heads={model.num_heads}; use a divisor of "
            f"{model.hidden_size}"
        )
    if model.num_kv_heads not in (None, model.num_heads):
        problems["model.num_kv_heads"] = "GPT-NeoX has no grouped-query attention; leave it null"
    if model.head_dim is not None:
        problems["model.head_dim"] = "GPT-NeoX's head size is hidden_size / num_heads; leave it null"
    if model.tie_word_embeddings:
        problems["model.tie_word_embeddings"] = "Pythia's embeddings are untied; use false"
    if not 0.0 < model.rotary_pct <= 1.0:
        problems["model.rotary_pct"] = f"rotary_pct={model.rotary_pct}; use a fraction in (0, 1]"
    problems.update(unread_fields(model))
    return problems


BUILDER = Builder("GPTNeoXConfig", "GPTNeoXForCausalLM", config_kwargs, refusals)
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
