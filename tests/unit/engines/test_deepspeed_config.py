"""The DeepSpeed config a cell trains with: batch keys, precision, offload, and the settings DeepSpeed refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from orchestrator.config.batch import BatchPlan
from orchestrator.config.schema import MethodConfig
from orchestrator.engines.deepspeed.config import build_ds_config

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"


def method(**overrides: Any) -> MethodConfig:
    """conf/method/default.yaml as the typed MethodConfig, with ``overrides``."""
    cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "method" / "default.yaml"), resolve=True)
    assert isinstance(cfg, dict)
    values = {k: v for k, v in cfg.items() if k != "defaults"}
    values.update(overrides)
    return MethodConfig(**values)


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
