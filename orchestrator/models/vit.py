"""Vision Transformer (ViT): parameters, training FLOPs, activation bytes and the module, from a ModelConfig.

Built from the transformers library's ``ViTForImageClassification`` with random weights. timm is where most
vision researchers train ViTs, but it needs torchvision, whose wheels are built for one torch each (a CUDA build of
torchvision does not load beside a CPU torch, as on this project's CPU test machines); transformers' ViT is the
same architecture (Dosovitskiy et al. 2021: a p×p patch embedding by a strided convolution, a class token, learned
positions, pre-LayerNorm encoder layers with biases and a GELU MLP, a final LayerNorm, a linear head on the class
token) and runs SDPA. It has no stochastic depth, which DeiT trains with (drop-path 0.1); that changes no FLOP and
no kept tensor but a mask per sample.

One sample is an image of ``image_size``² pixels: n = (image_size / patch_size)² patches and the class token,
T = n + 1 positions, each a token of the encoder. Notation: L layers, h hidden, f MLP width, a heads, C classes
(``vocab_size``), p patch side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orchestrator.models.images as images
from orchestrator.models.building import Builder, unread_fields

if TYPE_CHECKING:
    from orchestrator.config.schema import MethodConfig, ModelConfig
    from orchestrator.config.values import Container

NORM_EPS = 1e-6
"""LayerNorm epsilon of DeiT and timm's ViTs (``partial(nn.LayerNorm, eps=1e-6)``)."""
# Bytes a bf16 training step keeps per position of one layer, measured with ``saved_tensors_hooks`` on the real
# module (tests/unit/models/test_vision.py; transformers 5.23, torch 2.13): see activation_bytes_per_position.
LAYER_BYTES_PER_HIDDEN = 16.0
LAYER_BYTES_PER_MLP = 4.0
LAYER_BYTES_PER_ROW = 8.0
EAGER_BYTES_PER_SCORE = 6.0
FUSED_BYTES_PER_HEAD = 4.0
CHECKPOINT_BYTES_PER_HIDDEN = 2.0


def num_patches(model: ModelConfig) -> int:
    """n = (image_size / patch_size)²."""
    side = images.image_size(model) // patch_size(model)
    return side * side


def patch_size(model: ModelConfig) -> int:
    if model.patch_size is None:
        raise ValueError(f"model {model.name!r} (vit): model.patch_size is required")
    return model.patch_size


def positions(model: ModelConfig) -> int:
    """T = n + 1: the patches and the class token."""
    return num_patches(model) + 1


def intermediate_size(model: ModelConfig) -> int:
    """MLP width: the config's value, or 4h as in every ViT."""
    return model.intermediate_size if model.intermediate_size is not None else 4 * model.hidden_size


def num_parameters(model: ModelConfig) -> int:
    """Patch embedding 3p²h + h, class token h, positions T·h; per layer 4h² + 2hf + f + 9h (q, k, v, output
    with biases, two LayerNorms, the MLP with biases); final LayerNorm 2h; head hC + C."""
    h, f, p = model.hidden_size, intermediate_size(model), patch_size(model)
    embeddings = images.CHANNELS * p * p * h + h + h + positions(model) * h
    layer = 4 * h * h + 2 * h * f + f + 9 * h
    return embeddings + model.num_layers * layer + 2 * h + h * model.vocab_size + model.vocab_size


def layer_forward_flops_per_position(model: ModelConfig) -> float:
    """Forward FLOPs of one layer per position: 2(4h² + 2hf) for the products and 4Th for the scores and their
    sum of V (every position attends to all T)."""
    h, f = model.hidden_size, intermediate_size(model)
    return float(8 * h * h + 4 * h * f + 4 * positions(model) * h)


def flops_per_sample(model: ModelConfig, recompute: bool = False) -> float:
    """Training FLOPs of one image: three times the forward of the layers (T positions each) and of the head
    (2hC, on the class token only), and twice the patch embedding's (2·3p²h a patch): the pixels need no gradient,
    so its backward computes the weight's alone. Checkpointing reruns each layer's forward except its last product
    (the MLP's output projection feeds only the residual sum), as FlopCounterMode shows on the real module."""
    h, p = model.hidden_size, patch_size(model)
    layers = model.num_layers * positions(model) * layer_forward_flops_per_position(model)
    patch = 2.0 * images.CHANNELS * p * p * h * num_patches(model)
    head = 2.0 * h * model.vocab_size
    out = 3.0 * (layers + head) + 2.0 * patch
    if recompute:
        out += layers - model.num_layers * positions(model) * 2.0 * h * intermediate_size(model)
    return out


def activation_bytes_per_position(model: ModelConfig, attention: str, checkpointing: bool) -> float:
    """Bytes one layer keeps per position for backward with 16-bit activations, exact at seven shapes: eager
    16h + 4f + 6aT + 8 (two LayerNorms' inputs and statistics, q/k/v, the attention output, the a·T probabilities
    in fp32 and in 16 bits, the GELU's input and output); SDPA 16h + 4f + 4a + 8 (the fp32 log-sum-exp instead of
    the probabilities; the CPU's flash kernel keeps what the GPU's does); with checkpointing the layer's input
    (2h)."""
    h = model.hidden_size
    if checkpointing:
        return CHECKPOINT_BYTES_PER_HIDDEN * h
    common = LAYER_BYTES_PER_HIDDEN * h + LAYER_BYTES_PER_MLP * intermediate_size(model) + LAYER_BYTES_PER_ROW
    if attention == "eager":
        return common + EAGER_BYTES_PER_SCORE * model.num_heads * positions(model)
    return common + FUSED_BYTES_PER_HEAD * model.num_heads


def activation_bytes_per_sample(model: ModelConfig, method: MethodConfig) -> float:
    """Bytes one image adds to a step's peak: T positions of every layer (doubled in fp32), the patch embedding's
    output (2Th) and the head's logits; with checkpointing each layer keeps its input and one is rebuilt."""
    attention, ckpt = method.attention, method.activation_checkpointing
    scale = 2.0 if method.precision == "fp32" else 1.0
    per_layer = activation_bytes_per_position(model, attention, ckpt) * positions(model) * scale
    layers = model.num_layers * per_layer
    if ckpt:
        layers += activation_bytes_per_position(model, attention, False) * positions(model) * scale
    embedding = 2.0 * positions(model) * model.hidden_size * scale
    return float(layers + embedding + images.LOGIT_BYTES_PER_CLASS * model.vocab_size)


def largest_weight_elements(model: ModelConfig) -> int:
    """An MLP matrix h×f, the head h×C, or the positions T×h."""
    h = model.hidden_size
    return max(h * intermediate_size(model), h * model.vocab_size, positions(model) * h)


def blocks(module: object) -> list[object]:
    """The encoder layers (``vit.layers`` in transformers 5)."""
    layers = getattr(getattr(module, "vit", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(module).__name__} has no vit.layers: FSDP cannot wrap its layers")
    return list(layers)


def config_kwargs(model: ModelConfig) -> Container:
    """ViTConfig's arguments: DeiT's LayerNorm epsilon, no dropout (DeiT trains without), the class-token head."""
    return {
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "intermediate_size": intermediate_size(model),
        "image_size": images.image_size(model),
        "patch_size": patch_size(model),
        "num_channels": images.CHANNELS,
        "num_labels": model.vocab_size,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": model.norm_eps if model.norm_eps is not None else NORM_EPS,
        "qkv_bias": True,
    }


def refusals(model: ModelConfig) -> dict[str, str]:
    """Shapes ViTForImageClassification cannot build, or fields it would ignore, by key."""
    problems = images.required(model, ("image_size", "patch_size"))
    if model.hidden_size % model.num_heads:
        problems["model.num_heads"] = (
            f"hidden_size={model.hidden_size} is not a multiple of num_heads={model.num_heads}"
        )
    if not problems and model.image_size is not None and model.patch_size is not None:
        if model.image_size % model.patch_size:
            problems["model.patch_size"] = (
                f"image_size={model.image_size} is not a multiple of patch_size={model.patch_size}"
            )
    problems.update(
        unread_fields(model, ("num_kv_heads", "head_dim", "num_experts", "num_experts_per_token", "stage_depths"))
    )
    if model.tie_word_embeddings:
        problems["model.tie_word_embeddings"] = "an image classifier has no word embeddings; use false"
    return problems


BUILDER = Builder("ViTConfig", "ViTForImageClassification", config_kwargs, refusals)
architecture_errors = BUILDER.architecture_errors
build_model_config = BUILDER.build_model_config
build_model = BUILDER.build_model

SAMPLE = images.SAMPLE
THROUGHPUT_UNIT = images.THROUGHPUT_UNIT
COMPUTE_EFFICIENCY = 0.21
"""The share of the dense 16-bit peak the predictor assumes before a record calibrates it (the decoders' is
``analysis.predict.step_time.DEFAULT_EFFICIENCY``, 0.54). From DeiT's published run (Touvron et al. 2021, arXiv 2012.12877,
section 6: DeiT-B, 300 epochs, 53 hours on one node of 8 V100s): 300 × 1,281,167 images × 1.052e11 FLOPs each
over 53 h × 8 GPUs is 26.5 TFLOP/s a GPU, 21% of the V100's 125 TFLOP/s fp16 peak, data loading and
augmentation included (which the step model does not otherwise count). Not measured by gpudays."""
tokens_per_sample = images.tokens_per_sample
implementation = images.implementation
synthetic_batch = images.synthetic_batch
