"""The profile's timer (orchestrator/profile/timing.py): one-off costs of the first calls stay out of a figure."""

from __future__ import annotations

import time

from orchestrator.profile.timing import SLOW, median_seconds


def calls_taking(*slow_s: float, then_s: float = 0.001) -> tuple[list[float], object]:
    """A callable whose first calls sleep ``slow_s`` each, and every later one ``then_s``; and its call log."""
    made: list[float] = []

    def run() -> None:
        made.append(slow_s[len(made)] if len(made) < len(slow_s) else then_s)
        time.sleep(made[-1])

    return made, run


def test_a_first_call_slower_than_the_budget_does_not_become_the_figure() -> None:
    made, run = calls_taking(0.12)  # a GPU's lazily loaded kernels, cuBLAS's handle
    figure = median_seconds(run, min_run_s=0.05, threads=1)  # type: ignore[arg-type]
    assert figure < 0.01 and len(made) > 3


def test_a_second_slow_call_is_timed_again_and_the_faster_kept() -> None:
    made, run = calls_taking(0.12, 0.12)  # the first backward creates its gradients, the second adds into them
    figure = median_seconds(run, min_run_s=0.05, threads=1)  # type: ignore[arg-type]
    assert figure < 0.01 and len(made) == 3


def test_an_operation_that_stays_slow_is_timed_a_few_times_only() -> None:
    made, run = calls_taking(then_s=0.06)
    figure = median_seconds(run, min_run_s=0.05, threads=1)  # type: ignore[arg-type]
    assert 0.06 <= figure < 0.1 and len(made) == 3


def test_a_first_call_of_many_budgets_is_its_own_figure() -> None:
    made, run = calls_taking(SLOW * 0.01 + 0.01)
    assert median_seconds(run, min_run_s=0.01, threads=1) >= SLOW * 0.01  # type: ignore[arg-type]
    assert len(made) == 1


def test_on_an_accelerator_a_slow_first_call_is_a_one_off_cost_and_never_the_figure() -> None:
    # An H200's first attention backward took over 2 s (its kernel loaded lazily) and read 3.6 GFLOP/s.
    made, run = calls_taking(SLOW * 0.01 + 0.01)
    figure = median_seconds(run, min_run_s=0.01, threads=1, accelerator=True)  # type: ignore[arg-type]
    assert figure < 0.01 and len(made) > 2
