"""The predictor against hand-checked memory figures (ZeRO paper, Korthikanti et al.) and its calibration."""

from __future__ import annotations

import pandas as pd
import pytest
from omegaconf import OmegaConf

from analysis import synthetic
from analysis.estimates import model_flops_per_token
from analysis.memory import GIB, activation_bytes, model_state_bytes
from analysis.predict import (
    PLAN_COLUMNS,
    Calibration,
    GpuCalibration,
    calibrate,
    flat_cell,
    plan,
    predict_cell,
    predict_frame,
)
from analysis.records import Catalog


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


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
    # One GPU: nothing to partition.
    assert sum(model_state_bytes(psi, 3, 1)) == 16e9


def test_offload_and_fp32_states() -> None:
    psi, n = 1e9, 4
    assert model_state_bytes(psi, 2, n, offload_optimizer=True) == (2e9, 0.0, 0.0)
    assert model_state_bytes(psi, 1, n, offload_optimizer=True) == (2e9, 2e9, 0.0)
    assert model_state_bytes(psi, 3, n, offload_optimizer=True, offload_params=True) == (0.0, 0.0, 0.0)
    # Offload needs sharding: at stage 0 it changes nothing.
    assert model_state_bytes(psi, 0, n, offload_optimizer=True) == model_state_bytes(psi, 0, n)
    assert model_state_bytes(psi, 0, 1, precision="fp32") == (4e9, 4e9, 8e9)


def test_activations_by_hand_pythia_1b() -> None:
    # s = h = 2048, b = 1, a = 8, L = 16, V = 50304.
    # Per layer s*b*h*(34 + 5*a*s/h) = 4,194,304 * 74 = 310,378,496 bytes (eager attention keeps the scores).
    # Logits and loss: 2048 * 50304 * 12 = 1,236,271,104 bytes.
    logits = 1_236_271_104
    assert activation_bytes(2048, 2048, 8, 16, 50304, 1, attention="eager") == 16 * 310_378_496 + logits
    # SDPA keeps no scores: 34 * s*b*h per layer.
    assert activation_bytes(2048, 2048, 8, 16, 50304, 1) == 16 * 34 * 4_194_304 + logits
    # Full recomputation keeps each layer's input (2*s*b*h) plus one layer being recomputed.
    assert activation_bytes(2048, 2048, 8, 16, 50304, 1, activation_checkpointing=True) == (
        16 * 2 * 4_194_304 + 34 * 4_194_304 + logits
    )
    # Linear in the micro-batch.
    assert activation_bytes(2048, 2048, 8, 16, 50304, 4) == 4 * activation_bytes(2048, 2048, 8, 16, 50304, 1)


def test_a_model_that_cannot_fit_is_predicted_not_to(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-12b", "a100-80gb", 1, catalog=catalog)
    pred = predict_cell(cell)
    assert not pred.fits
    assert pred.peak_memory_gib > 16 * 11_846_072_320 / GIB  # 176.5 GiB of model states alone
    assert "does not fit" in pred.reason and "72.0 GiB usable" in pred.reason
    # ZeRO-3 with everything offloaded to the host fits.
    offloaded = synthetic.cell_config(
        "pythia-12b", "a100-80gb", 1, catalog=catalog, zero_stage=3, offload_optimizer=True, offload_params=True
    )
    assert predict_cell(offloaded).fits


def test_auto_micro_batch_is_the_largest_power_of_two_that_fits(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-410m", "a100-80gb", 2, catalog=catalog)
    pred = predict_cell(cell)
    assert pred.fits
    micro = pred.micro_batch_size
    assert micro & (micro - 1) == 0 and 512 % micro == 0
    assert pred.grad_accum_steps == 512 // micro
    assert pred.peak_memory_gib <= 72.0
    # One step larger would not have fitted.
    assert predict_cell(cell, micro_batch_size=2 * micro).peak_memory_gib > 72.0
    # More memory never means a smaller micro-batch.
    bigger = synthetic.cell_config("pythia-410m", "h200", 2, catalog=catalog)
    assert predict_cell(bigger).micro_batch_size >= micro
    # A fixed micro-batch is taken as it is.
    fixed = synthetic.cell_config("pythia-410m", "a100-80gb", 2, catalog=catalog, micro_batch_size=2)
    assert predict_cell(fixed).micro_batch_size == 2


def test_breakdown_adds_up_and_margin_is_applied(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-1b", "a100-40gb", 4, catalog=catalog, zero_stage=2)
    pred = predict_cell(cell, margin=0.25)
    parts = pred.params_gib + pred.grads_gib + pred.optimizer_gib + pred.activations_gib + pred.buffers_gib
    assert parts == pytest.approx(pred.peak_memory_gib)
    assert pred.usable_memory_gib == pytest.approx(30.0)
    assert pred.grads_gib == pytest.approx(2 * 1_011_781_632 / 4 / GIB)


def test_probe_memory_limit_replaces_the_gpu_memory(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-tiny", "cpu", 1, catalog=catalog)
    cell["probe"]["memory_limit_gib"] = 0.001
    pred = predict_cell(cell)
    assert pred.usable_memory_gib == 0.001
    assert not pred.fits and "probe's memory limit" in pred.reason


def test_uncalibrated_step_time_is_flops_at_forty_percent_of_peak(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-70m", "a100-80gb", 1, catalog=catalog)
    pred = predict_cell(cell)
    flops = 1024 * 2048 * model_flops_per_token(6, 512, 50304, 2048)
    assert pred.step_time_s == pytest.approx(flops / (312e12 * 0.40))
    assert pred.communication_s == 0.0 and not pred.calibrated
    # More GPUs: less compute each, and communication appears.
    eight = predict_cell(synthetic.cell_config("pythia-70m", "a100-80gb", 8, catalog=catalog))
    assert eight.compute_s == pytest.approx(pred.compute_s / 8)
    assert eight.communication_s > 0


def test_cpu_has_no_step_time_until_calibrated(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-tiny", "cpu", 2, catalog=catalog)
    assert predict_cell(cell).step_time_s is None
    calibration = Calibration({"cpu": GpuCalibration(efficiency=0.05)})  # 0.05 TFLOP/s per process
    pred = predict_cell(cell, calibration)
    flops = 16 * 128 * model_flops_per_token(2, 64, 512, 128)
    assert pred.compute_s == pytest.approx(flops / 2 / 0.05e12)
    assert pred.calibrated


def test_unknown_shape_is_not_skipped_on_a_guess() -> None:
    pred = predict_cell({"model": {"name": "mystery"}, "gpu": {"name": "a100-80gb", "memory_gib": 80}})
    assert pred.fits and pred.peak_memory_gib is None
    assert "mystery" in pred.reason


def test_omegaconf_cells_are_accepted(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-160m", "h100-80gb", 4, catalog=catalog)
    assert predict_cell(OmegaConf.create(cell)) == predict_cell(cell)


def test_table_and_single_cell_predictions_agree(catalog: Catalog) -> None:
    cells = [
        synthetic.cell_config("pythia-160m", "a100-80gb", 1, catalog=catalog),
        synthetic.cell_config("pythia-1b", "rtx3090", 4, catalog=catalog, zero_stage=3, offload_optimizer=True),
        synthetic.cell_config("pythia-2.8b", "h100-80gb", 16, num_nodes=2, catalog=catalog, zero_stage=1),
        synthetic.cell_config("pythia-70m", "v100-32gb", 2, catalog=catalog, precision="fp16", tf32=False),
        synthetic.cell_config("pythia-12b", "a6000", 1, catalog=catalog, activation_checkpointing=True),
    ]
    table = predict_frame(pd.DataFrame([flat_cell(c) for c in cells]))
    for cell, (_, row) in zip(cells, table.iterrows(), strict=True):
        one = predict_cell(cell)
        assert row["predicted_fits"] == one.fits
        assert row["predicted_micro_batch_size"] == one.micro_batch_size
        assert row["predicted_peak_memory_gib"] == pytest.approx(one.peak_memory_gib)
        assert row["predicted_step_time_s"] == pytest.approx(one.step_time_s)


def _measured_table(catalog: Catalog, truth: Calibration, memory_factor: float, memory_offset: float) -> pd.DataFrame:
    """Records whose step times and memory follow ``truth`` exactly, over models, GPU counts and settings."""
    rows = []
    for model in ("pythia-160m", "pythia-410m", "pythia-1b"):
        for num_gpus in (1, 2, 4, 8):
            for ckpt in (False, True):
                cell = synthetic.cell_config(
                    model, "a100-80gb", num_gpus, catalog=catalog, activation_checkpointing=ckpt
                )
                plan = predict_cell(cell)
                actual = predict_cell(cell, truth, micro_batch_size=plan.micro_batch_size)
                row = flat_cell(cell)
                row.update(
                    status="ok",
                    step_time_s=actual.step_time_s,
                    micro_batch_size=plan.micro_batch_size,
                    grad_accum_steps=plan.grad_accum_steps,
                    peak_memory_gib=plan.peak_memory_gib * memory_factor + memory_offset,
                )
                rows.append(row)
    return pd.DataFrame(rows)


def test_calibration_recovers_the_coefficients_it_was_made_with(catalog: Catalog) -> None:
    truth = Calibration(
        {"a100-80gb": GpuCalibration(efficiency=0.55, communication_scale=2.0, overhead_s_per_micro_step=0.004)}
    )
    measured = _measured_table(catalog, truth, memory_factor=1.1, memory_offset=0.5)
    fitted = calibrate(measured).for_gpu("a100-80gb")
    assert fitted is not None and fitted.num_records == 24
    assert fitted.efficiency == pytest.approx(0.55, rel=1e-6)
    assert fitted.communication_scale == pytest.approx(2.0, rel=1e-6)
    assert fitted.overhead_s_per_micro_step == pytest.approx(0.004, rel=1e-6)
    assert fitted.memory_scale == pytest.approx(1.1)
    assert fitted.memory_offset_gib == pytest.approx(0.5)
    assert fitted.step_time_error_pct < 1e-6
    # Calibrated predictions reproduce the measurements they came from.
    calibration = Calibration({"a100-80gb": fitted})
    again = predict_frame(measured, calibration, micro_batch_size=measured["micro_batch_size"])
    assert again["predicted_peak_memory_gib"].to_numpy() == pytest.approx(measured["peak_memory_gib"].to_numpy())
    assert again["predicted_step_time_s"].to_numpy() == pytest.approx(measured["step_time_s"].to_numpy())


def test_one_record_calibrates_the_efficiency_only(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-160m", "h100-80gb", 1, catalog=catalog)
    plan = predict_cell(cell)
    row = flat_cell(cell)
    row.update(status="ok", step_time_s=2 * plan.step_time_s, micro_batch_size=plan.micro_batch_size)
    fitted = calibrate(pd.DataFrame([row])).for_gpu("h100-80gb")
    assert fitted.efficiency == pytest.approx(0.20)  # twice as slow as the 40% default
    assert fitted.communication_scale == 1.0  # no record had communication: the nominal figure stays
    assert predict_cell(cell, calibrate(pd.DataFrame([row]))).step_time_s == pytest.approx(2 * plan.step_time_s)


def test_calibration_ignores_failed_and_unmeasured_rows(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-160m", "l40s", 1, catalog=catalog)
    rows = [dict(flat_cell(cell), status="failed", step_time_s=1.0), dict(flat_cell(cell), status="ok")]
    assert calibrate(pd.DataFrame(rows)).by_gpu == {}
    with pytest.raises(ValueError, match="missing columns"):
        calibrate(pd.DataFrame({"gpu": ["l40s"]}))


def test_plan_lists_every_cell_with_days(catalog: Catalog) -> None:
    cells = [
        synthetic.cell_config("pythia-160m", "a100-80gb", 8, catalog=catalog),
        synthetic.cell_config("pythia-12b", "rtx3090", 1, catalog=catalog),
    ]
    table = plan(cells)
    assert list(table.columns) == list(PLAN_COLUMNS)
    assert table["predicted_fits"].tolist() == [True, False]
    first = predict_cell(cells[0])
    assert table.loc[0, "predicted_time_to_train_days"] == pytest.approx(143_000 * first.step_time_s / 86_400)
    assert table.loc[0, "predicted_gpu_hours"] == pytest.approx(8 * 143_000 * first.step_time_s / 3_600)
    assert plan([]).empty
