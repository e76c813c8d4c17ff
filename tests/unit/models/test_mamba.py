"""Mamba: the formulas against transformers' MambaForCausalLM (its reference path on the CPU)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from orchestrator.config.schema import ModelConfig
from orchestrator.models import enable_activation_checkpointing, mamba

TINY = ModelConfig(
    name="tiny", family="mamba", num_layers=2, hidden_size=32, num_heads=1, vocab_size=256, tie_word_embeddings=True,
    seq_length=16,
)  # fmt: skip
SHAPES = [TINY, dataclasses.replace(TINY, hidden_size=48, seq_length=8), dataclasses.replace(TINY, hidden_size=64)]
PUBLISHED = {"mamba-130m": 130e6, "mamba-370m": 370e6, "mamba-790m": 790e6, "mamba-1.4b": 1.4e9, "mamba-2.8b": 2.8e9}
"""The released sizes (Gu and Dao 2023, Table 3)."""


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_is_the_full_size_module_numel(name: str, shipped_model: Callable[[str], ModelConfig]) -> None:
    model = shipped_model(name)
    module = mamba.build_model(model, "sdpa", torch.bfloat16, torch.device("meta"))
    numel = [p.numel() for p in module.parameters()]
    assert sum(numel) == mamba.num_parameters(model) == model.num_parameters
    assert max(numel) == mamba.largest_weight_elements(model)
    assert sum(numel) == pytest.approx(PUBLISHED[name], rel=0.03)


def counted(model: ModelConfig, checkpointing: bool) -> dict[str, float]:
    module = mamba.build_model(model, "sdpa", torch.float32, torch.device("cpu"))
    if checkpointing:
        enable_activation_checkpointing(module)
    module.train()
    batch = mamba.FAMILY.synthetic_batch(model, 3, torch.Generator().manual_seed(0), torch.float32)
    with FlopCounterMode(display=False) as counter:
        module(**batch).loss.backward()
    return {str(op): float(n) for op, n in counter.get_flop_counts()["Global"].items()}


@pytest.mark.parametrize("model", SHAPES, ids=["h32", "h48-s8", "h64"])
def test_flops_are_what_the_flop_counter_counts(model: ModelConfig) -> None:
    # The products exactly; the convolution's forward exactly. Its backward is left out of the comparison:
    # FlopCounterMode multiplies a depthwise convolution's weight gradient by the E channels (it ignores groups).
    tokens = 3 * model.seq_length
    conv = model.num_layers * mamba.conv_forward_flops_per_token(model)
    for checkpointing in (False, True):
        ops = counted(model, checkpointing)
        products = ops["aten.mm"] + ops["aten.bmm"]
        passes = 4 if checkpointing else 3
        assert products == tokens * (mamba.flops_per_token(model, checkpointing) - passes * conv)
        assert ops["aten.convolution"] == tokens * conv * (passes - 2)
    assert mamba.flops_per_token(model, True) < 4 / 3 * mamba.flops_per_token(model)


@pytest.mark.parametrize("model", SHAPES, ids=["h32", "h48-s8", "h64"])
def test_activation_bytes_are_what_autograd_keeps(
    model: ModelConfig, saved_bytes_per_token: Callable[..., float]
) -> None:
    module = mamba.build_model(model, "sdpa", torch.bfloat16, torch.device("cpu"))
    measured = saved_bytes_per_token(
        module, module.get_submodule("backbone.layers.1"), model.vocab_size, model.seq_length
    )
    assert measured == pytest.approx(mamba.activation_bytes_per_token_per_layer(model, "sdpa"), abs=1e-6)


def test_the_record_says_the_reference_path_ran_on_the_cpu() -> None:
    module = mamba.build_model(TINY, "sdpa", torch.float32, torch.device("cpu"))
    assert mamba.implementation(module) == {"mamba_scan": "reference"}
    assert len(mamba.FAMILY.blocks(module)) == TINY.num_layers
    assert set(mamba.architecture_errors(dataclasses.replace(TINY, num_heads=4, num_kv_heads=2))) == {
        "model.num_heads", "model.num_kv_heads",
    }  # fmt: skip
