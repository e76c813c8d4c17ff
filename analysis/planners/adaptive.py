"""One round of an adaptive sweep: from what is measured so far, whether to stop, and which cells to measure next.

The predictor is calibrated on the measured cells (:func:`analysis.predict.calibration.calibrate`), every cell of the grid
is predicted with its 90% interval, and the sweep stops when every cell without a measurement has an interval
narrower than the target (its larger half, in % of the predicted step time), when the GPU-hour budget would not
pay for one more cell, when the widest interval has stopped narrowing (:data:`STALL_ROUNDS`), or when every cell is
measured. Otherwise the next round is chosen by
:func:`analysis.planners.selection.choose_round` over the calibration's posterior.

The same function decides a real sweep's rounds (``orchestrator/cli/adaptive.py``, from its records) and a replay's
(``benchmarks/intervals.py``, from a table of truths), so the benchmark measures the logic the sweep runs.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.planners.selection import STARTUP_GPU_S, Candidates, ProbeSteps, choose_round, measurement_cost_gpu_s
from analysis.predict.calibration import Calibration, calibrate
from analysis.predict.discrepancy import positions
from analysis.predict.inputs import inputs_from_columns
from analysis.predict.network import MeasuredProfile
from analysis.predict.predictor import prediction_detail
from analysis.predict.step_time import DEFAULT_COEFFICIENTS
from analysis.predict.uncertainty import halfwidth_pct, prior_covariance, prior_spread
from analysis.sweeps.records import MEASURED_DOES_NOT_FIT, MEASURED_FITS
from orchestrator.store.adaptive_state import STOP_ALL_MEASURED, STOP_BUDGET, STOP_REASONS, STOP_STALLED, STOP_TARGET

STALL_ROUNDS = 3
STALL_SHARE = 0.05
"""A sweep has stalled when its widest unmeasured interval is not at least this share narrower than it was this
many rounds ago: the intervals have reached what the model's discrepancy leaves (on a synthetic grid whose
discrepancy sat at ±10%, a ±10% target would otherwise have measured 98% of it)."""


@dataclass(frozen=True)
class Goal:
    """When an adaptive sweep stops, and how many cells a round measures at most."""

    target_pct: float = 10.0
    """Stop once every unmeasured cell's 90% interval of step time is within ± this % of its prediction."""
    budget_gpu_hours: float = math.inf
    """Stop before a round would spend more than this, measurements so far included."""
    round_cells: int = 4
    """Cells measured per round at most (on SLURM: one array job a round)."""

    def __post_init__(self) -> None:
        if not (self.target_pct > 0):
            raise ValueError(f"target_pct={self.target_pct}: give the interval's half-width in %, above 0")
        if not (self.budget_gpu_hours > 0):
            raise ValueError(f"budget_gpu_hours={self.budget_gpu_hours}: give GPU-hours above 0")
        if self.round_cells < 1:
            raise ValueError(f"round_cells={self.round_cells}: give 1 or more cells per round")


@dataclass
class Decision:
    """What one round decided."""

    chosen: list[str]
    """Cell ids to measure next, in the order chosen (empty when stopping)."""
    stop: str | None
    """Why no further round (a key of :data:`STOP_REASONS`), or None."""
    widest_pct: float
    """The widest interval (larger half, %) of a cell without a measurement; inf where one cannot be predicted."""
    measured: int
    spent_gpu_hours: float
    predicted: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Every cell of the grid: ``cell_id``, ``answer`` (measured, predicted), ``step_time_s`` (the measured one, or
    the prediction) and the prediction's ``step_time_low_s``/``step_time_high_s``/``halfwidth_pct``, and the
    estimated ``cost_gpu_s`` of measuring it."""
    calibration: Calibration | None = None
    """What the round's predictions were made with (fitted to the measured cells)."""


def answered(measured: pd.DataFrame) -> pd.Series:
    """Measured cells that are an answer (ok, or measured not to fit), by cell id."""
    if measured.empty:
        return pd.Series(dtype=bool)
    return measured["status"].isin(MEASURED_FITS | MEASURED_DOES_NOT_FIT).groupby(measured["cell_id"]).any()


def startup_gpu_s(measured: pd.DataFrame) -> float:
    """Seconds a measurement spends before its timed steps (start-up and micro-batch search), from the records
    where they say it (median), else :data:`analysis.planners.selection.STARTUP_GPU_S`."""
    if measured.empty or "startup_s" not in measured.columns:
        return STARTUP_GPU_S
    fixed = pd.to_numeric(measured["startup_s"], errors="coerce") + pd.to_numeric(
        measured.get("search_s", 0.0), errors="coerce"
    ).fillna(0.0)
    fixed = fixed.dropna()
    return float(fixed.median()) if len(fixed) else STARTUP_GPU_S


def decide(
    grid: pd.DataFrame,
    measured: pd.DataFrame,
    goal: Goal,
    spent_gpu_s: float,
    probe: ProbeSteps | None = None,
    blocked: Collection[str] = (),
    history: Sequence[float] = (),
    profiles: Mapping[str, MeasuredProfile] | None = None,
) -> Decision:
    """The next round of an adaptive sweep over ``grid`` (flat cells, one row each, with ``cell_id``), given the
    cells table of what was measured (``measured``: rows with ``status``; only answers count) and the GPU-seconds
    spent so far. ``blocked`` cells are never chosen (they failed as often as a cell may): they stay predicted.
    ``history``: the widest unmeasured interval when each earlier round was chosen, oldest first; ``profiles``:
    each GPU type's measured profile, whose links the predictions use."""
    probe = probe if probe is not None else ProbeSteps()
    done = answered(measured)
    measured_ids = set(done[done].index)
    calibration = _calibrate(measured, profiles)
    x = inputs_from_columns({c: grid[c] for c in grid.columns}, len(grid))  # one reading, for both uses below
    detail = prediction_detail(grid, calibration, inputs=x)
    ids = grid["cell_id"].astype(str).to_numpy()
    is_measured = np.array([i in measured_ids for i in ids])
    central = detail["step_time_s"].astype(float)
    terms = np.nan_to_num(detail["terms"].astype(float))
    gpu = np.asarray(detail["gpu"]).astype(str)
    known = np.asarray(detail["known"], dtype=bool)
    fits = np.asarray(detail["fits"], dtype=bool)
    # Where nothing calibrates a device without a published peak (the CPU), the prior's centre weighs the terms.
    weigh_by = np.where(np.isfinite(central) & (central > 0), central, terms @ DEFAULT_COEFFICIENTS)
    weighted = np.nan_to_num(terms / np.where(weigh_by > 0, weigh_by, np.nan)[:, None])
    covariances: dict[str, np.ndarray] = {}
    discrepancy = np.zeros(len(ids))
    for name in sorted(set(gpu.tolist())):
        gcal = calibration.for_gpu(name)
        spread = gcal.spread_for(name) if gcal is not None else prior_spread(name, name in (calibration.profiles or {}))
        covariance = spread.covariance if gcal is not None else prior_covariance(name, DEFAULT_COEFFICIENTS)
        covariances[name] = covariance
        discrepancy[gpu == name] = spread.step_time_sd**2
    width = halfwidth_pct(np.asarray(detail["step_time_sd"], dtype=float), _dof(calibration, gpu))
    width = np.where(np.isfinite(central), width, np.inf)
    cost = measurement_cost_gpu_s(
        pd.to_numeric(grid["num_gpus"], errors="coerce").fillna(1).to_numpy(dtype=float),
        central,
        probe,
        startup_gpu_s(measured),
    )
    open_ = known & fits & ~is_measured
    predicted = pd.DataFrame(
        {
            "cell_id": ids,
            "answer": np.where(is_measured, "measured", np.where(known, "predicted", "unknown")),
            "step_time_s": central,
            "step_time_low_s": detail["step_time_low_s"],
            "step_time_high_s": detail["step_time_high_s"],
            "halfwidth_pct": width,
            "cost_gpu_s": cost,
        }
    )
    widest = float(width[open_].max()) if open_.any() else 0.0
    spent_hours = spent_gpu_s / 3600.0
    decision = Decision([], None, widest, len(measured_ids), spent_hours, predicted, calibration)
    budget_left = goal.budget_gpu_hours * 3600.0 - spent_gpu_s
    blocked_mask = np.array([i in set(blocked) for i in ids])
    selectable = open_ & ~blocked_mask
    if not selectable.any():
        decision.stop = STOP_ALL_MEASURED if not open_.any() else STOP_BUDGET
        return decision
    if widest <= goal.target_pct:
        decision.stop = STOP_TARGET
        return decision
    if len(history) >= STALL_ROUNDS and widest > (1.0 - STALL_SHARE) * history[-STALL_ROUNDS]:
        decision.stop = STOP_STALLED
        return decision
    if float(cost[selectable].min()) > budget_left:
        decision.stop = STOP_BUDGET
        return decision
    rows = np.flatnonzero(known & fits)
    # Where each cell lies, for the distances its discrepancy grows with (as the predictor's own).
    where = positions(x, detail["grad_accum_steps"])
    candidates = Candidates(
        group=gpu[rows],
        weighted=weighted[rows],
        discrepancy_var=discrepancy[rows],
        cost_gpu_s=cost[rows],
        measured=is_measured[rows],
        blocked=blocked_mask[rows],
        positions=where.take(rows),
    )
    picked = choose_round(candidates, covariances, goal.round_cells, budget_left)
    decision.chosen = [str(ids[rows[j]]) for j in picked]
    if not decision.chosen:
        decision.stop = STOP_BUDGET
    return decision


def _calibrate(measured: pd.DataFrame, profiles: Mapping[str, MeasuredProfile] | None = None) -> Calibration:
    if measured.empty:
        return Calibration(profiles=profiles)
    try:
        return calibrate(measured, profiles)
    except (ValueError, np.linalg.LinAlgError):
        return Calibration(profiles=profiles)


def _dof(calibration: Calibration, gpu: np.ndarray) -> np.ndarray:
    out = np.empty(len(gpu))
    for name in set(gpu.tolist()):
        gcal = calibration.for_gpu(name)
        out[gpu == name] = (gcal.spread_for(name) if gcal is not None else prior_spread(name)).dof
    return out


__all__ = [
    "STOP_ALL_MEASURED",
    "STOP_BUDGET",
    "STOP_REASONS",
    "STOP_TARGET",
    "Decision",
    "Goal",
    "answered",
    "decide",
    "startup_gpu_s",
]
