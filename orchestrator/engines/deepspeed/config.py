"""The DeepSpeed config that trains a cell: ZeRO stage, offload, precision, optimizer and the batch split.

Pure: nothing here imports DeepSpeed or touches a device, so the unit tests check every rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NotRequired, TypedDict

from orchestrator.config.choices import PRECISIONS, ZERO_STAGES
from orchestrator.engines.base import ADAM_BETAS, ADAM_EPS, GRADIENT_CLIPPING, WEIGHT_DECAY

if TYPE_CHECKING:
    from orchestrator.config.batch import BatchPlan
    from orchestrator.config.schema import MethodConfig


class Offload(TypedDict):
    device: str
    pin_memory: bool


class Zero(TypedDict):
    stage: int
    offload_optimizer: NotRequired[Offload]
    offload_param: NotRequired[Offload]


class AdamParams(TypedDict):
    lr: float
    betas: list[float]
    eps: float
    weight_decay: float
    torch_adam: NotRequired[bool]


class Optimizer(TypedDict):
    type: str
    params: AdamParams


class Enabled(TypedDict):
    enabled: bool


class LossScaling(TypedDict):
    enabled: bool
    loss_scale: int
    initial_scale_power: int
    loss_scale_window: int


class DeepSpeedConfig(TypedDict):
    """The part of DeepSpeed's JSON config a cell sets (https://www.deepspeed.ai/docs/config-json/)."""

    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    gradient_clipping: float
    optimizer: Optimizer
    zero_optimization: Zero
    steps_per_print: int
    wall_clock_breakdown: bool
    bf16: NotRequired[Enabled]
    fp16: NotRequired[LossScaling]


def uses_torch_adam(method: MethodConfig) -> bool:
    """Whether the optimizer is PyTorch's AdamW rather than a DeepSpeed op.

    With optimizer offload DeepSpeed needs its own ``cpu_adam`` op (compiled once per machine, about 50 s); in every
    other case PyTorch's AdamW avoids compiling ``fused_adam`` inside the job, which would need a CUDA toolchain on
    the compute node and be timed as start-up of the first cell of every fresh machine.
    """
    return not method.offload_optimizer


def check_method(method: MethodConfig) -> None:
    """Refuse settings DeepSpeed cannot run, naming the key and what is accepted."""
    if method.precision not in PRECISIONS:
        raise ValueError(f"method.precision={method.precision!r}: accepted are {', '.join(PRECISIONS)}")
    if method.zero_stage not in ZERO_STAGES:
        raise ValueError(f"method.zero_stage={method.zero_stage}: accepted are {', '.join(map(str, ZERO_STAGES))}")
    if method.offload_optimizer and method.zero_stage == 0:
        raise ValueError("method.offload_optimizer=true needs method.zero_stage 1, 2 or 3")
    if method.offload_params and method.zero_stage != 3:
        raise ValueError("method.offload_params=true needs method.zero_stage=3")


def build_ds_config(method: MethodConfig, plan: BatchPlan, lr: float, accelerator: str = "cuda") -> DeepSpeedConfig:
    """The DeepSpeed config that trains with ``method``'s settings and ``plan``'s batch split.

    ``accelerator`` is the GPU config's (``cuda`` or ``cpu``; pinned host memory only makes sense next to a GPU).
    """
    check_method(method)
    pin_memory = accelerator == "cuda"
    zero: Zero = {"stage": int(method.zero_stage)}
    if method.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin_memory}
    if method.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin_memory}

    optimizer_params: AdamParams = {
        "lr": lr,
        "betas": list(ADAM_BETAS),
        "eps": ADAM_EPS,
        "weight_decay": WEIGHT_DECAY,
    }
    if uses_torch_adam(method):
        optimizer_params["torch_adam"] = True

    config: DeepSpeedConfig = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum_steps,
        "gradient_clipping": GRADIENT_CLIPPING,
        "optimizer": {"type": "AdamW", "params": optimizer_params},
        "zero_optimization": zero,
        # Printing and timers of DeepSpeed's own would add host synchronisation inside the timed steps.
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if method.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif method.precision == "fp16":
        # Dynamic loss scaling, as mixed-precision training runs it: overflowing steps are skipped.
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000}
    return config
