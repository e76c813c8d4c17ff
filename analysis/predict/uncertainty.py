"""How sure the predictor is: a 90% interval around every predicted step time and peak memory per GPU.

Step time is ``Σ coefficient × term`` (:mod:`analysis.predict.step_time`). Its uncertainty has two parts, both relative
(on the log scale, where a step time is never negative and a factor is a factor whatever the cell's size):

- the coefficients' posterior, from Bayesian linear regression on relative error: the prior is centred on the
  uncalibrated coefficients (:data:`analysis.predict.step_time.DEFAULT_COEFFICIENTS`) with the widths below, the likelihood
  treats each measured record's ``Σ coefficient × term / measured`` as 1 with the model's discrepancy as noise;
- the model's discrepancy, what no choice of the four coefficients explains (a kernel that suits one shape, an
  attention implementation, the allocator), estimated by leave-one-out: each record predicted by the calibration
  fitted to the others, less what the posterior already accounts for, pooled with :data:`PRIOR_RECORDS` records'
  worth of the prior's discrepancy so that three records do not claim a 1% model.

The discrepancy so estimated is the measured neighbourhood's: a cell far from every record (more GPUs or nodes, a
larger model, more micro-steps, a family or method no record had) gets more, as :mod:`analysis.predict.discrepancy`
says, and a family or method whose records were predicted badly keeps its cells' intervals wide. Time in a term no
record exercises is the covariance's part: its coefficient keeps the prior's width.

A cell's predictive relative variance is ``w Σ wᵀ + discrepancy²`` with ``w`` its terms over its central step time
and ``Σ`` the coefficients' covariance; the interval is the central value times ``exp(± t × sd)``, ``t`` the 95%
quantile of Student's t with as many degrees of freedom as the discrepancy was estimated from.

Peak memory per GPU has a discrepancy only (its calibration is a scale and an offset): the relative leave-one-out
error of that fit, pooled with the prior's in the same way.

The central value is the posterior mean: with few records it stays near the prior (one record twice as slow as
predicted moves the prediction part of the way, as far as the prior's discrepancy makes that record credible);
with many, it is least squares on relative error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

from analysis.predict.discrepancy import Neighbourhood, Positions, cell_sd
from analysis.predict.step_time import DEFAULT_COEFFICIENTS, TERMS

LEVEL = 0.90
"""The intervals' coverage: 90%, from the 5th to the 95th percentile."""

REFERENCE_GPU = "h100-80gb"
"""The GPU type the uncalibrated coefficients were set on (tests/data/gpu-records)."""
COMPUTE_PRIOR_SD = 0.051
"""Relative spread of the compute coefficient (1 / efficiency) on the reference GPU: the standard deviation of the
log of the coefficient each of the 14 H100 records implies, once the default cost per micro-step is taken off,
with the cited profile (:mod:`analysis.predict.reference_profile`; 0.49 to 0.57 in the units where 0.54 is
nominal)."""
OTHER_GPU_FACTOR = 2.0
"""Every prior width is this much wider on another GPU type: the defaults were set on the H100 and are carried to
other GPUs by their datasheet peaks and bandwidths only."""
MICRO_STEP_PRIOR_SD = 0.5
"""Relative spread of the fixed cost per micro-step: set jointly with the efficiency from two H100 records that
share a micro-step count, so loosely pinned."""
LINK_PRIOR_SD = 1.0
"""Relative spread of the communication and offload coefficients: their nominal bandwidths are orders of
magnitude only (:mod:`analysis.predict.step_time`), and no H100 record has any communication or offload."""
VAGUE_PRIOR_SD = 10.0
"""Relative spread where there is no uncalibrated coefficient (a device without a published peak, the CPU): the
prior is then centred on the fitted value and says nothing."""
STEP_TIME_DISCREPANCY = 0.047
"""The uncalibrated step time's discrepancy: the root mean square of log(measured / predicted) over the 14 H100
records, predicted with the cited profile (:mod:`analysis.predict.reference_profile`; largest: pythia-1b compiled
whole, 8.7% fast). The seven compiled records set :data:`analysis.predict.memory_bound.COMPILED_SHARE`'s ``whole``;
over the seven others alone it is 0.034."""
PROFILED_DISCREPANCY = 0.045
"""The uncalibrated step time's discrepancy where the GPU type has a profile (``gpudays profile``): the root mean
square of log(measured / predicted) over the 13 H200 records no constant was set on, predicted with that machine's
profile (``tests/data/gpu-records/h200`` and ``h200-round2``; largest: pythia-160m under mesh3d, 9.3% fast). Off
the H200 it is doubled, as every prior width is off the GPU it was measured on."""
PROFILED_REFERENCE_GPU = "h200"
"""The GPU type :data:`PROFILED_DISCREPANCY` was measured on."""
MEMORY_DISCREPANCY = 0.043
"""The uncalibrated peak memory's discrepancy: root mean square of log(measured / predicted reserved peak) over
the same records (largest: pythia-1.4b, 7% under)."""
MIN_DISCREPANCY = 0.01
"""No calibration claims to be closer than the probe's own timing noise (its 95% interval is about ±1-2%)."""
PRIOR_RECORDS = 1
"""How many records' worth the prior's discrepancy weighs against the leave-one-out errors. One: on the synthetic
grid of ``tests/unit/analysis/test_uncertainty.py`` three kept 120 records' 90% intervals at 94-99% coverage, over-wide."""
PRIOR_DOF = 4
"""Degrees of freedom a calibrated interval starts from (Student's t, 2.13 at 90%), adding its records: its
discrepancy weighs the prior's as :data:`PRIOR_RECORDS` record beside the leave-one-out errors."""
UNCALIBRATED_DOF = 14
"""Degrees of freedom of an uncalibrated interval (Student's t, 1.76 at 90%): the records its discrepancies were
estimated from, :data:`STEP_TIME_DISCREPANCY`'s and :data:`MEMORY_DISCREPANCY`'s 14 H100 records
(:data:`PROFILED_DISCREPANCY`'s 13 H200 ones where the GPU type is profiled)."""
PROFILED_DOF = 13
"""Degrees of freedom of an uncalibrated interval on a profiled GPU type (:data:`UNCALIBRATED_DOF`)."""


@dataclass
class Spread:
    """The uncertainty of one GPU type's predictions: covariance of the step-time coefficients (in the order of
    :data:`analysis.predict.step_time.TERMS`), and the relative discrepancies of step time and peak memory (sd of log)."""

    covariance: np.ndarray
    step_time_sd: float
    memory_sd: float
    dof: float
    """Degrees of freedom of the discrepancies: :data:`PRIOR_DOF` plus the records they were estimated on."""
    num_records: int = 0
    neighbourhood: Neighbourhood | None = None
    """The records the discrepancy was estimated on, where a cell's distance to them is measured from."""

    def step_sd_at(self, cells: Positions) -> np.ndarray:
        """The step time's discrepancy at each cell: :attr:`step_time_sd` where records pin it down, growing with
        the distance to them (:func:`analysis.predict.discrepancy.cell_sd`)."""
        return cell_sd(self.step_time_sd, cells, self.neighbourhood)


def prior_covariance(gpu: str, centre: np.ndarray | None = None) -> np.ndarray:
    """The coefficients' prior covariance on ``gpu``: the widths above, relative to the uncalibrated coefficients;
    on a device without a published peak (the CPU) vague for compute and micro-steps, around ``centre``."""
    factor = 1.0 if gpu == REFERENCE_GPU else OTHER_GPU_FACTOR
    relative = np.array([COMPUTE_PRIOR_SD, LINK_PRIOR_SD, LINK_PRIOR_SD, MICRO_STEP_PRIOR_SD]) * factor
    scale = DEFAULT_COEFFICIENTS.astype(float).copy()
    if gpu == "cpu" and centre is not None:
        relative[[0, 3]] = VAGUE_PRIOR_SD
        scale[0], scale[3] = max(float(centre[0]), 1e-12), max(float(centre[3]), DEFAULT_COEFFICIENTS[3])
    out: np.ndarray = np.diag((relative * scale) ** 2)
    return out


def prior_spread(gpu: str, profiled: bool = False) -> Spread:
    """An uncalibrated GPU type's spread: the prior alone, the same for every cell. Its widths are those of a cell
    anywhere (the coefficients' priors, the discrepancy doubled off the reference GPU: the H100's without a
    profile, :data:`PROFILED_DISCREPANCY` where the GPU type is ``profiled``); the discrepancy's growth rates were
    fitted on calibrated predictions only (:mod:`analysis.predict.discrepancy`), so they are not applied here."""
    factor = 1.0 if gpu == REFERENCE_GPU else OTHER_GPU_FACTOR
    step_sd = STEP_TIME_DISCREPANCY * factor
    if profiled:
        step_sd = PROFILED_DISCREPANCY * (1.0 if gpu == PROFILED_REFERENCE_GPU else OTHER_GPU_FACTOR)
    dof = PROFILED_DOF if profiled else UNCALIBRATED_DOF
    return Spread(prior_covariance(gpu), step_sd, MEMORY_DISCREPANCY * factor, float(dof))


def pooled_sd(prior_sd: float, squared_errors: np.ndarray) -> float:
    """The discrepancy: the prior's, as :data:`PRIOR_RECORDS` records, pooled with the leave-one-out errors."""
    total = PRIOR_RECORDS * prior_sd**2 + float(np.sum(np.maximum(squared_errors, 0.0)))
    return max(float(np.sqrt(total / (PRIOR_RECORDS + len(squared_errors)))), MIN_DISCREPANCY)


def prior_centre(gpu: str, least_squares: np.ndarray | None) -> np.ndarray:
    """The prior's centre: the uncalibrated coefficients, or, on a device without a published peak (the CPU),
    the least-squares fit (under a vague prior, :func:`prior_covariance`)."""
    if gpu == "cpu" and least_squares is not None:
        return least_squares.astype(float).copy()
    return DEFAULT_COEFFICIENTS.astype(float).copy()


def fit_posterior(
    gpu: str,
    terms: np.ndarray,
    times: np.ndarray,
    centre: np.ndarray,
    memory_errors: np.ndarray,
    where: Positions | None = None,
    profiled: bool = False,
) -> tuple[np.ndarray, Spread]:
    """The coefficients' posterior mean and the spread of a GPU type calibrated on records with step-time
    ``terms`` (one row each) and measured ``times``; ``centre`` is the prior's (:func:`prior_centre`).

    The discrepancy is the likelihood's noise, and the leave-one-out errors (each record predicted by the
    posterior of the others, less the variance that posterior already accounts for) set it: a few rounds of each
    given the other settle. ``memory_errors`` are the peak memory's leave-one-out log errors, computed by the
    caller (NaN where unmeasured); ``where`` the records' positions, kept with their leave-one-out residuals as
    the neighbourhood a cell's discrepancy grows away from (:mod:`analysis.predict.discrepancy`); ``profiled``
    whether the terms came from a profile of the GPU type (:func:`prior_spread`). A coefficient the posterior puts
    below zero is taken as zero (compute: a thousandth of the prior's), the posterior being Gaussian where the
    truth is not.
    """
    prior = prior_spread(gpu, profiled)
    cov0 = prior_covariance(gpu, centre)
    precision0 = np.linalg.inv(cov0)
    weighted = terms / times[:, None]
    n = len(times)
    sd = prior.step_time_sd

    def solve(precision: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cov = np.linalg.inv(precision)
        return cov @ rhs, cov

    for _ in range(4):
        precision = precision0 + weighted.T @ weighted / sd**2
        rhs = precision0 @ centre + weighted.sum(axis=0) / sd**2
        # Every record's leave-one-out posterior at once: a stack of the small systems, each solved as alone.
        cov_i = np.linalg.inv(precision - weighted[:, :, None] * weighted[:, None, :] / sd**2)
        mean_i = (cov_i @ (rhs - weighted / sd**2)[:, :, None])[:, :, 0]
        predicted = np.maximum((terms[:, None, :] @ mean_i[:, :, None])[:, 0, 0], 1e-3 * times)
        v = terms / predicted[:, None]  # the prediction's own relative variance is v Σ vᵀ
        residuals = np.log(times / predicted)
        errors = residuals**2 - ((v[:, None, :] @ cov_i) @ v[:, :, None])[:, 0, 0]
        # One record alone has no other to be predicted from: its error is the prior's, not the model's.
        sd = pooled_sd(prior.step_time_sd, errors if n > 1 else errors[:0])
    precision = precision0 + weighted.T @ weighted / sd**2
    mean, covariance = solve(precision, precision0 @ centre + weighted.sum(axis=0) / sd**2)
    mean = np.maximum(mean, 0.0)
    mean[0] = max(mean[0], 1e-3 * centre[0])
    measured_memory = memory_errors[np.isfinite(memory_errors)]
    memory_sd = pooled_sd(prior.memory_sd, measured_memory**2 if len(measured_memory) > 1 else measured_memory[:0])
    near = Neighbourhood(where, residuals if n > 1 else None) if where is not None else None
    return mean, Spread(covariance, sd, memory_sd, float(PRIOR_DOF + n), n, near)


def quantile(dof: np.ndarray | float) -> np.ndarray:
    """The two-sided :data:`LEVEL` quantile of Student's t (1.645 for many degrees of freedom):
    ``scipy.special.stdtrit``, what ``scipy.stats.t.ppf`` computes, without importing scipy.stats (seconds)."""
    out = np.asarray(special.stdtrit(np.asarray(dof, dtype=float), 0.5 + LEVEL / 2.0), dtype=float)
    return out


def bounds(central: np.ndarray, sd: np.ndarray, dof: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """The :data:`LEVEL` interval around ``central`` for a relative (log) standard deviation ``sd``."""
    factor: np.ndarray = np.exp(quantile(dof) * sd)
    return central / factor, central * factor


def halfwidth_pct(sd: np.ndarray, dof: np.ndarray | float) -> np.ndarray:
    """The interval's larger half as a percentage of the central value (``exp(t × sd) − 1``)."""
    out: np.ndarray = 100.0 * (np.exp(quantile(dof) * sd) - 1.0)
    return out


__all__ = ["LEVEL", "TERMS", "Spread", "bounds", "fit_posterior", "halfwidth_pct", "prior_spread", "quantile"]
