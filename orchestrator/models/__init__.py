"""Model families: one module per family holds all of that family's arithmetic and its builder.

A family module owns, for its architecture, everything :class:`Family` lists: the parameter count, training FLOPs
per token (with and without activation recomputation), activation and logit bytes per token, the largest single
weight, and the shapes it refuses. Its three builder functions (``architecture_errors``, ``build_model_config``,
``build_model``) are the methods of its ``BUILDER``, a :class:`building.Builder` that names the family's
transformers classes, config arguments and refusals; the building itself is written once, there. The probe, the
engines' memory models, the predictor and the report import these from here; nothing else repeats them. A family
whose sample is a token sequence registers the ``FAMILY`` its module builds from its arithmetic per token
(:class:`sequences.SequenceFamily`); an image family's module satisfies :class:`Family` itself. Adding a family is
one module here, one entry in ``FAMILIES`` and its ``conf/model`` files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

from orchestrator.models import (
    convnext,
    gpt_neox,
    llama,
    mamba,
    mixtral,
    olmo2,
    olmoe,
    qwen3,
    roberta,
    sequences,
    vit,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    import torch
    from transformers import PreTrainedConfig

    from orchestrator.config.schema import GpuConfig, MethodConfig, ModelConfig

    CheckpointContexts = Callable[[], tuple[AbstractContextManager[None], AbstractContextManager[None]]]
    """``torch.utils.checkpoint``'s ``context_fn``: the contexts the forward and its recomputation run in."""


class Family(Protocol):
    """What a model family module provides; every function is pure arithmetic except the builders and the batch.

    A family says what one of its samples is (``SAMPLE``: a ``sequence`` of tokens or an ``image``) and in which
    unit its throughput is counted (``THROUGHPUT_UNIT``: ``tokens`` or ``images``); its FLOPs and activation bytes
    are per sample, and ``tokens_per_sample`` is None where a token count means nothing (an image classifier), so
    that every figure built on tokens (tokens per parameter, token budgets) is left empty for it, never wrong.
    """

    @property
    def SAMPLE(self) -> str:
        """What one sample is: ``sequence`` or ``image``."""
        ...

    @property
    def THROUGHPUT_UNIT(self) -> str:
        """What the throughput is counted in: ``tokens`` or ``images``."""
        ...

    def num_parameters(self, model: ModelConfig) -> int:
        """Parameters of the architecture, every expert included (checked against the built module's ``numel``)."""
        ...

    def tokens_per_sample(self, model: ModelConfig) -> int | None:
        """Tokens one sample trains on (``seq_length``); None for a family whose sample is not tokens."""
        ...

    def flops_per_sample(self, model: ModelConfig, recompute: bool = False) -> float:
        """Training FLOPs (forward + backward) of one sample, only the experts it is routed to; ``recompute`` adds
        what activation checkpointing reruns."""
        ...

    def activation_bytes_per_sample(self, model: ModelConfig, method: MethodConfig) -> float:
        """Bytes one sample adds to the peak of a training step under ``method`` (its output and loss included)."""
        ...

    def architecture_errors(self, model: ModelConfig) -> dict[str, str]:
        """Shapes the library's module cannot build, by the key to fix (empty when it can)."""
        ...

    def largest_weight_elements(self, model: ModelConfig) -> int:
        """Elements of the largest single weight (what ZeRO-3 gathers at once)."""
        ...

    def build_model_config(self, model: ModelConfig, attention: str) -> PreTrainedConfig:
        """The library's config of the model."""
        ...

    def build_model(
        self,
        model: ModelConfig,
        attention: str,
        dtype: torch.dtype,
        device: torch.device,
        init_context: AbstractContextManager[object] | None = None,
    ) -> torch.nn.Module:
        """The randomly initialised module."""
        ...

    def synthetic_batch(
        self, model: ModelConfig, size: int, generator: torch.Generator, dtype: torch.dtype
    ) -> dict[str, torch.Tensor]:
        """``size`` random samples with their labels, as the keyword arguments of the module's forward (which
        returns the loss); floating inputs (pixels) in ``dtype``."""
        ...

    def blocks(self, module: torch.nn.Module) -> list[torch.nn.Module]:
        """The repeated blocks of a built module (the layers FSDP shards one by one)."""
        ...

    def implementation(self, module: torch.nn.Module) -> dict[str, str]:
        """Which of the library's code paths the built module runs where the library chooses one (a mixture of
        experts' routing kernel, Mamba's fused or reference scan): the record's ``model_implementation``."""
        ...


class LanguageFamily(Family, Protocol):
    """A family whose sample is a token sequence, with its figures per token: what the scaling-law planners
    (``budget``, ``shortest``) and the tensor/pipeline layouts read."""

    def flops_per_token(self, model: ModelConfig, recompute: bool = False) -> float:
        """Training FLOPs (forward + backward) per token; ``recompute`` adds what activation checkpointing reruns."""
        ...

    def activation_bytes_per_token_per_layer(self, model: ModelConfig, attention: str, checkpointing: bool) -> float:
        """Bytes one layer keeps per token for the backward pass in 16-bit training."""
        ...

    def logit_bytes_per_token(self, model: ModelConfig, compiled: bool | str | None = False) -> float:
        """Peak bytes per token of the output logits and the loss."""
        ...


FAMILIES: dict[str, Family] = {
    "gpt_neox": gpt_neox.FAMILY,
    "llama": llama.FAMILY,
    "qwen3": qwen3.FAMILY,
    "olmo2": olmo2.FAMILY,
    "roberta": roberta.FAMILY,
    "vit": cast(Family, vit),
    "convnext": cast(Family, convnext),
    "olmoe": olmoe.FAMILY,
    "mamba": mamba.FAMILY,
    "mixtral": mixtral.FAMILY,
}
"""``model.family`` in a ``conf/model`` file → what implements it: a language family's ``FAMILY``
(:class:`sequences.SequenceFamily`, built from its module's arithmetic), an image family's module itself."""


def family_module(name: str) -> Family:
    """The module of family ``name``; a ValueError that lists the known families otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(sorted(FAMILIES))}") from None


def parameter_count_error(model: ModelConfig) -> str | None:
    """Why the published ``model.num_parameters`` is wrong, or None when it is absent or equals the formula.

    The count is derived from the architecture everywhere; a published figure in ``conf/model`` is only a check
    that the architecture was copied right, so a figure that disagrees is an error, never an input.
    """
    if model.num_parameters is None:
        return None
    computed = num_parameters(model)
    if int(model.num_parameters) == computed:
        return None
    return (
        f"model {model.name!r}: model.num_parameters={model.num_parameters} disagrees with its architecture "
        f"({model.num_layers} layers, hidden {model.hidden_size}, vocabulary {model.vocab_size}), which has "
        f"{computed} parameters; the count is derived: drop the key (model.num_parameters=null) or fix the architecture"
    )


def config_errors(model: ModelConfig) -> dict[str, str]:
    """Problems with a ``conf/model`` entry, by the key to fix: an unknown ``model.family``, a shape its family
    cannot build, or a published ``model.num_parameters`` that disagrees with the architecture. Empty when none."""
    if model.family not in FAMILIES:
        return {"model.family": f"{model.family!r} is not a known family; use one of {', '.join(sorted(FAMILIES))}"}
    errors = FAMILIES[model.family].architecture_errors(model)
    if errors:
        return errors  # the parameter count of a shape that cannot be built means nothing
    error = parameter_count_error(model)
    return {"model.num_parameters": error} if error else {}


def check_num_parameters(model: ModelConfig) -> None:
    """Raise a ValueError naming ``model.num_parameters`` when the published figure disagrees (see above)."""
    error = parameter_count_error(model)
    if error:
        raise ValueError(error)


def num_parameters(model: ModelConfig) -> int:
    """Parameters of ``model``, by its family's formula."""
    return int(family_module(model.family).num_parameters(model))


def language_family(model: ModelConfig, purpose: str) -> LanguageFamily:
    """The family of ``model`` when its samples are token sequences; a ValueError saying that ``purpose`` covers
    language models only otherwise (a ViT has no tokens for a scaling law to count)."""
    family = family_module(model.family)
    if family.SAMPLE != sequences.SAMPLE or not hasattr(family, "flops_per_token"):
        raise ValueError(
            f"model {model.name!r} ({model.family}) trains on {family.SAMPLE}s, not token sequences: {purpose} "
            f"covers language models only (families {', '.join(language_families())})"
        )
    return cast(LanguageFamily, family)


SCALING_LAW_FAMILIES = ("gpt_neox", "llama", "qwen3", "olmo2")
"""The families the scaling-law planners (``budget``, ``shortest``) cover: dense decoder-only language models, what
Chinchilla's compute-optimal fit and Kaplan's critical batch were measured on, and what their tensor/pipeline
layouts split. An encoder, a state-space model, a mixture of experts or an image classifier follows other laws."""


def scaling_law_error(model: ModelConfig, planner: str) -> str | None:
    """Why ``planner`` cannot plan ``model`` (its family is outside :data:`SCALING_LAW_FAMILIES`), or None."""
    if model.family in SCALING_LAW_FAMILIES:
        return None
    family = family_module(model.family)
    return (
        f"model {model.name!r} is of family {model.family!r} ({family.SAMPLE}s in, {family.THROUGHPUT_UNIT}/s): "
        f"{planner}'s scaling-law arithmetic covers dense decoder-only language models only (families "
        f"{', '.join(SCALING_LAW_FAMILIES)}); measure or plan it with `gpudays sweep` / `gpudays plan`"
    )


def language_families() -> list[str]:
    """The families whose samples are token sequences."""
    return sorted(name for name, f in FAMILIES.items() if f.SAMPLE == sequences.SAMPLE)


def flops_per_token(model: ModelConfig, recompute: bool = False) -> float:
    """Training FLOPs (forward and backward) per token of a language model; ``recompute`` adds what activation
    checkpointing reruns. A ValueError for a family whose sample is not tokens."""
    return float(language_family(model, "FLOPs per token").flops_per_token(model, recompute))


def flops_per_sample(model: ModelConfig, recompute: bool = False) -> float:
    """Training FLOPs (forward and backward) of one sample (a sequence, an image) of ``model``."""
    return float(family_module(model.family).flops_per_sample(model, recompute))


def tokens_per_sample(model: ModelConfig) -> int | None:
    """Tokens one sample of ``model`` trains on; None where its samples are not tokens (images)."""
    return family_module(model.family).tokens_per_sample(model)


def throughput_unit(model: ModelConfig) -> str:
    """What ``model``'s throughput is counted in: ``tokens`` or ``images``."""
    return family_module(model.family).THROUGHPUT_UNIT


def implementation(model: ModelConfig, module: torch.nn.Module) -> dict[str, str]:
    """``model``'s family's :meth:`Family.implementation` of a built ``module`` (empty where nothing is chosen)."""
    return family_module(model.family).implementation(module)


def enable_activation_checkpointing(module: Any, context_fn: CheckpointContexts | None = None) -> None:
    """Recompute each layer (block) in the backward pass (transformers' own checkpointing, non-reentrant).

    ``module`` is a transformers PreTrainedModel of any family here. ``context_fn``: ``torch.utils.checkpoint``'s,
    where only some of a layer's operators are recomputed (selective checkpointing); None recomputes all of them.
    """
    kwargs: dict[str, bool | CheckpointContexts] = {"use_reentrant": False}
    if context_fn is not None:
        kwargs["context_fn"] = context_fn
    if hasattr(module, "activation_checkpointing_enable"):  # transformers >= 5
        module.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def peak_tflops(gpu: GpuConfig, method: MethodConfig) -> float | None:
    """The GPU's dense peak for the precision the matrix products run in, or None where it has none.

    bf16 and fp16 use the tensor-core peak of that type; fp32 uses the TF32 tensor peak when TF32 is allowed and
    the GPU has it, else the plain fp32 peak.
    """
    if method.precision == "bf16":
        return gpu.peak_tflops_bf16
    if method.precision == "fp16":
        return gpu.peak_tflops_fp16
    if method.tf32 and gpu.supports_tf32 and gpu.peak_tflops_tf32:
        return gpu.peak_tflops_tf32
    return gpu.peak_tflops_fp32
