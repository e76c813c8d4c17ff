"""What every language-model family shares about its samples: one sample is a sequence of ``seq_length`` tokens.

A family whose sample is a token sequence (the decoders, the masked-language encoder, the state-space models)
counts its figures per token; this module turns them into the per-sample figures the :class:`Family` protocol
asks for, makes the probe's synthetic token batches and names the blocks an engine wraps. Each such family binds
these in a few lines (``tokens_per_sample = sequences.tokens_per_sample``), so none repeats them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from orchestrator.config.schema import MethodConfig, ModelConfig

SAMPLE = "sequence"
"""What one sample of a language model is: a sequence of ``model.seq_length`` tokens."""
THROUGHPUT_UNIT = "tokens"
"""A language model's throughput is counted in tokens per second."""


def tokens_per_sample(model: ModelConfig) -> int:
    """Tokens one sequence trains on: ``model.seq_length``."""
    return model.seq_length


def flops_per_sample(
    flops_per_token: Callable[[ModelConfig, bool], float], model: ModelConfig, recompute: bool = False
) -> float:
    """Training FLOPs of one sequence: the family's FLOPs per token times ``seq_length``."""
    return float(model.seq_length * flops_per_token(model, recompute))


def activation_bytes_per_sample(
    layer_bytes: Callable[[ModelConfig, str, bool], float],
    logit_bytes: Callable[[ModelConfig, bool], float],
    model: ModelConfig,
    method: MethodConfig,
) -> float:
    """Bytes of the activations one sequence adds to the peak of a training step (logits and loss included).

    ``layer_bytes`` is the family's bytes per token a layer keeps, ``logit_bytes`` its peak bytes per token of the
    output and the loss. Without checkpointing the peak comes at the loss, with every layer's activations still
    held: ``L × layer + logits``. With full checkpointing each layer keeps only its input, and the peak is the
    larger of the loss and one layer being rebuilt in the backward pass (measured on the CPU: the two never
    coincide). fp32 doubles the layers' bytes; the logits' peak is already counted in fp32 entries. The engine
    does not change them.
    """
    seq = model.seq_length
    kept = layer_bytes(model, method.attention, method.activation_checkpointing)
    scale = 2.0 if method.precision == "fp32" else 1.0
    layers = model.num_layers * kept * seq * scale
    logits = logit_bytes(model, bool(method.compile)) * seq
    if not method.activation_checkpointing:
        return float(layers + logits)
    rebuilt = layer_bytes(model, method.attention, False) * seq * scale
    return float(layers + max(logits, rebuilt))


def synthetic_batch(
    model: ModelConfig, size: int, generator: torch.Generator, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """``size`` sequences of random tokens, each its own labels (the causal-LM loss shifts them): the keyword
    arguments of the module's forward. ``dtype`` (the training dtype) is for families with floating inputs."""
    import torch

    tokens = torch.randint(0, model.vocab_size, (size, model.seq_length), generator=generator)
    return {"input_ids": tokens, "labels": tokens}


def decoder_layers(module: Any) -> list[Any]:
    """The decoder layers of a transformers causal LM (``base_model.layers``), what FSDP shards one by one."""
    layers = getattr(getattr(module, "base_model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(module).__name__} has no base_model.layers: FSDP cannot wrap its layers")
    return list(layers)


def implementation(module: object) -> dict[str, str]:
    """Nothing for the library to choose beyond ``method.attention``, which the record holds already."""
    return {}
