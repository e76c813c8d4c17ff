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
from orchestrator.engines.deepspeed.memory import GIB
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


# ---- memory metering ---------------------------------------------------------------------------------


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
