"""The predictor plans the model that was asked for: every field of the composed ModelConfig reaches it.

The family tests check the family modules; these check what the predictor hands them, on the path `gpudays plan`
takes (Hydra composition of the shipped conf/, then analysis.predict.predictor), and on the path a sweep's records take
(cells.yaml read back through the records table).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from analysis.predict.inputs import flat_cell, inputs_from_columns
from analysis.predict.predictor import plan as predict_plan
from analysis.sweeps.columns import ARCHITECTURE_FIELDS, model_of_row
from analysis.sweeps.records import load_cells
from orchestrator.config.schema import ModelConfig, to_config
from orchestrator.models import family_module
from orchestrator.planning import plan as sweep
from orchestrator.store.paths import CELL_CONFIG_NAME

CONF = Path(__file__).resolve().parents[3] / "conf"
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))


def composed(*overrides: str) -> list[dict[str, Any]]:
    """The resolved configs of the cells the overrides describe, as `gpudays plan` composes them."""
    p = sweep.plan(["gpu=a100-80gb", "num_gpus=8", "cluster=local", *overrides])
    return [c.config for c in [*p.cells, *p.skipped]]


@pytest.fixture(scope="module")
def shipped() -> list[dict[str, Any]]:
    cells = composed(f"model={','.join(MODELS)}")
    assert sorted(c["model"]["name"] for c in cells) == sorted(MODELS)
    return cells


def test_every_shipped_model_is_costed_with_its_family_modules_figures(shipped: list[dict[str, Any]]) -> None:
    rows = [flat_cell(c) for c in shipped]
    x = inputs_from_columns({k: [r.get(k) for r in rows] for k in rows[0]}, len(rows))
    for i, cell in enumerate(shipped):
        model = to_config(cell).model
        family = family_module(model.family)
        assert x.known[i], model.name
        assert x.params[i] == family.num_parameters(model), model.name
        assert x.flops_per_sample[i] == family.flops_per_sample(model), model.name
        # The record path: a row of the table rebuilds the same ModelConfig.
        assert model_of_row(rows[i]) == model


def test_every_shipped_models_predicted_parameters_equal_numel_on_the_meta_device(
    shipped: list[dict[str, Any]],
) -> None:
    rows = [flat_cell(c) for c in shipped]
    x = inputs_from_columns({k: [r.get(k) for r in rows] for k in rows[0]}, len(rows))
    for i, cell in enumerate(shipped):
        model = to_config(cell).model
        module = family_module(model.family).build_model(model, "sdpa", torch.bfloat16, torch.device("meta"))
        assert x.params[i] == sum(p.numel() for p in module.parameters()), model.name


# For each family, a shipped model and the architecture fields changed, with a value its module accepts.
CHANGES: dict[str, Any] = {
    "num_layers": lambda m: m.num_layers + 2,
    "hidden_size": lambda m: m.hidden_size * 2,
    "num_heads": lambda m: m.num_heads * 2,
    "vocab_size": lambda m: m.vocab_size + 1024,
    "intermediate_size": lambda m: (m.intermediate_size or 4 * m.hidden_size) * 2,
    "rotary_pct": lambda m: 0.5 if m.rotary_pct != 0.5 else 1.0,
    "num_kv_heads": lambda m: m.num_heads if (m.num_kv_heads or m.num_heads) != m.num_heads else m.num_heads // 2,
    "head_dim": lambda m: (m.head_dim or m.hidden_size // m.num_heads) * 2,
    "tie_word_embeddings": lambda m: not m.tie_word_embeddings,
    "rope_theta": lambda m: (m.rope_theta or 10_000.0) * 2,
    "norm_eps": lambda m: (m.norm_eps or 1e-5) * 10,
    "seq_length": lambda m: m.seq_length * 2,
    "num_experts": lambda m: (m.num_experts or 4) * 2,
    "num_experts_per_token": lambda m: (m.num_experts_per_token or 1) + 1,
    "image_size": lambda m: (m.image_size or 32) * 2,
    "patch_size": lambda m: (m.patch_size or 4) * 2,
    "stage_depths": lambda m: "1,1,1,1" if m.stage_depths != "1,1,1,1" else "2,2,2,2",
    "family": None,
}
FAMILY_MODELS = ("pythia-160m", "smollm2-135m", "llama-3.2-1b", "qwen3-0.6b", "olmo2-1b")


def _memory_figures(model: ModelConfig) -> tuple[float, ...]:
    family = family_module(model.family)
    return (
        family.num_parameters(model),
        family.activation_bytes_per_token_per_layer(model, "sdpa", False) * model.num_layers * model.seq_length,
        family.logit_bytes_per_token(model) * model.seq_length,
        family.largest_weight_elements(model),
    )


def _time_figures(model: ModelConfig) -> tuple[float, ...]:
    family = family_module(model.family)
    return (family.num_parameters(model), family.flops_per_token(model) * model.seq_length)


def test_the_changes_cover_every_architecture_field() -> None:
    assert set(CHANGES) == set(ARCHITECTURE_FIELDS)


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_changing_an_architecture_field_the_family_reads_changes_plans_memory_and_step_time(name: str) -> None:
    # A fixed micro-batch: with auto, a longer sequence halves the micro-batch and the peak can stay put.
    base_cell = composed(f"model={name}", "method.micro_batch_size=1")[0]
    base_model = to_config(base_cell).model
    read: dict[str, tuple[bool, bool]] = {}
    cells = [base_cell]
    for key, change in CHANGES.items():
        if change is None:
            continue
        value = change(base_model)
        changed = dataclasses.replace(base_model, **{key: value})
        if family_module(base_model.family).architecture_errors(changed):
            continue
        memory = _memory_figures(changed) != _memory_figures(base_model)
        time = _time_figures(changed) != _time_figures(base_model)
        if memory or time:  # rope_theta and norm_eps change numerics only: nothing to cost
            read[key] = (memory, time)
            cells.append({**base_cell, "model": {**base_cell["model"], key: value}})
    frame = predict_plan(cells)
    base = frame.iloc[0]
    for (key, (memory, time)), (_, row) in zip(read.items(), list(frame.iloc[1:].iterrows()), strict=True):
        if memory:
            assert row["predicted_peak_memory_gib"] != pytest.approx(base["predicted_peak_memory_gib"], rel=1e-9), key
        if time:
            assert row["predicted_step_time_s"] != pytest.approx(base["predicted_step_time_s"], rel=1e-9), key
    # The fields the predictor once dropped are among those read by the grouped-query families.
    if base_model.family != "gpt_neox":
        assert {"num_kv_heads", "head_dim", "tie_word_embeddings"} <= set(read)
    assert {"num_layers", "hidden_size", "vocab_size", "seq_length"} <= set(read)


def test_plan_with_an_architecture_override_differs_from_the_shipped_model() -> None:
    # `plan model=llama-3.2-1b model.num_kv_heads=32` once printed what `plan model=llama-3.2-1b` prints.
    shipped, changed = (
        composed("model=llama-3.2-1b"),
        composed("model=llama-3.2-1b", "model.num_kv_heads=32", "model.num_parameters=null"),
    )
    frame = predict_plan([*shipped, *changed])
    assert frame["predicted_peak_memory_gib"].iloc[1] > frame["predicted_peak_memory_gib"].iloc[0]


def test_records_read_back_carry_the_whole_model(tmp_path: Path) -> None:
    import yaml

    cell = composed("model=llama-3.2-1b")[0]
    folder = tmp_path / "sweep" / "cells" / "abc123"
    folder.mkdir(parents=True)
    (folder / CELL_CONFIG_NAME).write_text(yaml.safe_dump(cell))
    frame = load_cells([tmp_path / "sweep"]).frame
    model = model_of_row(frame.iloc[0].to_dict())
    assert model == to_config(cell).model
    x = inputs_from_columns({c: frame[c] for c in frame.columns}, len(frame))
    assert x.params[0] == family_module("llama").num_parameters(to_config(cell).model)
    assert isinstance(frame, pd.DataFrame)


def test_a_family_that_reaches_less_of_the_peak_is_costed_at_its_own_stated_efficiency(
    shipped: list[dict[str, Any]],
) -> None:
    from analysis.predict.step_time import DEFAULT_EFFICIENCY, step_terms

    rows = [flat_cell(c) for c in shipped]
    x = inputs_from_columns({k: [r.get(k) for r in rows] for k in rows[0]}, len(rows))
    compute = step_terms(x, np.ones(len(rows)))[:, 0]
    for i, cell in enumerate(shipped):
        model = to_config(cell).model
        own = getattr(family_module(model.family), "COMPUTE_EFFICIENCY", None)
        if own is None:
            continue  # a decoder: its products at the rates of its GPU's profile (cited where not measured)
        at_peak = x.batch[i] * x.flops_per_sample[i] / x.num_gpus[i] / (x.reference_tflops[i] * 1e12)
        # the compute term, over the decoders' efficiency (its coefficient), is FLOPs at the family's own share
        assert compute[i] / DEFAULT_EFFICIENCY == pytest.approx(at_peak / own), model.name
    by_name = {to_config(c).model.name: i for i, c in enumerate(shipped)}
    assert x.family_efficiency[by_name["convnext-t"]] < x.family_efficiency[by_name["vit-b16"]] < DEFAULT_EFFICIENCY
    assert pd.isna(x.family_efficiency[by_name["pythia-1b"]])
