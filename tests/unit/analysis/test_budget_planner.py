"""What a budget buys: compute-optimal sizes, budgets in every form, and sane answers at BigScience's scale."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import synthetic
import yaml

from analysis.planners.budget import (
    Measured,
    allowance,
    compute_optimal,
    optimal_for_budget,
    parse_budget,
    parse_size,
    sized_model,
    tokens_for_budget,
)
from analysis.predict.network import network_for
from analysis.predict.parallelism import PREDICTOR
from orchestrator.cli.main import main
from orchestrator.config.schema import GpuConfig, ModelConfig
from orchestrator.models import num_parameters

CONF = Path(__file__).resolve().parents[3] / "conf"


def _gpu(name: str) -> GpuConfig:
    return GpuConfig(**yaml.safe_load((CONF / "gpu" / f"{name}.yaml").read_text()))


def _model(name: str) -> ModelConfig:
    return ModelConfig(**yaml.safe_load((CONF / "model" / f"{name}.yaml").read_text()))


def test_compute_optimal_gives_back_n_and_d() -> None:
    # C = 6 * N * D with N = 1e9 and D = 20 N = 2e10: C = 1.2e20 FLOPs.
    n, d = compute_optimal(6 * 1e9 * 2e10)
    assert n == pytest.approx(1e9, rel=1e-12)
    assert d == pytest.approx(2e10, rel=1e-12)
    with pytest.raises(ValueError, match="positive"):
        compute_optimal(0.0)


def test_budget_forms_and_their_errors() -> None:
    assert parse_budget(gpu_hours=1e6).kind == "gpu_hours"
    assert parse_budget(usd=1e5).kind == "cloud_usd"
    assert parse_budget(num_gpus=64, days=30).kind == "gpu_days"
    with pytest.raises(ValueError, match="exactly one"):
        parse_budget(gpu_hours=1.0, usd=1.0)
    with pytest.raises(ValueError, match="exactly one"):
        parse_budget()
    with pytest.raises(ValueError, match="needs --days"):
        parse_budget(usd=1e5, pricing="purchase")
    with pytest.raises(ValueError, match="--gpu-hours -5: give an amount above 0"):
        parse_budget(gpu_hours=-5)
    with pytest.raises(ValueError, match="cloud or purchase"):
        parse_budget(usd=1.0, pricing="lease")


def test_allowances_by_hand() -> None:
    h100 = _gpu("h100-80gb")  # $4.176 a GPU-hour, $30,000 a GPU
    assert allowance(parse_budget(usd=1e5), h100, 8).gpu_hours == pytest.approx(1e5 / 4.176)
    grant = allowance(parse_budget(num_gpus=64, days=30), h100, 8)
    assert (grant.gpu_hours, grant.num_gpus) == (64 * 30 * 24, 64)
    # A node: 8 x $30,000 + the $10,500 eight-slot server = $250,500; $1M buys 3 whole nodes (4 would be $1,002,000).
    bought = allowance(parse_budget(usd=1e6, pricing="purchase", days=365), h100, 8)
    assert bought.num_gpus == 24 and bought.gpu_hours == 24 * 365 * 24
    # Short of one node: 3 GPUs in a four-slot machine ($7,500 + $90,000); 4 would be $127,500.
    assert allowance(parse_budget(usd=1e5, pricing="purchase", days=10), h100, 8).num_gpus == 3
    assert allowance(parse_budget(usd=1e4, pricing="purchase", days=10), h100, 8).gpu_hours is None
    no_price = GpuConfig(name="x", architecture="hopper", memory_gib=80, peak_tflops_bf16=900.0)
    assert "cloud_usd_per_gpu_hour" in allowance(parse_budget(usd=1e5), no_price, 8).reason


def test_sizes_and_sized_models() -> None:
    assert parse_size("70B") == 70e9 and parse_size("350M") == 350e6 and parse_size("1.3e9") == 1.3e9
    with pytest.raises(ValueError, match="accepted"):
        parse_size("big")
    gpt3 = sized_model(175e9)
    assert (gpt3.num_layers, gpt3.hidden_size, gpt3.num_heads) == (96, 12288, 96)  # GPT-3 175B's own shape
    for target in (1e9, 7e9, 60e9):
        model = sized_model(target)
        assert num_parameters(model) == pytest.approx(target, rel=0.1)
        assert model.num_heads % 8 == 0 or model.hidden_size < 1024
        assert model.num_layers % 4 == 0


def test_a_settled_model_size_is_planned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Sizing repeats until the model settles; once a size comes back, its layouts (the same model, batch and
    # GPUs) would be searched again for the same rate.
    import analysis.planners.budget as budget

    planned: list[tuple[int, int]] = []
    curve = budget.scaling_curve

    def counted(model: ModelConfig, *args: object, **kwargs: object) -> object:
        planned.append((num_parameters(model), model.global_batch_size))
        return curve(model, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(budget, "scaling_curve", counted)
    a100 = _gpu("a100-80gb")
    rows = optimal_for_budget(a100, parse_budget(gpu_hours=1e6), network_for(a100))
    assert planned and len(planned) == len(set(planned)), planned
    assert rows[0]["num_parameters"] == planned[-1][0]


def test_one_million_a100_hours_is_sane() -> None:
    a100 = _gpu("a100-80gb")
    rows = optimal_for_budget(a100, parse_budget(gpu_hours=1e6), network_for(a100))
    assert {r["choice"] for r in rows} == {"cheapest", "fastest"}
    for row in rows:
        # BigScience's estimate for 1M A100-hours is a model of tens of billions of parameters.
        assert 2e10 <= row["compute_optimal_parameters"] <= 1.2e11
        assert row["compute_optimal_tokens"] == pytest.approx(20 * row["compute_optimal_parameters"])
        assert row["tokens_per_parameter"] == pytest.approx(20, rel=0.1)
        assert row["memory_gib"] <= 72.0  # 80 GB less the 10% margin
        assert row["source"] == "predicted"
        assert row["num_gpus"] > 8  # does not fit in one node
    cheapest = next(r for r in rows if r["choice"] == "cheapest")
    assert cheapest["budget_used_pct"] == pytest.approx(100, abs=2)
    assert cheapest["days"] <= 90.0
    fastest = next(r for r in rows if r["choice"] == "fastest")
    assert fastest["days"] <= cheapest["days"] and fastest["budget_used_pct"] <= 125.0 + 1e-6


def test_what_a_budget_trains_for_175b_matches_bloom_in_order() -> None:
    # BLOOM-176B: about 1M A100-hours for 366B tokens (Le Scao et al. 2022).
    a100 = _gpu("a100-80gb")
    model = sized_model(175e9)
    (row,) = tokens_for_budget(model, a100, parse_budget(gpu_hours=1e6), network_for(a100))
    assert 2e11 <= row["tokens"] <= 6e11
    assert row["tokens_vs_compute_optimal"] < 0.2  # far under 20 tokens a parameter
    assert row["memory_gib"] <= 72.0
    # of the kind large runs use: tensor parallelism inside a node, a pipeline across nodes (BLOOM: tp4 pp12 dp8)
    sizes = {part[:2]: int(part[2:]) for part in row["layout"].split() if part[:2] in ("tp", "pp")}
    assert sizes["tp"] in (4, 8) and sizes["pp"] >= 8, row["layout"]
    assert row["days"] <= 90.0 and row["num_gpus"] >= 1e6 / (24 * 90)


def test_measured_rows_use_the_measured_throughput() -> None:
    h100 = _gpu("h100-80gb")
    measured = Measured(tokens_per_s_per_gpu=70_000.0, mfu=0.45, num_gpus=1, sweep="s")
    rows = tokens_for_budget(_model("pythia-1b"), h100, parse_budget(gpu_hours=1000), network_for(h100), measured)
    by = {r["source"]: r for r in rows}
    assert set(by) == {"predicted", "measured"}
    assert by["measured"]["tokens"] == pytest.approx(1000 * 3600 * 70_000.0)
    assert "measured on 1 GPUs" in by["measured"]["reason"]


def test_budget_command_reads_records_and_writes_csv(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    config = synthetic.cell_config("pythia-160m", "h100-80gb")
    metrics = replace(synthetic.metrics(config, step_time_s=6.0, micro_batch_size=32), hfu=0.3)
    synthetic.write_cell(sweep, "c1", config, synthetic.record("c1", config, metrics_=metrics))
    out = tmp_path / "out"
    argv = ["budget", "--usd", "1e5", "--gpu", "h100-80gb", "--model", "pythia-160m", "--from", str(sweep)]
    assert main([*argv, "--out", str(out)]) == 0
    models = pd.read_csv(out / "budget_models.csv")
    measured = models[models["source"] == "measured"]
    # 1024 x 2048 tokens in 6 s on one GPU
    assert measured["tokens_per_s_per_gpu"].iloc[0] == pytest.approx(1024 * 2048 / 6.0)
    predicted = models[models["source"] == "predicted"]
    # The records' achieved share of the peak replaces the default efficiency of predictions on that GPU type.
    assert predicted["efficiency"].iloc[0] == pytest.approx(0.3)
    assert predicted["efficiency_source"].iloc[0] == "median of 1 record(s)"
    optimal = pd.read_csv(out / "budget_optimal.csv")
    assert set(optimal["choice"]) == {"cheapest", "fastest"}
    json.dumps(optimal.to_dict())  # plain values only


def test_budget_command_errors_name_what_is_accepted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["budget", "--gpus", "8", "--gpu", "a100-80gb"]) == 2
    assert "--gpus needs --days" in capsys.readouterr().err
    assert main(["budget", "--gpu-hours", "10", "--gpu", "b200"]) == 2
    assert "known (conf/gpu)" in capsys.readouterr().err
    assert main(["budget", "--gpu-hours", "10", "--from", str(tmp_path)]) == 2
    assert "not a sweep folder" in capsys.readouterr().err


def test_help_quotes_the_defaults_the_analysis_uses() -> None:
    from analysis.planners.budget import DEFAULT_MAX_DAYS, DEFAULT_OVERRUN_PCT
    from analysis.planners.shortest import MAX_GPUS
    from analysis.predict.parallelism import DEFAULT_EFFICIENCY
    from orchestrator.cli.parser import HELP_DEFAULTS

    assert HELP_DEFAULTS == {
        "efficiency": DEFAULT_EFFICIENCY, "max_days": DEFAULT_MAX_DAYS, "overrun_pct": DEFAULT_OVERRUN_PCT,
        "max_gpus": MAX_GPUS,
    }  # fmt: skip


def test_the_cheapest_configuration_needs_the_fewest_gpu_hours() -> None:
    # 1e4 A100-hours: 8 or 16 GPUs spend the budget within 90 days; 128 GPUs were picked at 101% of it.
    a100 = _gpu("a100-80gb")
    budget = parse_budget(gpu_hours=1e4)
    rows = optimal_for_budget(a100, budget, network_for(a100))
    cheapest = next(r for r in rows if r["choice"] == "cheapest")
    assert cheapest["budget_used_pct"] <= 100.0 + 1e-6
    assert cheapest["days"] <= 90.0
    # No count of GPUs that ends within 90 days trains the same tokens for fewer GPU-hours.
    for n in (8, 16, 32, 64, 128):
        (other,) = [r for r in optimal_for_budget(a100, parse_budget(num_gpus=n, days=1e4 / n / 24), network_for(a100))
                    if r["choice"] == "cheapest"]  # fmt: skip
        if other["model"] == cheapest["model"]:
            assert cheapest["gpu_hours"] <= other["gpu_hours"] * (1 + 1e-9)


def test_budget_shortest_and_plan_each_name_the_one_model_behind_their_gpu_hours(capsys, tmp_path: Path) -> None:
    from orchestrator.cli import main as cli

    argv = ["shortest", "--model", "pythia-1b", "--gpu", "a100-80gb", "--out", str(tmp_path), "--width", "400"]
    assert main(argv) == 0
    assert "step-time model (analysis/predict/predictor.py" in capsys.readouterr().out
    assert set(pd.read_csv(tmp_path / "shortest.csv")["predictor"]) == {PREDICTOR}
    budget = ["budget", "--gpu-hours", "1e4", "--gpu", "a100-80gb", "--model", "pythia-1b", "--width", "400"]
    assert main([*budget, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step-time model (analysis/predict/predictor.py" in out
    assert "wall_clock_days and wall_clock_gpu_hours: the whole run's at 90% goodput" in out
    for name in ("budget_models.csv", "budget_optimal.csv"):
        frame = pd.read_csv(tmp_path / name)
        assert frame["wall_clock_days"].to_numpy() == pytest.approx(frame["days"].to_numpy() / 0.90), name
    assert cli.main(["plan", "model=pythia-1b", "gpu=a100-80gb"]) == 0
    out = capsys.readouterr().out
    assert "predicted by the step-time model (analysis/predict/predictor.py" in out and "layout model" not in out
