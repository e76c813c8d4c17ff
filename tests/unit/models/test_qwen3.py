"""Qwen3 family: the formulas against the transformers module they describe."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from orchestrator.config.schema import MethodConfig, ModelConfig
from orchestrator.models import enable_activation_checkpointing, llama, qwen3

MODELS = ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b"]

PUBLISHED = {
    # name: (total, non-embedding, one unit of the last digit) from each model card's "Number of Parameters";
    # rounded to the digits shown, so the count must lie within one unit of the last one.
    "qwen3-0.6b": (0.6e9, 0.44e9, (0.1e9, 0.01e9)),
    "qwen3-1.7b": (1.7e9, 1.4e9, (0.1e9, 0.1e9)),
    "qwen3-4b": (4.0e9, 3.6e9, (0.1e9, 0.1e9)),
}

TINY = ModelConfig(
    name="tiny",
    family="qwen3",
    num_layers=2,
    hidden_size=96,
    num_heads=6,
    num_kv_heads=2,
    head_dim=32,  # a·d = 192 ≠ h, as in every Qwen3 model
    vocab_size=512,
    intermediate_size=256,
    rotary_pct=1.0,
    tie_word_embeddings=True,
    seq_length=64,
)


@pytest.mark.parametrize("name", MODELS)
def test_parameter_count_is_the_full_size_module_numel(name: str, shipped_model: Callable[[str], ModelConfig]) -> None:
    model = shipped_model(name)
    assert model.family == "qwen3"
    module = qwen3.build_model(model, "sdpa", torch.bfloat16, torch.device("meta"))
    numel = [p.numel() for p in module.parameters()]
    assert sum(numel) == qwen3.num_parameters(model) == model.num_parameters
    assert max(numel) == qwen3.largest_weight_elements(model)


@pytest.mark.parametrize("name", MODELS)
def test_parameter_count_matches_the_published_totals(name: str, shipped_model: Callable[[str], ModelConfig]) -> None:
    model = shipped_model(name)
    total, non_embedding, (unit_total, unit_non_embedding) = PUBLISHED[name]
    count = qwen3.num_parameters(model)
    assert abs(count - total) < unit_total
    assert abs(count - model.vocab_size * model.hidden_size - non_embedding) < unit_non_embedding


def test_qk_norms_add_two_head_widths_a_layer() -> None:
    assert qwen3.num_parameters(TINY) - llama.num_parameters(TINY) == TINY.num_layers * 2 * 32


def test_flops_are_what_the_flop_counter_counts(training_flops: Callable[..., int]) -> None:
    # Exact with eager attention (the q/k norms are elementwise and counted by neither); see test_llama for sdpa.
    tokens = 3 * TINY.seq_length
    module = qwen3.build_model(TINY, "eager", torch.float32, torch.device("cpu"))
    assert training_flops(module, TINY.vocab_size, 3, TINY.seq_length) == tokens * qwen3.flops_per_token(TINY)
    enable_activation_checkpointing(module)
    counted = training_flops(module, TINY.vocab_size, 3, TINY.seq_length)
    assert counted == tokens * qwen3.flops_per_token(TINY, recompute=True)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_activation_bytes_are_what_autograd_keeps(attention: str, saved_bytes_per_token: Callable[..., float]) -> None:
    module = qwen3.build_model(TINY, attention, torch.bfloat16, torch.device("cpu"))
    measured = saved_bytes_per_token(module, module.get_submodule("model.layers.1"), TINY.vocab_size, TINY.seq_length)
    method = dataclasses.replace(MethodConfig(), attention=attention)
    assert measured == qwen3.activation_bytes_per_token_per_layer(TINY, method.attention)


def test_model_config_is_qwen3_shaped(shipped_model: Callable[[str], ModelConfig]) -> None:
    config = qwen3.build_model_config(shipped_model("qwen3-0.6b"), "sdpa")
    assert type(config).__name__ == "Qwen3Config" and config.use_sliding_window is False
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (16, 8, 128)
    assert config.tie_word_embeddings is True and config.rms_norm_eps == 1e-6
    assert config.rope_parameters["rope_theta"] == 1_000_000.0
    unset = dataclasses.replace(TINY, norm_eps=None)
    assert qwen3.build_model_config(unset, "sdpa").rms_norm_eps == qwen3.NORM_EPS
