"""RoBERTa family: the formulas against transformers' RobertaForMaskedLM they describe."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from orchestrator.config.schema import ModelConfig
from orchestrator.models import enable_activation_checkpointing, roberta

TINY = ModelConfig(
    name="tiny",
    family="roberta",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    vocab_size=512,
    intermediate_size=256,
    tie_word_embeddings=True,
    seq_length=64,
)
SHAPES = [TINY, dataclasses.replace(TINY, hidden_size=96, num_heads=6, intermediate_size=128, seq_length=32)]


@pytest.mark.parametrize("name", ["roberta-base", "roberta-large"])
def test_parameter_count_is_the_full_size_module_numel(name: str, shipped_model: Callable[[str], ModelConfig]) -> None:
    model = shipped_model(name)
    module = roberta.build_model(model, "sdpa", torch.bfloat16, torch.device("meta"))
    numel = [p.numel() for p in module.parameters()]
    assert sum(numel) == roberta.num_parameters(model) == model.num_parameters
    assert max(numel) == roberta.largest_weight_elements(model) == 50_265 * model.hidden_size
    published = {"roberta-base": 125e6, "roberta-large": 355e6}[name]  # fairseq's README
    assert abs(roberta.num_parameters(model) / published - 1) < 0.005


def counted_flops(module: torch.nn.Module, model: ModelConfig, batch: int) -> int:
    module.train()
    inputs = roberta.synthetic_batch(model, batch, torch.Generator().manual_seed(0), torch.float32)
    with FlopCounterMode(display=False) as counter:
        module(**inputs).loss.backward()
    return int(counter.get_total_flops())


@pytest.mark.parametrize("model", SHAPES, ids=["h64", "h96"])
def test_flops_are_what_the_flop_counter_counts(model: ModelConfig) -> None:
    # Eager attention (the CPU's SDPA has no FLOP formula); the MLM head runs on every position.
    module = roberta.build_model(model, "eager", torch.float32, torch.device("cpu"))
    assert counted_flops(module, model, 3) == 3 * roberta.FAMILY.flops_per_sample(model)
    enable_activation_checkpointing(module)
    assert counted_flops(module, model, 3) == 3 * roberta.FAMILY.flops_per_sample(model, recompute=True)


@pytest.mark.parametrize("model", SHAPES, ids=["h64", "h96"])
def test_activation_bytes_are_what_autograd_keeps(
    model: ModelConfig, saved_bytes_per_token: Callable[..., float]
) -> None:
    layer = "roberta.encoder.layer.1"
    eager = roberta.build_model(model, "eager", torch.bfloat16, torch.device("cpu"))
    measured = saved_bytes_per_token(eager, eager.get_submodule(layer), model.vocab_size, model.seq_length)
    assert measured == roberta.activation_bytes_per_token_per_layer(model, "eager", False)
    # The CPU's SDPA with dropout is PyTorch's math path, which keeps more than eager; the GPU's fused kernels less.
    sdpa = roberta.build_model(model, "sdpa", torch.bfloat16, torch.device("cpu"))
    measured = saved_bytes_per_token(sdpa, sdpa.get_submodule(layer), model.vocab_size, model.seq_length)
    per_hidden, per_score = roberta.CPU_MATH_SDPA_EXTRA
    extra = per_hidden * model.hidden_size + per_score * model.num_heads * model.seq_length
    assert measured == roberta.activation_bytes_per_token_per_layer(model, "eager", False) + extra
    assert roberta.activation_bytes_per_token_per_layer(model, "sdpa", False) < measured


def test_a_batch_masks_fifteen_percent_and_the_module_learns_only_those() -> None:
    batch = roberta.synthetic_batch(TINY, 64, torch.Generator().manual_seed(1), torch.bfloat16)
    predicted = (batch["labels"] != -100).float().mean().item()
    assert 0.13 < predicted < 0.17
    assert torch.equal(batch["labels"][batch["labels"] != -100], batch["input_ids"][batch["labels"] != -100])
    module = roberta.build_model(TINY, "sdpa", torch.float32, torch.device("cpu"))
    assert len(roberta.blocks(module)) == TINY.num_layers
    assert torch.isfinite(module(**batch).loss)


def test_shapes_it_cannot_build_are_refused_by_key() -> None:
    errors = roberta.architecture_errors(
        dataclasses.replace(TINY, num_heads=5, num_kv_heads=2, tie_word_embeddings=False)
    )
    assert set(errors) == {"model.num_heads", "model.num_kv_heads", "model.tie_word_embeddings"}
    assert all("roberta" in e for e in errors.values())
