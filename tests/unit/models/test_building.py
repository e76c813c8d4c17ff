"""Every family builds through the one ``building.Builder``: a family module names its classes, config arguments
and refusals, and holds no builder of its own."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from types import ModuleType
from typing import Any

import pytest
import transformers

from orchestrator.config.schema import ModelConfig
from orchestrator.models import FAMILIES
from orchestrator.models.building import Builder

BUILDER_FUNCTIONS = ("architecture_errors", "build_model_config", "build_model")

# For each family, a shape it can build and one it refuses, with the key its refusal names.
BUILDABLE = {
    "gpt_neox": ModelConfig(name="tiny", num_layers=1, hidden_size=64, num_heads=4, vocab_size=128, seq_length=32),
    "llama": ModelConfig(
        name="tiny",
        family="llama",
        num_layers=1,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=96,
        rotary_pct=1.0,
        vocab_size=128,
        seq_length=32,
    ),
}
BUILDABLE["qwen3"] = dataclasses.replace(BUILDABLE["llama"], family="qwen3", head_dim=32)
BUILDABLE["olmo2"] = dataclasses.replace(BUILDABLE["llama"], family="olmo2")
BUILDABLE["roberta"] = dataclasses.replace(BUILDABLE["gpt_neox"], family="roberta", tie_word_embeddings=True)
BUILDABLE["olmoe"] = dataclasses.replace(BUILDABLE["llama"], family="olmoe", num_experts=4, num_experts_per_token=2)
BUILDABLE["mixtral"] = dataclasses.replace(BUILDABLE["olmoe"], family="mixtral")
BUILDABLE["mamba"] = dataclasses.replace(BUILDABLE["gpt_neox"], family="mamba", num_heads=1, tie_word_embeddings=True)
BUILDABLE["vit"] = dataclasses.replace(BUILDABLE["gpt_neox"], family="vit", image_size=32, patch_size=8)
BUILDABLE["convnext"] = dataclasses.replace(
    BUILDABLE["gpt_neox"], family="convnext", num_heads=1, num_layers=4, stage_depths="1,1,1,1", image_size=32,
    patch_size=4,
)  # fmt: skip
REFUSED: dict[str, tuple[dict[str, Any], list[str]]] = {
    "gpt_neox": ({"num_kv_heads": 2, "head_dim": 8}, ["model.num_kv_heads", "model.head_dim"]),
    "llama": ({"num_kv_heads": 3, "rotary_pct": 0.5}, ["model.num_kv_heads", "model.rotary_pct"]),
    "qwen3": ({"intermediate_size": None}, ["model.intermediate_size"]),
    "olmo2": ({"num_heads": 3, "head_dim": None}, ["model.num_kv_heads", "model.num_heads"]),
    "roberta": ({"num_heads": 3, "tie_word_embeddings": False}, ["model.num_heads", "model.tie_word_embeddings"]),
    "olmoe": ({"num_kv_heads": 3, "num_experts": None}, ["model.num_kv_heads", "model.num_experts"]),
    "mixtral": ({"num_experts_per_token": 5}, ["model.num_experts_per_token"]),
    "mamba": ({"num_heads": 4, "tie_word_embeddings": False}, ["model.num_heads", "model.tie_word_embeddings"]),
    "vit": ({"patch_size": 7, "num_kv_heads": 2}, ["model.patch_size", "model.num_kv_heads"]),
    "convnext": ({"num_layers": 3, "num_heads": 2}, ["model.num_layers", "model.num_heads"]),
}


def family_module(family: str) -> ModuleType:
    """The module that implements ``family`` (a language family registers its ``FAMILY``, built there)."""
    return importlib.import_module(f"orchestrator.models.{family}")


def test_every_family_has_a_buildable_and_a_refused_shape() -> None:
    assert sorted(BUILDABLE) == sorted(REFUSED) == sorted(FAMILIES)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_builder_functions_are_the_shared_builders(family: str) -> None:
    module = family_module(family)
    builder = module.BUILDER
    assert isinstance(builder, Builder)
    assert FAMILIES[family].BUILDER is builder, f"{family} is registered with another builder"  # type: ignore[attr-defined]
    for name in BUILDER_FUNCTIONS:
        bound = getattr(module, name)
        assert bound.__self__ is builder, f"{family}.{name} is not its BUILDER's"
        assert bound.__func__ is getattr(Builder, name), f"{family}.{name} is a copy of Builder.{name}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_family_module_defines_a_builder_or_calls_transformers_itself(family: str) -> None:
    source = inspect.getsource(family_module(family))
    defined = {node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)}
    assert not defined & set(BUILDER_FUNCTIONS), f"{family} defines {sorted(defined & set(BUILDER_FUNCTIONS))}"
    assert "_from_config" not in source and "import transformers" not in source
    assert "from transformers" not in source


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_named_classes_are_a_transformers_config_and_causal_lm(family: str) -> None:
    builder = family_module(family).BUILDER
    assert issubclass(getattr(transformers, builder.config_class), transformers.PretrainedConfig)
    assert issubclass(getattr(transformers, builder.causal_lm_class), transformers.PreTrainedModel)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_buildable_shape_builds_its_family_class_with_the_attention_asked_for(family: str) -> None:
    import torch

    builder = family_module(family).BUILDER
    model = BUILDABLE[family]
    assert FAMILIES[family].architecture_errors(model) == {}
    config = FAMILIES[family].build_model_config(model, "eager")
    assert type(config).__name__ == builder.config_class
    assert config._attn_implementation == "eager" or not builder.has_attention
    module = FAMILIES[family].build_model(model, "sdpa", torch.bfloat16, torch.device("meta"))
    assert type(module).__name__ == builder.causal_lm_class
    assert sum(p.numel() for p in module.parameters()) == FAMILIES[family].num_parameters(model)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_refused_shape_names_every_key_and_the_build_raises_the_first(family: str) -> None:
    overrides, keys = REFUSED[family]
    model = dataclasses.replace(BUILDABLE[family], **overrides)
    errors = FAMILIES[family].architecture_errors(model)
    assert list(errors) == keys
    assert all(problem.startswith(f"model 'tiny' ({family}): ") for problem in errors.values())
    with pytest.raises(ValueError) as err:
        FAMILIES[family].build_model_config(model, "sdpa")
    assert str(err.value) == errors[keys[0]]
