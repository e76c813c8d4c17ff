"""GPT-NeoX arithmetic on typed configs: parameters (against the built module), FLOPs, peak, throughput."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from orchestrator.config.schema import Config, MethodConfig, to_config
from orchestrator.job.throughput import throughput_metrics
from orchestrator.models import (
    check_num_parameters,
    gpt_neox,
    num_parameters,
    parameter_count_error,
    peak_tflops,
)
from orchestrator.models.gpt_neox import build_model_config, flops_per_token, reference_flops_per_step
from orchestrator.planning.plan import plan
from orchestrator.store.record import Metrics

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"
MODELS = sorted(p.stem for p in (CONF_DIR / "model").glob("pythia-*.yaml"))  # the GPT-NeoX family


def cell(*overrides: str) -> Config:
    p = plan(list(overrides), sweep_dir=None)
    cells = p.cells + p.skipped
    assert len(cells) == 1
    return to_config(cells[0].config)


def method(**overrides: object) -> MethodConfig:
    return dataclasses.replace(MethodConfig(), **overrides)  # type: ignore[arg-type]


# Published totals (EleutherAI/pythia README), as listed in REFERENCE.md.
PUBLISHED_PARAMETERS = {
    "pythia-70m": 70_426_624,
    "pythia-160m": 162_322_944,
    "pythia-410m": 405_334_016,
    "pythia-1b": 1_011_781_632,
    "pythia-1.4b": 1_414_647_808,
    "pythia-2.8b": 2_775_208_960,
    "pythia-6.9b": 6_857_302_016,
    "pythia-12b": 11_846_072_320,
    "pythia-tiny": 165_632,  # not published: 2*(12*64^2 + 13*64) + 2*64 + 2*512*64, by hand
}


def test_every_shipped_model_has_a_known_count() -> None:
    assert set(MODELS) == set(PUBLISHED_PARAMETERS)


@pytest.mark.parametrize("name", MODELS)
def test_parameter_count_matches_the_published_count(name: str) -> None:
    model = cell(f"model={name}").model
    assert num_parameters(model) == model.num_parameters == PUBLISHED_PARAMETERS[name]


@pytest.mark.parametrize("name", MODELS)
def test_parameter_count_matches_the_module_built_at_full_size_on_the_meta_device(name: str) -> None:
    # The meta device allocates nothing, so even pythia-12b is built whole in a second.
    torch = pytest.importorskip("torch")
    model = cell(f"model={name}").model
    module = gpt_neox.build_model(model, "sdpa", torch.bfloat16, torch.device("meta"))
    assert sum(p.numel() for p in module.parameters()) == num_parameters(model)


def test_a_published_count_that_disagrees_with_the_architecture_is_an_error_naming_the_key() -> None:
    model = dataclasses.replace(cell("model=pythia-160m").model, num_parameters=5)
    error = parameter_count_error(model)
    assert error is not None and "model.num_parameters=5" in error and "162322944" in error
    with pytest.raises(ValueError, match="model.num_parameters=5"):
        check_num_parameters(model)
    # Absent is fine: the count is derived.
    check_num_parameters(dataclasses.replace(model, num_parameters=None))


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
    h, layers = model.hidden_size, model.num_layers
    # Checkpointing reruns each layer's forward but its MLP output projection (see test_flops_measured.py):
    # L*(16h² + 4sh) more per token with f = 4h.
    recompute = reference_flops_per_step(model, batch) + tokens * layers * (16 * h * h + 4 * seq * h)
    assert tokens * flops_per_token(model, recompute=True) == pytest.approx(recompute, rel=1e-12)


def test_flops_per_token_pythia_1b_by_hand() -> None:
    model = cell("model=pythia-1b").model
    # Forward per token: 16 layers x (2*(4h^2 + 2*h*4h) + 4*s*h) + 2*V*h with h = s = 2048, V = 50304
    # = 16 x (100,663,296 + 16,777,216) + 206,045,184 = 2,085,093,376; training x3.
    assert flops_per_token(model) == 6_255_280_128
    # Recomputation: 16 x (117,440,512 - 2*2048*8192) = 16 x 83,886,080 = 1,342,177,280 more, +21.5%, not +33%.
    assert flops_per_token(model, recompute=True) == 6_255_280_128 + 1_342_177_280


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
    assert m.tokens_per_step == 1024 * 2048
    assert m.tokens_per_s == pytest.approx(1024 * 2048 / 10.0)
    assert m.tokens_per_s_per_gpu == pytest.approx(m.tokens_per_s / 8)
    expected_tflops = reference_flops_per_step(cfg.model, 1024) / 10.0 / 8 / 1e12
    assert m.model_tflops_per_gpu == pytest.approx(expected_tflops)
    assert m.mfu == pytest.approx(expected_tflops / 989.0)
    assert m.hfu is not None and m.mfu is not None and m.hfu > m.mfu, "recomputation is hardware work, not model work"


def test_throughput_metrics_leave_mfu_empty_without_a_peak() -> None:
    m = throughput_metrics(cell("model=pythia-tiny", "gpu=cpu"), 16, 0.1)
    assert m.mfu is None and m.hfu is None and m.model_tflops_per_gpu is not None and m.model_tflops_per_gpu > 0


def test_throughput_metrics_complete_the_step_times_they_are_given() -> None:
    cfg = cell("model=pythia-tiny", "gpu=cpu")
    steps = Metrics(step_time_s=0.1, steps_timed=5, mfu=0.5)  # a rate of its own is replaced, the rest is kept
    m = throughput_metrics(cfg, 16, 0.1, base=steps)
    assert m == dataclasses.replace(throughput_metrics(cfg, 16, 0.1), step_time_s=0.1, steps_timed=5)


def test_a_sweep_with_a_wrong_published_count_is_refused_naming_the_key() -> None:
    from orchestrator.planning.plan import SweepError

    with pytest.raises(SweepError, match=r"model\.num_parameters.*162322944"):
        plan(["model=pythia-160m", "model.num_parameters=5"], sweep_dir=None)
