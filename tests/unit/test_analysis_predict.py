"""The predictor: fit, micro-batch, memory breakdown, step time, plan with costs, and its calibration.

DeepSpeed's memory arithmetic itself is tested in tests/unit/engines/, the model's in tests/unit/models/."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import synthetic
from omegaconf import OmegaConf

from analysis.predict.predictor import (
    PLAN_COLUMNS,
    Calibration,
    GpuCalibration,
    calibrate,
    flat_cell,
    plan,
    predict_cell,
    predict_frame,
)
from analysis.predict.reference_profile import carried_profile
from analysis.predict.step_time import DEFAULT_EFFICIENCY, DEFAULT_OVERHEAD_S_PER_MICRO_STEP
from analysis.predict.uncertainty import prior_covariance
from analysis.sweeps.records import Catalog
from orchestrator.config.batch import divisors
from orchestrator.config.schema import to_config
from orchestrator.engines.deepspeed.memory import estimate_micro_batch_size
from orchestrator.engines.memory import EXPANDABLE_OVERHEAD, GIB
from orchestrator.engines.registry import engine_specs
from orchestrator.models import flops_per_token


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


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


def test_a_sharded_build_holds_its_shards_and_one_layer_and_a_cell_that_cannot_build_is_refused(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.engines.fsdp import memory as fsdp_memory

    # Llama-2-70B over 64 H100s: 4 bytes a parameter over 64 ranks and one decoder layer whole, not 276 GB.
    psi, layer = 68_976_648_192, (68_976_648_192 - 2 * 32_000 * 8_192) / 80
    for engine in ({"engine": "fsdp"}, {"engine": "mesh3d", "tp": 8, "pp": 8, "pp_microbatches": 16}):
        pred = predict_cell(synthetic.cell_config("llama-2-70b", "h100-80gb", 64, 8, catalog=catalog, **engine))
        share = psi / 64 if engine["engine"] == "fsdp" else ((psi - 2 * 32_000 * 8_192) / 64 + 32_000 * 8_192)
        assert pred.build_peak_gib == pytest.approx(EXPANDABLE_OVERHEAD * 4 * (share + layer) / GIB), engine
        assert pred.build_peak_gib < 12
    # A build that does not fit refuses the cell however small its step, and says so.
    monkeypatch.setattr(fsdp_memory, "build_bytes_of", lambda x: np.full(len(x.params), 200.0 * GIB))
    cell = synthetic.cell_config("pythia-160m", "a100-80gb", 8, catalog=catalog, engine="fsdp")
    pred = predict_cell(cell)
    assert not pred.fits and pred.peak_memory_gib < 72 and "cannot be built" in pred.reason
    row = plan([cell]).iloc[0]
    assert not row["predicted_fits"] and row["predicted_build_peak_gib"] == pytest.approx(EXPANDABLE_OVERHEAD * 200)
    assert not row["predicted_fits_at_micro_batch_1"]


def test_auto_micro_batch_is_the_largest_divisor_that_fits(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-410m", "a100-80gb", 2, catalog=catalog)
    pred = predict_cell(cell)
    assert pred.fits
    micro = pred.micro_batch_size
    assert 512 % micro == 0
    assert pred.grad_accum_steps == 512 // micro
    assert pred.peak_memory_gib <= 72.0
    # The next divisor would not have fitted.
    following = min(d for d in divisors(512) if d > micro)
    assert predict_cell(cell, micro_batch_size=following).peak_memory_gib > 72.0
    # More memory never means a smaller micro-batch.
    bigger = synthetic.cell_config("pythia-410m", "h200", 2, catalog=catalog)
    assert predict_cell(bigger).micro_batch_size >= micro
    # A fixed micro-batch is taken as it is.
    fixed = synthetic.cell_config("pythia-410m", "a100-80gb", 2, catalog=catalog, micro_batch_size=2)
    assert predict_cell(fixed).micro_batch_size == 2


@pytest.mark.parametrize("per_gpu", [24, 48, 96, 40, 1024])
def test_auto_micro_batch_follows_the_probes_rule_also_off_powers_of_two(catalog: Catalog, per_gpu: int) -> None:
    # The probe tries the divisors of the per-GPU batch, starting at the largest not above the memory model's
    # estimate; the predictor must land on that divisor, not on a power of two.
    cell = synthetic.cell_config("pythia-160m", "a100-80gb", 1, catalog=catalog)
    cell["model"]["global_batch_size"] = per_gpu
    pred = predict_cell(cell)
    estimate = estimate_micro_batch_size(to_config(cell), cell["gpu"]["memory_gib"])
    assert pred.micro_batch_size == max(d for d in divisors(per_gpu) if d <= estimate)


def test_breakdown_adds_up_and_margin_is_applied(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-1b", "a100-40gb", 4, catalog=catalog, zero_stage=2)
    pred = predict_cell(cell, margin=0.25)
    parts = pred.params_gib + pred.grads_gib + pred.optimizer_gib + pred.activations_gib + pred.buffers_gib
    assert parts == pytest.approx(pred.peak_memory_gib)
    assert pred.usable_memory_gib == pytest.approx(30.0)
    # Reserved bytes: the allocated gradient partition times the caching allocator's overhead.
    assert pred.grads_gib == pytest.approx(EXPANDABLE_OVERHEAD * 2 * 1_011_781_632 / 4 / GIB)


def test_probe_memory_limit_replaces_the_gpu_memory(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-tiny", "cpu", 1, catalog=catalog)
    cell["probe"]["memory_limit_gib"] = 0.001
    pred = predict_cell(cell)
    assert pred.usable_memory_gib == 0.001
    assert not pred.fits and "probe's memory limit" in pred.reason


def test_uncalibrated_step_time_is_flops_at_the_default_efficiency_plus_a_cost_per_micro_step(
    catalog: Catalog,
) -> None:
    # A GPU type without a datasheet bandwidth: the cited profile does not cover it (analysis/predict/reference_profile.py).
    cell = synthetic.cell_config("pythia-70m", "a100-80gb", 1, catalog=catalog)
    cell["gpu"]["memory_gbytes_s"] = None
    pred = predict_cell(cell)
    flops = 1024 * 2048 * flops_per_token(to_config(cell).model)
    expected = flops / (312e12 * DEFAULT_EFFICIENCY) + DEFAULT_OVERHEAD_S_PER_MICRO_STEP * pred.grad_accum_steps
    assert pred.step_time_s == pytest.approx(expected)
    # Checkpointing adds what is recomputed, no more: the family's hardware FLOPs.
    ckpt = synthetic.cell_config("pythia-70m", "a100-80gb", 1, catalog=catalog, activation_checkpointing=True)
    ckpt["gpu"]["memory_gbytes_s"] = None
    recompute = 1024 * 2048 * flops_per_token(to_config(ckpt).model, recompute=True)
    assert predict_cell(ckpt, micro_batch_size=pred.micro_batch_size).compute_s == pytest.approx(
        recompute / (312e12 * DEFAULT_EFFICIENCY)
    )
    assert pred.communication_s == 0.0 and not pred.calibrated
    # More GPUs: less compute each, and communication appears.
    eight = synthetic.cell_config("pythia-70m", "a100-80gb", 8, catalog=catalog)
    eight["gpu"]["memory_gbytes_s"] = None
    assert predict_cell(eight).compute_s == pytest.approx(pred.compute_s / 8)
    assert predict_cell(eight).communication_s > 0


def test_a_listed_gpu_without_a_profile_is_predicted_with_the_reference_carried_to_it(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-70m", "a100-80gb", 8, catalog=catalog)
    carried = {"a100-80gb": carried_profile(312.0, cell["gpu"]["memory_gbytes_s"])}
    cited, given = predict_cell(cell), predict_cell(cell, profiles=carried)
    assert cited.step_time_s == pytest.approx(given.step_time_s)
    assert cited.compute_s == pytest.approx(given.compute_s)
    unlisted = synthetic.cell_config("pythia-70m", "a100-80gb", 8, catalog=catalog)
    unlisted["gpu"]["memory_gbytes_s"] = None
    assert cited.step_time_s != pytest.approx(predict_cell(unlisted).step_time_s, rel=1e-3)


def test_cpu_has_no_step_time_until_calibrated(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-tiny", "cpu", 2, catalog=catalog)
    assert predict_cell(cell).step_time_s is None
    calibration = Calibration({"cpu": GpuCalibration(efficiency=0.05)})  # 0.05 TFLOP/s per process
    pred = predict_cell(cell, calibration)
    flops = 16 * 128 * flops_per_token(to_config(cell).model)
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
    # The posterior mean: the prior pulls a little, the records' relative noise being taken as the model's.
    assert fitted.efficiency == pytest.approx(0.55, rel=1e-2)
    # The fixed cost per micro-step is a small term beside the memory-bound work (the cited profile's): the
    # records pin it down only to within the posterior's own spread, which must hold the truth.
    assert fitted.spread is not None
    sd = float(np.sqrt(fitted.spread.covariance[3, 3]))
    assert abs(fitted.overhead_s_per_micro_step - 0.004) <= 2 * sd
    assert fitted.memory_scale == pytest.approx(1.1)
    assert fitted.memory_offset_gib == pytest.approx(0.5)
    assert fitted.step_time_error_pct < 1.0
    # Communication is under 1% of these cells' time: the records barely say anything about its coefficient, and
    # its posterior stays about as wide as the prior, while the efficiency's narrows twentyfold.
    assert fitted.spread is not None
    prior = np.diag(prior_covariance("a100-80gb"))
    posterior = np.diag(fitted.spread.covariance)
    assert posterior[1] > 0.9 * prior[1] and posterior[0] < 0.05 * prior[0]
    # Calibrated predictions reproduce the measurements they came from.
    calibration = Calibration({"a100-80gb": fitted})
    again = predict_frame(measured, calibration, micro_batch_size=measured["micro_batch_size"])
    assert again["predicted_peak_memory_gib"].to_numpy() == pytest.approx(measured["peak_memory_gib"].to_numpy())
    assert again["predicted_step_time_s"].to_numpy() == pytest.approx(measured["step_time_s"].to_numpy(), rel=1e-2)


def test_one_record_moves_the_prediction_towards_it_as_far_as_the_prior_allows(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-160m", "h100-80gb", 1, catalog=catalog)
    plan = predict_cell(cell)
    row = flat_cell(cell)
    row.update(status="ok", step_time_s=1.2 * plan.step_time_s, micro_batch_size=plan.micro_batch_size)
    fitted = calibrate(pd.DataFrame([row])).for_gpu("h100-80gb")
    assert fitted is not None and fitted.efficiency < DEFAULT_EFFICIENCY
    assert fitted.communication_scale == 1.0  # no record had communication: the nominal figure stays
    again = predict_cell(cell, calibrate(pd.DataFrame([row])))
    assert again.step_time_s is not None and plan.step_time_s is not None
    assert 1.05 * plan.step_time_s < again.step_time_s < 1.2 * plan.step_time_s
    assert again.step_time_low_s is not None and again.step_time_high_s is not None
    assert again.step_time_low_s < 1.2 * plan.step_time_s < again.step_time_high_s


def test_calibration_ignores_failed_and_unmeasured_rows(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-160m", "l40s", 1, catalog=catalog)
    rows = [dict(flat_cell(cell), status="failed", step_time_s=1.0), dict(flat_cell(cell), status="ok")]
    assert calibrate(pd.DataFrame(rows)).by_gpu == {}
    with pytest.raises(ValueError, match="missing columns"):
        calibrate(pd.DataFrame({"gpu": ["l40s"]}))


def test_plan_lists_every_cell_with_days_and_costs(catalog: Catalog) -> None:
    cells = [
        synthetic.cell_config("pythia-160m", "a100-80gb", 8, catalog=catalog),
        synthetic.cell_config("pythia-12b", "rtx3090", 1, catalog=catalog),
    ]
    table = plan(cells)
    assert list(table.columns) == list(PLAN_COLUMNS)
    assert table["predicted_fits"].tolist() == [True, False]
    first = predict_cell(cells[0])
    assert table.loc[0, "predicted_time_to_train_days"] == pytest.approx(143_000 * first.step_time_s / 86_400)
    hours = 8 * 143_000 * first.step_time_s / 3_600
    assert table.loc[0, "predicted_gpu_hours"] == pytest.approx(hours)
    gpu = cells[0]["gpu"]
    assert table.loc[0, "predicted_cost_usd_cloud"] == pytest.approx(hours * gpu["cloud_usd_per_gpu_hour"])
    days = 143_000 * first.step_time_s / 86_400
    machine = 10_500 + 8 * gpu["purchase_price_usd"]  # one 8-slot machine and its GPUs
    assert table.loc[0, "predicted_cost_usd_amortised"] == pytest.approx(machine * days / (5 * 365))
    assert table.loc[0, "predicted_energy_kwh"] == pytest.approx(hours * gpu["board_power_w"] / 1000)
    assert plan([]).empty


def test_plan_of_cpu_cells_prices_them_once_calibrated(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-tiny", "cpu", 2, catalog=catalog)
    calibration = Calibration({"cpu": GpuCalibration(efficiency=0.002)})
    row = plan([cell], calibration).iloc[0]
    foreign = {key for spec in engine_specs() if spec.name != row["engine"] for key in spec.identity_if_set}
    for column in PLAN_COLUMNS:
        # Another engine's settings are empty, as in cells.csv: a DeepSpeed cell has no FSDP sharding.
        assert pd.isna(row[column]) if column in foreign else pd.notna(row[column]), column
    assert row["predicted_cost_usd_cloud"] == pytest.approx(row["predicted_gpu_hours"] * 0.08925)


def test_a_published_parameter_count_is_not_an_input(catalog: Catalog) -> None:
    # Memory and time both follow the architecture; a wrong published figure changes neither.
    cell = synthetic.cell_config("pythia-160m", "a100-80gb", 2, catalog=catalog)
    wrong = synthetic.cell_config("pythia-160m", "a100-80gb", 2, catalog=catalog)
    wrong["model"]["num_parameters"] = 5
    assert predict_cell(wrong) == predict_cell(cell)
