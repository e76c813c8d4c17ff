"""The vision families (ViT, ConvNeXt): formulas against the transformers modules they describe, at full size on
the meta device (parameters) and at a small size on the CPU (FLOPs with FlopCounterMode, bytes with
``saved_tensors_hooks``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from orchestrator.config.schema import MethodConfig, ModelConfig
from orchestrator.models import FAMILIES, convnext, enable_activation_checkpointing, tokens_per_sample, vit

VIT = ModelConfig(
    name="v", family="vit", num_layers=2, hidden_size=64, num_heads=4, vocab_size=10, intermediate_size=256,
    image_size=32, patch_size=8,
)  # fmt: skip
VITS = [
    VIT,
    dataclasses.replace(VIT, hidden_size=96, num_heads=6, intermediate_size=128, patch_size=16),
    dataclasses.replace(VIT, num_heads=2, intermediate_size=128, image_size=48),
]
CONVNEXT = ModelConfig(
    name="c", family="convnext", num_layers=5, hidden_size=8, num_heads=1, vocab_size=10, image_size=32,
    patch_size=4, stage_depths="1,1,2,1",
)  # fmt: skip
CONVNEXTS = [CONVNEXT, dataclasses.replace(CONVNEXT, hidden_size=12, num_layers=4, stage_depths="1,1,1,1")]


def batch_of(family: Any, model: ModelConfig, size: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return dict(family.synthetic_batch(model, size, torch.Generator().manual_seed(0), dtype))


def counted_flops(module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    module.train()
    with FlopCounterMode(display=False) as counter:
        module(**batch).loss.backward()
    return int(counter.get_total_flops())


def saved_bytes_per_sample(module: torch.nn.Module, layer: torch.nn.Module, make: Callable[[int], Any]) -> float:
    """Bytes ``layer`` hands autograd for backward per sample (batches of 2 and 4 differenced; parameters out)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}
    inside = [False]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if inside[0] and t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    hooks = [
        layer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)),
        layer.register_forward_hook(lambda *_: inside.__setitem__(0, False)),
    ]
    totals = []
    module.train()
    try:
        for size in (2, 4):
            seen.clear()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                module(**make(size))
            totals.append(sum(seen.values()))
    finally:
        for hook in hooks:
            hook.remove()
    return (totals[1] - totals[0]) / 2


@pytest.mark.parametrize(
    ("name", "published", "largest"), [("vit-b16", 86e6, 3072 * 768), ("convnext-t", 28e6, 4 * 768 * 768)]
)
def test_parameter_count_is_the_full_size_module_numel(
    name: str, published: float, largest: int, shipped_model: Callable[[str], ModelConfig]
) -> None:
    model = shipped_model(name)
    family = FAMILIES[model.family]
    module = family.build_model(model, "sdpa", torch.bfloat16, torch.device("meta"))
    numel = [p.numel() for p in module.parameters()]
    assert sum(numel) == family.num_parameters(model) == model.num_parameters
    assert max(numel) == family.largest_weight_elements(model) == largest
    assert abs(sum(numel) / published - 1) < 0.03  # the papers round to the million
    assert tokens_per_sample(model) is None and family.THROUGHPUT_UNIT == "images"


def test_published_forward_flops_of_an_image() -> None:
    # Per 224x224 image, forward, in multiply-adds: ViT-B/16 17.6G (DeiT, Table 1), ConvNeXt-T 4.5G (its paper).
    vit_b16 = dataclasses.replace(
        VIT, num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072, image_size=224, patch_size=16,
        vocab_size=1000,
    )  # fmt: skip
    convnext_t = dataclasses.replace(CONVNEXT, hidden_size=96, num_layers=18, stage_depths="3,3,9,3", image_size=224)
    assert vit.flops_per_sample(vit_b16) / 3 / 2 == pytest.approx(17.6e9, rel=0.01)
    assert convnext.flops_per_sample(convnext_t) / 3 / 2 == pytest.approx(4.5e9, rel=0.02)


@pytest.mark.parametrize("model", VITS, ids=["h64", "h96-p16", "img48"])
def test_vit_flops_are_what_the_flop_counter_counts(model: ModelConfig) -> None:
    module = vit.build_model(model, "eager", torch.float32, torch.device("cpu"))
    batch = batch_of(vit, model, 3, torch.float32)
    assert counted_flops(module, batch) == 3 * vit.flops_per_sample(model)
    enable_activation_checkpointing(module)
    assert counted_flops(module, batch) == 3 * vit.flops_per_sample(model, recompute=True)


def depthwise_weight_gradient_overcount(model: ModelConfig) -> float:
    """What FlopCounterMode adds per image to a depthwise convolution's weight gradient: it multiplies by the C
    input channels where each group has one (torch.utils.flop_counter.conv_backward_flop ignores groups there)."""
    widths, depths, positions = convnext.widths(model), convnext.stage_depths(model), convnext.stage_positions(model)
    k2 = convnext.KERNEL**2
    return float(sum(d * 2 * k2 * w * (w - 1) * n for w, d, n in zip(widths, depths, positions, strict=True)))


@pytest.mark.parametrize("model", CONVNEXTS, ids=["c8", "c12"])
def test_convnext_flops_are_what_the_flop_counter_counts(model: ModelConfig) -> None:
    module = convnext.build_model(model, "sdpa", torch.float32, torch.device("cpu"))
    batch = batch_of(convnext, model, 3, torch.float32)
    extra = depthwise_weight_gradient_overcount(model)
    assert counted_flops(module, batch) == 3 * (convnext.flops_per_sample(model) + extra)
    enable_activation_checkpointing(module)
    assert counted_flops(module, batch) == 3 * (convnext.flops_per_sample(model, recompute=True) + extra)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("model", VITS, ids=["h64", "h96-p16", "img48"])
def test_vit_layer_bytes_are_what_autograd_keeps(model: ModelConfig, attention: str) -> None:
    module = vit.build_model(model, attention, torch.bfloat16, torch.device("cpu"))
    layer = module.get_submodule("vit.layers.1")
    measured = saved_bytes_per_sample(module, layer, lambda n: batch_of(vit, model, n, torch.bfloat16))
    assert measured == vit.positions(model) * vit.activation_bytes_per_position(model, attention, False)


@pytest.mark.parametrize("model", CONVNEXTS, ids=["c8", "c12"])
def test_convnext_block_bytes_are_what_autograd_keeps(model: ModelConfig) -> None:
    module = convnext.build_model(model, "sdpa", torch.bfloat16, torch.device("cpu"))
    for stage in range(2):
        layer = module.get_submodule(f"convnext.encoder.stages.{stage}.layers.0")
        measured = saved_bytes_per_sample(module, layer, lambda n: batch_of(convnext, model, n, torch.bfloat16))
        width, positions = convnext.widths(model)[stage], convnext.stage_positions(model)[stage]
        # The first block's stochastic depth is 0 (the rate grows linearly from 0); later blocks keep a mask a sample.
        mask = convnext.DROP_PATH_MASK_BYTES if stage else 0
        assert measured == positions * convnext.block_bytes_per_position(width) + mask


@pytest.mark.parametrize("family", [vit, convnext])
def test_an_image_batch_trains_and_the_blocks_are_what_fsdp_wraps(family: Any) -> None:
    model = VIT if family is vit else CONVNEXT
    module = family.build_model(model, "sdpa", torch.bfloat16, torch.device("cpu"))
    batch = batch_of(family, model, 4, torch.bfloat16)
    assert batch["pixel_values"].dtype == torch.bfloat16 and batch["labels"].max() < model.vocab_size
    assert torch.isfinite(module(**batch).loss)
    assert len(family.blocks(module)) == (model.num_layers if family is vit else 4)
    method = MethodConfig()
    checkpointed = dataclasses.replace(method, activation_checkpointing=True)
    assert family.activation_bytes_per_sample(model, checkpointed) < family.activation_bytes_per_sample(model, method)


def test_shapes_the_vision_modules_cannot_build_are_refused_by_key() -> None:
    assert set(vit.architecture_errors(dataclasses.replace(VIT, patch_size=7, num_kv_heads=2))) == {
        "model.patch_size", "model.num_kv_heads",
    }  # fmt: skip
    assert set(convnext.architecture_errors(dataclasses.replace(CONVNEXT, num_layers=4, num_heads=2))) == {
        "model.num_layers", "model.num_heads",
    }  # fmt: skip
    assert set(convnext.architecture_errors(dataclasses.replace(CONVNEXT, image_size=40))) == {"model.image_size"}
    assert set(vit.architecture_errors(dataclasses.replace(VIT, image_size=None))) == {"model.image_size"}
