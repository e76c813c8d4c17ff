"""The compute term from a profile's measured rates (analysis/predict/measured_compute.py): each product at its
shape's rate, the rest at the peak, recomputation counted, and nothing changed without a profile."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from analysis.predict.inputs import Inputs, inputs_from_columns
from analysis.predict.measured_compute import linear_layers
from analysis.predict.step_time import DEFAULT_EFFICIENCY, step_terms
from orchestrator.profile.identity import Identity
from orchestrator.profile.record import AttentionTime, MatmulTime, Profile

PEAK = 989.0
RATE = PEAK * 1e12 * DEFAULT_EFFICIENCY
"""The rate the peak's term assumes: a profile at this rate leaves the term as it is."""
L, H, HEADS, V, SEQ = 6, 512, 8, 50304, 2048
ACCUM = np.array([32.0])
"""64 sequences over 2 GPUs, one a micro-step: 2,048 tokens a product."""


def cell(**columns: Any) -> Inputs:
    base: dict[str, Any] = {
        "model_family": "gpt_neox", "model_num_layers": L, "model_hidden_size": H, "model_num_heads": HEADS,
        "model_vocab_size": V, "model_seq_length": SEQ, "model_global_batch_size": 64, "gpu": "h100-80gb",
        "gpu_architecture": "hopper", "gpu_memory_gib": 80, "gpu_peak_tflops_bf16": PEAK, "num_gpus": 2,
        "num_nodes": 1, "precision": "bf16",
    }  # fmt: skip
    return inputs_from_columns({k: [v] for k, v in {**base, **columns}.items()}, 1)


def profile(speed: dict[tuple[str, int, int], float] | None = None, only: set[tuple[str, int, int]] | None = None,
            attention: bool = True, dtype: str = "bf16", everything: float = 1.0) -> Profile:  # fmt: skip
    """Every product of the cell's layers at :data:`RATE` x ``everything`` (x ``speed`` of a (step, fan_in,
    fan_out)), or ``only`` those; the attention at the same rate where ``attention``."""
    x = cell()
    matmuls = []
    for layer in linear_layers(x.models[0]) or []:
        a, b = layer.fan_in, layer.fan_out
        for step, (m, k, n) in (("forward", (SEQ, a, b)), ("backward_input", (SEQ, b, a)),
                                ("backward_weight", (b, SEQ, a))):  # fmt: skip
            if only is not None and (step, a, b) not in only:
                continue
            rate = RATE * everything * (speed or {}).get((step, a, b), 1.0)
            matmuls.append(MatmulTime(f"{a}x{b}", step, m, k, n, dtype, 2.0 * m * k * n / rate))
    forward = 4.0 * SEQ * SEQ * HEADS * (H // HEADS) / (RATE * everything)  # the families' full square
    heads = (AttentionTime(SEQ, HEADS, H // HEADS, 1, dtype, forward, 2.0 * forward),) if attention else ()
    identity = Identity("h100-80gb", 2, 1, "test", "2.13", "nccl")
    return Profile(identity, "2026-01-01T00:00:00+00:00", 1.0, tuple(matmuls), heads, (), ())


def compute(x: Inputs, prof: Profile | None, gpu: str = "h100-80gb") -> float:
    return float(step_terms(x, ACCUM, None if prof is None else {gpu: prof})[0, 0])


def share_of_qkv_forward() -> float:
    x = cell()
    return 2.0 * H * 3 * H * SEQ * L / float(x.flops_per_sample[0])


def test_a_profile_at_the_peaks_rate_leaves_the_term_as_it_is() -> None:
    x = cell()
    assert compute(x, profile()) == pytest.approx(compute(x, None), rel=1e-9)
    assert compute(x, None) == pytest.approx(64 * float(x.flops_per_sample[0]) / 2 / (PEAK * 1e12))


def test_a_shape_twice_as_fast_lowers_the_term_by_half_its_share() -> None:
    x = cell()
    faster = compute(x, profile(speed={("forward", H, 3 * H): 2.0}))
    assert faster == pytest.approx(compute(x, None) * (1.0 - 0.5 * share_of_qkv_forward()), rel=1e-9)
    assert faster < compute(x, None)


def test_shapes_the_profile_lacks_fall_back_to_the_peak() -> None:
    x = cell()
    alone = compute(x, profile(speed={("forward", H, 3 * H): 2.0}, only={("forward", H, 3 * H)}, attention=False))
    assert alone == pytest.approx(compute(x, None) * (1.0 - 0.5 * share_of_qkv_forward()), rel=1e-9)


def test_no_profile_for_the_gpu_or_the_precision_changes_nothing() -> None:
    x = cell()
    slow = profile(everything=0.1)
    assert compute(x, slow, gpu="a100-80gb") == compute(x, None)
    assert compute(x, profile(everything=0.1, dtype="fp32")) == compute(x, None)
    assert compute(x, slow) == pytest.approx(10 * compute(x, None), rel=1e-9)


def test_checkpointings_recomputation_is_counted_at_the_forwards_rate() -> None:
    plain, rerun = cell(), cell(activation_checkpointing=True)
    assert rerun.flops_per_sample[0] > plain.flops_per_sample[0]
    for x in (plain, rerun):
        # Everything twice as fast halves the term, recomputation included.
        assert compute(x, profile(everything=2.0)) == pytest.approx(compute(x, None) / 2, rel=1e-9)
    # The rerun is charged at the layers' forward: a slower forward makes checkpointing cost more than it did.
    slow_forward = {("forward", a, b): 0.5 for a, b in ((H, 3 * H), (H, H), (H, 4 * H))}
    extra = compute(rerun, profile(speed=slow_forward)) - compute(plain, profile(speed=slow_forward))
    assert extra > compute(rerun, None) - compute(plain, None)


def test_a_device_without_a_peak_puts_what_the_profile_lacks_at_its_median_rate() -> None:
    cpu = {"gpu": "cpu", "gpu_architecture": "cpu", "gpu_peak_tflops_bf16": None}
    x = cell(**cpu)
    # Without a peak (1 TFLOP/s stands for it), at the rate of the profile everywhere: seconds x efficiency.
    seconds = 64 / 2 * float(x.flops_per_sample[0]) / RATE
    assert compute(x, profile(), gpu="cpu") == pytest.approx(DEFAULT_EFFICIENCY * seconds, rel=1e-9)
    assert compute(x, profile(attention=False), gpu="cpu") == pytest.approx(DEFAULT_EFFICIENCY * seconds, rel=1e-9)


MOE = {"model_family": "olmoe", "model_num_experts": 8, "model_num_experts_per_token": 2,
       "model_intermediate_size": 256, "model_num_kv_heads": 4, "model_rotary_pct": 1.0}  # fmt: skip
"""An OLMoE-shaped cell: 8 SwiGLU experts of width 256, 2 a token; 2,048 tokens a micro-step, 512 an expert."""


def moe_profile(expert_rate: float = 1.0, expert_tokens: int = SEQ) -> Profile:
    """Every product of the MoE cell's layers at :data:`RATE`, over a micro-step's tokens; the experts' products
    (their shapes' own) also over ``expert_tokens`` rows at ``expert_rate`` times it; attention at the same rate."""
    x = cell(**MOE)
    matmuls = []
    for layer in linear_layers(x.models[0]) or []:
        a, b = layer.fan_in, layer.fan_out
        expert = layer.token_share < 1.0
        for tokens, rate in ((SEQ, RATE), *(((expert_tokens, RATE * expert_rate),) if expert else ())):
            for step, (m, k, n) in (("forward", (tokens, a, b)), ("backward_input", (tokens, b, a)),
                                    ("backward_weight", (b, tokens, a))):  # fmt: skip
                matmuls.append(MatmulTime(f"{a}x{b}", step, m, k, n, "bf16", 2.0 * m * k * n / rate))
    forward = 4.0 * SEQ * SEQ * HEADS * (H // HEADS) / RATE
    heads = (AttentionTime(SEQ, HEADS, H // HEADS, 1, "bf16", forward, 2.0 * forward),)
    return Profile(Identity("h100-80gb", 2, 1, "test", "2.13", "nccl"), "2026-01-01T00:00:00+00:00", 1.0,
                   tuple(matmuls), heads, (), ())  # fmt: skip


def test_a_mixture_of_experts_has_its_products_profiled_and_counts_the_flops_its_family_does() -> None:
    x = cell(**MOE)
    layers = linear_layers(x.models[0]) or []
    experts = [layer for layer in layers if layer.token_share < 1.0]
    assert [e.token_share for e in experts] == [0.25, 0.25]  # 2 of 8 experts a token
    # At the peak's rate everywhere the term is the peak's: every FLOP the family counts is a profiled product's.
    assert compute(x, moe_profile()) == pytest.approx(compute(x, None), rel=1e-9)


def test_an_experts_products_are_read_at_the_tokens_routed_to_it() -> None:
    x = cell(**MOE)
    # The experts' shapes measured over 512 rows (2,048 tokens x 2 / 8) at half the rate: the term grows by the
    # experts' share of the FLOPs; measured over 2,048 rows only, the experts' rate is the full micro-step's.
    slow = compute(x, moe_profile(expert_rate=0.5, expert_tokens=SEQ * 2 // 8))
    experts = sum(2.0 * e.fan_in * e.fan_out * SEQ * e.count * 3 for e in linear_layers(x.models[0]) or []
                  if e.token_share < 1.0)  # fmt: skip
    share = experts / float(x.flops_per_sample[0])
    assert slow == pytest.approx(compute(x, None) * (1.0 + share), rel=1e-6)
    assert 0.05 < share < 0.5  # the logits (50,304 wide) take most of the rest
