"""The discrepancy grows away from what was measured (analysis/predict/discrepancy.py): narrow where records pin a
cell down, wide where nothing like it was measured, by family and method effects the records inform."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.predict import discrepancy
from analysis.predict.discrepancy import Neighbourhood, Positions, cell_sd, nearest_log_distance
from analysis.predict.step_time import DEFAULT_COEFFICIENTS
from analysis.predict.uncertainty import LINK_PRIOR_SD, fit_posterior, prior_spread

BASE = 0.05


@pytest.fixture(autouse=True)
def rates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rates of a known size, so that each test says what it checks whatever the fitted defaults are."""
    for name, value in (("GPU_RATE", 0.05), ("NODE_RATE", 0.2), ("SIZE_RATE", 0.05), ("MICRO_STEP_RATE", 0.1),
                        ("FAMILY_SD", 0.15), ("METHOD_SD", 0.1)):  # fmt: skip
        monkeypatch.setattr(discrepancy, name, value)


def at(
    gpus: float, nodes: float, params: float, family: str = "gpt_neox", method: str = "ds|0", micro_steps: float = 1.0
) -> Positions:
    return Positions(
        np.array([gpus]), np.array([nodes]), np.array([params]), np.array([family], dtype=object),
        np.array([method], dtype=object), np.array([micro_steps]),
    )  # fmt: skip


def records(residuals: list[float], family: str = "gpt_neox", method: str = "ds|0") -> Neighbourhood:
    """Records on one GPU of one node, 160M to 1B parameters."""
    n = len(residuals)
    where = Positions(
        np.ones(n), np.ones(n), np.geomspace(1.6e8, 1e9, n), np.full(n, family, dtype=object),
        np.full(n, method, dtype=object), np.ones(n),
    )  # fmt: skip
    return Neighbourhood(where, np.array(residuals))


def sd(cell: Positions, near: Neighbourhood | None) -> float:
    return float(cell_sd(BASE, cell, near)[0])


def test_a_cell_among_well_predicted_records_is_about_as_narrow_as_the_records() -> None:
    near = records([0.01, -0.02, 0.0, 0.015, -0.01, 0.005])
    inside = sd(at(1, 1, 4e8), near)
    assert BASE <= inside < 1.2 * BASE


def test_the_interval_grows_with_every_distance_to_the_records() -> None:
    near = records([0.01, -0.02, 0.0, 0.015])
    home = sd(at(1, 1, 4e8), near)
    for far in (at(64, 1, 4e8), at(16, 4, 4e8), at(1, 1, 7e10), at(1, 1, 4e8, family="llama"), at(1, 1, 4e8, micro_steps=32),
                at(1, 1, 4e8, method="fsdp|full")):  # fmt: skip
        assert sd(far, near) > home
    nodes = [sd(at(8 * n, n, 4e8), near) for n in (1, 2, 4, 16, 128)]
    assert np.all(np.diff(nodes) > 0), nodes
    unknown = sd(at(4096, 512, 1.75e11, family="llama", method="mesh3d|tp8|pp16"), near)
    assert unknown > 4 * home


def test_a_family_whose_records_missed_keeps_its_cells_wide() -> None:
    # Both families measured as often; one was 25% slower than predicted every time, the other on the mark.
    missed = records([0.25, 0.22, 0.27], family="llama")
    hit = records([0.0, 0.01, -0.01], family="llama")
    cell = at(1, 1, 4e8, family="llama")
    assert sd(cell, missed) > 2 * sd(cell, hit)
    # A family no record is of is wider still than one measured on the mark, by the family's whole sd.
    unmeasured = sd(at(1, 1, 4e8, family="qwen3"), hit)
    assert unmeasured == pytest.approx(np.sqrt(BASE**2 + 0.15**2 + _method_part(hit)))


def _method_part(near: Neighbourhood) -> float:
    return float(discrepancy.group_variance(np.array(["ds|0"], dtype=object), near.records.method, near.residuals,
                                            discrepancy.METHOD_SD, BASE)[0])  # fmt: skip


def test_nearest_distance_is_the_log_ratio_to_the_closest_record() -> None:
    got = nearest_log_distance(np.array([1.0, 3.0, 8.0, np.nan]), np.array([1.0, 2.0, 2.0, 16.0]))
    assert got == pytest.approx([0.0, np.log(1.5), np.log(2.0), 0.0])


def test_time_in_a_term_no_record_had_widens_the_interval_with_its_share() -> None:
    # Six one-GPU records, no communication: the communication coefficient keeps its prior width.
    terms = np.column_stack([np.geomspace(1.0, 8.0, 6), np.zeros(6), np.zeros(6), np.full(6, 0.01)])
    times = terms @ DEFAULT_COEFFICIENTS * np.exp(np.array([0.02, -0.01, 0.0, 0.01, -0.02, 0.01]))
    _, spread = fit_posterior("h100-80gb", terms, times, DEFAULT_COEFFICIENTS.copy(), np.full(6, np.nan))
    sds, shares = [], []
    for amount in (0.0, 1.0, 4.0):
        cell = np.array([4.0, amount, 0.0, 0.01])
        w = cell / float(cell @ DEFAULT_COEFFICIENTS)
        sds.append(float(np.sqrt(w @ spread.covariance @ w)))
        shares.append(float(w[1] * DEFAULT_COEFFICIENTS[1]))
    # The communication coefficient keeps its prior sd (LINK_PRIOR_SD, 100%): its share of the time, as an sd.
    assert sds[0] < 0.02
    assert sds[1:] == pytest.approx([LINK_PRIOR_SD * s for s in shares[1:]], rel=0.1)
    assert sds[1] < sds[2]


def test_the_posterior_keeps_its_records_and_their_residuals() -> None:
    terms = np.column_stack([np.geomspace(1.0, 8.0, 4), np.zeros(4), np.zeros(4), np.full(4, 0.01)])
    times = terms @ DEFAULT_COEFFICIENTS
    where = Positions(np.ones(4), np.ones(4), np.geomspace(1e8, 1e9, 4), np.full(4, "gpt_neox", dtype=object),
                      np.full(4, "ds|0", dtype=object), np.ones(4))  # fmt: skip
    _, spread = fit_posterior("h100-80gb", terms, times, DEFAULT_COEFFICIENTS.copy(), np.full(4, np.nan), where)
    assert spread.neighbourhood is not None and spread.neighbourhood.residuals is not None
    assert np.all(np.abs(spread.neighbourhood.residuals) < 0.05)
    assert (
        spread.step_sd_at(at(1, 1, 3e8, "gpt_neox", "ds|0"))[0] < spread.step_sd_at(at(16, 2, 3e8, "llama", "ds|0"))[0]
    )


def test_an_uncalibrated_spread_is_the_same_for_every_cell() -> None:
    # Its widths are a cell anywhere's; the rates were fitted on calibrated predictions only.
    prior = prior_spread("h100-80gb")
    assert prior.step_sd_at(at(1, 1, 4e8))[0] == prior.step_sd_at(at(64, 8, 7e9, "llama", "fsdp|full"))[0]
    assert prior.step_sd_at(at(1, 1, 4e8))[0] == pytest.approx(prior.step_time_sd)
