"""``probe.memory_limit_gib`` judged on the timed steps' peak too: the probe's decisions, with its work stubbed.

The trial, warm-up and timed steps of each micro-batch are replaced by the peaks given here, so that what the
probe decides (the status, the reason, the size the search keeps) is checked without building an engine. A timed
run peaks higher than the few steps before it (the allocator's cache fragments: orchestrator/job/metering.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import synthetic

from orchestrator.config.batch import BatchPlan
from orchestrator.config.schema import to_config
from orchestrator.job.failures import Ending, outcome_of
from orchestrator.job.metering import GIB, over_limit
from orchestrator.job.probe import _Probe
from orchestrator.job.ranks import Outcome
from orchestrator.store.record import Metrics, Trial
from orchestrator.store.states import RecordStatus

LIMIT_GIB = 0.055


def trial_peak_gib(micro: int) -> float:
    return 0.003 * micro  # 16 fits a trial step and the warm-up under the limit: 0.048 GiB


def timed_peak_gib(micro: int) -> float:
    return 0.0045 * micro  # ... but its timed steps peak at 0.072 GiB


class StubProbe(_Probe):
    """The probe's loop over pythia-tiny (16 sequences a step, one rank), its work replaced by the peaks above."""

    def __init__(self, micro_batch_size: int | str, limit_gib: float | None = LIMIT_GIB) -> None:
        config = synthetic.cell_config("pythia-tiny", "cpu", 1, micro_batch_size=micro_batch_size)
        config["probe"] = {**config["probe"], "memory_limit_gib": limit_gib}
        super().__init__(to_config(config), 0, 1, 0)
        self.timed_sizes: list[int] = []

    def setup(self) -> None:
        engine = SimpleNamespace(estimate_micro_batch_size=lambda memory_gib: 16, describe=dict, skipped_steps=0)
        self.engine: Any = engine
        self.memory: Any = object()

    def build(self, plan: BatchPlan) -> None:
        self.built = True

    def build_judged(self, plan: BatchPlan) -> Outcome:
        self.build(plan)  # the build fits: these tests judge the steps
        return Outcome(None, None, 0.0)

    def use(self, plan: BatchPlan) -> None:
        self.built = True

    def trial(self, plan: BatchPlan) -> Trial:
        peak = trial_peak_gib(plan.micro_batch_size)
        reason = over_limit(peak * GIB, self.memory_limit_bytes, plan.micro_batch_size, "trial step")
        return Trial(plan.micro_batch_size, "oom" if reason else "ok", peak, reason, 0.001)

    def warm_up(self, plan: BatchPlan) -> Outcome:
        peak = trial_peak_gib(plan.micro_batch_size) * GIB
        return Outcome(over_limit(peak, self.memory_limit_bytes, plan.micro_batch_size, "warm-up"), None, peak)

    def measure(self, plan: BatchPlan) -> Metrics:
        self.timed_sizes.append(plan.micro_batch_size)
        self.phases.timed_s = 1.0
        peak = timed_peak_gib(plan.micro_batch_size)
        return Metrics(step_time_s=0.5, peak_memory_allocated_gib=peak, host_rss_gib=1.0)


def test_a_fixed_micro_batch_whose_timed_steps_peak_over_the_limit_does_not_fit() -> None:
    probe = StubProbe(16)
    result = outcome_of(probe.run(), probe.metrics())
    assert result.status is RecordStatus.OOM
    assert result.reason == "micro-batch 16, timed steps: peak 0.072 GiB over probe.memory_limit_gib=0.055"
    metrics = result.metrics
    assert metrics.micro_batch_size == 16 and metrics.step_time_s is None  # no step time for a size that does not fit
    assert metrics.peak_memory_allocated_gib == pytest.approx(0.072)  # the measured peak is kept


def test_a_fixed_micro_batch_whose_timed_steps_fit_is_measured() -> None:
    probe = StubProbe(8)
    result = outcome_of(probe.run(), probe.metrics())
    assert result.status is RecordStatus.OK and result.reason is None
    assert result.metrics.step_time_s == 0.5 and result.metrics.peak_memory_allocated_gib == pytest.approx(0.036)


def test_without_a_limit_the_timed_peak_is_recorded_not_judged() -> None:
    probe = StubProbe(16, limit_gib=None)
    assert probe.run().ending is Ending.COMPLETED and probe.metrics().step_time_s == 0.5


def test_the_search_refuses_a_size_whose_timed_steps_peak_over_the_limit_and_measures_below_it() -> None:
    probe = StubProbe("auto")
    result = outcome_of(probe.run(), probe.metrics())
    assert result.status is RecordStatus.OK
    metrics = result.metrics
    assert metrics.micro_batch_size == 8 and metrics.step_time_s == 0.5
    assert metrics.peak_memory_allocated_gib == pytest.approx(0.036)
    assert probe.timed_sizes == [16, 8]
    refused = [t for t in metrics.search_tried or [] if t.outcome == "oom"]
    assert [(t.micro_batch_size, t.reason) for t in refused] == [
        (16, "micro-batch 16, timed steps: peak 0.072 GiB over probe.memory_limit_gib=0.055")
    ]
    assert refused[0].peak_memory_gib == pytest.approx(0.072)
    assert metrics.search_s >= 1.0 and metrics.timed_s == 1.0  # the refused size's timing counts as the search's


def test_over_limit_names_the_peak_and_the_limit() -> None:
    assert over_limit(0.0709 * GIB, 0.055 * GIB, 16, "timed steps") == (
        "micro-batch 16, timed steps: peak 0.071 GiB over probe.memory_limit_gib=0.055"
    )
    assert over_limit(0.055 * GIB, 0.055 * GIB, 16, "timed steps") is None  # at the limit: fits
    assert over_limit(9.0 * GIB, None, 16, "timed steps") is None  # no limit
