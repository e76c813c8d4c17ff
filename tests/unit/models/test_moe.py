"""Mixture-of-experts families: memory counts every expert, FLOPs only the routed ones, against the real module."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from orchestrator.config.schema import ModelConfig
from orchestrator.models import FAMILIES, enable_activation_checkpointing, moe

TINY = ModelConfig(
    name="tiny", family="olmoe", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, vocab_size=256,
    intermediate_size=96, num_experts=8, num_experts_per_token=2, rotary_pct=1.0, seq_length=32,
)  # fmt: skip
SHAPES = [
    TINY,
    dataclasses.replace(TINY, hidden_size=96, num_heads=6, intermediate_size=64, num_experts=4),
    dataclasses.replace(TINY, family="mixtral"),
    dataclasses.replace(TINY, family="mixtral", num_heads=8, num_experts_per_token=3),
]
IDS = ["olmoe-e8", "olmoe-e4", "mixtral-e8", "mixtral-k3"]
FULL = {"olmoe-1b-7b": (6.9e9, 1.3e9), "mixtral-8x7b": (46.7e9, 12.9e9)}
"""Published total and active parameters (OLMoE paper, abstract; Mixtral paper, section 2)."""


@pytest.mark.parametrize("name", sorted(FULL))
def test_parameters_count_every_expert_and_the_active_ones_are_published(
    name: str, shipped_model: Callable[[str], ModelConfig]
) -> None:
    model = shipped_model(name)
    family = FAMILIES[model.family]
    module = family.build_model(model, "sdpa", torch.bfloat16, torch.device("meta"))
    numel = [p.numel() for p in module.parameters()]
    assert sum(numel) == family.num_parameters(model) == model.num_parameters
    assert max(numel) == family.largest_weight_elements(model)
    total, active = FULL[name]
    assert sum(numel) == pytest.approx(total, rel=0.01)
    assert moe.active_parameters(model, qk_norm=model.family == "olmoe") == pytest.approx(active, rel=0.02)


def eager_experts(model: ModelConfig) -> torch.nn.Module:
    """The module with transformers' eager experts (a loop of linear layers), whose products FlopCounterMode
    counts; the default ``grouped_mm`` runs ``torch._grouped_mm``, which it does not."""
    family = FAMILIES[model.family]
    config = family.build_model_config(model, "eager")
    config._experts_implementation = "eager"
    module: torch.nn.Module = getattr(transformers, family.BUILDER.causal_lm_class)._from_config(  # type: ignore[attr-defined]
        config, attn_implementation="eager", dtype=torch.float32
    )
    return module


@pytest.mark.parametrize("model", SHAPES, ids=IDS)
def test_flops_count_only_the_routed_experts(model: ModelConfig) -> None:
    family = FAMILIES[model.family]
    module = eager_experts(model)
    batch = family.synthetic_batch(model, 3, torch.Generator().manual_seed(0), torch.float32)
    module.train()
    with FlopCounterMode(display=False) as counter:
        module(**batch).loss.backward()
    assert counter.get_total_flops() == 3 * family.flops_per_sample(model)
    enable_activation_checkpointing(module)
    with FlopCounterMode(display=False) as counter:
        module(**batch).loss.backward()
    assert counter.get_total_flops() == 3 * family.flops_per_sample(model, recompute=True)
    dense = dataclasses.replace(model, num_experts_per_token=model.num_experts)
    assert family.flops_per_sample(model) < family.flops_per_sample(dense)
    assert family.num_parameters(model) == family.num_parameters(dense)


@pytest.mark.parametrize("model", [*SHAPES, dataclasses.replace(TINY, num_experts_per_token=3, seq_length=48)])
def test_activation_bytes_are_what_autograd_keeps(
    model: ModelConfig, saved_bytes_per_token: Callable[..., float]
) -> None:
    family = FAMILIES[model.family]
    module = family.build_model(model, "sdpa", torch.bfloat16, torch.device("cpu"))
    measured = saved_bytes_per_token(module, module.get_submodule("model.layers.1"), model.vocab_size, model.seq_length)
    assert measured == family.activation_bytes_per_token_per_layer(model, "sdpa", False)  # type: ignore[attr-defined]


def test_expert_fields_are_required_and_refused_elsewhere() -> None:
    errors = FAMILIES["olmoe"].architecture_errors(dataclasses.replace(TINY, num_experts=None, image_size=224))
    assert set(errors) == {"model.num_experts", "model.image_size"}
    errors = FAMILIES["olmoe"].architecture_errors(dataclasses.replace(TINY, num_experts_per_token=9))
    assert set(errors) == {"model.num_experts_per_token"}
    llama = dataclasses.replace(TINY, family="llama")
    assert set(FAMILIES["llama"].architecture_errors(llama)) == {"model.num_experts", "model.num_experts_per_token"}


def test_the_record_says_how_the_library_runs_the_experts() -> None:
    module = FAMILIES["olmoe"].build_model(TINY, "sdpa", torch.float32, torch.device("cpu"))
    assert FAMILIES["olmoe"].implementation(module)["moe_experts"] == module.config._experts_implementation_internal
    assert FAMILIES["olmoe"].implementation(eager_experts(TINY))["moe_experts"] == "eager"


def test_on_the_cpu_a_mixture_of_experts_runs_without_onednn_whose_kernel_cache_would_count_as_its_memory() -> None:
    """The CPU's "device memory" is the resident set's growth. A token's experts change every step, so with oneDNN
    every step JIT-compiles and caches GEMM kernels of new shapes (46 MiB over these three steps, 0.8 GiB in a
    probe): the probe turns it off for such a family, and the memory then holds still from step to step."""
    from orchestrator.job.metering import MemoryMeter
    from orchestrator.job.ranks import cpu_onednn

    assert cpu_onednn("llama") is None and torch.backends.mkldnn.is_available() == torch.backends.mkldnn.enabled
    try:
        assert (cpu_onednn("olmoe") or "").startswith("off") and not torch.backends.mkldnn.enabled
        family, cpu = FAMILIES["olmoe"], torch.device("cpu")
        module = family.build_model(TINY, "sdpa", torch.bfloat16, cpu)
        meter, generator = MemoryMeter(cpu), torch.Generator().manual_seed(0)
        for step in range(5):
            module(**family.synthetic_batch(TINY, 4, generator, torch.bfloat16)).loss.backward()
            if step == 1:
                settled = meter.in_use()
        assert meter.in_use() - settled < 8 * 2**20
    finally:
        torch.backends.mkldnn.set_flags(True)  # type: ignore[no-untyped-call]
    assert FAMILIES["mixtral"].CPU_ONEDNN is False  # type: ignore[attr-defined]
