"""What the vision families share about their samples: one sample is an RGB image and its class.

An image classifier's throughput is counted in images per second and its training run in epochs over a data set
(``train_steps`` = epochs × the data set's images ÷ the global batch, in its ``conf/model`` file); it has no
tokens, so ``tokens_per_sample`` is None and every figure built on tokens (tokens per parameter, token budgets,
the scaling-law planners) is left empty for it. ``vocab_size`` is the number of classes and ``seq_length`` is not
read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from orchestrator.config.schema import ModelConfig

SAMPLE = "image"
THROUGHPUT_UNIT = "images"
CHANNELS = 3
"""RGB."""
LOGIT_BYTES_PER_CLASS = 12.0
"""Peak bytes per class of an image's logits and loss, as a language model's per vocabulary entry (16-bit logits,
their fp32 copy and its log-softmax; ``gpt_neox.LOGIT_BYTES_PER_ENTRY``): one row per image, so small."""


def tokens_per_sample(model: ModelConfig) -> None:
    """An image is not tokens: None, so that token figures stay empty rather than wrong."""
    return None


def image_size(model: ModelConfig) -> int:
    """The input side in pixels; a ValueError naming the model when the file gives none."""
    if model.image_size is None:
        raise ValueError(f"model {model.name!r} ({model.family}): model.image_size is required for a vision family")
    return model.image_size


def synthetic_batch(
    model: ModelConfig, size: int, generator: torch.Generator, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """``size`` random images (normal pixels, in the training dtype, which the module's first layer takes as they
    are) and random classes in ``[0, vocab_size)``: the keyword arguments of a transformers image classifier."""
    import torch

    side = image_size(model)
    pixels = torch.randn((size, CHANNELS, side, side), generator=generator).to(dtype)
    labels = torch.randint(0, model.vocab_size, (size,), generator=generator)
    return {"pixel_values": pixels, "labels": labels}


def required(model: ModelConfig, keys: tuple[str, ...]) -> dict[str, str]:
    """A refusal for each of ``keys`` the model file leaves null although the family needs it."""
    return {f"model.{key}": f"{key} is required for this family" for key in keys if getattr(model, key) is None}


def implementation(module: object) -> dict[str, str]:
    """Nothing for the library to choose beyond ``method.attention``, which the record holds already."""
    return {}
