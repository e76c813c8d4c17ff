"""Step-time statistics, the stopping rule, and a step composed from micro-steps and the boundary step."""

from __future__ import annotations

import math

import pytest

from orchestrator.job.timing import (
    ComposedSample,
    SplitTimer,
    StoppingRule,
    compose_step_s,
    step_time_metrics,
    summarize,
    t_critical_95,
)


def test_t_quantiles() -> None:
    assert t_critical_95(1) == pytest.approx(12.706, abs=1e-3) and t_critical_95(30) == pytest.approx(2.042, abs=1e-3)
    assert t_critical_95(31) == pytest.approx(2.0395, abs=2e-4)
    assert t_critical_95(100) == pytest.approx(1.9840, abs=2e-4)
    assert t_critical_95(10_000) == pytest.approx(1.9602, abs=2e-4)
    with pytest.raises(ValueError):
        t_critical_95(0)


def test_summary_of_known_values() -> None:
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert (s.steps, s.median_s, s.mean_s) == (4, 2.5, 2.5)
    assert s.std_s == pytest.approx(math.sqrt(5 / 3))
    assert s.iqr_s == pytest.approx(1.5)
    assert s.ci95_halfwidth_s == pytest.approx(3.182 * math.sqrt(5 / 3) / 2, rel=1e-3)
    assert s.ci95_pct == pytest.approx(100 * s.ci95_halfwidth_s / 2.5)


def whole(*steps_s: float) -> list[ComposedSample]:
    return [ComposedSample((), step_s, 1) for step_s in steps_s]


def test_the_record_s_figures_of_whole_cycles() -> None:
    m = step_time_metrics(whole(4.0, 1.0, 3.0, 2.0), [0.5, 0.1, 0.3, 0.2], "target_ci", grad_accum_steps=4)
    assert (m.step_time_s, m.step_time_mean_s, m.steps_timed, m.stop_reason) == (2.5, 2.5, 4, "target_ci")
    assert m.step_time_ci95_pct == pytest.approx(summarize([4.0, 1.0, 3.0, 2.0]).ci95_pct)
    assert m.step_times_s == [4.0, 1.0, 3.0, 2.0] and m.step_cpu_time_s == pytest.approx(0.25)
    assert (m.step_time_method, m.micro_step_time_s, m.boundary_time_s) == ("whole", None, None)
    assert m.micro_steps_timed == 16, "four whole cycles of four micro-steps"
    assert m.tokens_per_s is None, "the throughput is the model's arithmetic, not the timer's"


def test_the_record_s_figures_of_composed_samples() -> None:
    samples = [ComposedSample((1.2, 1.0, 1.0), 3.0, 8), ComposedSample((1.2, 1.0, 1.0), 3.0, 8)]
    m = step_time_metrics(samples, [1.0, 1.0], "max_steps", grad_accum_steps=8)
    assert m.step_time_method == "composed" and m.micro_steps_timed == 8
    assert m.micro_step_time_s == pytest.approx(1.0) and m.step_time_s == pytest.approx(samples[0].step_s)
    assert m.boundary_time_s == pytest.approx(samples[0].step_s - 8 * 1.0)


def test_a_single_step_has_no_confidence_interval() -> None:
    s = summarize([1.0])
    assert math.isinf(s.ci95_pct) and step_time_metrics(whole(1.0), [0.1], "max_steps", 1).step_time_ci95_pct is None


def test_stopping_rule() -> None:
    rule = StoppingRule(min_steps=5, max_steps=8, target_ci_pct=2.0, time_budget_s=100.0)
    steady = [1.0] * 4
    assert rule.decide(steady) is None, "precise, but fewer than min_steps"
    assert rule.decide([1.0] * 5) == "target_ci"
    noisy = [1.0, 1.5] * 4
    assert rule.decide(noisy[:7]) is None
    assert rule.decide(noisy) == "max_steps"
    assert rule.decide([]) is None
    tight = StoppingRule(min_steps=5, max_steps=50, target_ci_pct=0.1, time_budget_s=10.0)
    assert tight.decide([3.0, 3.0]) is None
    assert tight.decide([3.0, 3.0, 3.0]) == "time_budget", "a fourth step would overrun 10 s at the median"
    with pytest.raises(ValueError, match="min_steps"):
        StoppingRule(min_steps=5, max_steps=3, target_ci_pct=2.0, time_budget_s=1.0)


def test_budget_is_spent_by_what_samples_cost_not_by_the_steps_they_stand_for() -> None:
    rule = StoppingRule(min_steps=5, max_steps=50, target_ci_pct=0.1, time_budget_s=10.0)
    composed = [30.0, 31.0, 29.0]  # a composed step of 30 s measured in 1 s
    assert rule.decide(composed) == "time_budget", "whole steps this long would overrun the budget"
    assert rule.decide(composed, [1.0, 1.0, 1.0]) is None
    noisy = [30.0, 33.0, 27.0] * 3
    assert rule.decide(noisy, [1.0] * 9) is None, "9 s spent, a tenth second just fits"
    assert rule.decide([*noisy, 30.0], [1.0] * 10) == "time_budget", "an eleventh second would overrun 10 s"


def test_a_step_is_its_micro_steps_and_the_boundary() -> None:
    assert compose_step_s(64, 0.45, 0.75) == pytest.approx(63 * 0.45 + 0.75)
    assert compose_step_s(1, 0.45, 0.75) == 0.75, "no accumulation: the boundary micro-step is the step"
    with pytest.raises(ValueError, match="grad_accum_steps=0"):
        compose_step_s(0, 1.0, 1.0)
    # The first micro-step after a boundary (0.6 s) counts once; the steady ones (0.45 s) stand for the other 62.
    sample = ComposedSample((0.6, 0.44, 0.46, 0.45), 0.75, grad_accum_steps=64)
    assert sample.micro_step_s == pytest.approx(0.45)
    assert sample.step_s == pytest.approx(0.6 + 62 * 0.45 + 0.75)
    assert sample.boundary_s == pytest.approx(0.15 + 0.30), "the boundary's extra and the first micro-step's"
    assert sample.step_s == pytest.approx(64 * sample.micro_step_s + sample.boundary_s)
    assert sample.cost_s == pytest.approx(2.7)
    three = ComposedSample((0.6, 0.45), 0.75, grad_accum_steps=3)
    assert three.step_s == pytest.approx(0.6 + 0.45 + 0.75), "every micro-step of a short cycle is measured"
    two = ComposedSample((0.5,), 0.75, grad_accum_steps=2)
    assert two.step_s == pytest.approx(1.25)
    whole = ComposedSample((), 2.0, 1)
    assert (whole.step_s, whole.boundary_s, whole.cost_s) == (2.0, 0.0, 2.0)


def test_split_timer_times_consecutive_regions() -> None:
    import time

    timer = SplitTimer(use_cuda=False)
    timer.start()
    time.sleep(0.01)
    timer.split()
    time.sleep(0.05)
    timer.split()
    first, second = timer.stop()  # lower bounds only: a busy machine may oversleep either region
    assert first >= 0.01 and second >= 0.05


def test_a_composed_sample_lasts_long_enough_and_never_longer_than_the_cycle() -> None:
    from orchestrator.job.timing import COMPOSED_MICRO_STEPS, COMPOSED_SAMPLE_S, composed_micro_steps

    assert composed_micro_steps(64, None) == COMPOSED_MICRO_STEPS + 1, "unmeasured: the fewest"
    assert composed_micro_steps(64, 10.0) == COMPOSED_MICRO_STEPS + 1, "slow micro-steps: still the fewest"
    # pythia-160m on an H100: 0.184 s a micro-step, so 11 inside the cycle last 2 s, and the boundary.
    assert composed_micro_steps(32, 0.184) == 12
    assert 11 * 0.184 >= COMPOSED_SAMPLE_S > 10 * 0.184
    assert composed_micro_steps(8, 0.001) == 8, "a short cycle: never more than the cycle"
