"""The batch arithmetic of a cell: how one optimizer step is split over GPUs and micro-batches.

Pure functions, the same for every engine: nothing here imports a training library or touches a device.

The batch arithmetic, as in every data-parallel run::

    per_gpu_batch_size = global_batch_size / num_gpus            (sequences each GPU sees per optimizer step)
    grad_accum_steps   = per_gpu_batch_size / micro_batch_size   (forward/backward passes per optimizer step)
    tokens_per_step    = global_batch_size * seq_length

so an optimizer step of the probe is exactly an optimizer step of the training run it stands for, with the
gradient reduction done once per step (at the accumulation boundary), not once per micro-batch. The probe may
time that step whole, or compose it from its parts (``orchestrator.job.timing.compose_step_s``)::

    step_time_s = grad_accum_steps * micro_step_s + boundary_s
"""

from __future__ import annotations

from dataclasses import dataclass


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
