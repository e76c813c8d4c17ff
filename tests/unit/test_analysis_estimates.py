"""The report's arithmetic against hand-checked figures: parameters, FLOPs, days, GPU-hours, costs, energy."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis import estimates as est
from analysis.records import Catalog

# Published totals (EleutherAI/pythia README), as listed in REFERENCE.md.
PUBLISHED_PARAMETERS = {
    "pythia-70m": 70_426_624,
    "pythia-160m": 162_322_944,
    "pythia-410m": 405_334_016,
    "pythia-1b": 1_011_781_632,
    "pythia-1.4b": 1_414_647_808,
    "pythia-2.8b": 2_775_208_960,
    "pythia-6.9b": 6_857_302_016,
    "pythia-12b": 11_846_072_320,
}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def test_every_published_pythia_model_is_configured(catalog: Catalog) -> None:
    assert set(PUBLISHED_PARAMETERS) <= set(catalog.models)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_parameter_formula_matches_config_and_published_total(catalog: Catalog, name: str) -> None:
    model = catalog.models[name]
    computed = est.gpt_neox_num_parameters(
        model["num_layers"], model["hidden_size"], model["vocab_size"], model.get("intermediate_size")
    )
    assert computed == model["num_parameters"] == PUBLISHED_PARAMETERS[name]


def test_tiny_model_parameters_match_its_config(catalog: Catalog) -> None:
    tiny = catalog.models["pythia-tiny"]
    # 2*(12*64^2 + 13*64) + 2*64 + 2*512*64, by hand
    assert est.gpt_neox_num_parameters(2, 64, 512) == 165_632 == tiny["num_parameters"]


def test_parameter_formula_matches_the_transformers_model(catalog: Catalog) -> None:
    """The formula counts what transformers' GPT-NeoX really builds (on the meta device: nothing allocated)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for name, model in sorted(catalog.models.items()):
        if model.get("family", "gpt_neox") != "gpt_neox":
            continue  # other families are checked against their own modules in tests/unit/models
        config = transformers.GPTNeoXConfig(
            vocab_size=model["vocab_size"],
            hidden_size=model["hidden_size"],
            num_hidden_layers=model["num_layers"],
            num_attention_heads=model["num_heads"],
            intermediate_size=model.get("intermediate_size") or 4 * model["hidden_size"],
            rotary_pct=model.get("rotary_pct", 0.25),
            max_position_embeddings=model["seq_length"],
            tie_word_embeddings=False,
            use_parallel_residual=True,
        )
        with torch.device("meta"):
            built = transformers.GPTNeoXForCausalLM(config)
        counted = sum(p.numel() for p in built.parameters())
        assert counted == model["num_parameters"], name


def test_flops_per_token_pythia_1b_by_hand() -> None:
    # Forward per token: 16 layers x (2*(4h^2 + 2*h*4h) + 4*s*h) + 2*V*h with h = s = 2048, V = 50304
    # = 16 x (100,663,296 + 16,777,216) + 206,045,184 = 2,085,093,376; training x3.
    assert est.model_flops_per_token(16, 2048, 50304, 2048) == 6_255_280_128
    # Narayanan et al.'s closed form, per token (B = s = 1 sequence of one token's share): same figure.
    per_step = est.narayanan_flops_per_step(1024, 2048, 16, 2048, 50304)
    assert per_step / (1024 * 2048) == pytest.approx(6_255_280_128, rel=1e-12)
    # Attention and logits add about 3% to the 6N rule at this size.
    assert 6_255_280_128 / (6 * PUBLISHED_PARAMETERS["pythia-1b"]) == pytest.approx(1.0304, abs=1e-4)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_flops_agree_with_narayanan_for_every_pythia_model(catalog: Catalog, name: str) -> None:
    m = catalog.models[name]
    per_token = est.model_flops_per_token(m["num_layers"], m["hidden_size"], m["vocab_size"], m["seq_length"])
    closed = est.narayanan_flops_per_step(1, m["seq_length"], m["num_layers"], m["hidden_size"], m["vocab_size"])
    assert per_token * m["seq_length"] == pytest.approx(closed, rel=1e-12)
    # The input embedding is a lookup, not a matmul: 6N counts it, the FLOPs do not.
    matmul_parameters = m["num_parameters"] - m["vocab_size"] * m["hidden_size"]
    assert 6 * matmul_parameters < per_token < 8 * m["num_parameters"]


def test_recomputation_costs_one_more_forward() -> None:
    assert est.hardware_flops_factor(True) == pytest.approx(4 / 3)
    assert est.hardware_flops_factor(False) == 1.0


def test_days_and_gpu_hours() -> None:
    # 143,000 steps of 3 s = 429,000 s = 4.9653 days; on 8 GPUs 953.33 GPU-hours.
    assert est.time_to_train_days(143_000, 3.0) == pytest.approx(429_000 / 86_400)
    assert est.gpu_hours(8, 143_000, 3.0) == pytest.approx(953.3333333)
    days = est.time_to_train_days(pd.Series([143_000, 1000]), pd.Series([3.0, 86.4]))
    assert list(days) == pytest.approx([4.965277778, 1.0])


@pytest.mark.parametrize(
    ("gpus_per_node", "usd"),
    [(1, 1_000), (2, 1_500), (3, 7_500), (4, 7_500), (8, 10_500), (16, 21_000)],
)
def test_base_machine_prices_of_the_paper(gpus_per_node: int, usd: float) -> None:
    assert est.base_machine_usd(gpus_per_node) == usd


def test_purchase_and_amortised_cost_follow_the_paper() -> None:
    # 8 x A100 80GB in one machine: $10,500 + 8 x $19,000 = $162,500 (Khandelwal et al. 2024).
    assert est.purchase_cost_usd(8, 1, 19_000) == 162_500
    # Two 4-GPU H100 machines.
    assert est.purchase_cost_usd(8, 2, 30_000) == 2 * (7_500 + 4 * 30_000)
    # 30 days of a five-year write-off.
    assert est.amortised_cost_usd(162_500, 30) == pytest.approx(162_500 * 30 / 1825)
    assert math.isnan(est.purchase_cost_usd(1, 1, float("nan")))


def test_cloud_cost_and_energy() -> None:
    hours = est.gpu_hours(8, 143_000, 3.0)
    assert est.cloud_cost_usd(hours, 1.79) == pytest.approx(1706.4667, rel=1e-6)
    assert est.energy_kwh(hours, 400) == pytest.approx(381.3333, rel=1e-6)


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        (None, "model", None),
        ("20x", "per_parameter", 20.0),
        ("0.5X", "per_parameter", 0.5),
        ("300e9", "absolute", 300e9),
        ("300B", "absolute", 300e9),
        ("1.5T", "absolute", 1.5e12),
        ("500M", "absolute", 500e6),
        ("4096", "absolute", 4096.0),
        (2e9, "absolute", 2e9),
    ],
)
def test_token_budgets_are_parsed(text: str | None, kind: str, value: float | None) -> None:
    budget = est.parse_token_budget(text)
    assert (budget.kind, budget.value) == (kind, value)


@pytest.mark.parametrize("text", ["abc", "-5x", "0", "10Q", "x", "3e9 tokens"])
def test_bad_token_budgets_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="20x"):
        est.parse_token_budget(text)


def test_training_steps_for_a_budget() -> None:
    tokens_per_step = 1024 * 2048
    assert est.train_steps_for(143_000 * tokens_per_step, tokens_per_step) == 143_000
    assert est.train_steps_for(300e9, tokens_per_step) == 143_052  # 143,051.1 rounded up
    chinchilla = est.train_tokens(est.parse_token_budget("20x"), 0, PUBLISHED_PARAMETERS["pythia-1b"])
    assert chinchilla == pytest.approx(20 * 1_011_781_632)


def test_confidence_interval_is_rebuilt_from_the_spread() -> None:
    # Given by the probe: used as is. Otherwise t(0.975, 9 dof) = 2.262: 2.262 * 0.1 / sqrt(10) / 2.0 = 3.577 %.
    out = est.ci95_halfwidth_pct([1.5, None, None], [2.0, 2.0, 2.0], [0.1, 0.1, None], [10, 10, 10])
    assert out[0] == 1.5
    assert out[1] == pytest.approx(3.5766, abs=1e-4)
    assert np.isnan(out[2])
    low, high = est.interval(np.array([10.0]), np.array([5.0]))
    assert (low[0], high[0]) == pytest.approx((9.5, 10.5))
