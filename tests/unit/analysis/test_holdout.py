"""Hold-outs that hold out (analysis/predict/holdout.py): a left-out configuration's or model's records are never in
the training set of their own prediction, and twins written differently still share their configuration."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import synthetic

from analysis.predict.calibration import Calibration, calibrate
from analysis.predict.holdout import (
    configuration_groups,
    hold_out,
    leave_configurations_out,
    leave_models_out,
    leave_records_out,
    model_groups,
)
from analysis.predict.inputs import flat_cell

MODELS = {"small": "pythia-160m", "medium": "pythia-410m", "large": "pythia-1b"}


def _row(cell_id: str, model: str, step: float, micro: object = "auto", compile_: bool = False,
         num_gpus: int = 1, stage: int = 0, engine: object = "deepspeed") -> dict[str, object]:  # fmt: skip
    """A measured cell on H100s, as the cells table holds it; ``engine=None``: a record older than the setting."""
    config = synthetic.cell_config(
        MODELS[model], "h100-80gb", num_gpus, zero_stage=stage, compile=compile_, micro_batch_size=micro
    )
    per_gpu = 1024 // num_gpus
    found = micro if isinstance(micro, int) else 16
    row = {**flat_cell(config), "cell_id": cell_id, "status": "ok", "step_time_s": step,
           "micro_batch_size": found, "grad_accum_steps": per_gpu // found}  # fmt: skip
    row["engine"] = engine
    return row


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    """Nine records: twins (auto and a fixed micro-batch; an older record without ``engine``), two methods of the
    small model, three models, one and eight GPUs, and one cell that did not fit."""
    rows = [
        _row("small-auto", "small", 7.2),
        _row("small-mb16", "small", 7.3, micro=16),
        _row("small-old", "small", 7.25, engine=None),
        _row("small-compile", "small", 6.0, compile_=True),
        _row("small-8gpu", "small", 1.0, num_gpus=8, stage=1),
        _row("medium-auto", "medium", 16.3),
        _row("medium-mb16", "medium", 16.2, micro=16),
        _row("large-auto", "large", 28.1),
        {**_row("large-8gpu", "large", np.nan, num_gpus=8, stage=3), "status": "does_not_fit"},
    ]
    return pd.DataFrame(rows, index=[10 * i + 3 for i in range(len(rows))])  # an index that is not positions


class Spy:
    """calibrate(), noting the cell ids of every training set it was given."""

    def __init__(self) -> None:
        self.seen: list[set[str]] = []

    def __call__(self, records: pd.DataFrame) -> Calibration:
        self.seen.append(set(records["cell_id"]))
        return calibrate(records)


def test_twins_share_a_configuration_whatever_their_micro_batch_or_how_they_were_written(table: pd.DataFrame) -> None:
    groups = configuration_groups(table).set_axis(table["cell_id"])
    assert groups["small-auto"] == groups["small-mb16"] == groups["small-old"]
    assert groups["medium-auto"] == groups["medium-mb16"]
    assert len({groups["small-auto"], groups["small-compile"], groups["small-8gpu"], groups["medium-auto"]}) == 4
    models = model_groups(table).set_axis(table["cell_id"])
    assert models["small-auto"] == models["small-compile"] == models["small-8gpu"] != models["medium-auto"]


@pytest.mark.parametrize("leave_out, groups_of", [(leave_configurations_out, configuration_groups),
                                                   (leave_models_out, model_groups)])  # fmt: skip
def test_no_record_of_a_left_out_group_is_in_the_training_set_of_its_own_prediction(
    table: pd.DataFrame, leave_out, groups_of
) -> None:
    spy = Spy()
    result = leave_out(table, fit=spy)
    group_of = groups_of(table).set_axis(table["cell_id"])
    judged = result.errors
    assert set(judged["cell_id"]) == set(table["cell_id"]) - {"large-8gpu"}  # every answer with a step time
    assert len(spy.seen) == judged["group"].nunique()  # one fit per group
    for _, row in judged.iterrows():
        same = {cell for cell, group in group_of.items() if group == group_of[row["cell_id"]]}
        trained = {table.loc[label, "cell_id"] for label in result.training[row["group"]]}
        assert row["cell_id"] in same and not trained & same
        assert trained == set(table["cell_id"]) - same  # everything else is offered, the failed cell too
        assert row["trained_on"] == len(trained)
    # What calibrate() was really given: for every fit, no cell of the group it predicted.
    for seen, group in zip(spy.seen, sorted(set(judged["group"])), strict=True):
        assert not seen & {cell for cell, g in group_of.items() if g == group}


def test_leaving_one_record_out_keeps_its_twins_in(table: pd.DataFrame) -> None:
    result = leave_records_out(table)
    row = result.errors.set_index("cell_id").loc["small-auto"]
    trained = {table.loc[label, "cell_id"] for label in result.training[row["group"]]}
    assert "small-mb16" in trained and "small-auto" not in trained


def test_errors_and_summary(table: pd.DataFrame) -> None:
    result = hold_out(table, configuration_groups(table))
    errors = result.errors
    assert list(errors.index) == [i for i in table.index if table.loc[i, "status"] == "ok"]
    expected = 100.0 * (errors["predicted_s"] / errors["measured_s"] - 1.0)
    assert np.allclose(errors["error_pct"], expected)
    assert (errors["low_s"] <= errors["predicted_s"]).all() and (errors["predicted_s"] <= errors["high_s"]).all()
    s = result.summary
    assert s.records == 8 and s.groups == 5
    assert s.median_abs_error_pct == pytest.approx(errors["error_pct"].abs().median())
    assert s.within_10pct == pytest.approx(100.0 * (errors["error_pct"].abs() <= 10).mean())
    assert s.inside_90pct_interval == pytest.approx(100.0 * errors["inside"].mean())


def test_the_unfittable_truth_imports_nothing_of_the_predictor() -> None:
    """tests/truth_grid.py must not be able to borrow the predictor's terms: no import of analysis.predict, of an
    engine's step-time module, or of tests/synthetic.py (which imports the predictor)."""
    source = (Path(__file__).resolve().parents[2] / "truth_grid.py").read_text()
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    banned = [n for n in names if n.startswith("analysis.predict") or "step_time" in n or n == "synthetic"]
    assert not banned
