"""Real H100 records of the composed timing and the rest-memory search (tests/data/gpu-records, README there):
the search replayed on their trials takes the same sizes, and the uncalibrated predictor at the micro-batch they
found is within 15% of their step time and 10% of their reserved peak."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analysis.predict.predictor import flat_cell, predict_frame
from analysis.sweeps.catalog import recorded_cell
from orchestrator.config.batch import divisors
from orchestrator.job.search import next_size
from orchestrator.store.record import Metrics

FOLDER = Path(__file__).resolve().parents[2] / "data" / "gpu-records" / "h100-80gb-composed"
RECORDS = sorted(FOLDER.glob("*.json"))
SEARCHED = [path for path in RECORDS if "_auto" in path.name]


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_the_records_are_there() -> None:
    assert len(RECORDS) == 8 and len(SEARCHED) == 5


@pytest.mark.parametrize("path", SEARCHED, ids=lambda p: p.stem)
def test_the_search_replayed_on_the_trials_takes_the_same_sizes(path: Path) -> None:
    record = load(path)
    metrics = Metrics.from_json(record["metrics"])
    tried = metrics.search_tried
    assert tried is not None and metrics.per_gpu_batch_size is not None
    candidates = divisors(metrics.per_gpu_batch_size)
    capacity = (record["environment"]["device_memory_gib"] * 2**30, False)
    assert all(t.outcome == "ok" for t in tried), "the rest line spared every OOM"
    for k in range(1, len(tried)):
        assert next_size(candidates, tried[:k], capacity) == tried[k].micro_batch_size
    assert next_size(candidates, tried, capacity) is None
    assert metrics.micro_batch_size == max(t.micro_batch_size for t in tried)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_the_predictor_at_the_found_micro_batch_is_within_tolerance(path: Path) -> None:
    record = load(path)
    metrics = record["metrics"]
    found = pd.Series([float(metrics["micro_batch_size"])])
    row = predict_frame(pd.DataFrame([flat_cell(recorded_cell(record["config"]))]), micro_batch_size=found).iloc[0]
    assert row["predicted_step_time_s"] == pytest.approx(metrics["step_time_s"], rel=0.15)
    assert row["predicted_peak_memory_gib"] == pytest.approx(metrics["peak_memory_reserved_gib"], rel=0.10)
