"""Which cells an adaptive sweep measures (analysis/planners/selection.py): the expected reduction of the grid's uncertainty
is the exact posterior arithmetic, and the choice weighs it against each cell's cost in GPU-seconds."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.planners.selection import (
    Candidates,
    ProbeSteps,
    choose_round,
    distance_terms,
    expected_reduction,
    grid_uncertainty,
    measurement_cost_gpu_s,
    unchecked,
    updated_covariance,
)
from analysis.predict.discrepancy import Neighbourhood, Positions, distance_variance


def candidates(weighted: np.ndarray, cost: np.ndarray | None = None, measured: np.ndarray | None = None) -> Candidates:
    n = len(weighted)
    return Candidates(
        group=np.array(["a100-80gb"] * n),
        weighted=weighted,
        discrepancy_var=np.full(n, 0.05**2),
        cost_gpu_s=np.ones(n) if cost is None else cost,
        measured=np.zeros(n, dtype=bool) if measured is None else measured,
    )


def random_grid(n: int = 30, seed: int = 0) -> tuple[Candidates, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    weighted = np.abs(rng.normal(size=(n, 4))) * np.array([0.6, 0.3, 0.1, 0.01])
    cov = np.diag([0.1, 0.5, 0.5, 2.0]) ** 2
    return candidates(weighted), {"a100-80gb": cov}


def test_the_expected_reduction_is_what_measuring_the_cell_takes_off_the_grid() -> None:
    c, covs = random_grid()
    reduction = expected_reduction(c, covs)
    before = grid_uncertainty(c, covs)
    for j in (0, 7, 19):
        measured = c.measured.copy()
        measured[j] = True
        after_cov = {"a100-80gb": updated_covariance(covs["a100-80gb"], c.weighted[j], float(c.discrepancy_var[j]))}
        after = grid_uncertainty(candidates(c.weighted, measured=measured), after_cov)
        assert reduction[j] == pytest.approx(before - after, rel=1e-9)


def test_the_rank_one_update_is_the_posterior_with_one_more_record() -> None:
    cov = np.diag([0.2, 0.4, 0.1, 1.0]) ** 2
    v = np.array([0.5, 0.2, 0.0, 0.03])
    noise = 0.04**2
    direct = np.linalg.inv(np.linalg.inv(cov) + np.outer(v, v) / noise)
    assert np.allclose(updated_covariance(cov, v, noise), direct)


def test_a_measured_cell_teaches_nothing_more() -> None:
    c, covs = random_grid()
    c.measured[[3, 4]] = True
    reduction = expected_reduction(c, covs)
    assert reduction[3] == 0 and reduction[4] == 0 and (reduction[~c.measured] > 0).all()


def test_of_two_cells_that_teach_the_same_the_cheaper_is_chosen() -> None:
    # The last cell, measured, has checked the communication term (see the unchecked terms' test below).
    weighted = np.array([[0.9, 0.1, 0.0, 0.01], [0.9, 0.1, 0.0, 0.01], [0.5, 0.5, 0.0, 0.01], [0.5, 0.5, 0.0, 0.0]])
    c = candidates(weighted, cost=np.array([8 * 60.0, 60.0, 400.0, 400.0]), measured=np.array([0, 0, 0, 1], bool))
    covs = {"a100-80gb": np.diag([0.1, 0.5, 0.5, 1.0]) ** 2}
    assert choose_round(c, covs, 1) == [1]


def test_a_round_does_not_ask_twice_the_same_question() -> None:
    # Two identical cheap cells that pin compute, and one that alone pins communication: after the first of the
    # twins the communication cell teaches more than the second twin.
    # (The last cell, measured, has checked the communication term: the greedy design alone chooses.)
    weighted = np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.2, 0.8, 0.0, 0.0], [0.1, 0.9, 0.0, 0.0]])
    c = candidates(weighted, cost=np.array([1.0, 1.0, 1.5, 1.5]), measured=np.array([0, 0, 0, 1], bool))
    c.discrepancy_var[:] = 0.01**2
    covs = {"a100-80gb": np.diag([0.3, 0.6, 0.01, 0.01]) ** 2}
    first, second = choose_round(c, covs, 2)
    assert first in (0, 1) and second == 2


def test_a_term_no_record_has_is_checked_first_where_it_shows_most() -> None:
    # Three one-GPU cells pin compute and the fixed cost cheaply; the greedy design alone would take them, since the
    # nominal communication is a small share of every step. But no record has checked that share: the cell that
    # shows it most per GPU-second goes first (cell 3: 0.05² / 2 over cell 4's 0.06² / 4), then the offload's
    # (cell 5), then the design's own choice.
    weighted = np.array([[1.0, 0.0, 0.0, 0.1], [0.8, 0.0, 0.0, 0.3], [0.9, 0.0, 0.0, 0.2],
                         [0.9, 0.05, 0.0, 0.1], [0.9, 0.06, 0.0, 0.1], [0.7, 0.0, 0.2, 0.1]])  # fmt: skip
    c = candidates(weighted, cost=np.array([1.0, 1.0, 1.0, 2.0, 4.0, 1.0]))
    covs = {"a100-80gb": np.diag([10.0, 2.0, 2.0, 10.0]) ** 2}
    greedy = choose_round(candidates(weighted[[0, 1, 2, 4]], cost=np.array([1.0, 1.0, 1.0, 4.0]),
                                     measured=np.array([0, 0, 0, 1], bool)), covs, 2)  # fmt: skip
    assert set(greedy) <= {0, 1, 2}
    first, second, third = choose_round(c, covs, 3)
    assert (first, second) == (3, 5) and third in (0, 1, 2)
    assert unchecked(c, np.array([0, 0, 0, 0, 1, 0], bool), np.ones(6, bool)) == 5  # cell 4 checked communication
    # A blocked cell is never forced; nor is one of another GPU type (each type checks its own terms).
    c.blocked = np.array([0, 0, 0, 1, 0, 0], bool)
    assert choose_round(c, covs, 1) == [4]
    c.group = np.array(["a100-80gb"] * 3 + ["l40s"] * 3)
    assert unchecked(c, np.array([0, 0, 0, 1, 0, 0], bool), ~c.blocked) == 5


def test_a_round_stays_within_the_budget_and_skips_blocked_cells() -> None:
    c, covs = random_grid()
    c.cost_gpu_s = np.linspace(10, 300, len(c.group))
    c.blocked = np.zeros(len(c.group), dtype=bool)
    c.blocked[:5] = True
    chosen = choose_round(c, covs, 10, budget_gpu_s=200.0)
    assert chosen and float(c.cost_gpu_s[chosen].sum()) <= 200.0
    assert not set(chosen) & set(range(5))
    assert choose_round(c, covs, 10, budget_gpu_s=5.0) == []


def test_groups_share_nothing() -> None:
    c, covs = random_grid(20)
    c.group = np.array(["a100-80gb"] * 10 + ["l40s"] * 10)
    covs["l40s"] = covs["a100-80gb"].copy()
    base = expected_reduction(c, covs)
    c.measured[10:] = True  # the whole other GPU type measured: a100 cells' reductions are as before
    assert np.allclose(expected_reduction(c, covs)[:10], base[:10])


def test_a_measurement_costs_its_gpus_times_start_up_and_timed_steps() -> None:
    probe = ProbeSteps(warmup_steps=2, max_steps=8, time_budget_s=20.0)
    cost = measurement_cost_gpu_s(np.array([1, 8, 2]), np.array([0.5, 0.5, np.nan]), probe, startup_s=30.0)
    # 10 steps of 0.5 s; 8 GPUs cost 8 times as much; no step time: the whole budget.
    assert cost.tolist() == [35.0, 280.0, 100.0]


def sized(params: np.ndarray, cost: np.ndarray, measured: np.ndarray) -> Candidates:
    """Cells alike in every term, of the model sizes ``params``, on one GPU type."""
    n = len(params)
    return Candidates(
        group=np.array(["a100-80gb"] * n),
        weighted=np.tile([0.9, 0.1, 0.0, 0.0], (n, 1)),
        discrepancy_var=np.full(n, 0.05**2),
        cost_gpu_s=cost,
        measured=measured,
        positions=Positions(
            np.ones(n),
            np.ones(n),
            params,
            np.full(n, "gpt_neox", dtype=object),
            np.full(n, "deepspeed", dtype=object),
            np.full(n, np.nan),
        ),
    )


def test_the_distance_a_measurement_takes_off_is_the_discrepancys_own() -> None:
    rng = np.random.default_rng(3)
    params = rng.choice([7e7, 1.6e8, 4.1e8, 1e9, 2.8e9], size=25)
    measured = np.zeros(25, dtype=bool)
    measured[[0, 1]] = True
    c = sized(params, np.ones(25), measured)
    own, gain = distance_terms(c, measured)

    def total(done: np.ndarray, skip: int | None = None) -> float:
        open_ = ~done
        if skip is not None:
            open_[skip] = False
        near = Neighbourhood(c.positions.take(done))  # type: ignore[union-attr]
        return float(distance_variance(c.positions.take(open_), near).sum())  # type: ignore[union-attr]

    near = Neighbourhood(c.positions.take(measured))  # type: ignore[union-attr]
    assert np.allclose(own[~measured], distance_variance(c.positions.take(~measured), near))  # type: ignore[union-attr]
    for j in np.flatnonzero(~measured)[:6]:
        after = measured.copy()
        after[j] = True
        assert gain[j] == pytest.approx(total(measured, skip=j) - total(after), abs=1e-12)


def test_past_the_first_cell_a_far_model_is_worth_its_price() -> None:
    params = np.array([1e8] * 10 + [1e9] * 10)
    cost = np.array([1.0] * 10 + [4.0] * 10)
    measured = np.zeros(20, dtype=bool)
    measured[0] = True
    covs = {"a100-80gb": np.diag([0.1, 0.5, 0.5, 2.0]) ** 2}
    chosen = choose_round(sized(params, cost, measured), covs, 1)
    assert params[chosen[0]] == 1e9
    # Without the distances, the cheaper small model teaches as much per GPU-second.
    plain = sized(params, cost, measured)
    plain.positions = None
    assert params[choose_round(plain, covs, 1)[0]] == 1e8
    # A GPU type with no record has no distance terms yet: its first cell is the cheap one.
    first = choose_round(sized(params, cost, np.zeros(20, dtype=bool)), covs, 1)
    assert params[first[0]] == 1e8
