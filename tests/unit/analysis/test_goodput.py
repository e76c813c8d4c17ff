"""Steady-state and wall-clock figures: the training steps' days and GPU-hours, and the whole run's over its
cluster's goodput (``cluster.goodput``, else the published default)."""

from __future__ import annotations

import pandas as pd
import pytest
import synthetic

from analysis.predict.estimates import DEFAULT_GOODPUT, TokenBudget
from analysis.predict.predictor import plan
from analysis.report.tables import add_estimates
from orchestrator.cli.display.answers import MEASURED, PREDICTED, answer_line


def _cells(goodput: float | None) -> list[dict]:
    cell = synthetic.cell_config("pythia-160m", "a100-80gb", 8)
    return [dict(cell, cluster={**cell["cluster"], "goodput": goodput})]


def test_the_plan_gives_the_steps_and_the_whole_runs_figures() -> None:
    default, site = plan(_cells(None)).iloc[0], plan(_cells(0.8)).iloc[0]
    assert default["goodput"] == DEFAULT_GOODPUT == 0.9
    assert default["predicted_wall_clock_days"] == pytest.approx(default["predicted_time_to_train_days"] / 0.9)
    assert site["predicted_wall_clock_days"] == pytest.approx(site["predicted_time_to_train_days"] / 0.8)
    assert site["predicted_wall_clock_gpu_hours"] == pytest.approx(site["predicted_gpu_hours"] / 0.8)
    # The steps themselves do not depend on the goodput.
    assert site["predicted_time_to_train_days"] == pytest.approx(default["predicted_time_to_train_days"])
    line = answer_line("pythia-160m", "a100-80gb", 8, site.to_dict(), PREDICTED)
    assert "of training steps" in line and "wall-clock at 80% goodput" in line, line


def test_the_report_gives_a_measured_cells_wall_clock_figures() -> None:
    from analysis.predict.inputs import flat_cell

    row = {**flat_cell(_cells(0.5)[0]), "status": "ok", "step_time_s": 2.0, "step_time_ci95_pct": 1.0}
    cells = add_estimates(pd.DataFrame([row]), TokenBudget()).iloc[0]
    assert cells["goodput"] == 0.5
    assert cells["wall_clock_days"] == pytest.approx(2 * cells["time_to_train_days"])
    assert cells["wall_clock_gpu_hours"] == pytest.approx(2 * cells["gpu_hours"])
    assert "wall-clock at 50% goodput" in answer_line("pythia-160m", "a100-80gb", 8, cells.to_dict(), MEASURED)
