"""The probe: measure one cell (a model, a GPU type and count, a method) with a short real training run.

It runs inside one job, one process per rank, and returns the measured part of the cell's record. Which engine
trains (``method.engine``) is its folder's business (orchestrator/engines/<name>/, found through
orchestrator/engines/registry.py and created by orchestrator/engines/base.py); this loop is the same for all::

    build  the model and the engine for the first micro-batch, once
    search the largest micro-batch that fits (``method.micro_batch_size: auto``) on that one engine: start from a
           memory estimate, one shortened step per size (two micro-steps, the second at the accumulation
           boundary), up while it fits (on a GPU only where the line through the trial's peak and the memory
           it left at rest says the next size fits; jumping ahead where the peaks of two sizes, memory being
           close to affine in the micro-batch, predict a larger one fits), down after an OOM; no rebuild and no
           recompilation per size, and none after the search (only a real OOM, which may leave an engine
           inconsistent, costs a rebuild)
    warm   ``probe.warmup_steps`` steps, not timed (compilation, allocator, optimizer states)
    time   optimizer steps, device-synchronised, until the 95% CI of the mean is under ``probe.target_ci_pct`` %
           or the budget ends: composed from micro-steps and the boundary step (``probe.step_timing: composed``,
           the default; on a GPU each sample holds at least 2 s of micro-steps, as the warm-up measured them) or
           whole accumulation cycles (``whole``); see orchestrator/job/timing.py

Every rank takes the same decisions: step times, trial outcomes and failures are exchanged after each step,
trial and phase (orchestrator/job/ranks.py), so no rank is left waiting in a collective another rank has left.

Memory (orchestrator/job/metering.py): ``probe.memory_limit_gib`` is compared with the peak of the build, of each
trial, of the warm-up and of the timed steps (a size over it at any of them does not fit: ``auto`` searches below
it); a build over it, or out of memory, ends the probe with a reason of its own ("building the model: ..."), before
any micro-batch. Failures (orchestrator/job/failures.py): an OOM that is not a trial of the search, a communication error, a
compile error and any other exception each end the probe with what happened, a one-line reason and the traceback;
nothing is retried or replaced silently. The probe returns one ``ProbeOutcome`` (orchestrator/job/failures.py), whose
status is decided there; its metrics are the record's :class:`orchestrator.store.record.Metrics`, documented there.

Run one rank by hand on a resolved cell config: ``python -m orchestrator.job.by_hand CELL.yaml [--out record.json]``
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment when set, else a world of one).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from orchestrator.config.batch import BatchPlan, divisors, per_gpu_batch_size, plan_batch
from orchestrator.config.schema import Config
from orchestrator.engines.base import batch_split
from orchestrator.job.build_cache import pin_build_environment
from orchestrator.job.env import say
from orchestrator.job.failures import CellFailed, Ending, Happened, ProbeOutcome, TimeSignal, outcome_of
from orchestrator.job.host_load import HostLoadMeter
from orchestrator.job.metering import GIB, gib, over_limit
from orchestrator.job.op_lock import guard_op_builds
from orchestrator.job.ranks import Outcome, RankGroup
from orchestrator.job.search import next_size
from orchestrator.job.throughput import throughput_metrics
from orchestrator.job.timing import (
    STEP_TIMINGS,
    ComposedSample,
    SplitTimer,
    StepTimer,
    StoppingRule,
    composed_micro_steps,
    step_time_metrics,
    summarize,
)
from orchestrator.models.probe_data import synthetic_batches
from orchestrator.store.record import Metrics, Trial

BUILDING = "building the model"
"""How a reason names the build: an OOM there, or a build peak over the limit, is its own, no micro-batch's."""


class _Probe(RankGroup):
    """State of one probe on one rank; ``run`` does the work, phases raise CellFailed once all ranks agree."""

    def __init__(self, cell: Config, rank: int, world_size: int, local_rank: int) -> None:
        super().__init__(cell, rank, world_size, local_rank)
        self.batches: list[Any] = []
        self.built = False
        self.micro_step_s: float | None = None
        """A micro-step's time as the last warm-up step measured it: how long a composed sample runs."""
        # What the record's metrics will say (see metrics()), each set once the probe knows it.
        self.num_parameters: int | None = None
        self.per_gpu: int | None = None
        self.estimate: int | None = None
        self.trials: list[Trial] | None = None
        self.micro_batch_size: int | None = None
        """The micro-batch timed; for does_not_fit and oom, the one that did not fit."""
        self.grad_accum_steps: int | None = None
        self.build_peak: float | None = None
        self.timed: Metrics | None = None
        self.batch_split = self.num_gpus
        """Ways a micro-step splits the global batch (orchestrator.engines.base.batch_split)."""

    def check_options(self) -> None:
        if self.config.probe.step_timing not in STEP_TIMINGS:
            raise ValueError(
                f"probe.step_timing={self.config.probe.step_timing!r}: accepted are {', '.join(STEP_TIMINGS)}"
            )

    # ---- the engine and its data ---------------------------------------------------------------------------

    def build(self, plan: BatchPlan) -> None:
        """A fresh engine for ``plan``, and its data."""
        self.built = False
        assert self.memory is not None
        self.engine.release()
        self.memory.rebase()
        self.engine.build(plan)
        self.built = True
        self.num_parameters = self.engine.num_parameters
        self.make_batches(plan)

    def build_judged(self, plan: BatchPlan) -> Outcome:
        """:meth:`build`, its peak held to the memory limit as a step's is; an OOM frees what was built."""
        began = time.perf_counter()
        outcome = self.attempt(lambda: self.build(plan), None, BUILDING)
        self.phases.startup_s += time.perf_counter() - began
        self.build_peak = gib(outcome.peak_bytes)
        if outcome.oom_reason is not None:
            self.release()
        return outcome

    def use(self, plan: BatchPlan) -> None:
        """Train with ``plan`` from now on: on the engine already built when there is one, else a new one."""
        if not self.built:
            self.build(plan)
            return
        self.engine.resize(plan)
        self.make_batches(plan)

    def make_batches(self, plan: BatchPlan) -> None:
        self.batches = []  # the old batches go before the new ones are made
        assert self.device is not None  # set up before anything is built
        self.batches = synthetic_batches(self.config, self.rank, plan.micro_batch_size, self.device)

    def release(self) -> None:
        self.batches = []
        self.built = False
        if self.engine is not None:
            self.engine.release()

    def cycle(self, micro_steps: int, timer: SplitTimer | None = None) -> Any:
        """``micro_steps`` micro-batches, gradients reduced and the optimizer stepped at the last; with ``timer``,
        a split after each micro-step."""
        loss = None
        for i in range(micro_steps):
            loss = self.engine.micro_step(self.batches[i % len(self.batches)], boundary=i == micro_steps - 1)
            if timer is not None:
                timer.split()
        return loss

    def sample_micro_steps(self, plan: BatchPlan) -> int:
        """Micro-steps a timed sample (and a warm-up step) runs: a whole cycle, or a composed sample's."""
        if self.config.probe.step_timing == "whole":
            return plan.grad_accum_steps
        return composed_micro_steps(plan.grad_accum_steps, self.micro_step_s)

    # ---- search, warm-up, timing ---------------------------------------------------------------------------

    def trial(self, plan: BatchPlan) -> Trial:
        """A shortened optimizer step at ``plan``'s micro-batch: does it fit on every rank?

        Two micro-batches (one when there is no accumulation), the second at the boundary, so the step holds what
        a whole step holds: accumulated gradients, then the reduction and the optimizer's states. A real OOM
        frees the engine (its state may be half-updated); a peak over the imposed limit keeps it.
        """
        micro_steps = min(plan.grad_accum_steps, 2)

        def work() -> None:
            self.use(plan)
            assert self.memory is not None
            self.memory.reset()  # the step's peak, not the build's
            self.cycle(micro_steps)

        outcome = self.attempt(work, plan.micro_batch_size, "trial step")
        if outcome.traceback is not None:
            self.release()
        if outcome.oom_reason:
            return Trial(plan.micro_batch_size, "oom", gib(outcome.peak_bytes), outcome.oom_reason)
        assert self.memory is not None
        (rest,) = self.agree([float(self.memory.in_use())], None)  # the model states, for the search's line
        return Trial(plan.micro_batch_size, "ok", gib(outcome.peak_bytes), None, gib(rest))

    def search(self, per_gpu: int, below: int | None = None) -> BatchPlan | None:
        """The largest micro-batch dividing ``per_gpu`` (and smaller than ``below``) that fits in a trial step;
        returns with the engine set to it, or None when even the smallest size does not fit. Trials are appended
        to the record's ``search_tried``."""
        candidates = [c for c in divisors(per_gpu) if below is None or c < below]
        if not candidates:
            return None
        global_batch = self.config.model.global_batch_size
        if self.estimate is None:
            self.estimate = self.engine.estimate_micro_batch_size(self.device_memory_gib())
        tried = self.trials = self.trials if self.trials is not None else []
        size: int | None = max([c for c in candidates if c <= self.estimate] or [candidates[0]])
        while size is not None:
            tried.append(self.trial(BatchPlan(global_batch, self.batch_split, size)))
            size = next_size(candidates, tried, self.capacity_bytes())
        fitted = [t.micro_batch_size for t in tried if t.outcome == "ok" and t.micro_batch_size in candidates]
        if not fitted:
            return None
        plan = BatchPlan(global_batch, self.batch_split, max(fitted))
        self.guarded(self.use, plan)  # no rebuild unless a real OOM dropped the engine
        return plan

    def warm_up(self, plan: BatchPlan) -> Outcome:
        """``probe.warmup_steps`` steps (each of a timed sample's micro-steps); whether they fit."""
        self.micro_step_s = None
        micro_steps = self.sample_micro_steps(plan)
        timer = StepTimer(self.use_cuda)
        last_s = 0.0

        def work() -> None:
            nonlocal last_s
            for _ in range(self.config.probe.warmup_steps):
                timer.start()
                self.cycle(micro_steps)
                last_s = timer.stop()

        began = time.perf_counter()
        outcome = self.attempt(work, plan.micro_batch_size, "warm-up")
        self.phases.warmup_s += time.perf_counter() - began
        if outcome.oom_reason is None and self.use_cuda:  # the burst effect is a GPU's (timing.COMPOSED_SAMPLE_S)
            (slowest,) = self.agree([last_s], None)
            self.micro_step_s = slowest / micro_steps if slowest > 0 else None
        return outcome

    def timed_steps(self, plan: BatchPlan) -> tuple[list[ComposedSample], list[float], str, Any]:
        """Time samples until the stopping rule says enough; the same decision on every rank.

        Each sample is a whole cycle (``whole``) or a composed sample's micro-steps; returns the samples, the host
        CPU time of each step (this process, all its threads, scaled to a whole step for a composed sample), why
        timing stopped, and the last loss.
        """
        probe = self.config.probe
        rule = StoppingRule(probe.min_steps, probe.max_steps, probe.target_ci_pct, probe.time_budget_s)
        timer = SplitTimer(self.use_cuda)
        micro_steps = self.sample_micro_steps(plan)
        whole = probe.step_timing == "whole" or micro_steps == plan.grad_accum_steps
        samples: list[ComposedSample] = []
        cpu_times: list[float] = []
        loss = None
        while True:
            failure, splits, cpu_s = None, [0.0] * micro_steps, 0.0
            try:
                timer.start()
                cpu_began = time.process_time()
                loss = self.cycle(micro_steps, timer)
                splits = timer.stop()
                cpu_s = time.process_time() - cpu_began
            except Exception as exc:
                failure = self.failure_from(exc)
            # A synchronous step is as slow as its slowest rank; every rank then holds the same numbers.
            if whole:
                step_s, cpu_s = self.agree([sum(splits), cpu_s], failure)
                sample = ComposedSample((), step_s, 1)
            else:
                *agreed, cpu_s = self.agree([*splits, cpu_s], failure)
                sample = ComposedSample(tuple(agreed[:-1]), agreed[-1], plan.grad_accum_steps)
                cpu_s *= plan.grad_accum_steps / micro_steps
            samples.append(sample)
            cpu_times.append(cpu_s)
            reason = rule.decide([s.step_s for s in samples], [s.cost_s for s in samples])
            if reason is not None:
                return samples, cpu_times, reason, loss

    def choose_plan(self, per_gpu: int) -> BatchPlan | None:
        """Search, warm up, then time (``timed``); a size that fits a trial step but not the warm-up, or whose
        timed steps peak over ``probe.memory_limit_gib``, is refused too and the search goes on below it. None
        when nothing fits."""
        below: int | None = None
        while True:
            began = time.perf_counter()
            plan = self.search(per_gpu, below)
            self.phases.search_s += time.perf_counter() - began
            if plan is None:
                return None
            outcome = self.warm_up(plan)
            if outcome.oom_reason is None:
                outcome = self.measured(plan)
                if outcome.oom_reason is None:
                    return plan
                self.timed = None  # a refused size's timing was part of the search
                self.phases.search_s += self.phases.timed_s
            refused = Trial(plan.micro_batch_size, "oom", gib(outcome.peak_bytes), outcome.oom_reason)
            assert self.trials is not None  # the search made them
            self.trials.append(refused)
            if outcome.traceback is not None:
                self.release()
            below = plan.micro_batch_size

    def run(self) -> Happened:
        """Measure the cell; what happened, unless a phase raised CellFailed (then on every rank)."""
        self.guarded(self.check_options)
        self.guarded(self.setup)
        assert self.memory is not None
        self.phases.startup_s = time.perf_counter() - self.started
        global_batch = self.config.model.global_batch_size
        micro_setting = self.config.method.micro_batch_size
        self.batch_split = batch_split(self.engine, self.num_gpus)
        self.per_gpu = per_gpu = self.guarded(per_gpu_batch_size, global_batch, self.batch_split)

        if micro_setting == "auto":
            built = self.build_judged(BatchPlan(global_batch, self.batch_split, 1))  # the search resizes it
            if built.oom_reason is not None:  # no micro-batch can fit
                return Happened(Ending.NOTHING_FITS, built.oom_reason, built.traceback)
            plan = self.choose_plan(per_gpu)
            if plan is None:
                tried = self.trials or []
                smallest = min(t.micro_batch_size for t in tried)
                self.micro_batch_size = smallest
                last = [t for t in tried if t.micro_batch_size == smallest][-1]
                return Happened(
                    Ending.NOTHING_FITS,
                    f"nothing fits: even the smallest micro-batch, {smallest}, is out of memory ({last.reason})",
                )
        else:
            plan = self.guarded(plan_batch, global_batch, self.batch_split, micro_setting)
            built = self.build_judged(plan)
            if built.oom_reason is not None:
                return Happened(Ending.OUT_OF_MEMORY, built.oom_reason, built.traceback)
            warm = self.warm_up(plan)
            if warm.oom_reason is None:
                warm = self.measured(plan)
            if warm.oom_reason is not None:
                self.micro_batch_size = plan.micro_batch_size
                return Happened(Ending.OUT_OF_MEMORY, warm.oom_reason, warm.traceback)
        self.micro_batch_size, self.grad_accum_steps = plan.micro_batch_size, plan.grad_accum_steps
        self.environment.update(self.engine.describe())  # after the timed steps: what the engine measured in them
        return Happened(Ending.COMPLETED)

    def measured(self, plan: BatchPlan) -> Outcome:
        """Time ``plan``'s steps (``timed``); whether their peak fits under ``probe.memory_limit_gib``. The trial
        and the warm-up ran fewer steps, and a longer run can peak higher (orchestrator/job/metering.py), so their
        peaks under the limit do not vouch for this one. A size over it keeps only its memory figures: the step
        time of a size that does not fit is no answer."""
        self.timed = timed = self.measure(plan)
        reserved, allocated = timed.peak_memory_reserved_gib, timed.peak_memory_allocated_gib
        peak = (reserved if reserved is not None else allocated or 0.0) * GIB  # MemoryPeak.limited, over ranks
        over = over_limit(peak, self.memory_limit_bytes, plan.micro_batch_size, "timed steps")
        if over is not None:
            self.timed = Metrics(peak_memory_allocated_gib=allocated, peak_memory_reserved_gib=reserved,
                                 host_rss_gib=timed.host_rss_gib)  # fmt: skip
        return Outcome(over, None, peak)

    def measure(self, plan: BatchPlan) -> Metrics:
        """Time ``plan``'s steps: the record's figures of the timed steps."""
        assert self.memory is not None
        skipped_before = self.engine.skipped_steps
        began, host = time.perf_counter(), HostLoadMeter()
        samples, cpu_times, stop_reason, loss = self.timed_steps(plan)
        self.phases.timed_s = time.perf_counter() - began
        self.environment["host_load"] = asdict(host.end())  # the record's host_load (entry.py moves it there)
        peak = self.memory.peak()  # since the warm-up began: the steady state's peak
        allocated, reserved, host_rss = self.agree(
            [float(peak.allocated), float(peak.reserved or 0), float(peak.host_rss)], None
        )
        steps = step_time_metrics(samples, cpu_times, stop_reason, plan.grad_accum_steps)
        median_s = summarize([s.step_s for s in samples]).median_s
        return replace(
            throughput_metrics(self.config, plan.global_batch_size, median_s, base=steps),
            peak_memory_allocated_gib=allocated / GIB,
            peak_memory_reserved_gib=reserved / GIB if peak.reserved is not None else None,
            host_rss_gib=host_rss / GIB,
            final_loss=float(loss.item()) if loss is not None else None,
            skipped_steps_timed=self.engine.skipped_steps - skipped_before,
        )

    def metrics(self) -> Metrics:
        """The record's metrics: all this probe knows so far, gathered here (the timed steps' from ``measure``)."""
        return replace(
            self.timed or Metrics(),
            num_parameters=self.num_parameters,
            per_gpu_batch_size=self.per_gpu,
            memory_limit_gib=gib(self.memory_limit_bytes) if self.per_gpu is not None else None,
            build_peak_memory_gib=self.build_peak,
            micro_batch_estimate=self.estimate,
            search_tried=None if self.trials is None else list(self.trials),
            micro_batch_size=self.micro_batch_size,
            grad_accum_steps=self.grad_accum_steps,
            **asdict(self.phases),  # startup_s, search_s, warmup_s, timed_s: the metrics of the same names
            probe_wall_s=time.perf_counter() - self.started,
        )


def run_probe(
    cell: Config,
    rank: int,
    world_size: int,
    local_rank: int,
    time_signal: Callable[[], TimeSignal | None] = lambda: None,
) -> ProbeOutcome:
    """Measure one cell. Called on every rank after the job side set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT and, for gpu.accelerator == "cpu", DS_ACCELERATOR=cpu (before deepspeed is imported). Never raises
    for a failure of the cell: returns the outcome on every rank, its status decided with ``time_signal()``, the
    job's time-limit signal if one came (asked once the probe has ended)."""
    build_cache = pin_build_environment()  # before torch is imported
    removed = guard_op_builds(Path(build_cache["TORCH_EXTENSIONS_DIR"]), say)  # before any op is built
    probe = _Probe(cell, rank, world_size, local_rank)
    probe.environment["build_cache"] = build_cache
    if removed:
        probe.environment["stale_op_locks_removed"] = [str(p) for p in removed]
    try:
        happened = probe.run()
    except CellFailed as exc:
        happened = exc.failure.happened()
    except Exception as exc:  # a failure no other rank could be told about (e.g. inside the process group setup)
        happened = probe.failure_from(exc).happened()
    metrics = probe.metrics()
    if probe.engine is not None and "engine" not in probe.environment:
        with contextlib.suppress(Exception):  # a record must be written even if the engine cannot say more
            probe.environment.update(probe.engine.describe())
    probe.release()
    probe.close(happened.ending)
    return outcome_of(happened, metrics, probe.environment, time_signal())
