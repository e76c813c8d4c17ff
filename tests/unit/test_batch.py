"""The batch arithmetic: how an optimizer step is split over GPUs and micro-batches, and what is refused."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.config.batch import BatchSizeError, divisors, per_gpu_batch_size, plan_batch


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
