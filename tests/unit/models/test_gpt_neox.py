"""GPT-NeoX arithmetic: parameters, FLOPs, peak, throughput, and DeepSpeed's memory model, on typed configs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from orchestrator.engines.deepspeed.memory import (
    activation_bytes_per_sequence,
    estimate_micro_batch_size,
    model_state_bytes_per_gpu,
)
from orchestrator.models import gpt_neox, num_parameters, peak_tflops, throughput_metrics
from orchestrator.models.gpt_neox import build_model_config, flops_per_token, reference_flops_per_step
from orchestrator.schema import Config, MethodConfig, to_config
from orchestrator.sweep import plan

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"
MODELS = sorted(p.stem for p in (CONF_DIR / "model").glob("pythia-*.yaml"))  # the GPT-NeoX family


def cell(*overrides: str) -> Config:
    p = plan(list(overrides), sweep_dir=None)
    cells = p.cells + p.skipped
    assert len(cells) == 1
    return to_config(cells[0].config)


def method(**overrides: object) -> MethodConfig:
    return dataclasses.replace(MethodConfig(), **overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", MODELS)
def test_parameter_count_matches_the_published_count(name: str) -> None:
    model = cell(f"model={name}").model
    assert num_parameters(model) == model.num_parameters


def test_parameter_count_matches_the_transformers_model_also_with_a_custom_mlp_width() -> None:
    from transformers import GPTNeoXForCausalLM

    for width in (None, 96):
        model = dataclasses.replace(cell("model=pythia-tiny").model, intermediate_size=width)
        module = GPTNeoXForCausalLM(build_model_config(model, "sdpa"))
        assert sum(p.numel() for p in module.parameters()) == num_parameters(model)


def test_model_config_is_pythia_shaped() -> None:
    config = build_model_config(cell("model=pythia-410m").model, "eager")
    assert config.tie_word_embeddings is False and config.use_parallel_residual is True
    assert config.intermediate_size == 4 * 1024 and config.num_hidden_layers == 24
    assert config.rope_parameters["partial_rotary_factor"] == 0.25
    assert config._attn_implementation == "eager"


@pytest.mark.parametrize("name", MODELS)
def test_flops_follow_the_reference_formula(name: str) -> None:
    model = cell(f"model={name}").model
    batch, seq = model.global_batch_size, model.seq_length
    tokens = batch * seq
    assert tokens * flops_per_token(model) == pytest.approx(reference_flops_per_step(model, batch), rel=1e-12)
    h, layers, vocab = model.hidden_size, model.num_layers, model.vocab_size
    recompute = 96.0 * batch * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))
    assert tokens * flops_per_token(model, recompute=True) == pytest.approx(recompute, rel=1e-12)


def test_flops_approach_six_n_per_token_when_attention_and_logits_are_small() -> None:
    # A wide, shallow-context model: the 6N rule of thumb (Kaplan et al.) should hold within a few percent.
    base = cell("model=pythia-tiny").model
    model = dataclasses.replace(
        base, num_layers=48, hidden_size=8192, num_heads=64, vocab_size=1024, seq_length=256, intermediate_size=None
    )
    ratio = gpt_neox.flops_per_token(model) / (6 * num_parameters(model))
    assert 1.0 < ratio < 1.03


@pytest.mark.parametrize(
    ("gpu_name", "overrides", "expected"),
    [
        ("h100-80gb", {"precision": "bf16"}, 989.0),
        ("h100-80gb", {"precision": "fp16"}, 989.0),
        ("h100-80gb", {"precision": "fp32", "tf32": True}, 494.0),
        ("h100-80gb", {"precision": "fp32", "tf32": False}, 67.0),
        ("v100-32gb", {"precision": "fp32", "tf32": True}, None),  # no TF32 before Ampere: the fp32 peak
        ("cpu", {"precision": "bf16"}, None),
    ],
)
def test_peak_follows_precision_and_tf32(gpu_name: str, overrides: dict[str, object], expected: float | None) -> None:
    gpu = cell(f"gpu={gpu_name}").gpu
    got = peak_tflops(gpu, method(**overrides))
    if gpu_name == "v100-32gb":
        assert got == gpu.peak_tflops_fp32
    else:
        assert got == expected


def test_throughput_metrics_on_an_h100() -> None:
    cfg = cell("model=pythia-1b", "gpu=h100-80gb", "num_gpus=8", "method.activation_checkpointing=true")
    m = throughput_metrics(cfg, 1024, step_time_s=10.0)
    assert m["tokens_per_step"] == 1024 * 2048
    assert m["tokens_per_s"] == pytest.approx(1024 * 2048 / 10.0)
    assert m["tokens_per_s_per_gpu"] == pytest.approx(m["tokens_per_s"] / 8)
    expected_tflops = reference_flops_per_step(cfg.model, 1024) / 10.0 / 8 / 1e12
    assert m["model_tflops_per_gpu"] == pytest.approx(expected_tflops)
    assert m["mfu"] == pytest.approx(expected_tflops / 989.0)
    assert m["hfu"] > m["mfu"], "recomputation is hardware work, not model work"


def test_throughput_metrics_leave_mfu_empty_without_a_peak() -> None:
    m = throughput_metrics(cell("model=pythia-tiny", "gpu=cpu"), 16, 0.1)
    assert m["mfu"] is None and m["hfu"] is None and m["model_tflops_per_gpu"] > 0


def test_model_states_follow_the_zero_paper() -> None:
    psi = 1_000_000
    assert model_state_bytes_per_gpu(psi, method(zero_stage=0), 4) == 16 * psi
    assert model_state_bytes_per_gpu(psi, method(zero_stage=1), 4) == 4 * psi + 12 * psi / 4
    assert model_state_bytes_per_gpu(psi, method(zero_stage=2), 4) == 2 * psi + 14 * psi / 4
    assert model_state_bytes_per_gpu(psi, method(zero_stage=3), 4) == 16 * psi / 4
    offloaded = method(zero_stage=3, offload_optimizer=True, offload_params=True)
    assert model_state_bytes_per_gpu(psi, offloaded, 4) == 2 * psi / 4


def test_activation_model_orders_the_settings() -> None:
    model = cell("model=pythia-410m").model
    sdpa = activation_bytes_per_sequence(model, method(attention="sdpa"))
    assert activation_bytes_per_sequence(model, method(attention="eager")) > sdpa
    # Checkpointing keeps one layer's activations and each layer's input; the logits stay.
    assert activation_bytes_per_sequence(model, method(activation_checkpointing=True)) < 0.6 * sdpa
    assert activation_bytes_per_sequence(model, method(precision="fp32")) == pytest.approx(2 * sdpa)


def test_micro_batch_estimate_grows_with_memory_and_never_drops_below_one() -> None:
    cfg = cell("model=pythia-1b", "gpu=h100-80gb")
    small = estimate_micro_batch_size(cfg, 24.0)
    large = estimate_micro_batch_size(cfg, 80.0)
    assert 1 <= small < large <= 64
    assert estimate_micro_batch_size(cfg, 0.5) == 1
    checkpointed = dataclasses.replace(cfg, method=method(activation_checkpointing=True))
    assert estimate_micro_batch_size(checkpointed, 80.0) > large
