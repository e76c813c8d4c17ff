"""The micro-batch search's next size: up while trials fit, a jump on the affine memory line, down after an OOM."""

from __future__ import annotations

import pytest

from orchestrator.job.search import next_size, predicted_peak_bytes
from orchestrator.store.record import Trial

GIB = 2**30
SIZES = [1, 2, 4, 8, 16, 32, 64]


def trial(size: int, peak_gib: float | None, ok: bool = True, rest_gib: float | None = None) -> Trial:
    return Trial(size, "ok" if ok else "oom", peak_gib, None, rest_gib)


def line(size: int) -> float:
    """A step of 10 GiB of model states plus 1 GiB per sequence, in GiB."""
    return 10.0 + size


def test_affine_prediction_through_the_two_largest_points() -> None:
    points = [(1, 11 * GIB), (2, 12 * GIB), (4, 14 * GIB)]
    assert predicted_peak_bytes(points, 16) == pytest.approx(26 * GIB)


def test_up_one_size_until_two_fit_then_a_jump_to_the_largest_predicted() -> None:
    capacity = (40.0 * GIB, False)  # a real device: 0.95 * 40 = 38 GiB usable
    assert next_size(SIZES, [trial(4, line(4))], capacity) == 8
    assert next_size(SIZES, [trial(4, line(4)), trial(8, line(8))], capacity) == 16, "26 GiB fits, 42 does not"


def test_a_real_device_trusts_the_prediction_and_an_imposed_limit_checks_one_size_up() -> None:
    tried = [trial(8, line(8)), trial(16, line(16))]
    assert next_size(SIZES, tried, (30.0 * GIB, False)) is None, "32 would need 42 GiB: not risked"
    assert next_size(SIZES, tried, (30.0 * GIB, True)) == 32, "over an imposed limit costs only the trial"
    assert next_size(SIZES, [*tried, trial(32, 42.0, ok=False)], (30.0 * GIB, True)) is None


def test_down_after_a_refused_jump_to_just_above_the_largest_fit() -> None:
    tried = [trial(1, 11.0), trial(2, 12.0), trial(64, None, ok=False)]
    assert next_size(SIZES, tried, (80.0 * GIB, False)) == 32
    tried += [trial(32, None, ok=False)]
    assert next_size(SIZES, tried, (80.0 * GIB, False)) == 16
    tried += [trial(16, 26.0)]
    assert next_size(SIZES, tried, (80.0 * GIB, False)) is None, "16 fits, 32 was refused: the answer is known"


def test_down_from_the_start_when_nothing_fits_yet() -> None:
    assert next_size(SIZES, [trial(16, None, ok=False)], (8.0 * GIB, True)) == 8
    tried = [trial(s, None, ok=False) for s in (16, 8, 4, 2, 1)]
    assert next_size(SIZES, tried, (8.0 * GIB, True)) is None


def test_trials_outside_the_candidates_are_ignored() -> None:
    # After a warm-up refused 8, the search goes on below it with what it knows of 1..4.
    tried = [trial(4, 14.0), trial(8, 18.0), trial(8, None, ok=False)]
    assert next_size([1, 2, 4], tried, (80.0 * GIB, False)) is None
    assert next_size([1, 2], tried, (80.0 * GIB, False)) is None


def rested(size: int, peak_gib: float, rest_gib: float) -> Trial:
    return trial(size, peak_gib, rest_gib=rest_gib)


def test_one_size_on_a_real_device_steps_up_only_where_the_line_from_rest_says_it_fits() -> None:
    # pythia-1b on an H100 (79.2 GiB): 8 sequences peaked at 45.4 GiB with 13.3 GiB left at rest; 16 then peaked
    # at 77.6 GiB, 0.1 GiB over the line through (0, 13.3) and (8, 45.4).
    h100 = (79.18 * GIB, False)
    assert next_size(SIZES, [rested(8, 45.4, 13.3)], h100) == 16
    # pythia-1.4b: 8 peaked at 59.7 GiB, 18.5 at rest; 16 would need about 101 GiB: no OOM risked, 8 is the answer.
    assert next_size(SIZES, [rested(8, 59.7, 18.5)], h100) is None
    # Without a rest figure, or under an imposed limit where a trial over it costs nothing, one size up is tried.
    assert next_size(SIZES, [trial(8, 59.7)], h100) == 16
    assert next_size(SIZES, [rested(8, 59.7, 18.5)], (79.18 * GIB, True)) == 16


def test_the_line_from_rest_is_used_only_until_two_sizes_fit() -> None:
    h100 = (79.18 * GIB, False)
    tried = [rested(4, 14.0, 10.5), rested(8, 18.0, 10.5)]  # two points: 1 GiB a sequence, 10 of model states
    assert next_size(SIZES, tried, h100) == 64, "64 needs 74 GiB on the two-point line, under 0.95 * 79.18"
