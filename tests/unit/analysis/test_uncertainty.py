"""Every prediction's 90% interval (analysis/predict/uncertainty.py): it holds held-out truths about as often as it says,
narrows as records come, and is wide, and says so, where nothing was measured."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import synthetic

from analysis.predict import discrepancy
from analysis.predict.calibration import calibrate
from analysis.predict.inputs import inputs_from_columns
from analysis.predict.predictor import flat_cell, plan, predict_cell, predict_frame, prediction_detail
from analysis.predict.uncertainty import OTHER_GPU_FACTOR, STEP_TIME_DISCREPANCY, bounds, quantile
from analysis.sweeps.catalog import recorded_cell
from orchestrator.engines.allocator import recorded_expandable

RECORDS = sorted((Path(__file__).resolve().parents[2] / "data" / "gpu-records").glob("h100-80gb*/*.json"))


@pytest.fixture(scope="module")
def grid() -> pd.DataFrame:
    return synthetic.grid(
        models=("pythia-70m", "pythia-410m", "pythia-1b", "smollm2-360m", "qwen3-0.6b", "llama-3.2-1b"),
        gpus=("a100-80gb", "l40s"),
        layouts=((1, 1), (2, 1), (8, 1), (16, 2)),
    )


def held_out(truth: pd.DataFrame, n: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``n`` measured cells to calibrate on, and the rest to judge the predictions by."""
    ok = truth[truth["status"] == "ok"]
    order = np.random.default_rng(seed).permutation(len(ok))
    return ok.iloc[order[:n]], ok.iloc[order[n:]]


def predicted_for(train: pd.DataFrame, test: pd.DataFrame) -> pd.DataFrame:
    return predict_frame(
        test, calibrate(train), micro_batch_size=test["micro_batch_size"], grad_accum_steps=test["grad_accum_steps"]
    )


def coverage(pred: pd.DataFrame, test: pd.DataFrame, name: str, truth: str) -> float:
    inside = (pred[f"{name}_low"] <= test[truth]) & (test[truth] <= pred[f"{name}_high"])
    return float(inside.mean())


def test_intervals_hold_held_out_truths_at_about_the_stated_rate(grid: pd.DataFrame) -> None:
    rates = []
    for seed in range(4):
        train, test = held_out(synthetic.perturbed_truth(grid, seed=seed), 120, seed)
        rates.append(coverage(predicted_for(train, test), test, "predicted_step_time_s", "step_time_s"))
    # 90% intervals over four perturbed grids: neither far over- nor under-confident.
    assert 0.85 <= float(np.mean(rates)) <= 0.97, rates
    assert min(rates) >= 0.8, rates


def test_the_posterior_narrows_as_records_come(grid: pd.DataFrame) -> None:
    truth = synthetic.perturbed_truth(grid, seed=1)
    widths = []
    for n in (5, 20, 80, 200):
        train, test = held_out(truth, n, seed=1)
        pred = predicted_for(train, test)
        widths.append(float((pred["predicted_step_time_s_high"] / pred["predicted_step_time_s_low"]).median()))
    assert widths == sorted(widths, reverse=True), widths
    assert widths[-1] < 0.5 * widths[0] + 0.5, widths


def test_uncalibrated_intervals_are_wider_and_say_so(grid: pd.DataFrame) -> None:
    truth = synthetic.perturbed_truth(grid, seed=2)
    train, test = held_out(truth, 60, seed=2)
    calibrated = predicted_for(train, test)
    uncalibrated = predict_frame(test, micro_batch_size=test["micro_batch_size"])
    assert (uncalibrated["predicted_from_records"] == 0).all() and (calibrated["predicted_from_records"] > 0).all()
    ratio = uncalibrated["predicted_step_time_s_high"] / uncalibrated["predicted_step_time_s_low"]
    ratio_calibrated = calibrated["predicted_step_time_s_high"] / calibrated["predicted_step_time_s_low"]
    assert (ratio > ratio_calibrated).mean() > 0.95
    # The uncalibrated intervals are wide, but they hold the truth.
    assert coverage(uncalibrated, test, "predicted_step_time_s", "step_time_s") > 0.9
    pred = predict_cell(synthetic.cell_config("pythia-160m", "a100-80gb", 2))
    assert not pred.calibrated and "uncalibrated" in pred.reason
    assert pred.step_time_low_s is not None and pred.step_time_high_s is not None and pred.step_time_s is not None
    # at least the uncalibrated discrepancy's own 90% spread off the reference GPU (Student's t above 1.645)
    assert pred.step_time_high_s / pred.step_time_s > math.exp(1.645 * OTHER_GPU_FACTOR * STEP_TIME_DISCREPANCY)


def test_days_hours_and_dollars_carry_the_step_time_s_interval() -> None:
    row = plan([synthetic.cell_config("pythia-410m", "h100-80gb", 4)]).iloc[0]
    share_low = row["predicted_step_time_s_low"] / row["predicted_step_time_s"]
    share_high = row["predicted_step_time_s_high"] / row["predicted_step_time_s"]
    for column in ("predicted_time_to_train_days", "predicted_gpu_hours", "predicted_cost_usd_cloud"):
        assert row[f"{column}_low"] == pytest.approx(row[column] * share_low)
        assert row[f"{column}_high"] == pytest.approx(row[column] * share_high)
    assert (
        row["predicted_peak_memory_gib_low"] < row["predicted_peak_memory_gib"] < row["predicted_peak_memory_gib_high"]
    )


def test_the_uncalibrated_intervals_hold_every_real_h100_record() -> None:
    records = [json.loads(path.read_text()) for path in RECORDS]
    assert len(records) == 14
    table = pd.DataFrame([flat_cell(recorded_cell(r["config"])) for r in records])
    # As cells.csv reads them: these probes ran before gpudays set the allocator (no expandable segments).
    table["allocator_expandable_segments"] = [recorded_expandable(r["environment"]) for r in records]
    assert not table["allocator_expandable_segments"].any()
    micro = pd.Series([float(r["metrics"]["micro_batch_size"]) for r in records])
    pred = predict_frame(table, micro_batch_size=micro)
    for record, (_, row) in zip(records, pred.iterrows(), strict=True):
        metrics = record["metrics"]
        assert row["predicted_step_time_s_low"] <= metrics["step_time_s"] <= row["predicted_step_time_s_high"]
        reserved = metrics["peak_memory_reserved_gib"]
        assert row["predicted_peak_memory_gib_low"] <= reserved <= row["predicted_peak_memory_gib_high"]


def test_the_interval_is_student_t_on_the_log_scale() -> None:
    low, high = bounds(np.array([10.0]), np.array([0.1]), 1e9)
    assert quantile(1e9) == pytest.approx(1.6449, abs=1e-4)
    assert (low[0], high[0]) == pytest.approx((10.0 / np.exp(0.16449), 10.0 * np.exp(0.16449)), rel=1e-4)
    assert quantile(4.0) == pytest.approx(2.1318, abs=1e-4)


def test_a_calibrated_interval_widens_for_a_model_far_from_its_records(
    grid: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Records of pythia-70m and 410m only: a 410m cell is among them, a 1b cell 2.5 times the nearest size.
    truth = synthetic.perturbed_truth(grid, seed=3)
    ok = truth[truth["status"] == "ok"]
    train = ok[ok["model"].isin(["pythia-70m", "pythia-410m"]) & (ok["gpu"] == "a100-80gb")]
    test = ok[ok["model"].isin(["pythia-410m", "pythia-1b"]) & (ok["gpu"] == "a100-80gb")]
    calibration = calibrate(train)

    def variance(rate: float) -> np.ndarray:
        monkeypatch.setattr(discrepancy, "SIZE_RATE", rate)
        out: np.ndarray = np.asarray(prediction_detail(test, calibration)["step_time_sd"], dtype=float) ** 2
        return out

    added = variance(0.2) - variance(0.0)
    far = (test["model"] == "pythia-1b").to_numpy()
    params = inputs_from_columns({c: test[c] for c in test.columns}, len(test)).params
    distance = np.log(params[far].max() / params[~far].max())
    assert added[~far] == pytest.approx(0.0, abs=1e-12)
    assert added[far] == pytest.approx((0.2 * distance) ** 2)


def test_a_profiled_gpu_types_prior_discrepancy_is_the_profiled_predictors() -> None:
    from analysis.predict.uncertainty import (
        OTHER_GPU_FACTOR,
        PROFILED_DISCREPANCY,
        PROFILED_REFERENCE_GPU,
        STEP_TIME_DISCREPANCY,
        prior_spread,
    )

    # Measured where it was set (the H200's records with its profile), doubled elsewhere, as every prior width is.
    assert prior_spread(PROFILED_REFERENCE_GPU, profiled=True).step_time_sd == PROFILED_DISCREPANCY
    assert prior_spread("cpu", profiled=True).step_time_sd == OTHER_GPU_FACTOR * PROFILED_DISCREPANCY
    assert prior_spread("cpu").step_time_sd == OTHER_GPU_FACTOR * STEP_TIME_DISCREPANCY
    # Memory does not come from the profile: its width stays.
    assert prior_spread("cpu", profiled=True).memory_sd == prior_spread("cpu").memory_sd
