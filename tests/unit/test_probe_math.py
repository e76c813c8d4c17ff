"""The probe's pure parts: batch arithmetic, the DeepSpeed config, parameters and FLOPs, the memory model,
step-time statistics and the stopping rule, MFU, and how failures are told apart. No DeepSpeed needed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from orchestrator.ds_config import (
    BatchPlan,
    BatchSizeError,
    build_ds_config,
    divisors,
    per_gpu_batch_size,
    plan_batch,
)
from orchestrator.models.gpt_neox import (
    GIB,
    activation_bytes_per_sequence,
    build_model_config,
    count_parameters,
    estimate_micro_batch_size,
    flops_per_step,
    model_state_bytes_per_gpu,
    peak_tflops,
    reference_flops_per_step,
    throughput_metrics,
)
from orchestrator.probe import MemoryMeter, classify_failure, one_line, short_traceback
from orchestrator.timing import StoppingRule, summarize, t_critical_95

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
MODELS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


def load(group: str, name: str) -> dict[str, Any]:
    cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{name}.yaml"), resolve=True)
    assert isinstance(cfg, dict)
    return {k: v for k, v in cfg.items() if k != "defaults"}


def method(**overrides: Any) -> dict[str, Any]:
    base = load("method", "default")
    base.update(overrides)
    return base


# ---- batch arithmetic ------------------------------------------------------------------------------------


def test_divisors_are_every_micro_batch_that_splits_the_batch() -> None:
    assert divisors(16) == [1, 2, 4, 8, 16]
    assert divisors(96) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]
    assert divisors(1) == [1]
    with pytest.raises(ValueError):
        divisors(0)


def test_plan_spells_out_accumulation() -> None:
    plan = plan_batch(global_batch_size=1024, num_gpus=8, micro_batch_size=16)
    assert (plan.per_gpu_batch_size, plan.grad_accum_steps) == (128, 8)
    assert plan.tokens_per_step(2048) == 1024 * 2048


def test_a_micro_batch_that_does_not_divide_the_per_gpu_batch_is_refused_with_the_choices() -> None:
    with pytest.raises(BatchSizeError) as err:
        plan_batch(16, 1, 3)
    msg = str(err.value)
    assert "method.micro_batch_size=3" in msg and "per-GPU batch of 16" in msg and "1, 2, 4, 8, 16" in msg


@pytest.mark.parametrize("bad", [0, -2, "4", True, 2.0])
def test_a_micro_batch_that_is_not_a_positive_integer_is_refused(bad: Any) -> None:
    with pytest.raises(BatchSizeError, match="positive integer or 'auto'"):
        plan_batch(16, 1, bad)


def test_a_gpu_count_that_does_not_divide_the_global_batch_is_refused() -> None:
    with pytest.raises(BatchSizeError, match="num_gpus=3"):
        per_gpu_batch_size(16, 3)


# ---- DeepSpeed config ------------------------------------------------------------------------------------


def test_ds_config_batch_keys_agree_with_deepspeed_rule() -> None:
    plan = BatchPlan(1024, 4, 8)
    ds = build_ds_config(method(), plan, lr=3e-4)
    # DeepSpeed refuses a config where train_batch != micro * accumulation * data-parallel ranks.
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 4
    assert ds["gradient_accumulation_steps"] == 32
    opt = ds["optimizer"]
    assert opt["type"] == "AdamW" and opt["params"]["lr"] == 3e-4 and opt["params"]["betas"] == [0.9, 0.95]
    assert opt["params"]["torch_adam"] is True


@pytest.mark.parametrize(
    ("precision", "present", "absent"),
    [("bf16", "bf16", "fp16"), ("fp16", "fp16", "bf16"), ("fp32", None, None)],
)
def test_ds_config_precision(precision: str, present: str | None, absent: str | None) -> None:
    ds = build_ds_config(method(precision=precision), BatchPlan(16, 1, 4), lr=1e-3)
    if present:
        assert ds[present]["enabled"] is True and absent not in ds
    else:
        assert "bf16" not in ds and "fp16" not in ds
    if precision == "fp16":
        assert ds["fp16"]["loss_scale"] == 0, "dynamic loss scaling"


def test_ds_config_offload_uses_cpu_adam_and_pins_memory_only_next_to_a_gpu() -> None:
    m = method(zero_stage=3, offload_optimizer=True, offload_params=True)
    on_gpu = build_ds_config(m, BatchPlan(16, 2, 2), lr=1e-3, accelerator="cuda")
    on_cpu = build_ds_config(m, BatchPlan(16, 2, 2), lr=1e-3, accelerator="cpu")
    assert on_gpu["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
    }
    assert on_cpu["zero_optimization"]["offload_param"]["pin_memory"] is False
    assert "torch_adam" not in on_gpu["optimizer"]["params"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"zero_stage": 4}, "zero_stage=4"),
        ({"precision": "fp8"}, "precision='fp8'"),
        ({"zero_stage": 0, "offload_optimizer": True}, "offload_optimizer=true needs"),
        ({"zero_stage": 2, "offload_params": True}, "offload_params=true needs"),
    ],
)
def test_ds_config_refuses_settings_deepspeed_cannot_run(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_ds_config(method(**overrides), BatchPlan(16, 1, 4), lr=1e-3)


# ---- parameters, FLOPs, MFU ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_parameter_count_matches_the_published_count(name: str) -> None:
    model = load("model", name)
    assert count_parameters(model) == model["num_parameters"]


def test_parameter_count_matches_the_transformers_model_also_with_a_custom_mlp_width() -> None:
    from transformers import GPTNeoXForCausalLM

    for width in (None, 96):
        model = {**load("model", "pythia-tiny"), "intermediate_size": width}
        module = GPTNeoXForCausalLM(build_model_config(model, "sdpa"))
        assert sum(p.numel() for p in module.parameters()) == count_parameters(model)


def test_model_config_is_pythia_shaped() -> None:
    config = build_model_config(load("model", "pythia-410m"), "eager")
    assert config.tie_word_embeddings is False and config.use_parallel_residual is True
    assert config.intermediate_size == 4 * 1024 and config.num_hidden_layers == 24
    assert config.rope_parameters["partial_rotary_factor"] == 0.25
    assert config._attn_implementation == "eager"


@pytest.mark.parametrize("name", MODELS)
def test_flops_follow_the_reference_formula(name: str) -> None:
    model = load("model", name)
    batch = model["global_batch_size"]
    assert flops_per_step(model, batch) == pytest.approx(reference_flops_per_step(model, batch), rel=1e-12)
    h, layers, seq, vocab = model["hidden_size"], model["num_layers"], model["seq_length"], model["vocab_size"]
    recompute = 96.0 * batch * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))
    assert flops_per_step(model, batch, recompute=True) == pytest.approx(recompute, rel=1e-12)


def test_flops_approach_six_n_per_token_when_attention_and_logits_are_small() -> None:
    # A wide, shallow-context model: the 6N rule of thumb (Kaplan et al.) should hold within a few percent.
    model = {"num_layers": 48, "hidden_size": 8192, "num_heads": 64, "vocab_size": 1024, "seq_length": 256}
    tokens = 256
    ratio = flops_per_step(model, 1) / (6 * count_parameters(model) * tokens)
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
def test_peak_follows_precision_and_tf32(gpu_name: str, overrides: dict[str, Any], expected: float | None) -> None:
    gpu = load("gpu", gpu_name)
    got = peak_tflops(gpu, method(**overrides))
    if gpu_name == "v100-32gb":
        assert got == gpu["peak_tflops_fp32"]
    else:
        assert got == expected


def test_throughput_metrics_on_an_h100() -> None:
    model, gpu = load("model", "pythia-1b"), load("gpu", "h100-80gb")
    plan = BatchPlan(1024, 8, 8)
    m = throughput_metrics(model, method(activation_checkpointing=True), gpu, plan, step_time_s=10.0)
    assert m["tokens_per_step"] == 1024 * 2048
    assert m["tokens_per_s"] == pytest.approx(1024 * 2048 / 10.0)
    assert m["tokens_per_s_per_gpu"] == pytest.approx(m["tokens_per_s"] / 8)
    expected_tflops = reference_flops_per_step(model, 1024) / 10.0 / 8 / 1e12
    assert m["model_tflops_per_gpu"] == pytest.approx(expected_tflops)
    assert m["mfu"] == pytest.approx(expected_tflops / 989.0)
    assert m["hfu"] > m["mfu"], "recomputation is hardware work, not model work"


def test_throughput_metrics_leave_mfu_empty_without_a_peak() -> None:
    m = throughput_metrics(load("model", "pythia-tiny"), method(), load("gpu", "cpu"), BatchPlan(16, 1, 4), 0.1)
    assert m["mfu"] is None and m["hfu"] is None and m["model_tflops_per_gpu"] > 0


# ---- memory model ----------------------------------------------------------------------------------------


def test_model_states_follow_the_zero_paper() -> None:
    psi = 1_000_000
    assert model_state_bytes_per_gpu(psi, method(zero_stage=0), 4) == 16 * psi
    assert model_state_bytes_per_gpu(psi, method(zero_stage=1), 4) == 4 * psi + 12 * psi / 4
    assert model_state_bytes_per_gpu(psi, method(zero_stage=2), 4) == 2 * psi + 14 * psi / 4
    assert model_state_bytes_per_gpu(psi, method(zero_stage=3), 4) == 16 * psi / 4
    offloaded = method(zero_stage=3, offload_optimizer=True, offload_params=True)
    assert model_state_bytes_per_gpu(psi, offloaded, 4) == 2 * psi / 4


def test_activation_model_orders_the_settings() -> None:
    model = load("model", "pythia-410m")
    sdpa = activation_bytes_per_sequence(model, method(attention="sdpa"))
    assert activation_bytes_per_sequence(model, method(attention="eager")) > sdpa
    # Checkpointing keeps one layer's activations and each layer's input; the logits stay.
    assert activation_bytes_per_sequence(model, method(activation_checkpointing=True)) < 0.6 * sdpa
    assert activation_bytes_per_sequence(model, method(precision="fp32")) == pytest.approx(2 * sdpa)


def test_micro_batch_estimate_grows_with_memory_and_never_drops_below_one() -> None:
    model = load("model", "pythia-1b")
    small = estimate_micro_batch_size(model, method(), 1, 24.0)
    large = estimate_micro_batch_size(model, method(), 1, 80.0)
    assert 1 <= small < large <= 64
    assert estimate_micro_batch_size(model, method(), 1, 0.5) == 1
    assert estimate_micro_batch_size(model, method(activation_checkpointing=True), 1, 80.0) > large


def test_memory_meter_sees_a_host_allocation() -> None:
    meter = MemoryMeter(torch.device("cpu"))
    meter.rebase()
    meter.reset()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    peak = meter.peak()
    del block
    assert peak.allocated >= 60 * 2**20
    assert peak.reserved is None and peak.limited == peak.allocated
    assert peak.host_rss > peak.allocated
    meter.reset()
    assert meter.peak().allocated < peak.allocated, "reset forgets the previous peak"
    assert GIB == 2**30


# ---- statistics and the stopping rule --------------------------------------------------------------------


def test_t_quantiles() -> None:
    assert t_critical_95(1) == 12.706 and t_critical_95(30) == 2.042
    assert t_critical_95(31) == pytest.approx(2.0395, abs=2e-4)
    assert t_critical_95(100) == pytest.approx(1.9840, abs=2e-4)
    assert t_critical_95(10_000) == pytest.approx(1.9602, abs=2e-4)
    with pytest.raises(ValueError):
        t_critical_95(0)


def test_summary_of_known_values() -> None:
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert (s.steps, s.median_s, s.mean_s) == (4, 2.5, 2.5)
    assert s.std_s == pytest.approx(math.sqrt(5 / 3))
    assert s.iqr_s == pytest.approx(1.5)
    assert s.ci95_halfwidth_s == pytest.approx(3.182 * math.sqrt(5 / 3) / 2)
    assert s.ci95_pct == pytest.approx(100 * s.ci95_halfwidth_s / 2.5)
    metrics = s.as_metrics()
    assert metrics["step_time_s"] == 2.5 and metrics["steps_timed"] == 4


def test_a_single_step_has_no_confidence_interval() -> None:
    s = summarize([1.0])
    assert math.isinf(s.ci95_pct) and s.as_metrics()["step_time_ci95_pct"] is None


def test_stopping_rule() -> None:
    rule = StoppingRule(min_steps=5, max_steps=8, target_ci_pct=2.0, time_budget_s=100.0)
    steady = [1.0] * 4
    assert rule.decide(steady) is None, "precise, but fewer than min_steps"
    assert rule.decide([1.0] * 5) == "target_ci"
    noisy = [1.0, 1.5] * 4
    assert rule.decide(noisy[:7]) is None
    assert rule.decide(noisy) == "max_steps"
    assert rule.decide([]) is None
    tight = StoppingRule(min_steps=5, max_steps=50, target_ci_pct=0.1, time_budget_s=10.0)
    assert tight.decide([3.0, 3.0]) is None
    assert tight.decide([3.0, 3.0, 3.0]) == "time_budget", "a fourth step would overrun 10 s at the median"
    with pytest.raises(ValueError, match="min_steps"):
        StoppingRule(min_steps=5, max_steps=3, target_ci_pct=2.0, time_budget_s=1.0)


# ---- failures --------------------------------------------------------------------------------------------


def _raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        raise exc from cause
    except BaseException as caught:  # noqa: BLE001 - the point is to get a real traceback
        return caught


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
        (MemoryError(), "oom"),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory"), "oom"),
        (RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"), "comm_error"),
        (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"), "comm_error"),
        (torch.distributed.DistStoreError("Timed out after 6 seconds waiting for clients. 1/2 clients joined."),
         "comm_error"),
        (TimeoutError("rendezvous"), "comm_error"),
        (RuntimeError("Error building extension 'cpu_adam'"), "compile_error"),
        (ImportError("FlashAttention2 has been toggled on, but it cannot be used"), "failed"),
        (ValueError("something else"), "failed"),
    ],
)  # fmt: skip
def test_failures_are_told_apart(exc: BaseException, status: str) -> None:
    assert classify_failure(_raised(exc)) == status


def test_the_cause_chain_counts() -> None:
    assert classify_failure(_raised(RuntimeError("step failed"), MemoryError())) == "oom"
    assert classify_failure(_raised(RuntimeError("wrapped"), _raised(torch.OutOfMemoryError("x")))) == "oom"


def test_a_failure_inside_a_native_op_build_is_a_compile_error() -> None:
    # Code that runs as if it lived in DeepSpeed's op builder: where it was raised decides.
    namespace: dict[str, Any] = {}
    source = "def build():\n    raise FileNotFoundError('ninja')\n"
    exec(compile(source, "/site-packages/deepspeed/ops/op_builder/builder.py", "exec"), namespace)
    try:
        namespace["build"]()
    except FileNotFoundError as exc:
        assert classify_failure(exc) == "compile_error"


def test_reason_is_one_line_and_names_the_compiler_error() -> None:
    exc = RuntimeError("C++ compile error\nwarning: overflow\nfoo.cpp:32:26: error: conflicting declaration\n")
    assert one_line(exc) == "RuntimeError: C++ compile error (foo.cpp:32:26: error: conflicting declaration)"
    assert len(one_line(ValueError("x" * 5000))) == 500
    assert one_line(MemoryError()) == "MemoryError"


def test_long_tracebacks_keep_their_ends() -> None:
    text = "Traceback (most recent call last):\n" + "warning\n" * 20_000 + "RuntimeError: the end\n"
    short = short_traceback(text)
    assert len(short) < 33_000 and short.startswith("Traceback") and short.endswith("RuntimeError: the end\n")
    assert short_traceback("short") == "short"
