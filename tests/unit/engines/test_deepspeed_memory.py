"""DeepSpeed's memory model: ZeRO states (hand-checked against the ZeRO paper), offload, buffers, activations,
and the micro-batch rule the probe and the predictor share."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config.batch import divisors
from orchestrator.config.schema import Config, MethodConfig, to_config
from orchestrator.engines.deepspeed.memory import build_bytes, estimate_micro_batch_size, fixed_bytes, model_state_bytes
from orchestrator.engines.memory import (
    ALLOCATOR_OVERHEAD,
    EXPANDABLE_OVERHEAD,
    GIB,
    activation_bytes_per_sequence,
    largest_fitting_divisor,
    peak_bytes,
    sequences_that_fit,
)
from orchestrator.planning.plan import plan


def cell(*overrides: str) -> Config:
    p = plan(list(overrides), sweep_dir=None)
    cells = p.cells + p.skipped
    assert len(cells) == 1
    return to_config(cells[0].config)


def method(**overrides: object) -> MethodConfig:
    return dataclasses.replace(MethodConfig(), **overrides)  # type: ignore[arg-type]


def test_zero_model_states_match_the_zero_paper() -> None:
    """Figure 1 of Rajbhandari et al. (2020): 7.5B parameters on 64 GPUs, K = 12."""
    psi, n = 7.5e9, 64
    expected_gb = {0: 120.0, 1: 31.40625, 2: 16.640625, 3: 1.875}  # 16Ψ; 4Ψ+12Ψ/N; 2Ψ+14Ψ/N; 16Ψ/N
    for stage, gb in expected_gb.items():
        assert sum(model_state_bytes(psi, stage, n)) / 1e9 == pytest.approx(gb, rel=1e-12), stage


def test_zero_split_per_stage() -> None:
    psi, n = 1e9, 8
    assert model_state_bytes(psi, 0, n) == (2e9, 2e9, 12e9)
    assert model_state_bytes(psi, 1, n) == (2e9, 2e9, 1.5e9)
    assert model_state_bytes(psi, 2, n) == (2e9, 0.25e9, 1.5e9)
    assert model_state_bytes(psi, 3, n) == (0.25e9, 0.25e9, 1.5e9)
    assert sum(model_state_bytes(psi, 3, 1)) == 16e9  # one GPU: nothing to partition


def test_offload_moves_optimizer_states_and_the_gradient_partition_to_the_host() -> None:
    # DeepSpeed 0.19 (stage_1_and_2.py): with offload_optimizer the fp32 gradient partition lives on the
    # optimizer's device, the CPU; stage 1 still accumulates full 16-bit gradients on the GPU.
    psi, n = 1e9, 4
    assert model_state_bytes(psi, 2, n, offload_optimizer=True) == (2e9, 0.0, 0.0)
    assert model_state_bytes(psi, 1, n, offload_optimizer=True) == (2e9, 2e9, 0.0)
    assert model_state_bytes(psi, 3, n, offload_optimizer=True, offload_params=True) == (0.0, 0.0, 0.0)
    assert model_state_bytes(psi, 0, n, offload_optimizer=True) == model_state_bytes(psi, 0, n)  # needs sharding
    assert model_state_bytes(psi, 0, 1, precision="fp32") == (4e9, 4e9, 8e9)


def test_arrays_are_evaluated_element_wise_like_scalars() -> None:
    stages = [0, 1, 2, 3]
    params, grads, optim = model_state_bytes([1e9] * 4, stages, [8] * 4)
    for i, stage in enumerate(stages):
        assert (params[i], grads[i], optim[i]) == model_state_bytes(1e9, stage, 8)


def test_activations_by_hand_pythia_1b() -> None:
    model = cell("model=pythia-1b").model  # s = h = 2048, a = 8, L = 16, V = 50304
    # Per layer and token 36h + 6a = 73,776 bytes (SDPA); logits 12 bytes x 50,304 = 603,648 per token.
    per_token = 16 * 73_776 + 603_648
    assert activation_bytes_per_sequence(model, method()) == 2048 * per_token
    # Compiled block by block, the loss a region of its own: 4 bytes per logit entry; the whole engine: 6.
    assert activation_bytes_per_sequence(model, method(compile=True)) == 2048 * (16 * 73_776 + 4 * 50_304)
    whole = method(compile=True, compile_scope="whole")
    assert activation_bytes_per_sequence(model, whole) == 2048 * (16 * 73_776 + 6 * 50_304)
    # Checkpointing: each layer keeps its input (2h = 4,096 bytes a token); the peak is then the loss (the
    # larger of the loss and one rebuilt layer).
    assert activation_bytes_per_sequence(model, method(activation_checkpointing=True)) == 2048 * (16 * 4_096 + 603_648)
    # Eager attention keeps 5.25 bytes per score: + 5.25 * 8 * 2048 a token and layer.
    eager = activation_bytes_per_sequence(model, method(attention="eager"))
    assert eager == 2048 * (16 * (36 * 2048 + 5.25 * 8 * 2048) + 603_648)


def test_micro_batch_rule_is_every_divisor_not_only_powers_of_two() -> None:
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(1) == [1]
    assert largest_fitting_divisor(12, 5) == 4
    assert largest_fitting_divisor(24, 7) == 6  # a power-of-two rule would say 4
    assert largest_fitting_divisor(1024, 50) == 32
    assert largest_fitting_divisor(12, 0) == 1  # nothing fits: the smallest is tried
    assert largest_fitting_divisor(12, float("nan")) == 12  # unknown memory: the whole batch
    assert list(largest_fitting_divisor([12, 24, 7], [5, 7, 100])) == [4, 6, 7]


def test_estimate_is_the_most_sequences_whose_reserved_peak_fits() -> None:
    cfg = cell("model=pythia-1b", "gpu=h100-80gb")
    estimate = estimate_micro_batch_size(cfg, 80.0)
    fixed = fixed_bytes(cfg.model, cfg.method, 1)
    per_sequence = activation_bytes_per_sequence(cfg.model, cfg.method)
    usable = 0.9 * 80 * GIB
    assert peak_bytes(fixed, per_sequence, estimate) <= usable < peak_bytes(fixed, per_sequence, estimate + 1)
    assert sequences_that_fit(usable, fixed, per_sequence) == estimate
    assert peak_bytes(fixed, 0, 1) == pytest.approx(EXPANDABLE_OVERHEAD * fixed)  # the probe's allocator
    assert peak_bytes(fixed, 0, 1, expandable=False) == pytest.approx(ALLOCATOR_OVERHEAD * fixed)
    assert peak_bytes(fixed, 0, 1, "cpu") == fixed  # no caching allocator on the host
    assert estimate_micro_batch_size(cfg, 0.5) == 1
    checkpointed = dataclasses.replace(cfg, method=method(activation_checkpointing=True))
    assert estimate_micro_batch_size(checkpointed, 80.0) > estimate


def test_the_build_holds_the_model_in_its_dtype_partitioned_only_at_stage_3() -> None:
    psi, largest = 1e9, 1e7
    assert build_bytes(psi, largest, 2, 8, "bf16", False) == 2 * psi
    assert build_bytes(psi, largest, 0, 8, "fp32", False) == 4 * psi
    assert build_bytes(psi, largest, 3, 8, "bf16", False) == 2 * psi / 8 + 2 * largest
    assert build_bytes(psi, largest, 3, 8, "bf16", True) == 2 * largest, "zero.Init puts the partitions on the host"


def test_regional_compile_has_its_own_allocator_overhead() -> None:
    from orchestrator.engines.memory import ALLOCATOR_OVERHEAD_REGIONAL_COMPILE, allocator_overhead, compiles_regionally

    regional = compiles_regionally([True, True, False], ["regional", "whole", "regional"])
    assert regional.tolist() == [True, False, False]
    assert allocator_overhead(["cuda"] * 3, regional).tolist() == [
        ALLOCATOR_OVERHEAD_REGIONAL_COMPILE, EXPANDABLE_OVERHEAD, EXPANDABLE_OVERHEAD,
    ]  # fmt: skip
    assert allocator_overhead(["cuda"] * 3, regional, expandable=False).tolist() == [
        ALLOCATOR_OVERHEAD_REGIONAL_COMPILE, ALLOCATOR_OVERHEAD, ALLOCATOR_OVERHEAD,
    ]  # fmt: skip
    assert allocator_overhead("cpu", True) == 1.0
    assert sequences_that_fit(100.0, 0.0, 1.0, "cuda", True) > sequences_that_fit(100.0, 0.0, 1.0)
