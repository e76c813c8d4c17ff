"""The model's discrepancy at a cell: small where measured records pin the answer down, growing with the distance to
them.

A cell's discrepancy (the sd of log(measured / predicted) that no choice of the coefficients explains) is, in
quadrature,

- the measured neighbourhood's: the leave-one-out discrepancy of the records (:mod:`analysis.predict.uncertainty`);
- distance terms, each a rate per unit of natural log ratio to the nearest measured record in that dimension:
  GPU count (:data:`GPU_RATE`), node count (:data:`NODE_RATE`), parameters (:data:`SIZE_RATE`) and micro-steps
  per optimizer step (:data:`MICRO_STEP_RATE`: the fixed cost per micro-step is confounded with compute where
  every record ran the same number);
- two random effects, the model family's and the method's (engine, ZeRO stage, FSDP sharding, tp, pp): a group no
  record is in adds its whole variance (:data:`FAMILY_SD`, :data:`METHOD_SD`); a group some records are in adds
  what its records' leave-one-out residuals leave of it, ``b² + v`` with ``b`` and ``v`` the posterior mean and
  variance of the group's effect (a normal prior of the group's sd, the records' residuals with the
  neighbourhood's discrepancy as noise): a family whose records were all 20% slower than predicted keeps its cells'
  intervals wide, one whose records were on the mark narrows them.

The share of a cell's time in terms no record constrains (communication where no record had any) is the
coefficients' part of the variance (``w Σ wᵀ`` in :mod:`analysis.predict.uncertainty`): such a coefficient keeps
its prior width, so the interval grows with that share times the prior's sd; it is not counted again here.

The rates were fitted (``python benchmarks/discrepancy_rates.py``) on the unfittable generator of
``tests/truth_grid.py``, whose physics is its own, not on the real CPU grid, the H100 records or the published runs
the scorecard judges them on: non-negative least squares of each unmeasured cell's squared log error, less the
variance the calibration already gave it, on the squared distances and the indicators of an unmeasured family or
method, over calibrations on random draws of 1-5% of its cells. On that generator the figures are in-sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.predict.inputs import Inputs

GPU_RATE = 0.0
"""Growth of the discrepancy per unit of log GPU-count ratio to the nearest measured count. Fitted on the
generator (``benchmarks/discrepancy_rates.py``, 2 seeds x 1, 2 and 5% measured x 3 draws, 48,564 cells): 0, the
node count and the method taking what GPUs alone would (single calibrations' fits: 0 to 0.10, 10th to 90th
percentile). The real CPU grid alone would want 0.51 (in-sample there, so not used): its 4-rank cells ran
oversubscribed on two cores."""
NODE_RATE = 0.0
"""Growth per unit of log node-count ratio to the nearest measured node count. Fitted on the generator: 0 (0 to
0.02)."""
SIZE_RATE = 0.156
"""Growth per unit of log parameter ratio to the nearest measured model size. Fitted on the generator: 0.156 (0 to
0.23): a model 10x the nearest measured adds 0.36 to the sd in quadrature."""
MICRO_STEP_RATE = 0.0
"""Growth per unit of log ratio of micro-steps per optimizer step to the nearest measured count. Fitted on the
generator: 0 (0 to 0.09)."""
FAMILY_SD = 0.0
"""The sd of a model family's effect on log step time: what a family no record is of adds. Fitted on the
generator: 0 (0 to 0.16); its four families share one physics, so this says little, and the real CPU grid's
three (in-sample) also give 0."""
METHOD_SD = 0.0
"""The sd of a method's effect (engine, ZeRO stage, FSDP sharding, tp, pp): what a method no record used adds.
Fitted on the generator: 0 (0 to 0.09); the real CPU grid (in-sample, not used) gives 0.04."""

METHOD_KEYS = ("engine", "zero_stage", "fsdp_sharding", "tp", "pp")
"""The method settings whose combination is a method for the random effect."""


@dataclass(frozen=True)
class Positions:
    """Where cells lie for the distances: one entry per cell."""

    gpus: np.ndarray
    nodes: np.ndarray
    params: np.ndarray
    family: np.ndarray
    method: np.ndarray
    micro_steps: np.ndarray
    """Micro-steps per optimizer step (NaN where unknown: no distance is counted)."""

    def take(self, rows: np.ndarray) -> Positions:
        """The cells at ``rows`` (a boolean mask or indexes)."""
        return Positions(
            self.gpus[rows], self.nodes[rows], self.params[rows], self.family[rows], self.method[rows],
            self.micro_steps[rows],
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.gpus)


def positions(x: Inputs, micro_steps: np.ndarray | None = None) -> Positions:
    """The :class:`Positions` of the predictor's inputs, at ``micro_steps`` per optimizer step (unknown if None)."""
    size = len(x.gpu)
    parts = [np.asarray(x.method[k], dtype=object).astype(str) for k in METHOD_KEYS if k in x.method]
    method = np.array(["|".join(p) for p in zip(*parts, strict=True)], dtype=object) if parts else np.full(size, "")
    family = x.family.astype(str) if len(x.family) == size else np.full(size, "", dtype=object)
    return Positions(
        np.asarray(x.num_gpus, dtype=float), np.asarray(x.num_nodes, dtype=float),
        np.asarray(x.params, dtype=float), family.astype(object), method,
        np.full(size, np.nan) if micro_steps is None else np.asarray(micro_steps, dtype=float),
    )  # fmt: skip


@dataclass(frozen=True)
class Neighbourhood:
    """The records a calibration rests on: where they lie and their leave-one-out log residuals
    (log(measured / predicted), each by the fit to the others); residuals None where only where they lie is known
    (the records the uncalibrated coefficients were set on)."""

    records: Positions
    residuals: np.ndarray | None = None


def nearest_log_distance(cells: np.ndarray, records: np.ndarray) -> np.ndarray:
    """Each cell's |log ratio| to the nearest of the records' values (0 where either is unknown)."""
    known = np.unique(records[np.isfinite(records) & (records > 0)])
    out = np.zeros(len(cells))
    ok = np.isfinite(cells) & (cells > 0)
    if known.size and ok.any():
        out[ok] = np.min(np.abs(np.log(cells[ok])[:, None] - np.log(known)[None, :]), axis=1)
    return out


def group_variance(
    cells: np.ndarray, records: np.ndarray, residuals: np.ndarray | None, sd: float, noise: float
) -> np.ndarray:
    """Each cell's share of squared log error from its group's random effect: ``sd²`` for a group no record is
    in; ``b² + v`` for one that some are, ``b`` and ``v`` the posterior of the group's effect given its records'
    residuals (noise ``noise``); 0 for such a group where the residuals are not known."""
    out = np.full(len(cells), sd**2)
    for group in np.unique(records.astype(str)):
        rows = cells.astype(str) == group
        if not rows.any():
            continue
        if residuals is None or sd <= 0:
            out[rows] = 0.0
            continue
        r = residuals[(records.astype(str) == group) & np.isfinite(residuals)]
        precision = len(r) / max(noise, 1e-6) ** 2 + 1.0 / sd**2
        b = float(np.sum(r)) / max(noise, 1e-6) ** 2 / precision
        out[rows] = b**2 + 1.0 / precision
    return out


def rated_dimensions(cells: Positions) -> list[tuple[float, np.ndarray]]:
    """Each distance dimension's growth rate and the cells' values in it, in one order: GPU count, node count,
    parameters, micro-steps."""
    return [(GPU_RATE, cells.gpus), (NODE_RATE, cells.nodes), (SIZE_RATE, cells.params),
            (MICRO_STEP_RATE, cells.micro_steps)]  # fmt: skip


def distance_variance(cells: Positions, near: Neighbourhood | None) -> np.ndarray:
    """The distance terms' variance at each cell (the dimensions' rates times their log distances, squared and
    summed); with no neighbourhood at all, none."""
    out = np.zeros(len(cells))
    if near is None or len(near.records) == 0:
        return out
    for (rate, mine), (_, theirs) in zip(rated_dimensions(cells), rated_dimensions(near.records), strict=True):
        out += (rate * nearest_log_distance(mine, theirs)) ** 2
    return out


def cell_sd(base: float, cells: Positions, near: Neighbourhood | None) -> np.ndarray:
    """The discrepancy (sd of log) at each cell: ``base`` (the neighbourhood's), the distance terms and the family
    and method effects in quadrature. With no neighbourhood (an uncalibrated spread, whose widths are already a
    cell anywhere's), ``base``."""
    if near is None or len(near.records) == 0:
        return np.full(len(cells), float(base))
    variance = (
        base**2
        + distance_variance(cells, near)
        + group_variance(cells.family, near.records.family, near.residuals, FAMILY_SD, base)
        + group_variance(cells.method, near.records.method, near.residuals, METHOD_SD, base)
    )
    out: np.ndarray = np.sqrt(variance)
    return out


__all__ = [
    "FAMILY_SD", "GPU_RATE", "METHOD_SD", "MICRO_STEP_RATE", "NODE_RATE", "SIZE_RATE", "Neighbourhood", "Positions", "cell_sd",
    "distance_variance", "group_variance", "nearest_log_distance", "positions", "rated_dimensions",
]  # fmt: skip
