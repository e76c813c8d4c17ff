"""ConvNeXt: parameters, training FLOPs, activation bytes and the module, from a ModelConfig.

Built from the transformers library's ``ConvNextForImageClassification`` with random weights (timm, where ConvNeXt
was released, needs a torchvision built for the installed torch; see ``vit``). The architecture (Liu et al. 2022,
"A ConvNet for the 2020s", arXiv 2201.03545): a p×p stride-p stem convolution and LayerNorm, four stages of widths
C, 2C, 4C, 8C at 1/4, 1/8, 1/16, 1/32 of the image side, each but the first opened by a LayerNorm and a 2×2
stride-2 convolution; a block is a 7×7 depthwise convolution, a LayerNorm, a 4C MLP with GELU and a learned
layer scale, with stochastic depth on the residual; then a global average pool, a LayerNorm and the linear head.

From the model file: ``hidden_size`` is C, ``stage_depths`` the blocks of each stage (``num_layers`` their sum),
``patch_size`` the stem's p (4), ``image_size`` the input side, ``vocab_size`` the classes. transformers does not
checkpoint ConvNeXt's blocks itself; the builder makes each block checkpointable the way transformers' own layers
are (``Builder.unsupported_checkpointing``), so ``method.activation_checkpointing`` works as for every other
family.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orchestrator.models.images as images
from orchestrator.models.building import Builder, unread_fields

if TYPE_CHECKING:
    from orchestrator.config.schema import MethodConfig, ModelConfig
    from orchestrator.config.values import Container

NORM_EPS = 1e-6
"""LayerNorm epsilon of the released ConvNeXt models."""
DROP_PATH_RATE = 0.1
"""Stochastic depth of ConvNeXt-T on ImageNet-1K (Liu et al. 2022, Table 9: 0.1/0.4/0.5 for T/S/B)."""
LAYER_SCALE_INIT = 1e-6
KERNEL = 7
"""The depthwise convolution's side."""
# Bytes a bf16 training step keeps per position of one block, measured with ``saved_tensors_hooks`` on the real
# module (tests/unit/models/test_vision.py; transformers 5.23, torch 2.13): see block_bytes_per_position.
BLOCK_BYTES_PER_CHANNEL = 24.0
BLOCK_BYTES_PER_ROW = 4.0
DROP_PATH_MASK_BYTES = 2.0
"""A block with stochastic depth keeps its 16-bit keep-or-drop scale, one per image."""


def stage_depths(model: ModelConfig) -> list[int]:
    """Blocks per stage, from ``model.stage_depths`` (``3,3,9,3``)."""
    if model.stage_depths is None:
        raise ValueError(f"model {model.name!r} (convnext): model.stage_depths is required")
    return [int(d) for d in model.stage_depths.split(",")]


def widths(model: ModelConfig) -> list[int]:
    """C, 2C, 4C, 8C: each stage doubles the width."""
    return [model.hidden_size * 2**i for i in range(len(stage_depths(model)))]


def stem(model: ModelConfig) -> int:
    if model.patch_size is None:
        raise ValueError(f"model {model.name!r} (convnext): model.patch_size is required (4 for every ConvNeXt)")
    return model.patch_size


def stage_positions(model: ModelConfig) -> list[int]:
    """Positions (pixels of the feature map) of each stage: (R/p)², then a quarter at each stage."""
    side = images.image_size(model) // stem(model)
    return [(side // 2**i) ** 2 for i in range(len(stage_depths(model)))]


def block_parameters(width: int) -> int:
    """A block: depthwise 49C + C, LayerNorm 2C, MLP 4C² + 4C and 4C² + C, layer scale C: 8C² + 58C."""
    return 8 * width * width + (KERNEL * KERNEL + 9) * width


def num_parameters(model: ModelConfig) -> int:
    """Stem 3p²C + C and its LayerNorm 2C; each later stage's downsampling LayerNorm 2C' and 2×2 convolution
    4C'C + C (C' the previous width); the blocks; the final LayerNorm 2·8C and the head 8C·K + K."""
    p, ws, depths = stem(model), widths(model), stage_depths(model)
    total = images.CHANNELS * p * p * ws[0] + ws[0] + 2 * ws[0]
    for i, (width, depth) in enumerate(zip(ws, depths, strict=True)):
        if i:
            total += 2 * ws[i - 1] + 4 * ws[i - 1] * width + width
        total += depth * block_parameters(width)
    return total + 2 * ws[-1] + ws[-1] * model.vocab_size + model.vocab_size


def block_forward_flops(width: int, positions: int) -> float:
    """A block's forward over a feature map: the depthwise convolution 2·49·C and the MLP 2·8C² a position."""
    return float(positions * (2 * KERNEL * KERNEL * width + 16 * width * width))


def flops_per_sample(model: ModelConfig, recompute: bool = False) -> float:
    """Training FLOPs of one image: three times the forward of the blocks, the downsampling convolutions
    (2·4C'C a position of the smaller map) and the head (2·8C·K), twice the stem's (2·3p²C a position; the pixels
    need no gradient). Checkpointing reruns each block's whole forward (the layer scale keeps its input, the MLP's
    last product). FlopCounterMode on the real module counts this plus its own overcount of a depthwise
    convolution's weight gradient (it multiplies by the C input channels where a group has one: 2·49·C·(C-1) a
    position and block), which the tests take out."""
    p, ws, depths, positions = stem(model), widths(model), stage_depths(model), stage_positions(model)
    blocks_ = sum(d * block_forward_flops(w, n) for w, d, n in zip(ws, depths, positions, strict=True))
    downsampling = sum(2.0 * 4 * ws[i - 1] * ws[i] * positions[i] for i in range(1, len(ws)))
    head = 2.0 * ws[-1] * model.vocab_size
    stem_flops = 2.0 * images.CHANNELS * p * p * ws[0] * positions[0]
    return 3.0 * (blocks_ + downsampling + head) + 2.0 * stem_flops + (blocks_ if recompute else 0.0)


def block_bytes_per_position(width: int) -> float:
    """Bytes a block keeps per position for backward with 16-bit activations, exact at three widths: 24C + 4 (the
    depthwise convolution's input, the LayerNorm's input and statistics, the MLP's inputs, the GELU's 4C input,
    the layer scale's input)."""
    return BLOCK_BYTES_PER_CHANNEL * width + BLOCK_BYTES_PER_ROW


def activation_bytes_per_sample(model: ModelConfig, method: MethodConfig) -> float:
    """Bytes one image adds to a step's peak: every block's bytes over its stage's positions (with checkpointing
    only each block's input, 2C, and one block rebuilt), the stem's and downsampling layers' inputs and outputs
    (4C' + 8 a position, a LayerNorm and a convolution), the pixels (2·3R²) and the logits; fp32 doubles them."""
    ws, depths, positions = widths(model), stage_depths(model), stage_positions(model)
    scale = 2.0 if method.precision == "fp32" else 1.0
    if method.activation_checkpointing:
        kept = sum(d * 2.0 * w * n for w, d, n in zip(ws, depths, positions, strict=True))
        kept += max(block_bytes_per_position(w) * n for w, n in zip(ws, positions, strict=True))
    else:
        kept = sum(d * block_bytes_per_position(w) * n for w, d, n in zip(ws, depths, positions, strict=True))
    transitions = sum((4.0 * w + 8.0) * n for w, n in zip(ws, positions, strict=True))
    kept += DROP_PATH_MASK_BYTES * sum(depths)
    side = images.image_size(model)
    pixels = 2.0 * images.CHANNELS * side * side
    return float((kept + transitions + pixels) * scale + images.LOGIT_BYTES_PER_CLASS * model.vocab_size)


def largest_weight_elements(model: ModelConfig) -> int:
    """The last stage's MLP matrix 8C×32C (4·(8C)²) or the head 8C×K."""
    last = widths(model)[-1]
    return max(4 * last * last, last * model.vocab_size)


def blocks(module: Any) -> list[Any]:
    """The four stages (``convnext.encoder.stages``), what FSDP shards one by one."""
    encoder = getattr(getattr(module, "convnext", None), "encoder", None)
    if encoder is None:
        raise ValueError(f"{type(module).__name__} has no convnext.encoder: FSDP cannot wrap its stages")
    return list(encoder.stages)


def config_kwargs(model: ModelConfig) -> Container:
    """ConvNextConfig's arguments: the stages, ConvNeXt-T's stochastic depth, layer scale and epsilon."""
    return {
        "num_channels": images.CHANNELS,
        "patch_size": stem(model),
        "num_stages": len(stage_depths(model)),
        "hidden_sizes": list(widths(model)),
        "depths": list(stage_depths(model)),
        "hidden_act": "gelu",
        "layer_norm_eps": model.norm_eps if model.norm_eps is not None else NORM_EPS,
        "layer_scale_init_value": LAYER_SCALE_INIT,
        "drop_path_rate": DROP_PATH_RATE,
        "image_size": images.image_size(model),
        "num_labels": model.vocab_size,
    }


def refusals(model: ModelConfig) -> dict[str, str]:
    """Shapes ConvNextForImageClassification cannot build, or fields it would ignore, by key."""
    problems = images.required(model, ("image_size", "patch_size", "stage_depths"))
    if problems:
        return problems
    depths = stage_depths(model)
    if sum(depths) != model.num_layers:
        problems["model.num_layers"] = f"num_layers={model.num_layers} is not the sum of stage_depths ({sum(depths)})"
    reduction = stem(model) * 2 ** (len(depths) - 1)
    if images.image_size(model) % reduction:
        problems["model.image_size"] = (
            f"image_size={model.image_size} is not a multiple of {reduction} (the stem's {stem(model)} and a halving "
            f"at each of the {len(depths) - 1} later stages)"
        )
    if model.num_heads != 1:
        problems["model.num_heads"] = "ConvNeXt has no attention; use 1"
    problems.update(unread_fields(model, ("num_kv_heads", "head_dim", "num_experts", "num_experts_per_token")))
    if model.tie_word_embeddings:
        problems["model.tie_word_embeddings"] = "an image classifier has no word embeddings; use false"
    return problems


def block_layers(module: Any) -> list[Any]:
    """Every block of every stage: what activation checkpointing recomputes one at a time."""
    return [layer for stage in blocks(module) for layer in stage.layers]


BUILDER = Builder(
    "ConvNextConfig",
    "ConvNextForImageClassification",
    config_kwargs,
    refusals,
    has_attention=False,
    unsupported_checkpointing=block_layers,
)
architecture_errors = BUILDER.architecture_errors
build_model_config = BUILDER.build_model_config


build_model = BUILDER.build_model


SAMPLE = images.SAMPLE
THROUGHPUT_UNIT = images.THROUGHPUT_UNIT
COMPUTE_EFFICIENCY = 0.05
"""The share of the dense 16-bit peak the predictor assumes before a record calibrates it (the decoders' 0.54
would put ConvNeXt-T at 6,300 images/s an A100). Its 7×7 depthwise convolutions and LayerNorms are bound by memory
bandwidth, not the matrix units: InceptionNeXt's authors measured ConvNeXt-T training at 575 images/s on an A100
(Yu et al. 2023, arXiv 2303.16900, their README's table, batch 128), i.e. 575 × 2.67e10 FLOPs = 15.4 TFLOP/s, 4.9%
of the A100's 312 TFLOP/s bf16 peak. Not measured by gpudays; data loading is not modelled."""
tokens_per_sample = images.tokens_per_sample
implementation = images.implementation
synthetic_batch = images.synthetic_batch
