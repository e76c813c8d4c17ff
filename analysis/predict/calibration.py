"""Fit the predictor's step-time coefficients and a memory factor, per GPU type, to measured records.

The step time is modelled as ``Σ coefficient × term`` over :data:`analysis.TERMS`: compute at the
reference rate (the coefficient is 1 / efficiency), nominal communication, nominal offload, and micro-steps (the
coefficient is a fixed cost per micro-step). The coefficients are the posterior mean of Bayesian linear regression
on relative error (:mod:`analysis.predict.uncertainty`, which also says how sure they are): priors at the uncalibrated
coefficients, so a term no record exercises keeps its nominal coefficient. On a device without a published peak
(the CPU) the prior is vague, centred on least squares over subsets of the terms with positive coefficients.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.predict.discrepancy import positions
from analysis.predict.inputs import grads_held, inputs_from_columns, memory_terms
from analysis.predict.network import MeasuredProfile
from analysis.predict.step_time import TERMS, step_terms
from analysis.predict.uncertainty import Spread, fit_posterior, prior_centre, prior_spread
from analysis.sweeps.records import MEASURED_FITS
from orchestrator.engines.memory import GIB, allocator_overhead, compiles_regionally


@dataclass
class GpuCalibration:
    """Step-time coefficients and a memory factor for one GPU type, fitted to its measured records."""

    efficiency: float
    """Achieved hardware FLOP/s per GPU over the reference rate: the dense peak for the cell's precision, or
    1 TFLOP/s for a device without a published peak (the CPU), where this is then the achieved TFLOP/s."""
    communication_scale: float = 1.0
    offload_scale: float = 1.0
    overhead_s_per_micro_step: float = 0.0
    memory_scale: float = 1.0
    memory_offset_gib: float = 0.0
    """Measured peak ≈ memory_scale × predicted + memory_offset_gib (GiB per GPU): the offset is what every
    process holds whatever the model (allocator pools, communication buffers, on the CPU the framework itself)."""
    num_records: int = 0
    fitted_terms: tuple[str, ...] = ()
    """The terms the records exercise (compute and micro-steps always; communication and offload where some
    record had any)."""
    step_time_error_pct: float | None = None
    """Median absolute error of the fitted step time on the records it was fitted to."""
    spread: Spread | None = None
    """How sure the fit is (:mod:`analysis.predict.uncertainty`); None: the prior's, as if uncalibrated."""

    def spread_for(self, gpu: str) -> Spread:
        """The fitted spread, or the prior's where none was fitted (a calibration written by hand)."""
        return self.spread if self.spread is not None else prior_spread(gpu)

    @property
    def coefficients(self) -> np.ndarray:
        """The multipliers of :data:`analysis.TERMS`, in order."""
        return np.array(
            [1.0 / self.efficiency, self.communication_scale, self.offload_scale, self.overhead_s_per_micro_step]
        )


@dataclass
class Calibration:
    """Calibrations by GPU config name (``a100-80gb``, ``cpu``...)."""

    by_gpu: dict[str, GpuCalibration] = field(default_factory=dict)
    profiles: Mapping[str, MeasuredProfile] | None = None
    """The measured profiles, by GPU name, whose links the coefficients were fitted with
    (:func:`analysis.predict.network.links_for`): a prediction with this calibration uses them too, unless it is
    given its own. None: the cited defaults."""

    def for_gpu(self, name: str | None) -> GpuCalibration | None:
        return self.by_gpu.get(name or "")


def _fit_coefficients(x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """Positive least squares on relative error over subsets of the terms (compute always in).

    Returns the coefficients of the subset with the smallest error (fewer terms on a tie) and its column
    indexes. A subset needs at least one record more than it has terms (compute alone: one record).
    """
    n = len(t)
    informative = [j for j in range(1, x.shape[1]) if np.any(x[:, j] > 0)]
    weighted = x / t[:, None]
    target = np.ones(n)
    best: tuple[float, int, np.ndarray, tuple[int, ...]] | None = None
    for k in range(len(informative) + 1):
        for extra in itertools.combinations(informative, k):
            cols = (0, *extra)
            if n < len(cols) or (len(cols) > 1 and n <= len(cols)):
                continue
            coef, *_ = np.linalg.lstsq(weighted[:, cols], target, rcond=None)
            if not np.all(np.isfinite(coef)) or np.any(coef <= 0):
                continue
            sse = float(np.sum((weighted[:, cols] @ coef - target) ** 2))
            candidate = (round(sse, 12), len(cols), coef, cols)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
    return None if best is None else (best[2], best[3])


def calibrate(records: pd.DataFrame, profiles: Mapping[str, MeasuredProfile] | None = None) -> Calibration:
    """Fit a :class:`GpuCalibration` per GPU type from measured cells.

    ``records`` is the cells table of :func:`analysis.sweeps.records.load_cells` (or ``Report.cells``): rows with status
    ``ok``, a ``step_time_s`` and a complete model shape count, at their measured micro-batch and accumulation,
    so that the fit compares like with like; ``profiles`` (a measured profile by GPU name) sets the links of those
    GPUs' communication terms, as it will for the predictions made with the result. A term no record exercises (communication when every cell had one
    GPU) keeps its nominal coefficient; GPU types without such rows are left uncalibrated.
    """
    needed = {"status", "gpu", "step_time_s", "model_num_layers", "num_gpus"}
    missing = needed - set(records.columns)
    if missing:
        raise ValueError(
            f"calibrate() needs the cells table of analysis.sweeps.records.load_cells; missing columns {sorted(missing)}"
        )
    step = pd.to_numeric(records["step_time_s"], errors="coerce")
    measured = records[records["status"].isin(MEASURED_FITS) & step.gt(0)]
    out = Calibration(profiles=profiles)
    if measured.empty:
        return out
    x = inputs_from_columns({c: measured[c] for c in measured.columns}, len(measured))
    micro = _column(measured, "micro_batch_size")
    accum = _column(measured, "grad_accum_steps")
    micro = np.where(micro >= 1, micro, np.nan)
    accum = np.where(accum >= 1, accum, np.maximum(np.floor(x.per_gpu_batch / np.where(micro >= 1, micro, 1.0)), 1.0))
    terms = step_terms(x, accum, profiles)
    mem = memory_terms(x)
    allocated = mem["params"] + grads_held(mem, accum) + mem["optimizer"] + mem["buffers"] + micro * mem["per_sequence"]
    overhead = allocator_overhead(
        x.accelerator, compiles_regionally(x.compile, x.method["compile_scope"]), x.checkpointing, x.expandable
    )
    predicted_peak = overhead * allocated / GIB
    # The prediction is of the reserved peak (what a GPU runs out of); the CPU's records have only one figure.
    reserved = _column(measured, "peak_memory_reserved_gib")
    measured_peak = np.where(np.isfinite(reserved), reserved, _column(measured, "peak_memory_gib"))
    times = step.loc[measured.index].to_numpy(dtype=float)
    for name in sorted(set(x.gpu[x.known])):
        rows = (x.gpu == name) & x.known
        least_squares = _coefficients_for(terms[rows], times[rows])
        if least_squares is None and name == "cpu":
            continue
        memory_scale, memory_offset = _fit_memory(predicted_peak[rows], measured_peak[rows])
        full, spread = fit_posterior(
            str(name),
            terms[rows],
            times[rows],
            prior_centre(str(name), least_squares),
            _memory_loo_errors(predicted_peak[rows], measured_peak[rows]),
            positions(x, accum).take(rows),
            profiled=str(name) in (profiles or {}),
        )
        gcal = GpuCalibration(
            efficiency=1.0 / full[0],
            communication_scale=float(full[1]),
            offload_scale=float(full[2]),
            overhead_s_per_micro_step=float(full[3]),
            memory_scale=memory_scale,
            memory_offset_gib=memory_offset,
            num_records=int(rows.sum()),
            fitted_terms=tuple(t for j, t in enumerate(TERMS) if np.any(terms[rows][:, j] > 0)),
            spread=spread,
        )
        errors = np.abs(terms[rows] @ gcal.coefficients / times[rows] - 1.0)
        gcal.step_time_error_pct = 100.0 * float(np.median(errors))
        out.by_gpu[str(name)] = gcal
    return out


def _coefficients_for(terms: np.ndarray, times: np.ndarray) -> np.ndarray | None:
    """All four coefficients fitted to records (:func:`_fit_coefficients`): a term no record exercises keeps its
    nominal coefficient, one exercised but left out of the best subset is zero. None where nothing fits."""
    fitted = _fit_coefficients(terms, times)
    if fitted is None:
        return None
    coef, cols = fitted
    full = np.array([0.0, 1.0, 1.0, 0.0])  # nominal coefficients for terms the records say nothing about
    for j in range(1, len(TERMS)):
        if np.any(terms[:, j] > 0):
            full[j] = 0.0
    full[list(cols)] = coef
    return full


def _memory_loo_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """log(measured / predicted) of each record's peak, the memory fit made without it (NaN where unmeasured).

    Every record's fit without it at once, as :func:`_fit_memory` would make it on the others: the least-squares
    system downdated by the record's row (a stack of 2x2 systems), the median ratio of the others where that fit is
    not taken. Linear in the records, where fitting again for each was quadratic (a sweep of 10,000 cells of one
    GPU type is 10,000 fits over 10,000 rows)."""
    out = np.full(len(predicted), np.nan)
    ok = np.isfinite(predicted) & np.isfinite(measured) & (predicted > 0) & (measured > 0)
    where = np.flatnonzero(ok)
    p, m = predicted[where], measured[where]
    k = len(p)
    if k == 0:
        return out
    if k == 1:  # no other record: the prediction stands
        out[where] = np.log(m / p)
        return out
    rest = k - 1
    scale, offset = _median_without_each(m / p), np.zeros(k)
    # The others' spread of predictions, each record left out in turn.
    ps, place = _ranked(p)
    high = np.where(place == k - 1, ps[-2], ps[-1])
    low = np.where(place == 0, ps[1], ps[0])
    mean = (p.sum() - p) / rest
    linear = (rest >= 3) & (high - low > 1e-3 * mean)
    if np.any(linear):
        rows = np.column_stack([p, np.ones_like(p)]) / m[:, None]
        gram = rows.T @ rows - rows[:, :, None] * rows[:, None, :]
        rhs = rows.sum(axis=0) - rows
        with np.errstate(all="ignore"):
            try:
                fitted = np.linalg.solve(gram[linear], rhs[linear][:, :, None])[:, :, 0]
            except np.linalg.LinAlgError:  # a singular system in the stack: least squares, as lstsq would
                fitted = (np.linalg.pinv(gram[linear]) @ rhs[linear][:, :, None])[:, :, 0]
        taken = np.isfinite(fitted).all(axis=1) & (fitted[:, 0] > 0) & (fitted[:, 1] >= 0)
        chosen = np.flatnonzero(linear)[taken]
        scale[chosen], offset[chosen] = fitted[taken, 0], fitted[taken, 1]
    out[where] = np.log(m / (scale * p + offset))
    return out


def _median_without_each(values: np.ndarray) -> np.ndarray:
    """The median of ``values`` without each one in turn (two or more values)."""
    k = len(values)
    ranked, place = _ranked(values)
    lo, hi = (k - 2) // 2, (k - 1) // 2  # the middle of the k - 1 others
    # The t-th smallest of the others: the t-th of all, or the next one where the left-out value came before it.
    at_lo = ranked[np.where(lo < place, lo, lo + 1)]
    at_hi = ranked[np.where(hi < place, hi, hi + 1)]
    out: np.ndarray = (at_lo + at_hi) / 2.0
    return out


def _ranked(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values`` sorted, and each value's place in that order."""
    order = np.argsort(values, kind="stable")
    place = np.empty(len(values), dtype=int)
    place[order] = np.arange(len(values))
    return values[order], place


def _fit_memory(predicted: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    """Scale and offset (GiB) mapping predicted to measured peaks, least squares on relative error.

    With fewer than two distinct predictions, or when the fit wants a negative offset, the offset is zero and
    the scale is the median ratio; with no measured peak at all, the prediction stands (1, 0).
    """
    ok = np.isfinite(predicted) & np.isfinite(measured) & (predicted > 0) & (measured > 0)
    p, m = predicted[ok], measured[ok]
    if len(p) == 0:
        return 1.0, 0.0
    if len(p) >= 3 and np.ptp(p) > 1e-3 * np.mean(p):
        (scale, offset), *_ = np.linalg.lstsq(
            np.column_stack([p, np.ones_like(p)]) / m[:, None], np.ones(len(p)), rcond=None
        )
        if scale > 0 and offset >= 0:
            return float(scale), float(offset)
    return float(np.median(m / p)), 0.0


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name not in frame.columns:
        return np.full(len(frame), np.nan)
    out: np.ndarray = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    return out
