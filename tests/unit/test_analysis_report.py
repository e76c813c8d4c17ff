"""``write_report`` end to end on synthetic sweep folders: tables, estimates, merging, bad input, files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import synthetic

from analysis.predict.predictor import flat_cell, predict_frame
from analysis.report.tables import pareto_mask
from analysis.report.writer import CELLS_COLUMNS, calibration_from, write_report
from analysis.sweeps.records import Catalog, load_cells


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def _measured(sweep: Path, cell_id: str, config: dict, step_time_s: float, micro: int = 4, **kw) -> dict:
    rec = synthetic.record(cell_id, config, "ok", synthetic.metrics(config, step_time_s, micro, 20.0), **kw)
    synthetic.write_cell(sweep, cell_id, config, rec)
    return rec


def test_cells_csv_has_one_row_per_cell_with_days_and_gpu_hours(tmp_path: Path, catalog: Catalog) -> None:
    sweep = tmp_path / "demo"
    configs = {
        "aaa": synthetic.cell_config("pythia-tiny", "cpu", 1, catalog=catalog),
        "bbb": synthetic.cell_config("pythia-tiny", "cpu", 2, catalog=catalog),
        "ccc": synthetic.cell_config("pythia-tiny", "cpu", 2, catalog=catalog, activation_checkpointing=True),
        "ddd": synthetic.cell_config("pythia-160m", "a100-80gb", 4, catalog=catalog, zero_stage=1),
    }
    steps = {"aaa": 0.2, "bbb": 0.13, "ccc": 0.16, "ddd": 0.9}
    for cell_id, config in configs.items():
        _measured(sweep, cell_id, config, steps[cell_id])
    report = write_report([sweep], plots=False)

    table = pd.read_csv(sweep / "cells.csv")
    assert list(table.columns) == list(CELLS_COLUMNS)
    assert sorted(table["cell_id"]) == sorted(configs)
    for row in table.itertuples():
        config = configs[row.cell_id]
        train_steps = config["model"]["train_steps"]
        assert row.status == "ok" and row.sweep == "demo"
        assert row.model == config["model"]["name"] and row.num_gpus == config["num_gpus"]
        assert row.step_time_s == pytest.approx(steps[row.cell_id])
        assert row.train_steps == train_steps
        assert row.time_to_train_days == pytest.approx(train_steps * steps[row.cell_id] / 86400)
        assert row.gpu_hours == pytest.approx(config["num_gpus"] * train_steps * steps[row.cell_id] / 3600)
        # The 95% interval comes from the probe's ci95 (1.5% in the synthetic records).
        assert row.time_to_train_days_low == pytest.approx(row.time_to_train_days * 0.985)
        assert row.time_to_train_days_high == pytest.approx(row.time_to_train_days * 1.015)
    a100 = table.set_index("cell_id").loc["ddd"]
    assert a100.cost_usd_cloud == pytest.approx(a100.gpu_hours * 2.736)
    assert a100.machine_price_usd == 7_500 + 4 * 19_000
    assert a100.cost_usd_amortised == pytest.approx(a100.machine_price_usd * a100.time_to_train_days / 1825)
    assert a100.energy_kwh == pytest.approx(a100.gpu_hours * 0.4)
    cpu = table.set_index("cell_id").loc["aaa"]
    # The cpu device is priced per core-hour (conf/gpu/cpu.yaml), so its cells are costed like a GPU's.
    assert cpu.cost_usd_cloud == pytest.approx(cpu.gpu_hours * 0.08925)
    assert cpu.energy_kwh == pytest.approx(cpu.gpu_hours * 6.25 / 1000)
    # ddd's 0.9 s is faster than an A100 could run it: only its in-sample error is named
    assert [p.split(":")[0] for p in report.problems] == ["cell ddd (sweep demo)"] and "in-sample" in report.problems[0]
    assert {p.name for p in report.files} == {
        "cells.csv", "best.csv", "frontier.csv", "scaling.csv", "engines.csv", "report.md",
    }  # fmt: skip


def test_a_token_budget_recomputes_without_probes(tmp_path: Path, catalog: Catalog) -> None:
    sweep = tmp_path / "s"
    config = synthetic.cell_config("pythia-1b", "h100-80gb", 8, catalog=catalog)
    _measured(sweep, "one", config, 2.0)
    own = write_report([sweep], plots=False).cells.iloc[0]
    chinchilla = write_report([sweep], plots=False, tokens="20x").cells.iloc[0]
    tokens = 20 * 1_011_781_632
    steps = int(np.ceil(tokens / (1024 * 2048)))  # 9,650 steps
    assert chinchilla["train_tokens"] == pytest.approx(tokens)
    assert chinchilla["train_steps"] == steps
    assert chinchilla["time_to_train_days"] == pytest.approx(steps * 2.0 / 86400)
    assert own["train_steps"] == 143_000
    fixed = write_report([sweep], plots=False, tokens="300B").cells.iloc[0]
    assert fixed["train_steps"] == 143_052
    with pytest.raises(ValueError, match="accepted"):
        write_report([sweep], plots=False, tokens="lots")


def test_bad_input_is_listed_and_the_rest_still_produced(tmp_path: Path, catalog: Catalog) -> None:
    sweep = tmp_path / "bad"
    good = synthetic.cell_config("pythia-160m", "a100-80gb", 1, catalog=catalog)
    _measured(sweep, "good", good, 3.0)
    synthetic.write_cell(sweep, "pending", good)  # no record yet
    synthetic.write_cell(sweep, "queued", good)
    synthetic.write_cell(sweep, "truncated", good, '{"schema_version": 1, "status": "ok", "metr')
    synthetic.write_cell(sweep, "empty", good, "")
    garbage_metrics = {"step_time_s": "fast", "mfu": None, "peak_memory_allocated_gib": []}  # as no probe writes
    garbage = {**synthetic.record("garbage", good, "ok").to_json(), "metrics": garbage_metrics}
    synthetic.write_cell(sweep, "garbage", good, garbage)
    failed = synthetic.record("failed", good, "comm_error", reason="NCCL timeout after 600 s")
    synthetic.write_cell(sweep, "failed", good, failed)
    old_gpu = json.loads(json.dumps(good))
    old_gpu["gpu"].update(name="a100-sxm-old", cloud_usd_per_gpu_hour=2.5)
    _measured(sweep, "oldgpu", old_gpu, 3.0)
    lost_config = synthetic.record("lostcfg", good, "ok", synthetic.metrics(good, 3.3, 4))
    lost_config = dataclasses.replace(lost_config, config={})
    synthetic.write_cell(sweep, "lostcfg", good, lost_config)
    (sweep / "cells" / "lostcfg" / "cell.yaml").unlink()
    (sweep / "cells" / "not-a-cell").mkdir()
    empty_sweep = tmp_path / "empty"
    empty_sweep.mkdir()

    synthetic.write_cell(sweep, "lost", good)
    (sweep / "skipped.jsonl").write_text(
        '{"cell_id": "refused1", "label": "pythia-1b on 1 x v100-32gb", "reasons": ["bf16 needs Ampere or newer"]}\n'
        '{"cell_id": "refu\n'
    )
    states = {"queued": "PENDING", "lost": "timeout"}
    report = write_report([sweep, empty_sweep, tmp_path / "missing"], plots=True, states=states)
    cells = report.cells.set_index("cell_id")
    assert set(cells.index) == {
        "good",
        "pending",
        "queued",
        "lost",
        "truncated",
        "empty",
        "garbage",
        "failed",
        "oldgpu",
        "lostcfg",
    }
    assert cells.loc["pending", "status"] == "no_record"
    assert cells.loc["queued", "status"] == "PENDING"
    # One reader with one set of checks (orchestrator.store.record): `status` calls the same files corrupt.
    assert cells.loc["truncated", "status"] == "corrupt"
    assert "record is not valid JSON" in cells.loc["truncated", "reason"]
    assert cells.loc["empty", "status"] == "corrupt"
    assert cells.loc["garbage", "status"] == "corrupt"
    # nothing of the unusable record is measured: its days are its prediction's, and say so
    assert np.isnan(cells.loc["garbage", "step_time_s"]) and cells.loc["garbage", "answer"] == "predicted"
    assert cells.loc["garbage", "time_to_train_days"] == pytest.approx(
        cells.loc["garbage", "train_steps"] * cells.loc["garbage", "predicted_step_time_s"] / 86400
    )
    assert cells.loc["failed", "reason"] == "NCCL timeout after 600 s"
    # An unknown GPU keeps the figures stored with its cell.
    assert cells.loc["oldgpu", "cost_usd_cloud"] == pytest.approx(cells.loc["oldgpu", "gpu_hours"] * 2.5)
    # Without config or cell.yaml, the record's own settings and conf/ fill in the cell.
    assert cells.loc["lostcfg", "model"] == "pythia-160m"
    assert cells.loc["lostcfg", "time_to_train_days"] == pytest.approx(143_000 * 3.3 / 86400)

    text = "\n".join(report.problems)
    for expected in (
        "cell pending (sweep bad): no record yet",
        "cell lost (sweep bad): no record (state timeout)",
        "1 line(s) of skipped.jsonl could not be read",
        "cells/truncated/record.json: record is not valid JSON",
        "cells/empty/record.json: record is empty",
        "cells/garbage/record.json: record metric 'step_time_s' is 'fast'",
        "cell failed (sweep bad): status comm_error: NCCL timeout",
        "GPU 'a100-sxm-old' is not in conf/gpu (known: a100-40gb, a100-80gb",
        "cells/lostcfg/cell.yaml is missing",
        f"sweep {empty_sweep}: no cells in it",
        f"sweep {tmp_path / 'missing'}: folder does not exist",
    ):
        assert expected in text
    assert "cell queued" not in text  # a pending cell is not a problem
    # A folder under cells/ without cell.yaml is no cell, but it is said (status, show and resume say it too).
    assert "cells/not-a-cell has no cell.yaml" in text and "cell not-a-cell" not in text
    assert report.skipped["label"].tolist() == ["pythia-1b on 1 x v100-32gb"]
    markdown = (sweep / "report.md").read_text()
    assert "GPU 'a100-sxm-old' is not in conf/gpu" in markdown
    assert "bf16 needs Ampere or newer" in markdown
    for name in ("cells.csv", "best.csv", "frontier.csv", "scaling.csv", "days_vs_gpus.png", "cost_vs_days.png"):
        assert (sweep / name).is_file()
    assert (sweep / "scaling_efficiency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_empty_sweep_still_gives_every_file(tmp_path: Path) -> None:
    report = write_report([tmp_path / "nothing-here"], out_dir=tmp_path / "out")
    assert report.cells.empty and report.best.empty
    assert list(pd.read_csv(tmp_path / "out" / "cells.csv").columns) == list(CELLS_COLUMNS)
    assert len(report.files) == 9
    assert "folder does not exist" in (tmp_path / "out" / "report.md").read_text()


def test_sweeps_merge_keeping_the_newest_ok_record(tmp_path: Path, catalog: Catalog) -> None:
    config = synthetic.cell_config("pythia-410m", "l40s", 2, catalog=catalog)
    first, second, third = tmp_path / "first", tmp_path / "second", tmp_path / "third"
    _measured(first, "same", config, 5.0, finished_at="2026-11-20T00:00:00+00:00")
    _measured(second, "same", config, 4.0, finished_at="2026-11-21T00:00:00+00:00")
    later_failure = synthetic.record("same", config, "timeout", finished_at="2026-11-22T00:00:00+00:00")
    synthetic.write_cell(third, "same", config, later_failure)
    report = write_report([first, third, second], out_dir=tmp_path / "merged", plots=False)
    assert len(report.cells) == 1
    row = report.cells.iloc[0]
    assert (row["sweep"], row["step_time_s"], row["status"]) == ("second", 4.0, "ok")
    # the failure was superseded; the two measurements, 5 s and 4 s each ±1.5%, cannot both be right
    [problem] = [p for p in report.problems if "in-sample" not in p]  # (with one cell, the fit is loose)
    assert problem.startswith("cell same: its measurements disagree") and "5 s" in problem and "keeps 4 s" in problem


@pytest.mark.parametrize("plumbing", ["sleep", "fail"])
@pytest.mark.parametrize("measured_first", [True, False])
def test_a_later_plumbing_check_of_a_cell_never_replaces_its_measurement(
    tmp_path: Path, catalog: Catalog, plumbing: str, measured_first: bool
) -> None:
    # The cell id leaves probe.kind out: a sleep (ok, nothing measured) or fail probe of the same cell has its id.
    config = synthetic.cell_config("pythia-410m", "l40s", 2, catalog=catalog)
    measured, check = tmp_path / "sl1", tmp_path / "slc"
    _measured(measured, "same", config, 4.0, finished_at="2026-11-20T00:00:00+00:00")
    _measured(measured, "other", config, 3.0, finished_at="2026-11-20T00:00:00+00:00")
    checked = {**config, "probe": {**config["probe"], "kind": plumbing}}
    status = "ok" if plumbing == "sleep" else "failed"
    for cell_id in ("same", "other"):
        later = synthetic.record(cell_id, checked, status, finished_at="2026-11-22T00:00:00+00:00")
        synthetic.write_cell(check, cell_id, checked, later)
    order = [measured, check] if measured_first else [check, measured]
    cells = load_cells(order, catalog=catalog).frame.set_index("cell_id")
    assert cells.loc["same", ["sweep", "status", "step_time_s"]].tolist() == ["sl1", "ok", 4.0]
    assert cells.loc["other", ["sweep", "status", "step_time_s"]].tolist() == ["sl1", "ok", 3.0]


def test_a_plumbing_check_never_replaces_even_a_failed_measurement(tmp_path: Path, catalog: Catalog) -> None:
    config = synthetic.cell_config("pythia-410m", "l40s", 2, catalog=catalog)
    failed = synthetic.record("same", config, "timeout", finished_at="2026-11-20T00:00:00+00:00")
    synthetic.write_cell(tmp_path / "real", "same", config, failed)
    slept = {**config, "probe": {**config["probe"], "kind": "sleep"}}
    synthetic.write_cell(tmp_path / "slc", "same", slept, synthetic.record("same", slept, "ok"))
    only_check = load_cells([tmp_path / "slc"], catalog=catalog).frame
    assert only_check["status"].tolist() == ["ok"]  # alone, a plumbing check's record is the cell's row
    both = load_cells([tmp_path / "real", tmp_path / "slc"], catalog=catalog).frame
    assert both[["sweep", "status"]].values.tolist() == [["real", "timeout"]]


def test_best_frontier_and_scaling_by_hand(tmp_path: Path, catalog: Catalog) -> None:
    sweep = tmp_path / "grid"
    # pythia-160m on a100-80gb: 1 GPU 4.0 s; 2 GPUs 2.5 s (zero0) or 2.2 s (zero1); 4 GPUs 1.5 s.
    # On h100-80gb: 1 GPU 1.6 s.
    plan = [
        ("a1", "a100-80gb", 1, {}, 4.0),
        ("a2", "a100-80gb", 2, {}, 2.5),
        ("a2z", "a100-80gb", 2, {"zero_stage": 1}, 2.2),
        ("a4", "a100-80gb", 4, {}, 1.5),
        ("h1", "h100-80gb", 1, {}, 1.6),
    ]
    for cell_id, gpu, n, method, step in plan:
        _measured(sweep, cell_id, synthetic.cell_config("pythia-160m", gpu, n, catalog=catalog, **method), step)
    report = write_report([sweep], plots=False)

    best = report.best.set_index(["gpu", "num_gpus"])
    assert best.loc[("a100-80gb", 2), "cell_id"] == "a2z"
    assert best.loc[("a100-80gb", 2), "cells_compared"] == 2
    assert best.loc[("a100-80gb", 2), "settings"] == "zero1 mb4x128 bf16"
    assert len(best) == 4

    # Cloud cost = GPUs x 143,000 x step / 3600 x price: a1 $434.7, a2z $478.1, a4 $652.1 (A100 $2.736);
    # h1 $265.4 (H100 $4.176). h1 is both fastest and cheapest of the single-GPU cells, a4 and a2z are faster.
    frontier = report.frontier
    assert list(frontier["cell_id"]) == ["a4", "h1"]
    assert set(frontier["cost_basis"]) == {"cost_usd_cloud"}

    # Scaling follows each sharding option: ZeRO-0 at 1, 2 and 4 GPUs on A100s, ZeRO-1 at 2 alone.
    scale = report.scaling.set_index(["gpu", "sharding", "num_gpus"])
    tokens = 1024 * 2048
    assert scale.loc[("a100-80gb", "zero1", 2), "tokens_per_s"] == pytest.approx(tokens / 2.2)
    assert scale.loc[("a100-80gb", "zero1", 2), "speedup"] == pytest.approx(1.0)
    assert scale.loc[("a100-80gb", "zero0", 2), "speedup"] == pytest.approx(4.0 / 2.5)
    assert scale.loc[("a100-80gb", "zero0", 4), "scaling_efficiency"] == pytest.approx(4.0 / 1.5 / 4)
    # From 2 to 4 GPUs: (1/1.5 - 1/2.5) per added GPU, in units of one GPU's 1/4.0.
    marginal = (1 / 1.5 - 1 / 2.5) / 2 * 4.0
    assert scale.loc[("a100-80gb", "zero0", 4), "marginal_speedup_per_added_gpu"] == pytest.approx(marginal)
    assert np.isnan(scale.loc[("a100-80gb", "zero0", 1), "marginal_speedup_per_added_gpu"])


def test_pareto_mask() -> None:
    days = np.array([1.0, 2.0, 3.0, 2.0, 5.0])
    cost = np.array([10.0, 8.0, 9.0, 8.5, 1.0])
    assert pareto_mask(days, cost).tolist() == [True, True, False, False, True]


def test_predicted_against_measured_columns(tmp_path: Path, catalog: Catalog) -> None:
    sweep = tmp_path / "p"
    fits = synthetic.cell_config("pythia-160m", "a100-80gb", 1, catalog=catalog)
    _measured(sweep, "fits", fits, 3.0, micro=8)
    too_big = synthetic.cell_config("pythia-12b", "a100-80gb", 1, catalog=catalog)
    synthetic.write_cell(sweep, "big", too_big, synthetic.record("big", too_big, "does_not_fit"))
    cells = write_report([sweep], plots=False).cells.set_index("cell_id")
    assert cells.loc["fits", "predicted_micro_batch_size"] == 8  # compared at the measured micro-batch
    # One record calibrates its GPU type: the prediction moves towards it (3.5 times faster than uncalibrated:
    # part of the way only, the prior holding the efficiency within about a fifth).
    uncalibrated = predict_frame(pd.DataFrame([flat_cell(fits)]), micro_batch_size=pd.Series([8.0]))
    before = 100.0 * (uncalibrated["predicted_step_time_s"].iloc[0] / 3.0 - 1.0)
    assert abs(cells.loc["fits", "step_time_error_pct"]) < abs(before)
    assert cells.loc["fits", "predicted_from_records"] == 1 and cells.loc["fits", "answer"] == "measured"
    assert cells.loc["fits", "predicted_from_records"] == 1
    assert cells.loc["fits", "memory_error_pct"] == pytest.approx(0.0, abs=1e-6)
    assert bool(cells.loc["big", "fit_agrees"]) and not bool(cells.loc["big", "predicted_fits"])
    assert bool(cells.loc["fits", "fit_agrees"])


def test_calibration_from_sweeps(tmp_path: Path, catalog: Catalog) -> None:
    sweep = tmp_path / "cal"
    config = synthetic.cell_config("pythia-160m", "h100-80gb", 1, catalog=catalog)
    _measured(sweep, "one", config, 7.0, micro=16)
    calibration = calibration_from([sweep])
    assert calibration.for_gpu("h100-80gb").num_records == 1
    assert calibration_from([tmp_path / "none"]).by_gpu == {}


def test_a_cell_measured_on_a_shared_node_is_flagged(tmp_path: Path, catalog: Catalog) -> None:
    sweep = tmp_path / "shared"
    config = synthetic.cell_config("pythia-tiny", "cpu", 1, catalog=catalog)
    cases = (("alone", [], []), ("crowd", ["41 alice"], ["41 alice", "42 bob"]), ("unk", None, []), ("hid", None, None))
    for cell_id, start, end in cases:
        rec = synthetic.record(cell_id, config, "ok", synthetic.metrics(config, 0.2, 4, 20.0))
        shared = None if start is None else bool(start or end)
        rec.environment.update(node_jobs_at_start=start, node_jobs_at_end=end, shared_node=shared)
        rec.environment["other_users_jobs_hidden"] = cell_id == "hid"
        synthetic.write_cell(sweep, cell_id, config, rec)
    report = write_report([sweep], plots=False)
    table = pd.read_csv(sweep / "cells.csv").set_index("cell_id")
    assert table.loc["crowd", "shared_node"] == True and table.loc["alone", "shared_node"] == False  # noqa: E712
    assert pd.isna(table.loc["unk", "shared_node"])
    (flag,) = [p for p in report.problems if "shared with other jobs" in p]
    assert "crowd" in flag and "41 alice, 42 bob" in flag
    assert "shared with other jobs" in (sweep / "report.md").read_text()
    (hidden,) = [p for p in report.problems if "hides other users' jobs" in p]
    assert "hid" in hidden and "unknown" in hidden and pd.isna(table.loc["hid", "shared_node"])


def test_a_damaged_list_of_a_nodes_jobs_is_named_not_a_crash(tmp_path: Path, catalog: Catalog) -> None:
    sweep = tmp_path / "damaged"
    config = synthetic.cell_config("pythia-tiny", "cpu", 1, catalog=catalog)
    for cell_id, start in (("number", 5), ("text", "43 carol")):
        rec = synthetic.record(cell_id, config, "ok", synthetic.metrics(config, 0.2, 4, 20.0))
        rec.environment.update(node_jobs_at_start=start, node_jobs_at_end={"44": "dave"}, shared_node=True)
        synthetic.write_cell(sweep, cell_id, config, rec)
    report = write_report([sweep], plots=False)
    flags = sorted(p for p in report.problems if "shared with other jobs" in p)
    assert len(flags) == 2 and "(5, {'44': 'dave'})" in flags[0] and "(43 carol, {'44': 'dave'})" in flags[1]


def test_a_count_no_integer_holds_is_left_empty_not_a_crash(tmp_path: Path, catalog: Catalog) -> None:
    sweep = tmp_path / "huge"
    config = synthetic.cell_config("pythia-tiny", "cpu", 1, catalog=catalog)
    for cell_id, steps in (("fine", 20), ("huge", -1e308)):
        metrics = dataclasses.replace(synthetic.metrics(config, 0.2, 4, 20.0), steps_timed=steps)
        synthetic.write_cell(sweep, cell_id, config, synthetic.record(cell_id, config, "ok", metrics))
    write_report([sweep], plots=False)
    table = pd.read_csv(sweep / "cells.csv").set_index("cell_id")
    assert table.loc["fine", "steps_timed"] == 20 and pd.isna(table.loc["huge", "steps_timed"])


def test_a_cluster_env_that_is_no_mapping_is_read_as_none_not_a_crash(tmp_path: Path, catalog: Catalog) -> None:
    sweep = tmp_path / "env"
    config = synthetic.cell_config("pythia-tiny", "cpu", 1, catalog=catalog)
    damaged = {**config, "cluster": {**config["cluster"], "env": "PYTORCH_CUDA_ALLOC_CONF=x"}}
    rec = synthetic.record("damaged", damaged, "ok", synthetic.metrics(config, 0.2, 4, 20.0))
    synthetic.write_cell(sweep, "damaged", damaged, rec)
    write_report([sweep], plots=False)
    table = pd.read_csv(sweep / "cells.csv").set_index("cell_id")
    assert table.loc["damaged", "status"] == "ok"
