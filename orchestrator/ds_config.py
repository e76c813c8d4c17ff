"""The batch arithmetic of a cell and the DeepSpeed config that trains it.

Pure functions: nothing here imports DeepSpeed or touches a device, so the unit tests check every rule.

The batch arithmetic, as in every data-parallel run::

    per_gpu_batch_size = global_batch_size / num_gpus            (sequences each GPU sees per optimizer step)
    grad_accum_steps   = per_gpu_batch_size / micro_batch_size   (forward/backward passes per optimizer step)
    tokens_per_step    = global_batch_size * seq_length

so an optimizer step of the probe is exactly an optimizer step of the training run it stands for, with the
gradient reduction done once per step (at the accumulation boundary), not once per micro-batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PRECISIONS = ("bf16", "fp16", "fp32")
ADAM_BETAS = (0.9, 0.95)
"""Adam betas of every Pythia run (EleutherAI/pythia models/*.yml)."""
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.01
"""Pythia's weight decay (models/*.yml)."""
GRADIENT_CLIPPING = 1.0
"""Pythia clips gradients at norm 1.0; the norm is part of a real step's cost, so the probe computes it too."""


class BatchSizeError(ValueError):
    """A micro-batch or GPU count that does not divide the batch it must split."""


def divisors(n: int) -> list[int]:
    """All positive divisors of ``n``, ascending: the micro-batch sizes that split ``n`` sequences evenly."""
    if n < 1:
        raise ValueError(f"divisors of {n}: need a positive integer")
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step of ``global_batch_size`` sequences is split over GPUs and micro-batches."""

    global_batch_size: int
    """Sequences per optimizer step across all GPUs (the model's training batch)."""
    num_gpus: int
    micro_batch_size: int
    """Sequences per GPU per forward/backward pass."""

    @property
    def per_gpu_batch_size(self) -> int:
        return self.global_batch_size // self.num_gpus

    @property
    def grad_accum_steps(self) -> int:
        return self.per_gpu_batch_size // self.micro_batch_size

    def tokens_per_step(self, seq_length: int) -> int:
        return self.global_batch_size * seq_length


def per_gpu_batch_size(global_batch_size: int, num_gpus: int) -> int:
    """Sequences each GPU processes per optimizer step; refuses a GPU count that does not divide the batch."""
    if num_gpus < 1:
        raise BatchSizeError(f"num_gpus={num_gpus}: need at least one GPU")
    if global_batch_size < 1 or global_batch_size % num_gpus:
        raise BatchSizeError(
            f"model.global_batch_size={global_batch_size} cannot be split evenly over num_gpus={num_gpus}; "
            f"use a GPU count that divides it ({', '.join(map(str, divisors(max(global_batch_size, 1))))})"
        )
    return global_batch_size // num_gpus


def plan_batch(global_batch_size: int, num_gpus: int, micro_batch_size: int) -> BatchPlan:
    """The batch plan for a fixed micro-batch; refuses one that does not divide the per-GPU batch, naming those
    that do."""
    per_gpu = per_gpu_batch_size(global_batch_size, num_gpus)
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise BatchSizeError(f"method.micro_batch_size={micro_batch_size!r}: need a positive integer or 'auto'")
    if per_gpu % micro_batch_size:
        raise BatchSizeError(
            f"method.micro_batch_size={micro_batch_size} does not divide the per-GPU batch of {per_gpu} sequences "
            f"(model.global_batch_size={global_batch_size} / num_gpus={num_gpus}); "
            f"use one of {', '.join(map(str, divisors(per_gpu)))} or 'auto'"
        )
    return BatchPlan(global_batch_size, num_gpus, micro_batch_size)


def uses_torch_adam(method: Mapping[str, Any]) -> bool:
    """Whether the optimizer is PyTorch's AdamW rather than a DeepSpeed op.

    With optimizer offload DeepSpeed needs its own ``cpu_adam`` op (compiled once per machine, about 50 s); in every
    other case PyTorch's AdamW avoids compiling ``fused_adam`` inside the job, which would need a CUDA toolchain on
    the compute node and be timed as start-up of the first cell of every fresh machine.
    """
    return not bool(method["offload_optimizer"])


def build_ds_config(method: Mapping[str, Any], plan: BatchPlan, lr: float, accelerator: str = "cuda") -> dict[str, Any]:
    """The DeepSpeed config that trains with ``method``'s settings and ``plan``'s batch split.

    ``method`` is the cell's ``method`` group (orchestrator/schema.py:MethodConfig); ``accelerator`` is the GPU
    config's (``cuda`` or ``cpu``; pinned host memory only makes sense next to a GPU).
    """
    precision = method["precision"]
    if precision not in PRECISIONS:
        raise ValueError(f"method.precision={precision!r}: accepted are {', '.join(PRECISIONS)}")
    stage = int(method["zero_stage"])
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"method.zero_stage={stage}: accepted are 0, 1, 2, 3")
    if method["offload_optimizer"] and stage == 0:
        raise ValueError("method.offload_optimizer=true needs method.zero_stage 1, 2 or 3")
    if method["offload_params"] and stage != 3:
        raise ValueError("method.offload_params=true needs method.zero_stage=3")

    pin_memory = accelerator == "cuda"
    zero: dict[str, Any] = {"stage": stage}
    if method["offload_optimizer"]:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin_memory}
    if method["offload_params"]:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin_memory}

    optimizer_params: dict[str, Any] = {
        "lr": lr,
        "betas": list(ADAM_BETAS),
        "eps": ADAM_EPS,
        "weight_decay": WEIGHT_DECAY,
    }
    if uses_torch_adam(method):
        optimizer_params["torch_adam"] = True

    config: dict[str, Any] = {
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
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        # Dynamic loss scaling, as mixed-precision training runs it: overflowing steps are skipped.
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000}
    return config
