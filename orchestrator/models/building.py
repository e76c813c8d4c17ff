"""Building a transformers model (a causal or masked LM, an image classifier) with random weights, the same way
for every family.

A family module names only what is its own: the transformers config and causal-LM classes, the keyword arguments
its config takes, and the shapes it refuses. :class:`Builder` does the rest, once for every family: it refuses a
shape before transformers sees it, makes the config, and builds the module on the device it will run on. A
family module binds the builder's methods to its module-level names (``build_model = BUILDER.build_model``), and a
language family's ``FAMILY`` (``orchestrator.models.sequences.SequenceFamily``) builds through the same ``BUILDER``,
so every family satisfies :class:`orchestrator.models.Family` with the one copy here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import torch
    from transformers import PreTrainedConfig

    from orchestrator.config.schema import ModelConfig
    from orchestrator.config.values import Container


def where(model: ModelConfig) -> str:
    """How a refusal names the model: ``model 'smollm2-135m' (llama)``."""
    return f"model {model.name!r} ({model.family})"


@dataclass(frozen=True)
class Builder:
    """One family's transformers module: its classes, the config's arguments, and the shapes it cannot take.

    ``config_class`` and ``causal_lm_class`` are names in ``transformers`` (imported only when a model is built,
    so planning never imports it). ``config_kwargs`` gives the config's keyword arguments for a model whose shape
    ``refusals`` accepts; ``refusals`` gives, by the key to fix, what is wrong with the shape, each problem in
    words that follow :func:`where`.
    """

    config_class: str
    causal_lm_class: str
    config_kwargs: Callable[[ModelConfig], Container]
    refusals: Callable[[ModelConfig], dict[str, str]]
    has_attention: bool = True
    """False for a model without attention (ConvNeXt): ``method.attention`` is then not passed to the library."""
    unsupported_checkpointing: Callable[[Any], list[Any]] | None = None
    """For a library class that does not checkpoint its layers itself (ConvNeXt): the layers of a built module to
    make checkpointable the way transformers' own layers are."""

    def preload(self) -> None:
        """Import the library's module of the class (transformers imports it lazily, on first use), so that its
        code is loaded before the probe takes the resident set as the CPU's zero of "device memory"."""
        import transformers

        getattr(transformers, self.causal_lm_class)

    def architecture_errors(self, model: ModelConfig) -> dict[str, str]:
        """Shapes the transformers module cannot build, by the key to fix (empty when it can).

        Found at planning time, so a cell that could only fail inside its job is refused before it is submitted.
        """
        return {key: f"{where(model)}: {problem}" for key, problem in self.refusals(model).items()}

    def build_model_config(self, model: ModelConfig, attention: str) -> PreTrainedConfig:
        """The transformers config of the cell's model; a ValueError naming the model when the shape is refused."""
        errors = self.architecture_errors(model)
        if errors:
            raise ValueError(next(iter(errors.values())))
        import transformers

        config: PreTrainedConfig = getattr(transformers, self.config_class)(**self.config_kwargs(model))
        if self.has_attention:
            config._attn_implementation = attention
        return config

    def build_model(
        self,
        model: ModelConfig,
        attention: str,
        dtype: torch.dtype,
        device: torch.device,
        init_context: AbstractContextManager[object] | None = None,
    ) -> torch.nn.Module:
        """A randomly initialised causal LM of the cell's model, nothing downloaded, built where it will run.

        It is built directly on ``device`` in the training dtype: initialising a billion parameters on the host in
        fp32 would take minutes of the probe's time and four bytes a parameter on every rank. ``init_context`` (e.g.
        ``deepspeed.zero.Init`` for ZeRO stage 3) builds it already partitioned, so no rank holds the whole model.
        transformers sets the default dtype to ``dtype`` while it builds. A missing attention implementation
        (flash-attn not installed) raises ImportError.
        """
        import transformers

        config = self.build_model_config(model, attention)
        causal_lm = getattr(transformers, self.causal_lm_class)
        with init_context if init_context is not None else device:
            if self.has_attention:
                module: torch.nn.Module = causal_lm._from_config(config, attn_implementation=attention, dtype=dtype)
            else:
                module = causal_lm._from_config(config, dtype=dtype)
        if self.unsupported_checkpointing is not None:
            for layer in self.unsupported_checkpointing(module):
                checkpointable(layer)
            module.supports_gradient_checkpointing = True  # type: ignore[assignment]
        return module


def checkpointable(layer: Any) -> None:
    """Make ``layer`` run through ``_gradient_checkpointing_func`` once transformers' ``gradient_checkpointing_enable``
    has set its ``gradient_checkpointing`` (what transformers' ``GradientCheckpointingLayer`` does), for a library
    class that does not declare support itself."""
    layer.gradient_checkpointing = False
    forward = layer.forward

    def checkpointed(*args: object, **kwargs: object) -> object:
        if layer.gradient_checkpointing and layer.training:
            return layer._gradient_checkpointing_func(forward, *args, **kwargs)
        return forward(*args, **kwargs)

    layer.forward = checkpointed


OTHER_FAMILIES_FIELDS = ("num_experts", "num_experts_per_token", "image_size", "patch_size", "stage_depths")
"""Fields only the mixture-of-experts and the vision families read."""


def unread_fields(model: ModelConfig, keys: tuple[str, ...] = OTHER_FAMILIES_FIELDS) -> dict[str, str]:
    """A refusal for every one of ``keys`` that ``model`` sets although its family never reads it (a Llama with
    ``num_experts`` would otherwise be costed as a dense model without a word)."""
    return {
        f"model.{key}": f"{key}={getattr(model, key)!r} is not read by this family; leave it null"
        for key in keys
        if getattr(model, key) is not None
    }
