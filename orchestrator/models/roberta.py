"""RoBERTa: a bidirectional encoder pre-trained by masked-language modelling; parameters, FLOPs, bytes and module.

Built from the transformers library's ``RobertaForMaskedLM`` with random weights: the Hugging Face port is what RoBERTa's users
train and fine-tune (fairseq, the original, is no longer maintained), and its SDPA attention is the fast path.
The architecture (Liu et al. 2019, arXiv 1907.11692; BERT's, Devlin et al. 2019): learned absolute positions
(``seq_length + 2`` of them, fairseq's padding offset), one token type, post-LayerNorm layers with biases
everywhere and a GELU MLP, and a masked-LM head (dense h×h, GELU, LayerNorm, output tied to the input embedding
with its own bias). One sample is a sequence of ``seq_length`` tokens, of which :data:`MASK_RATE` are masked and
predicted; the head runs on every position, as transformers does, so it costs as a causal LM's logits do.
Notation as in ``gpt_neox``: L layers, h hidden, f MLP width, a heads, V vocabulary, s sequence length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orchestrator.models.gpt_neox as gpt_neox
import orchestrator.models.sequences as sequences
from orchestrator.models.building import OTHER_FAMILIES_FIELDS, Builder, unread_fields

if TYPE_CHECKING:
    import torch

    from orchestrator.config.schema import ModelConfig
    from orchestrator.config.values import Container

MASK_RATE = 0.15
"""Share of tokens masked and predicted (Devlin et al. 2019; RoBERTa keeps it, Liu et al. 2019 section 2.4)."""
DROPOUT = 0.1
"""Dropout of RoBERTa's pre-training, on the attention probabilities and the hidden states (Liu et al. 2019,
Table 9)."""
NORM_EPS = 1e-5
"""LayerNorm epsilon of the released RoBERTa configs."""
POSITION_OFFSET = 2
"""fairseq's learned positions start after the padding index: 514 positions for 512 tokens."""

# Bytes a bf16 training step keeps per token of one layer, measured on the real module with
# ``saved_tensors_hooks`` (tests/unit/models/test_roberta.py; transformers 5.23, torch 2.13, dropout 0.1), exact
# at five shapes: eager attention keeps 20h + 4f + 6as + 8 (the a·s attention probabilities, their dropout mask and
# the dropped-out copy; two LayerNorms' statistics). On the CPU, SDPA with dropout runs PyTorch's math path, which
# keeps more again (26h + 4f + 12as + 8 measured). On a GPU the fused kernels (flash, memory-efficient) apply the
# dropout from the random generator's state and keep no a·s tensor, only the fp32 log-sum-exp (4a): that is what
# ``sdpa`` here counts, eager's count without the scores, as ViT's SDPA measures against its eager (``vit``); an
# estimate for RoBERTa's dropout, not a measurement.
LAYER_BYTES_PER_HIDDEN = 20.0
LAYER_BYTES_PER_MLP = 4.0
LAYER_BYTES_PER_ROW = 8.0
EAGER_BYTES_PER_SCORE = 6.0
FUSED_BYTES_PER_HEAD = 4.0
CPU_MATH_SDPA_EXTRA = (6.0, 6.0)
"""What the CPU's math path keeps beyond eager, per hidden unit and per query-key pair (measured)."""
CHECKPOINT_BYTES_PER_HIDDEN = 2.0
HEAD_BYTES_PER_HIDDEN = 12.0
"""The masked-LM head per token before its logits, from what each operator saves (not measured): the dense
layer's output and the GELU's (2h each), the LayerNorm's fp32 input (4h) and output (2h), the decoder's input
(2h)."""


def intermediate_size(model: ModelConfig) -> int:
    """MLP width: the config's value, or 4h as in every RoBERTa."""
    return model.intermediate_size if model.intermediate_size is not None else 4 * model.hidden_size


def positions(model: ModelConfig) -> int:
    """Learned positions: ``seq_length`` plus fairseq's offset."""
    return model.seq_length + POSITION_OFFSET


def num_parameters(model: ModelConfig) -> int:
    """Embeddings V·h + (s+2)·h + h (one token type) + LayerNorm 2h; per layer 4h² + 2hf + f + 9h (as GPT-NeoX's:
    q, k, v and output with biases, two LayerNorms, the MLP with biases); the head h² + h + 2h + V (its output
    matrix is the input embedding)."""
    h, f, vocab = model.hidden_size, intermediate_size(model), model.vocab_size
    embeddings = vocab * h + positions(model) * h + h + 2 * h
    layer = 4 * h * h + 2 * h * f + f + 9 * h
    head = h * h + h + 2 * h + vocab
    return embeddings + model.num_layers * layer + head


def layer_forward_flops_per_token(model: ModelConfig) -> float:
    """Forward FLOPs of one layer per token: 2(4h² + 2hf) for the products, 4sh for the scores and their sum of V
    (every query sees every key: the encoder is bidirectional)."""
    h, f = model.hidden_size, intermediate_size(model)
    return float(8 * h * h + 4 * h * f + 4 * model.seq_length * h)


def flops_per_token(model: ModelConfig, recompute: bool = False) -> float:
    """Training FLOPs per token: three times the forward of every layer and of the head (2h² + 2hV, on every
    position); checkpointing reruns every layer's whole forward (its last product feeds the post-LayerNorm, which
    keeps it), as FlopCounterMode shows on the real module."""
    h = model.hidden_size
    layers = model.num_layers * layer_forward_flops_per_token(model)
    head = 2.0 * h * h + 2.0 * h * model.vocab_size
    return 3.0 * (layers + head) + (layers if recompute else 0.0)


def activation_bytes_per_token_per_layer(model: ModelConfig, attention: str, checkpointing: bool) -> float:
    """Bytes one layer keeps per token for backward with 16-bit activations: eager 20h + 4f + 6as + 8, fused
    attention (``sdpa``, ``flash_attention_2``) 20h + 4f + 4a + 8 (see the constants); with checkpointing only the
    layer's input (2h)."""
    h = model.hidden_size
    if checkpointing:
        return CHECKPOINT_BYTES_PER_HIDDEN * h
    common = LAYER_BYTES_PER_HIDDEN * h + LAYER_BYTES_PER_MLP * intermediate_size(model) + LAYER_BYTES_PER_ROW
    if attention == "eager":
        return common + EAGER_BYTES_PER_SCORE * model.num_heads * model.seq_length
    return common + FUSED_BYTES_PER_HEAD * model.num_heads


def logit_bytes_per_token(model: ModelConfig, compiled: bool | str | None = False) -> float:
    """Peak bytes per token of the masked-LM head and its loss: the head's own layers and the logits as a causal
    LM's (``gpt_neox``'s measured bytes per vocabulary entry: the loss upcasts every position's logits)."""
    return HEAD_BYTES_PER_HIDDEN * model.hidden_size + gpt_neox.logit_bytes_per_token(model, compiled)


def largest_weight_elements(model: ModelConfig) -> int:
    """The V×h embedding (tied to the head's output), or an MLP matrix h×f."""
    h = model.hidden_size
    return max(model.vocab_size * h, h * intermediate_size(model))


def synthetic_batch(
    model: ModelConfig, size: int, generator: torch.Generator, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Random token sequences with :data:`MASK_RATE` of their positions as the targets (the rest labelled -100,
    which the loss ignores), as a masked-LM step sees them."""
    import torch

    tokens = torch.randint(0, model.vocab_size, (size, model.seq_length), generator=generator)
    masked = torch.rand((size, model.seq_length), generator=generator) < MASK_RATE
    return {"input_ids": tokens, "labels": torch.where(masked, tokens, torch.full_like(tokens, -100))}


def blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The encoder layers (``roberta.encoder.layer``)."""
    encoder = getattr(getattr(module, "roberta", None), "encoder", None)
    if encoder is None:
        raise ValueError(f"{type(module).__name__} has no roberta.encoder: FSDP cannot wrap its layers")
    return list(encoder.layer)


def config_kwargs(model: ModelConfig) -> Container:
    """RobertaConfig's arguments: RoBERTa's dropout, positions and one token type, no pooler (MLM only)."""
    return {
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "intermediate_size": intermediate_size(model),
        "max_position_embeddings": positions(model),
        "type_vocab_size": 1,
        "hidden_dropout_prob": DROPOUT,
        "attention_probs_dropout_prob": DROPOUT,
        "layer_norm_eps": model.norm_eps if model.norm_eps is not None else NORM_EPS,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "tie_word_embeddings": True,
        "use_cache": False,
    }


def refusals(model: ModelConfig) -> dict[str, str]:
    """Shapes RobertaForMaskedLM cannot build, or fields of other families it would ignore, by key."""
    problems: dict[str, str] = {}
    if model.hidden_size % model.num_heads:
        problems["model.num_heads"] = (
            f"hidden_size={model.hidden_size} is not a multiple of num_heads={model.num_heads}"
        )
    problems.update(unread_fields(model, ("num_kv_heads", "head_dim", *OTHER_FAMILIES_FIELDS)))
    if not model.tie_word_embeddings:
        problems["model.tie_word_embeddings"] = "RoBERTa's MLM head shares the input embedding; use true"
    if model.vocab_size < 3:
        problems["model.vocab_size"] = "RoBERTa reserves token ids 0-2 (<s>, <pad>, </s>); use at least 3"
    return problems


BUILDER = Builder("RobertaConfig", "RobertaForMaskedLM", config_kwargs, refusals)
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
    synthetic_batch=synthetic_batch,
    blocks=blocks,
)
