"""What every language-model family shares about its samples: one sample is a sequence of ``seq_length`` tokens.

A family whose sample is a token sequence (the decoders, the masked-language encoder, the state-space models)
counts its figures per token; :class:`SequenceFamily` turns them into the per-sample figures the
:class:`orchestrator.models.Family` protocol asks for, makes the probe's synthetic token batches and names the
blocks an engine wraps. Each such family module builds its ``FAMILY`` from its own arithmetic and builder (what
``orchestrator.models.FAMILIES`` registers), so none repeats the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import torch
    from transformers import PreTrainedConfig

    from orchestrator.config.schema import MethodConfig, ModelConfig
    from orchestrator.models.building import Builder

SAMPLE = "sequence"
"""What one sample of a language model is: a sequence of ``model.seq_length`` tokens."""
THROUGHPUT_UNIT = "tokens"
"""A language model's throughput is counted in tokens per second."""


class FlopsPerToken(Protocol):
    """A family's training FLOPs per token (``recompute``: with what activation checkpointing reruns)."""

    def __call__(self, model: ModelConfig, recompute: bool = False) -> float: ...


class LayerBytesPerToken(Protocol):
    """A family's bytes one layer keeps per token for the backward pass in 16-bit training."""

    def __call__(self, model: ModelConfig, attention: str, checkpointing: bool) -> float: ...


def compiled_loss(method: MethodConfig) -> str | None:
    """How the loss is compiled: the method's ``compile_scope`` where it compiles, else None (eager)."""
    return method.compile_scope if method.compile else None


class LogitBytesPerToken(Protocol):
    """A family's peak bytes per token of the output logits and the loss."""

    def __call__(self, model: ModelConfig, compiled: bool | str | None = False) -> float: ...


class SyntheticBatch(Protocol):
    """``size`` random samples with their labels, as the keyword arguments of the module's forward."""

    def __call__(
        self, model: ModelConfig, size: int, generator: torch.Generator, dtype: torch.dtype
    ) -> dict[str, torch.Tensor]: ...


def tokens_per_sample(model: ModelConfig) -> int:
    """Tokens one sequence trains on: ``model.seq_length``."""
    return model.seq_length


def flops_per_sample(flops_per_token: FlopsPerToken, model: ModelConfig, recompute: bool = False) -> float:
    """Training FLOPs of one sequence: the family's FLOPs per token times ``seq_length``."""
    return float(model.seq_length * flops_per_token(model, recompute))


def activation_bytes_per_sample(
    layer_bytes: LayerBytesPerToken,
    logit_bytes: LogitBytesPerToken,
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
    logits = logit_bytes(model, compiled_loss(method)) * seq
    if not method.activation_checkpointing:
        return float(layers + logits)
    rebuilt = layer_bytes(model, method.attention, False) * seq * scale
    return float(layers + max(logits, rebuilt))


def causal_lm_batch(
    model: ModelConfig, size: int, generator: torch.Generator, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """``size`` sequences of random tokens, each its own labels (the causal-LM loss shifts them): the keyword
    arguments of the module's forward. ``dtype`` (the training dtype) is for families with floating inputs."""
    import torch

    tokens = torch.randint(0, model.vocab_size, (size, model.seq_length), generator=generator)
    return {"input_ids": tokens, "labels": tokens}


def decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (``base_model.layers``), what FSDP shards one by one."""
    layers = getattr(getattr(module, "base_model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(module).__name__} has no base_model.layers: FSDP cannot wrap its layers")
    return list(layers)


def nothing_chosen(module: object) -> dict[str, str]:
    """Nothing for the library to choose beyond ``method.attention``, which the record holds already."""
    return {}


@dataclass(frozen=True, kw_only=True)
class SequenceFamily:
    """A family whose sample is a sequence of ``seq_length`` tokens, built from its figures per token: it is an
    :class:`orchestrator.models.LanguageFamily` (and so a ``Family``).

    The family module gives its own arithmetic (parameters, FLOPs and activation bytes per token, the largest
    weight) and its :class:`~orchestrator.models.building.Builder`; the per-sample figures are the per-token ones
    times ``seq_length`` (:func:`flops_per_sample`, :func:`activation_bytes_per_sample`). A family gives its own
    batch, blocks or implementation only where they differ from a causal LM's. ``CPU_ONEDNN`` and ``PLAN_CAVEAT``
    are read by name where a family has them (``orchestrator.job.ranks``, ``orchestrator.cli.display.preview``).
    """

    BUILDER: Builder
    num_parameters: Callable[[ModelConfig], int]
    flops_per_token: FlopsPerToken
    activation_bytes_per_token_per_layer: LayerBytesPerToken
    logit_bytes_per_token: LogitBytesPerToken
    largest_weight_elements: Callable[[ModelConfig], int]
    synthetic_batch: SyntheticBatch = causal_lm_batch
    blocks: Callable[[torch.nn.Module], list[torch.nn.Module]] = decoder_layers
    implementation: Callable[[torch.nn.Module], dict[str, str]] = nothing_chosen
    CPU_ONEDNN: bool = True
    """False for a family whose CPU matrix products must not use oneDNN (a mixture of experts: ``moe.CPU_ONEDNN``)."""
    PLAN_CAVEAT: str | None = None
    """What ``gpudays plan`` says under the predictions of the family's cells, where they leave something out."""
    SAMPLE: str = field(default=SAMPLE, init=False)
    THROUGHPUT_UNIT: str = field(default=THROUGHPUT_UNIT, init=False)

    def tokens_per_sample(self, model: ModelConfig) -> int:
        """Tokens one sequence trains on: ``model.seq_length``."""
        return tokens_per_sample(model)

    def flops_per_sample(self, model: ModelConfig, recompute: bool = False) -> float:
        """Training FLOPs of one sequence: the family's FLOPs per token times ``seq_length``."""
        return flops_per_sample(self.flops_per_token, model, recompute)

    def activation_bytes_per_sample(self, model: ModelConfig, method: MethodConfig) -> float:
        """Bytes one sequence adds to a step's peak, from the family's layer and logit bytes per token."""
        return activation_bytes_per_sample(
            self.activation_bytes_per_token_per_layer, self.logit_bytes_per_token, model, method
        )

    def architecture_errors(self, model: ModelConfig) -> dict[str, str]:
        """Shapes the library's module cannot build, by the key to fix (the builder's)."""
        return self.BUILDER.architecture_errors(model)

    def build_model_config(self, model: ModelConfig, attention: str) -> PreTrainedConfig:
        """The library's config of the model (the builder's)."""
        return self.BUILDER.build_model_config(model, attention)

    def build_model(
        self,
        model: ModelConfig,
        attention: str,
        dtype: torch.dtype,
        device: torch.device,
        init_context: AbstractContextManager[object] | None = None,
    ) -> torch.nn.Module:
        """The randomly initialised module (the builder's)."""
        return self.BUILDER.build_model(model, attention, dtype, device, init_context)
