"""Step-time statistics, the rule that decides when the probe has timed enough, how a step is composed from its
parts, and device-synchronised timers.

Two ways to time an optimizer step of ``grad_accum_steps`` micro-batches:

* ``whole``: run the whole accumulation cycle and time it; each sample costs a full step.
* ``composed``: time a few micro-steps that do not end the cycle (forward and backward; ZeRO-2/3 also reduce or
  partition gradients there) and the micro-step at the boundary (forward, backward, then the gradient reduction,
  clipping and the optimizer step), back to back as a cycle runs them, and compose::

      step_time_s = first_micro_step_s + (grad_accum_steps - 2) * micro_step_s + boundary_micro_step_s
                  = grad_accum_steps * micro_step_s + boundary_s

  where ``micro_step_s`` is the mean of the steady micro-steps (after the first of the cycle) and ``boundary_s``
  what the cycle costs beyond them: the reduction and the optimizer step, and the first micro-step's extra.

  Every micro-step of a cycle does the same work, so this is the whole step's time without running all of it:
  a sample costs a few micro-steps (``composed_micro_steps``) instead of ``grad_accum_steps``. With no accumulation
  (one micro-step a step) both ways time the same thing.

The statistics, the composition, the stopping rule and the record's step-time figures (:func:`step_time_metrics`)
are pure; the timers are the only parts that touch a device.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scipy import special

from orchestrator.store.record import Metrics

COMPOSED_MICRO_STEPS = 4
"""Fewest micro-steps inside the cycle timed per composed sample (fewer only when the cycle is shorter)."""
COMPOSED_SAMPLE_S = 2.0
"""Least work a composed sample holds, in seconds: a GPU timed in short bursts runs a little faster than under the
sustained load of whole cycles (about 2% on an H100 with four micro-steps a sample), so a sample holds as many
micro-steps as last this long, as measured in the warm-up."""


def composed_micro_steps(grad_accum_steps: int, micro_step_s: float | None) -> int:
    """Micro-steps of one composed sample, the boundary included: at least ``COMPOSED_MICRO_STEPS`` inside the
    cycle, more until they last ``COMPOSED_SAMPLE_S`` at ``micro_step_s``, never more than the cycle."""
    inner = COMPOSED_MICRO_STEPS
    if micro_step_s is not None and micro_step_s > 0:
        inner = max(inner, math.ceil(COMPOSED_SAMPLE_S / micro_step_s))
    return min(grad_accum_steps, inner + 1)


STEP_TIMINGS = ("composed", "whole")


def t_critical_95(df: int) -> float:
    """Two-sided 95% quantile of Student's t with ``df`` degrees of freedom (``scipy.special.stdtrit``, what
    ``scipy.stats.t.ppf`` computes, without scipy.stats' two seconds of import in every job)."""
    if df < 1:
        raise ValueError(f"t quantile needs at least one degree of freedom, got {df}")
    return float(special.stdtrit(df, 0.975))


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of already sorted values."""
    pos = q * (len(sorted_values) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


@dataclass(frozen=True)
class StepTimeSummary:
    """Centre and spread of timed optimizer steps, in seconds."""

    steps: int
    median_s: float
    mean_s: float
    std_s: float
    """Sample standard deviation (n - 1); 0 for a single step."""
    iqr_s: float
    ci95_halfwidth_s: float
    """Half-width of the 95% confidence interval of the mean (Student's t); infinite for a single step."""

    @property
    def ci95_pct(self) -> float:
        """The half-width as a percentage of the mean."""
        return 100.0 * self.ci95_halfwidth_s / self.mean_s if self.mean_s > 0 else math.inf

    @property
    def total_s(self) -> float:
        return self.mean_s * self.steps


def summarize(times_s: Sequence[float]) -> StepTimeSummary:
    """Median, mean, spread and 95% confidence half-width of the mean of step times."""
    if not times_s:
        raise ValueError("no step times to summarise")
    ordered = sorted(times_s)
    n = len(ordered)
    mean = statistics.fmean(ordered)
    std = statistics.stdev(ordered) if n > 1 else 0.0
    halfwidth = t_critical_95(n - 1) * std / math.sqrt(n) if n > 1 else math.inf
    return StepTimeSummary(
        steps=n,
        median_s=statistics.median(ordered),
        mean_s=mean,
        std_s=std,
        iqr_s=_quantile(ordered, 0.75) - _quantile(ordered, 0.25),
        ci95_halfwidth_s=halfwidth,
    )


@dataclass(frozen=True)
class StoppingRule:
    """When to stop timing: precise enough, as many steps as allowed, or out of time.

    Consulted after every timed step, on step times that every rank holds identically, so every rank takes the
    same decision without further communication.
    """

    min_steps: int
    """Steps timed before precision may end the timing."""
    max_steps: int
    target_ci_pct: float
    """Stop once the 95% confidence half-width of the mean is under this percentage of the mean."""
    time_budget_s: float
    """Budget for the timed steps; the rule stops before a step that would, at the median, overrun it, even
    before ``min_steps`` (a step slower than the budget is still timed once)."""

    def __post_init__(self) -> None:
        if self.min_steps < 1 or self.max_steps < self.min_steps:
            raise ValueError(
                f"probe.min_steps={self.min_steps}, probe.max_steps={self.max_steps}: need 1 <= min_steps <= max_steps"
            )

    def decide(self, times_s: Sequence[float], costs_s: Sequence[float] | None = None) -> str | None:
        """The reason to stop now (``max_steps``, ``target_ci``, ``time_budget``), or None to time another step.

        ``costs_s`` is what each sample took to measure, when that is not the step time itself (a composed sample
        runs a few micro-steps, not a whole step); the budget is spent by costs.
        """
        costs = times_s if costs_s is None else costs_s
        n = len(times_s)
        if n == 0:
            return None
        if n >= self.max_steps:
            return "max_steps"
        summary = summarize(times_s)
        if n >= self.min_steps and summary.ci95_pct <= self.target_ci_pct:
            return "target_ci"
        if sum(costs) + statistics.median(costs) > self.time_budget_s:
            return "time_budget"
        return None


class StepTimer:
    """Times a region of work on the device, synchronised at both ends.

    On a CUDA device the region is bracketed by CUDA events and the end event is waited for, so the time is the
    device's, including any host gap between kernels; elsewhere (DeepSpeed's CPU accelerator runs every op
    synchronously) a monotonic host clock.
    """

    def __init__(self, use_cuda: bool) -> None:
        self.use_cuda = use_cuda
        self._start_wall = 0.0
        self._events: tuple[Any, Any] | None = None

    def start(self) -> None:
        if self.use_cuda:
            import torch

            # Work queued before the region must not be counted in it.
            torch.cuda.synchronize()
            begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begin.record()
            self._events = (begin, end)
        self._start_wall = time.perf_counter()

    def stop(self) -> float:
        """Seconds since ``start``, after the device finished the region's work."""
        if self.use_cuda and self._events is not None:
            begin, end = self._events
            end.record()
            end.synchronize()
            return float(begin.elapsed_time(end)) / 1000.0
        return time.perf_counter() - self._start_wall


def compose_step_s(grad_accum_steps: int, micro_step_s: float, boundary_micro_step_s: float) -> float:
    """An optimizer step's time from its parts: ``grad_accum_steps`` micro-steps plus the boundary's extra work.

    ``boundary_micro_step_s`` is the whole last micro-step (its forward and backward included), so the step is
    ``(grad_accum_steps - 1) * micro_step_s + boundary_micro_step_s``.
    """
    if grad_accum_steps < 1:
        raise ValueError(f"grad_accum_steps={grad_accum_steps}: need at least one micro-step a step")
    return (grad_accum_steps - 1) * micro_step_s + boundary_micro_step_s


@dataclass(frozen=True)
class ComposedSample:
    """One composed measurement: micro-steps inside the cycle, then the boundary micro-step.

    The first micro-step after a boundary can differ from the rest (gradients were just zeroed, ZeRO-3 starts a
    new prefetch trace); a real cycle has one of it, so it counts once and the others stand for the remaining
    ``grad_accum_steps - 2``. ``micro_step_s`` is the steady micro-step; ``boundary_s`` all a cycle costs beyond
    ``grad_accum_steps`` steady micro-steps, so that ``step_s = grad_accum_steps * micro_step_s + boundary_s``.
    """

    micro_steps_s: tuple[float, ...]
    boundary_micro_step_s: float
    grad_accum_steps: int

    @property
    def micro_step_s(self) -> float:
        steady = self.micro_steps_s[1:] or self.micro_steps_s
        return statistics.fmean(steady) if steady else self.boundary_micro_step_s

    @property
    def step_s(self) -> float:
        if len(self.micro_steps_s) < 2:
            return compose_step_s(self.grad_accum_steps, self.micro_step_s, self.boundary_micro_step_s)
        first = self.micro_steps_s[0]
        return first + compose_step_s(self.grad_accum_steps - 1, self.micro_step_s, self.boundary_micro_step_s)

    @property
    def boundary_s(self) -> float:
        """Gradient reduction and optimizer step (and the first micro-step's extra): beyond steady micro-steps."""
        return self.step_s - self.grad_accum_steps * self.micro_step_s

    @property
    def cost_s(self) -> float:
        """What measuring this sample took."""
        return sum(self.micro_steps_s) + self.boundary_micro_step_s


class SplitTimer:
    """Times consecutive regions of work with one synchronisation at each end.

    ``start``, then ``split`` after each region: on a CUDA device each split records an event, so the host keeps
    queueing work and the regions are timed as they run back to back in a real step; ``stop`` waits for the last
    event and returns the regions' durations. Elsewhere a monotonic host clock.
    """

    def __init__(self, use_cuda: bool) -> None:
        self.use_cuda = use_cuda
        self._marks: list[Any] = []

    def _mark(self) -> Any:
        if self.use_cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        if self.use_cuda:
            import torch

            torch.cuda.synchronize()
        self._marks = [self._mark()]

    def split(self) -> None:
        self._marks.append(self._mark())

    def stop(self) -> list[float]:
        """Seconds of each region between ``start`` and the last ``split``."""
        marks = self._marks
        if self.use_cuda:
            marks[-1].synchronize()
            return [a.elapsed_time(b) / 1000.0 for a, b in zip(marks, marks[1:], strict=False)]
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]


@dataclass
class PhaseTimes:
    """Where a probe's time went, in seconds (the record's metrics of the same names)."""

    startup_s: float = 0.0
    search_s: float = 0.0
    warmup_s: float = 0.0
    timed_s: float = 0.0


def step_time_metrics(
    samples: Sequence[ComposedSample], cpu_times_s: Sequence[float], stop_reason: str, grad_accum_steps: int
) -> Metrics:
    """The record's step-time figures of timed samples (whole cycles, or composed: ``micro_steps_s`` not empty)
    and the host CPU time of each; an undefined spread (one step) is None, not infinity, so JSON stays valid."""
    times = [s.step_s for s in samples]
    summary = summarize(times)
    composed = bool(samples[0].micro_steps_s)
    ci_pct = summary.ci95_pct
    return Metrics(
        step_time_s=summary.median_s,
        step_time_mean_s=summary.mean_s,
        step_time_std_s=summary.std_s,
        step_time_iqr_s=summary.iqr_s,
        step_time_ci95_pct=ci_pct if math.isfinite(ci_pct) else None,
        steps_timed=summary.steps,
        step_time_method="composed" if composed else "whole",
        micro_step_time_s=summarize([s.micro_step_s for s in samples]).median_s if composed else None,
        boundary_time_s=summarize([s.boundary_s for s in samples]).median_s if composed else None,
        micro_steps_timed=(
            sum(len(s.micro_steps_s) + 1 for s in samples) if composed else len(samples) * grad_accum_steps
        ),
        stop_reason=stop_reason,
        step_times_s=times,
        step_cpu_time_s=summarize(cpu_times_s).median_s,
        step_cpu_times_s=list(cpu_times_s),
    )
