"""Which cells to measure next: those whose measurement most narrows the grid's answers per GPU-second spent.

The predictor's step time is linear in its coefficients (:mod:`analysis.predict.step_time`), and its uncertainty
(:mod:`analysis.predict.uncertainty`) is, per GPU type, a Gaussian posterior over those coefficients plus a discrepancy of
its own for every cell. On the log scale a cell's predictive variance is ``w Σ wᵀ + δ²``, ``w`` its terms over
its central step time, ``Σ`` its GPU type's covariance and ``δ`` the discrepancy. The uncertainty of the grid's
answers is the sum of that variance over the cells not yet measured.

Measuring cell ``j`` (terms ``v``) adds one row to the regression with noise ``δ²``: the posterior covariance
becomes ``Σ − Σvᵀ vΣ / (δ² + vΣvᵀ)`` whatever the measured value turns out to be (linear-Gaussian), so the
expected reduction is known before the measurement:

- every other unmeasured cell ``i`` of the same GPU type loses ``(w_i Σ vᵀ)² / (δ² + vΣvᵀ)``;
- cell ``j`` itself stops being a prediction: its whole variance ``vΣvᵀ + δ²`` leaves the sum.

The discrepancy of a cell also grows with its distance to the measured cells of its GPU type (in model size, and in
any other dimension :mod:`analysis.predict.discrepancy` gives a rate): measuring ``j`` takes off the distance
variance of every cell it is now the nearest record to, and that too is known before the measurement
(:func:`distance_terms`). Without it the design saw only the coefficients, and a small model's cells, cheapest to
measure, taught them as much as a large one's: on the generator of ``tests/truth_grid.py`` (seed 0) 83 of its first
128 cells were of its two smallest models, and the five larger models' cells came out 21-55% slow; with it, 0-17%.

A cell's score is that reduction over its cost in GPU-seconds (:func:`measurement_cost_gpu_s`): a one-GPU cell of a
small model pins the compute and micro-step coefficients cheaply, a two-node cell the communication coefficient
at a price. A round takes the best-scoring cell, updates the covariance as if it were measured (the update does
not depend on the value), and takes the next, until the round is full or its cost would pass the budget left:
the greedy batch of cost-aware A-optimal design. One exception comes first: a term priced by a link's nominal
figures (communication, offload) that no measured cell of the GPU type has is checked by the cell that shows it
most (:func:`unchecked`), since the design cannot see a term whose nominal share is wrong.

Everything here is arithmetic on arrays; the records, the calibration and the sweep folder are the callers'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from analysis.predict.discrepancy import Positions, nearest_log_distance, rated_dimensions
from analysis.predict.step_time import TERMS

STARTUP_GPU_S = 30.0
"""What a measurement costs per GPU before its first timed step, where no record says better: starting the
processes, building the model and the engine, the micro-batch search (about half of the 45 GPU-seconds an H100
cell of pythia-160m takes)."""


@dataclass(frozen=True)
class ProbeSteps:
    """How many steps a probe times at most, and its time budget (``conf/probe``)."""

    warmup_steps: int = 2
    max_steps: int = 50
    time_budget_s: float = 300.0


def measurement_cost_gpu_s(
    num_gpus: np.ndarray, step_time_s: np.ndarray, probe: ProbeSteps, startup_s: float = STARTUP_GPU_S
) -> np.ndarray:
    """GPU-seconds one measurement of each cell costs: its GPUs × (start-up + its timed steps, at most the
    probe's time budget). A cell without a predicted step time is taken to spend the whole budget."""
    steps = probe.warmup_steps + probe.max_steps
    timed = np.where(
        np.isfinite(step_time_s), np.minimum(steps * step_time_s, probe.time_budget_s), probe.time_budget_s
    )
    out: np.ndarray = np.maximum(num_gpus, 1) * (startup_s + timed)
    return out


@dataclass
class Candidates:
    """The grid as the selection sees it, one entry per cell (fitting cells with a step-time model only)."""

    group: np.ndarray
    """Each cell's GPU type: cells share coefficients, and so information, within a group only."""
    weighted: np.ndarray
    """Terms over the central step time (one row per cell, :data:`analysis.predict.step_time.TERMS`)."""
    discrepancy_var: np.ndarray
    """Each cell's ``δ²``: the discrepancy no coefficient explains (also the noise of its measurement)."""
    cost_gpu_s: np.ndarray
    measured: np.ndarray
    """True where the cell has been measured (or chosen in this round already)."""
    blocked: np.ndarray | None = None
    """True where a cell may not be chosen though unmeasured (it failed as often as a cell may): it stays a
    prediction, and counts in the grid's uncertainty."""
    positions: Positions | None = None
    """Where each cell lies. With it, the discrepancy of a cell also grows with its distance to the measured cells
    of its GPU type (:mod:`analysis.predict.discrepancy`), and a measurement narrows that of the cells near it."""


def predictive_variance(c: Candidates, covariances: Mapping[str, np.ndarray]) -> np.ndarray:
    """``w Σ wᵀ + δ²`` of every cell, on the log scale."""
    out = c.discrepancy_var.astype(float).copy()
    for name, cov in covariances.items():
        rows = c.group == name
        w = c.weighted[rows]
        out[rows] += np.einsum("ij,jk,ik->i", w, cov, w).clip(min=0.0)
    return out


def grid_uncertainty(c: Candidates, covariances: Mapping[str, np.ndarray]) -> float:
    """The sum of the unmeasured cells' predictive variances: what a round tries to shrink."""
    return float(predictive_variance(c, covariances)[~c.measured].sum())


def expected_reduction(c: Candidates, covariances: Mapping[str, np.ndarray]) -> np.ndarray:
    """For every cell, how much measuring it would take off :func:`grid_uncertainty` (0 where measured)."""
    out = np.zeros(len(c.group))
    own = predictive_variance(c, covariances)
    for name, cov in covariances.items():
        rows = np.flatnonzero(c.group == name)
        if len(rows) == 0:
            continue
        w = c.weighted[rows]
        cross = w @ cov @ w.T  # cross[i, j] = w_i Σ w_jᵀ
        denominator = c.discrepancy_var[rows] + np.diag(cross)
        open_ = ~c.measured[rows]
        # Σ over unmeasured i ≠ j of (w_i Σ w_jᵀ)² / (δ_j² + w_j Σ w_jᵀ), and j's own variance.
        squares = (cross**2 * open_[:, None]).sum(axis=0) - np.diag(cross) ** 2 * open_
        out[rows] = np.where(open_, squares / np.maximum(denominator, 1e-300) + own[rows], 0.0)
    return out


def updated_covariance(cov: np.ndarray, v: np.ndarray, noise_var: float) -> np.ndarray:
    """The covariance after one more record with weighted terms ``v`` and noise ``noise_var`` (rank one)."""
    sv = cov @ v
    out: np.ndarray = cov - np.outer(sv, sv) / (noise_var + float(v @ sv))
    return out


def distance_terms(c: Candidates, measured: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each cell's distance variance given the ``measured`` cells of its GPU type, and for every unmeasured cell
    ``j`` how much measuring it would take off the other unmeasured cells' distance variances (every cell is as
    far from a record as its nearest one: :func:`analysis.predict.discrepancy.distance_variance`). A GPU type
    with no measured cell has no distance terms yet (the prior's discrepancy is a cell anywhere's), so its first
    cell narrows none."""
    size = len(c.group)
    own, gain = np.zeros(size), np.zeros(size)
    if c.positions is None:
        return own, gain
    for name in np.unique(c.group):
        rows = c.group == name
        done = rows & measured
        if not done.any():
            continue
        open_ = rows & ~measured
        for rate, values in rated_dimensions(c.positions):
            if rate <= 0:
                continue
            near = nearest_log_distance(values, values[done])
            ok = open_ & np.isfinite(values) & (values > 0)
            if not ok.any():
                continue
            logs = np.log(values[ok])
            levels, index = np.unique(logs, return_inverse=True)
            count = np.bincount(index, minlength=len(levels)).astype(float)
            now = np.zeros(len(levels))
            now[index] = near[ok]
            # after[a, b]: the distance of level b once a cell at level a is measured.
            after = np.minimum(now[None, :], np.abs(levels[:, None] - levels[None, :]))
            saved = rate**2 * ((now[None, :] ** 2 - after**2) * count[None, :]).sum(axis=1)
            own[ok] += rate**2 * near[ok] ** 2
            # The cell measured leaves the sum as a whole (its own variance), not as a narrowed neighbour.
            gain[ok] += saved[index] - rate**2 * near[ok] ** 2
    return own, np.maximum(gain, 0.0)


CHECKED_TERMS = ("communication_s", "offload_s")
"""The terms priced by nominal figures of a link (:data:`analysis.predict.step_time.TERMS`), checked by a record
before the design relies on them (:func:`unchecked`)."""


def unchecked(c: Candidates, measured: np.ndarray, allowed: np.ndarray) -> int | None:
    """The cell to measure first where a GPU type's cells have a term of :data:`CHECKED_TERMS` that none of its
    measured cells has: of the ``allowed`` cells with that term, the one whose measurement says most of that
    coefficient alone per GPU-second (its share of the step squared over its cost); None where every such term
    is checked.

    The greedy design trusts the prior's form: a term whose nominal share is small looks unimportant, and a
    one-rank cell looks as informative as any. But the nominal figures of a link can be wrong by more than the
    prior's width says (on the real CPU grid the engines' many small collectives cost several times what the
    profiled links give), and only a record that has the term shows it."""
    for name in np.unique(c.group):
        rows = c.group == name
        for k in (TERMS.index(term) for term in CHECKED_TERMS):
            has = rows & (c.weighted[:, k] > 0)
            pool = has & allowed
            if (has & measured).any() or not pool.any():
                continue
            information = np.where(pool, c.weighted[:, k] ** 2 / np.maximum(c.cost_gpu_s, 1e-9), -np.inf)
            return int(np.argmax(information))
    return None


def choose_round(
    c: Candidates, covariances: Mapping[str, np.ndarray], max_cells: int, budget_gpu_s: float = np.inf
) -> list[int]:
    """Up to ``max_cells`` unmeasured cells, best reduction per GPU-second first, each chosen given the ones before
    it (greedy batch), their total cost within ``budget_gpu_s``; a term no record has checked is measured first
    (:func:`unchecked`). Indexes into ``c``, in the order chosen."""
    covs = {name: np.array(cov, dtype=float) for name, cov in covariances.items()}
    measured = c.measured.copy()
    chosen: list[int] = []
    spent = 0.0
    while len(chosen) < max_cells:
        state = Candidates(c.group, c.weighted, c.discrepancy_var, c.cost_gpu_s, measured)
        distance_own, distance_gain = distance_terms(c, measured)
        reduction = expected_reduction(state, covs) + np.where(measured, 0.0, distance_own + distance_gain)
        score = reduction / np.maximum(c.cost_gpu_s, 1e-9)
        affordable = ~measured & (spent + c.cost_gpu_s <= budget_gpu_s)
        if c.blocked is not None:
            affordable &= ~c.blocked
        if not affordable.any():
            break
        first = unchecked(c, measured, affordable)
        j = first if first is not None else int(np.argmax(np.where(affordable, score, -np.inf)))
        chosen.append(j)
        measured[j] = True
        spent += float(c.cost_gpu_s[j])
        name = str(c.group[j])
        covs[name] = updated_covariance(covs[name], c.weighted[j], float(c.discrepancy_var[j]))
    return chosen


__all__ = [
    "CHECKED_TERMS", "STARTUP_GPU_S", "Candidates", "ProbeSteps", "choose_round", "distance_terms", "expected_reduction",
    "grid_uncertainty", "measurement_cost_gpu_s", "predictive_variance", "unchecked", "updated_covariance",
]  # fmt: skip
