"""OLMo 2 family: the formulas against the transformers module they describe."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from orchestrator.config.schema import MethodConfig, ModelConfig
from orchestrator.models import enable_activation_checkpointing, llama, olmo2

TINY = ModelConfig(
    name="tiny",
    family="olmo2",
    num_layers=2,
    hidden_size=96,
    num_heads=6,
    num_kv_heads=2,
    vocab_size=512,
    intermediate_size=256,
    rotary_pct=1.0,
    tie_word_embeddings=False,
    seq_length=64,
)


def test_parameter_count_is_the_full_size_module_numel(shipped_model: Callable[[str], ModelConfig]) -> None:
    # OLMo 2 1B has no exact published count (its card calls it "1B"); the module is the reference.
    model = shipped_model("olmo2-1b")
    assert model.family == "olmo2"
    module = olmo2.build_model(model, "sdpa", torch.bfloat16, torch.device("meta"))
    numel = [p.numel() for p in module.parameters()]
    assert sum(numel) == olmo2.num_parameters(model) == model.num_parameters
    assert max(numel) == olmo2.largest_weight_elements(model) == 100_352 * 2048
    assert 1.4e9 < model.num_parameters < 1.5e9


def test_qk_norms_span_all_heads() -> None:
    assert olmo2.num_parameters(TINY) - llama.num_parameters(TINY) == TINY.num_layers * (6 + 2) * 16


def test_flops_are_what_the_flop_counter_counts(training_flops: Callable[..., int]) -> None:
    # Exact with eager attention; checkpointing reruns the whole layer, the down projection too (post-norm).
    tokens = 3 * TINY.seq_length
    module = olmo2.build_model(TINY, "eager", torch.float32, torch.device("cpu"))
    assert training_flops(module, TINY.vocab_size, 3, TINY.seq_length) == tokens * olmo2.flops_per_token(TINY)
    enable_activation_checkpointing(module)
    counted = training_flops(module, TINY.vocab_size, 3, TINY.seq_length)
    assert counted == tokens * olmo2.flops_per_token(TINY, recompute=True)
    assert olmo2.flops_per_token(TINY, recompute=True) > llama.flops_per_token(TINY, recompute=True)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_activation_bytes_are_what_autograd_keeps(attention: str, saved_bytes_per_token: Callable[..., float]) -> None:
    module = olmo2.build_model(TINY, attention, torch.bfloat16, torch.device("cpu"))
    measured = saved_bytes_per_token(module, module.get_submodule("model.layers.1"), TINY.vocab_size, TINY.seq_length)
    method = dataclasses.replace(MethodConfig(), attention=attention)
    assert measured == olmo2.activation_bytes_per_token_per_layer(TINY, method.attention)


def test_model_config_is_olmo2_shaped(shipped_model: Callable[[str], ModelConfig]) -> None:
    config = olmo2.build_model_config(shipped_model("olmo2-1b"), "sdpa")
    assert type(config).__name__ == "Olmo2Config"
    assert config.tie_word_embeddings is False and config.num_key_value_heads == 16
    assert config.rope_parameters["rope_theta"] == 500_000.0 and config.rms_norm_eps == 1e-6
    assert config.vocab_size == 100_352 and config.max_position_embeddings == 4096
