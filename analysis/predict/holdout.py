"""Hold-outs that hold out: the predictor judged on records of configurations, or models, it was not fitted to.

Leaving out one record while its twin (the same cell measured again, or at a fixed micro-batch beside ``auto``)
stays in the calibration flatters the predictor: the twin tells it the answer. Here a whole group is left out at a
time, and each of its records is predicted by the calibration fitted to every record outside the group:

- :func:`leave_configurations_out`: a configuration is every record of the same model, GPU type, GPU and node
  count and method settings, whatever its micro-batch (:data:`CONFIGURATION_COLUMNS`);
- :func:`leave_models_out`: every record of the same model, on any GPU, with any method;
- :func:`leave_records_out`: one record at a time, twins staying in (in-sample; for comparison only).

A method setting a record leaves empty counts as its default (an older record without ``engine`` is the default
engine's twin of one that names it), so a twin is never split from its configuration by how it was written. Model
variants under one name (``model.num_layers`` overridden) share a group: grouping coarser never flatters.

Each held-out record is predicted at its measured micro-batch and accumulation, as the calibration compares like
with like. Only answers are judged (``ok`` with a step time); every row outside the group is offered to the fit,
which reads what it can use (:func:`analysis.predict.calibration.calibrate`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.predict.calibration import Calibration, calibrate
from analysis.predict.predictor import predict_frame
from analysis.sweeps.catalog import method_column, method_defaults
from analysis.sweeps.records import MEASURED_FITS

IGNORED_METHOD_SETTINGS = frozenset({"micro_batch_size"})
"""Method settings a configuration is the same whatever their value: the micro-batch (``auto`` or a fixed size is
the same training run measured at another split of the same batch)."""

CONFIGURATION_COLUMNS: tuple[str, ...] = (
    "model",
    "gpu",
    "num_gpus",
    "num_nodes",
    *(method_column(k) for k in method_defaults() if k not in IGNORED_METHOD_SETTINGS),
)
"""The columns of the cells table that name a configuration."""
MODEL_COLUMNS: tuple[str, ...] = ("model",)

Fit = Callable[[pd.DataFrame], Calibration]
"""What calibrates the predictor on the training records of one fold (:func:`calibrate`, or a test's spy)."""

JUDGED_COLUMNS = ("group", "trained_on", "measured_s", "predicted_s", "low_s", "high_s", "error_pct", "inside")


@dataclass(frozen=True)
class Summary:
    """The figures of one hold-out over its judged records (percentages; NaN where nothing was judged)."""

    records: int
    groups: int
    median_abs_error_pct: float
    p90_abs_error_pct: float
    within_10pct: float
    """Share of records whose predicted step time is within ±10% of the measured one, in %."""
    inside_90pct_interval: float
    """Share of measured step times inside their 90% interval, in % (the goal: 85-95%)."""

    def line(self) -> str:
        """The figures as one line of text."""
        return (
            f"{self.records} records in {self.groups} groups: median |error| {self.median_abs_error_pct:.1f}%, "
            f"p90 {self.p90_abs_error_pct:.1f}%, within ±10% {self.within_10pct:.1f}%, "
            f"inside the 90% interval {self.inside_90pct_interval:.1f}%"
        )


@dataclass(frozen=True)
class HoldOut:
    """Per-record errors of one hold-out, what each fold trained on, and the summary."""

    errors: pd.DataFrame
    """One row per judged record (index: the cells table's), columns :data:`JUDGED_COLUMNS` and ``cell_id`` where
    the table has one: its group, how many rows the fit was offered, measured and predicted step time (s) with
    the 90% interval, the error in % (signed) and whether the interval holds the measurement."""
    training: dict[str, tuple[Hashable, ...]]
    """By group: the index labels of the rows offered to the fit that predicted the group's records."""
    summary: Summary


def labels(cells: pd.DataFrame, columns: Sequence[str]) -> pd.Series:
    """One text label per row from ``columns`` (absent ones skipped), method settings left empty read as their
    defaults, whole numbers written alike whatever their dtype."""
    defaults = {method_column(k): v for k, v in method_defaults().items()}
    parts = []
    for column in columns:
        if column not in cells.columns:
            continue
        default = defaults.get(column)
        parts.append(cells[column].map(lambda value, d=default: _text(d if _missing(value) else value)))
    if not parts:
        return pd.Series("", index=cells.index, dtype=object)
    return pd.concat(parts, axis=1).agg("|".join, axis=1)


def configuration_groups(cells: pd.DataFrame) -> pd.Series:
    """Each row's configuration (:data:`CONFIGURATION_COLUMNS`)."""
    return labels(cells, CONFIGURATION_COLUMNS)


def model_groups(cells: pd.DataFrame) -> pd.Series:
    """Each row's model."""
    return labels(cells, MODEL_COLUMNS)


def record_groups(cells: pd.DataFrame) -> pd.Series:
    """Each row its own group: leave-one-record-out, in which a left-out record's twins stay in."""
    return pd.Series([f"row {i}" for i in range(len(cells))], index=cells.index, dtype=object)


def hold_out(cells: pd.DataFrame, groups: pd.Series, fit: Fit = calibrate) -> HoldOut:
    """Predict every judged record of ``cells`` from a fit to the rows outside its group (``groups``: one label
    per row, aligned on the index)."""
    if not cells.index.is_unique:
        raise ValueError("hold_out() needs a cells table with a unique index")
    groups = groups.reindex(cells.index).astype(str)
    judged = _judged(cells)
    rows: list[pd.DataFrame] = []
    training: dict[str, tuple[Hashable, ...]] = {}
    for group in sorted(set(groups[judged].tolist())):
        inside = (groups == group).to_numpy()
        train = cells[~inside]
        training[group] = tuple(train.index)
        test = cells[inside & judged]
        prediction = predict_frame(
            test,
            fit(train),
            micro_batch_size=_numbers(test, "micro_batch_size"),
            grad_accum_steps=_numbers(test, "grad_accum_steps"),
        )
        rows.append(_errors(test, prediction, group, len(train)))
    columns = (*(("cell_id",) if "cell_id" in cells.columns else ()), *JUDGED_COLUMNS)
    errors = pd.concat(rows).loc[cells.index[judged]] if rows else pd.DataFrame(columns=list(columns))
    return HoldOut(errors, training, summarise(errors))


def leave_configurations_out(cells: pd.DataFrame, fit: Fit = calibrate) -> HoldOut:
    """Every configuration's records predicted from the other configurations' records."""
    return hold_out(cells, configuration_groups(cells), fit)


def leave_models_out(cells: pd.DataFrame, fit: Fit = calibrate) -> HoldOut:
    """Every model's records predicted from the other models' records."""
    return hold_out(cells, model_groups(cells), fit)


def leave_records_out(cells: pd.DataFrame, fit: Fit = calibrate) -> HoldOut:
    """Every record predicted from all the others, its twins included: in-sample, not evidence."""
    return hold_out(cells, record_groups(cells), fit)


def summarise(errors: pd.DataFrame) -> Summary:
    """The summary figures of per-record errors (:attr:`HoldOut.errors`)."""
    error = pd.to_numeric(errors["error_pct"], errors="coerce").abs().dropna()
    inside = errors["inside"].astype(bool)
    if error.empty:
        return Summary(0, 0, float("nan"), float("nan"), float("nan"), float("nan"))
    return Summary(
        records=len(errors),
        groups=int(errors["group"].nunique()),
        median_abs_error_pct=float(error.median()),
        p90_abs_error_pct=float(error.quantile(0.9)),
        within_10pct=100.0 * float((error <= 10.0).mean()),
        inside_90pct_interval=100.0 * float(inside.mean()),
    )


def _judged(cells: pd.DataFrame) -> np.ndarray:
    """Rows that are a measured answer with a step time."""
    step = pd.to_numeric(cells["step_time_s"], errors="coerce") if "step_time_s" in cells.columns else None
    if step is None or "status" not in cells.columns:
        return np.zeros(len(cells), dtype=bool)
    out: np.ndarray = (cells["status"].isin(MEASURED_FITS) & step.gt(0)).to_numpy(dtype=bool)
    return out


def _errors(test: pd.DataFrame, prediction: pd.DataFrame, group: str, trained_on: int) -> pd.DataFrame:
    measured = pd.to_numeric(test["step_time_s"], errors="coerce")
    predicted = pd.to_numeric(prediction["predicted_step_time_s"], errors="coerce")
    low = pd.to_numeric(prediction["predicted_step_time_s_low"], errors="coerce")
    high = pd.to_numeric(prediction["predicted_step_time_s_high"], errors="coerce")
    out = pd.DataFrame(
        {
            "group": group,
            "trained_on": trained_on,
            "measured_s": measured,
            "predicted_s": predicted,
            "low_s": low,
            "high_s": high,
            "error_pct": 100.0 * (predicted / measured - 1.0),
            "inside": (low <= measured) & (measured <= high),
        },
        index=test.index,
    )
    if "cell_id" in test.columns:
        out.insert(0, "cell_id", test["cell_id"])
    return out


def _numbers(frame: pd.DataFrame, column: str) -> pd.Series | None:
    return pd.to_numeric(frame[column], errors="coerce") if column in frame.columns else None


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA


def _text(value: object) -> str:
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, float, np.integer, np.floating)) and float(value).is_integer():
        return str(int(value))
    return "" if _missing(value) else str(value)


__all__ = [
    "CONFIGURATION_COLUMNS",
    "MODEL_COLUMNS",
    "HoldOut",
    "Summary",
    "configuration_groups",
    "hold_out",
    "labels",
    "leave_configurations_out",
    "leave_models_out",
    "leave_records_out",
    "model_groups",
    "record_groups",
    "summarise",
]
