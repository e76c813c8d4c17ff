"""The report's arithmetic against hand-checked figures: days, GPU-hours, costs, energy, token budgets.

The model's own figures (parameters, FLOPs) are tested with its family module in tests/unit/models/."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.predict import estimates as est


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
        ("2000000", "absolute", 2e6),  # a bare number under a million tokens is a forgotten unit (below)
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
    chinchilla = est.train_tokens(est.parse_token_budget("20x"), 0, 1_011_781_632)
    assert chinchilla == pytest.approx(20 * 1_011_781_632)


def test_confidence_interval_is_rebuilt_from_the_spread() -> None:
    # Given by the probe: used as is. Otherwise t(0.975, 9 dof) = 2.262: 2.262 * 0.1 / sqrt(10) / 2.0 = 3.577 %.
    out = est.ci95_halfwidth_pct([1.5, None, None], [2.0, 2.0, 2.0], [0.1, 0.1, None], [10, 10, 10])
    assert out[0] == 1.5
    assert out[1] == pytest.approx(3.5766, abs=1e-3)
    assert np.isnan(out[2])
    low, high = est.interval(np.array([10.0]), np.array([5.0]))
    assert (low[0], high[0]) == pytest.approx((9.5, 10.5))


@pytest.mark.parametrize("text", ["300", "20", "999999"])
def test_a_small_token_count_without_a_unit_is_refused_naming_the_units(text: str) -> None:
    # `shortest --tokens 300` once answered a global batch of 1 and 0.00 days; `report --tokens 20` days of 1e-06.
    with pytest.raises(ValueError, match=rf"'{text}B'.*'{text}M'.*'{text}x'"):
        est.parse_token_budget(text)
    assert est.parse_token_budget("3e11").value == 3e11 and est.parse_token_budget("300B").value == 3e11
    assert est.parse_token_budget("1000000").value == 1e6
