"""The memory calibration's leave-one-out errors: every record's fit without it, made at once, is the fit
``_fit_memory`` makes on the others, record by record (its cost: ``benchmarks/report_10k.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.predict.calibration import _fit_memory, _memory_loo_errors


def one_by_one(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """The definition: each measured record against the fit to all the others."""
    out = np.full(len(predicted), np.nan)
    for i in range(len(predicted)):
        if not (np.isfinite(measured[i]) and measured[i] > 0 and np.isfinite(predicted[i]) and predicted[i] > 0):
            continue
        keep = np.arange(len(predicted)) != i
        scale, offset = _fit_memory(predicted[keep], measured[keep])
        out[i] = np.log(measured[i] / (scale * predicted[i] + offset))
    return out


MIXED = (np.array([8.1, 6.4, 8.8, 7.6, 6.4]), np.array([7.9, 6.5, 8.3, 8.6, 6.0]))


def cases() -> list[tuple[str, np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    out = []
    for n in (0, 1, 2, 3, 4, 5, 6, 9, 40):
        p = rng.uniform(0.5, 40.0, n)
        out.append((f"scale and offset, {n}", p, 1.1 * p + 0.8 + rng.normal(0, 0.05, n)))
        # The fit wants a negative offset: each falls back to the others' median ratio.
        out.append((f"negative offset, {n}", p, 1.3 * p - 0.4 + rng.normal(0, 0.01, n)))
    p = rng.uniform(1.0, 3.0, 12)
    out.append(("one prediction for all", np.full(12, 2.0), 2.2 + rng.normal(0, 0.1, 12)))
    out.append(("all the same but one", np.r_[np.full(5, 2.0), 3.0], np.r_[np.full(5, 2.3), 3.4]))
    out.append(("ties in the ratios", np.r_[p[:6], p[:6]], np.r_[1.2 * p[:6], 1.2 * p[:6]]))
    unmeasured = 1.05 * p + 0.3
    unmeasured[[1, 4, 7]] = [np.nan, 0.0, -1.0]
    p_gaps = p.copy()
    p_gaps[9] = np.nan
    out.append(("unmeasured and unpredicted records", p_gaps, unmeasured))
    # Which record is left out decides whether the others' fit keeps its offset or falls back to their median.
    out.append(("mixed", *MIXED))
    return out


@pytest.mark.parametrize(("name", "predicted", "measured"), cases(), ids=[c[0] for c in cases()])
def test_each_records_error_is_the_fit_to_the_others(name: str, predicted: np.ndarray, measured: np.ndarray) -> None:
    got = _memory_loo_errors(predicted, measured)
    want = one_by_one(predicted, measured)
    assert np.array_equal(np.isnan(got), np.isnan(want)), name
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-9, atol=1e-12)


def test_the_mixed_case_takes_both_fits() -> None:
    """The case above where some records' fits without them keep their offset and others fall back: both paths
    are checked, not one twice."""
    p, m = MIXED
    offsets = [_fit_memory(p[np.arange(5) != i], m[np.arange(5) != i])[1] for i in range(5)]
    assert any(o > 0 for o in offsets) and any(o == 0 for o in offsets)
