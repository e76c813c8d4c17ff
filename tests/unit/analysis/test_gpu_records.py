"""The uncalibrated predictor against real H100 records (tests/data/gpu-records, README there)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analysis.predict.predictor import flat_cell, predict_frame
from analysis.sweeps.catalog import recorded_cell
from orchestrator.engines.allocator import expandable_segments, recorded_conf

RECORDS = sorted((Path(__file__).resolve().parents[2] / "data" / "gpu-records" / "h100-80gb").glob("*.json"))
FREE_LUNCH = [path for path in RECORDS if "free-lunch" in path.name]


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def row_of(record: dict[str, Any]) -> dict[str, Any]:
    """The record's cell as cells.csv reads it: with the allocator it ran with (these, before gpudays set one)."""
    conf = recorded_conf(record["environment"])
    return {**flat_cell(recorded_cell(record["config"])), "allocator_expandable_segments": expandable_segments(conf)}


@pytest.fixture(scope="module")
def predicted() -> dict[str, pd.Series]:
    records = [load(path) for path in RECORDS]
    table = predict_frame(pd.DataFrame([row_of(r) for r in records]))
    return {path.name: row for path, (_, row) in zip(RECORDS, table.iterrows(), strict=True)}


def test_the_records_are_there() -> None:
    assert len(FREE_LUNCH) == 5 and len(RECORDS) == 6


@pytest.mark.parametrize("path", FREE_LUNCH, ids=lambda p: p.stem)
def test_free_lunch_cells_are_predicted_within_tolerance(path: Path, predicted: dict[str, pd.Series]) -> None:
    metrics = load(path)["metrics"]
    row = predicted[path.name]
    assert row["predicted_step_time_s"] == pytest.approx(metrics["step_time_s"], rel=0.15)
    assert row["predicted_peak_memory_gib"] == pytest.approx(metrics["peak_memory_reserved_gib"], rel=0.10)
    assert row["predicted_micro_batch_size"] == metrics["micro_batch_size"]
    assert bool(row["predicted_fits"])


def test_one_size_larger_is_predicted_not_to_fit_where_the_probe_ran_out_of_memory(
    predicted: dict[str, pd.Series],
) -> None:
    for path in RECORDS:
        record = load(path)
        refused = [t["micro_batch_size"] for t in record["metrics"].get("search_tried", []) if t["outcome"] == "oom"]
        if not refused:
            continue
        row = row_of(record)
        larger = predict_frame(pd.DataFrame([row]), micro_batch_size=pd.Series([float(min(refused))]))
        assert not bool(larger["predicted_fits"].iloc[0]), path.name
