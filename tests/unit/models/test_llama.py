"""Llama family (SmolLM2, Llama 3.2, Llama 2, Llama 3.1): the formulas against the transformers module they describe."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from orchestrator.config.schema import MethodConfig, ModelConfig
from orchestrator.models import enable_activation_checkpointing, llama

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"
MODELS = [
    "smollm2-tiny", "smollm2-135m", "smollm2-360m", "smollm2-1.7b", "llama-3.2-1b", "llama-3.2-3b", "llama-2-7b",
    "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
]  # fmt: skip

PUBLISHED = {
    # name: (published total, one unit of its last digit). The figures are rounded or truncated to the digits
    # shown, so the count must lie within one unit of the last one.
    "smollm2-135m": (135e6, 1e6),  # SmolLM2 paper and model card: 135M
    "smollm2-360m": (360e6, 10e6),  # the model's name, two significant figures
    "smollm2-1.7b": (1.7e9, 0.1e9),  # SmolLM2 paper: 1.7B
    "llama-3.2-1b": (1.23e9, 0.01e9),  # Llama 3.2 model card: 1B (1.23B)
    "llama-3.2-3b": (3.21e9, 0.01e9),  # Llama 3.2 model card: 3B (3.21B)
    # Llama 2 names it 70B; its Hugging Face checkpoint holds 137,953,296,384 bytes of fp16 weights
    # (model.safetensors.index.json's total_size), 68,976,648,192 parameters.
    "llama-2-70b": (68.98e9, 0.01e9),
    "llama-2-7b": (7e9, 1e9),  # Llama 2, Table 1: the model's name, one significant figure
    "llama-2-13b": (13e9, 1e9),  # Llama 2, Table 1: the model's name, two significant figures
    "llama-3.1-8b": (8e9, 1e9),  # Llama 3.1 model card: 8B
    "llama-3.1-70b": (70e9, 1e9),  # Llama 3.1 model card: 70B
    "llama-3.1-405b": (405e9, 1e9),  # the Herd paper: 405B
}


def family_of(name: str) -> str:
    conf = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml"))
    assert isinstance(conf, dict)
    return str(conf.get("family", "gpt_neox"))


def test_these_are_all_the_llama_files() -> None:
    shipped = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml") if family_of(p.stem) == "llama")
    assert shipped == sorted(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_parameter_count_is_the_full_size_module_numel(name: str, shipped_model: Callable[[str], ModelConfig]) -> None:
    model = shipped_model(name)
    module = llama.build_model(model, "sdpa", torch.bfloat16, torch.device("meta"))
    numel = [p.numel() for p in module.parameters()]  # a tied matrix is listed once
    assert sum(numel) == llama.num_parameters(model) == model.num_parameters
    assert max(numel) == llama.largest_weight_elements(model)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_the_published_total(name: str, shipped_model: Callable[[str], ModelConfig]) -> None:
    published, unit = PUBLISHED[name]
    assert abs(llama.num_parameters(shipped_model(name)) - published) < unit


def tiny(**overrides: object) -> ModelConfig:
    base = ModelConfig(
        name="tiny",
        family="llama",
        num_layers=2,
        hidden_size=96,
        num_heads=6,
        num_kv_heads=2,
        vocab_size=512,
        intermediate_size=256,
        rotary_pct=1.0,
        tie_word_embeddings=True,
        seq_length=64,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


VARIANTS = {
    "gqa-tied": tiny(),
    "mha-untied": tiny(num_kv_heads=None, tie_word_embeddings=False),
    "wide-heads": tiny(head_dim=32, num_kv_heads=3),  # a·d = 192 ≠ h, as in Qwen3
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_flops_are_what_the_flop_counter_counts(variant: str, training_flops: Callable[..., int]) -> None:
    # Eager attention runs as matrix products the counter sees, so formula and count must agree exactly: both count
    # every multiply-add twice and nothing elementwise (norms, rotary, SiLU, softmax, the loss).
    model = VARIANTS[variant]
    batch, tokens = 3, 3 * model.seq_length
    module = llama.build_model(model, "eager", torch.float32, torch.device("cpu"))
    assert training_flops(module, model.vocab_size, batch, model.seq_length) == tokens * llama.flops_per_token(model)
    # The counter has no formula for PyTorch's CPU flash-attention kernel, so with sdpa on the CPU it sees all but
    # the scores and their weighted sum: the formula less 3 passes × 4·s·a·d per token and layer.
    module = llama.build_model(model, "sdpa", torch.float32, torch.device("cpu"))
    attention = 3 * model.num_layers * 4 * model.seq_length * model.num_heads * llama.head_dim(model)
    counted = training_flops(module, model.vocab_size, batch, model.seq_length)
    assert counted == tokens * (llama.flops_per_token(model) - attention)


def test_recompute_flops_are_what_the_flop_counter_counts_with_checkpointing(
    training_flops: Callable[..., int],
) -> None:
    model = VARIANTS["gqa-tied"]
    module = llama.build_model(model, "eager", torch.float32, torch.device("cpu"))
    enable_activation_checkpointing(module)
    counted = training_flops(module, model.vocab_size, 3, model.seq_length)
    assert counted == 3 * model.seq_length * llama.flops_per_token(model, recompute=True)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_activation_bytes_are_what_autograd_keeps(
    variant: str, attention: str, saved_bytes_per_token: Callable[..., float]
) -> None:
    model = VARIANTS[variant]
    module = llama.build_model(model, attention, torch.bfloat16, torch.device("cpu"))
    measured = saved_bytes_per_token(module, module.get_submodule("model.layers.1"), model.vocab_size, model.seq_length)
    method = dataclasses.replace(MethodConfig(), attention=attention)
    assert measured == llama.activation_bytes_per_token_per_layer(model, method.attention)


def test_eager_attention_keeps_the_scores() -> None:
    model = VARIANTS["gqa-tied"]
    sdpa = llama.activation_bytes_per_token_per_layer(model, "sdpa")
    eager = llama.activation_bytes_per_token_per_layer(model, "eager")
    longer = dataclasses.replace(model, seq_length=2 * model.seq_length)
    grown = llama.activation_bytes_per_token_per_layer(longer, "eager") - eager
    assert grown == 6 * model.num_heads * model.seq_length  # fp32 softmax and its 16-bit copy, per head
    assert eager > sdpa == llama.activation_bytes_per_token_per_layer(longer, "sdpa")


def test_model_config_is_llama_3_2_shaped(shipped_model: Callable[[str], ModelConfig]) -> None:
    config = llama.build_model_config(shipped_model("llama-3.2-3b"), "eager")
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (24, 8, 128)
    assert config.tie_word_embeddings is True and config.intermediate_size == 8192
    assert config.rope_parameters["rope_theta"] == 500_000.0 and config.rms_norm_eps == 1e-5
    assert config._attn_implementation == "eager" and config.use_cache is False


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"intermediate_size": None}, "intermediate_size is required"),
        ({"rotary_pct": 0.25}, "rotary_pct"),
        ({"num_kv_heads": 4}, "num_kv_heads=4"),
        ({"hidden_size": 100, "num_kv_heads": None}, "set head_dim"),
    ],
)
def test_shapes_the_module_cannot_take_are_refused_with_the_model_and_key(
    overrides: dict[str, object], words: str
) -> None:
    with pytest.raises(ValueError, match=words) as err:
        llama.build_model_config(tiny(**overrides), "sdpa")
    assert "'tiny'" in str(err.value)


def test_a_hidden_size_not_a_multiple_of_the_heads_is_refused_even_with_head_dim_set() -> None:
    # LlamaConfig validates this itself (a StrictDataclass error inside the job otherwise); Qwen3's config does not.
    from orchestrator.models import qwen3

    model = ModelConfig(name="odd", family="llama", num_layers=2, hidden_size=100, num_heads=3, vocab_size=64,
                        intermediate_size=128, rotary_pct=1.0, head_dim=64)  # fmt: skip
    assert "model.num_heads" in llama.architecture_errors(model)
    assert "model.num_heads" not in qwen3.architecture_errors(dataclasses.replace(model, family="qwen3"))
    llama.build_model_config(dataclasses.replace(model, hidden_size=96), "sdpa")  # a multiple: transformers agrees
