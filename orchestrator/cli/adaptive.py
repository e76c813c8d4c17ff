"""An adaptive sweep's life: measure a few cells a round, refit, predict the rest, and stop when the grid is
answered well enough (``gpudays sweep --adaptive``).

A round is chosen by :func:`analysis.planners.adaptive.decide` from the records measured so far, written and submitted
like any sweep's cells (on SLURM one array job a round); the round's cells then have states, records and attempts
as any other. On this machine (``cluster=local``) the command runs round after round to the end. On SLURM it
returns once a round is submitted; ``gpudays status`` says which round runs, and ``gpudays resume`` (or ``--wait``)
submits the round's cells a per-user job limit held back (``orchestrator.submission.quota``; ``--wait`` as others end), reruns
the round's failed cells (a cell that failed :data:`orchestrator.store.adaptive_state.MAX_ATTEMPTS` times is left
to its prediction and others are chosen in its place), then, once the round has ended, chooses the next from
everything measured. The goal, the rounds and why the sweep stopped are in ``adaptive.json``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd

from analysis.planners.adaptive import STOP_REASONS, Decision, Goal, decide
from analysis.planners.selection import ProbeSteps
from analysis.predict.inputs import flat_cell
from analysis.sweeps.records import UNMEASURED, load_cells
from orchestrator.cli import autoprofile, folder
from orchestrator.cli import flow as lifecycle
from orchestrator.cli.display import console
from orchestrator.cli.display.figures import figure
from orchestrator.cli.errors import CommandError, Exit
from orchestrator.config.schema import to_config
from orchestrator.profile import sweep as profile_sweep
from orchestrator.store.adaptive_state import (
    MAX_ATTEMPTS,
    AdaptiveState,
    Round,
    Stopped,
    is_adaptive,
    now,
    read_grid,
    write_grid,
    write_state,
)
from orchestrator.store.durable import append_jsonl
from orchestrator.store.paths import SweepPaths
from orchestrator.store.states import State, is_active, needs_rerun
from orchestrator.submission import intents, launch, quota, status, usage

if TYPE_CHECKING:
    from orchestrator.planning.plan import Plan


def goal_from_flags(
    target_pct: float | None, budget_gpu_hours: float | None, round_cells: int | None, size: int
) -> Goal:
    """The goal of ``--target-pct``, ``--budget-gpu-hours`` and ``--round-cells`` (default: 1% of the grid, at
    least 2 cells); CommandError naming the flag and what it accepts."""
    if target_pct is not None and not (math.isfinite(target_pct) and target_pct > 0):
        raise CommandError(f"--target-pct {target_pct}: give the interval's half-width in %, above 0 (e.g. 10)")
    if budget_gpu_hours is not None and not (budget_gpu_hours > 0):
        raise CommandError(f"--budget-gpu-hours {budget_gpu_hours}: give GPU-hours above 0 (e.g. 5)")
    if round_cells is not None and round_cells < 1:
        raise CommandError(f"--round-cells {round_cells}: give the cells measured per round, 1 or more")
    return Goal(
        target_pct=10.0 if target_pct is None else target_pct,
        budget_gpu_hours=math.inf if budget_gpu_hours is None else budget_gpu_hours,
        round_cells=round_cells or max(2, round(size / 100)),
    )


def start(
    plan: Plan, goal: Goal, wait: bool, report: bool, interval_s: float = 5.0, profile_from: Sequence[str] | None = None
) -> Exit:
    """``gpudays sweep --adaptive``: write the grid into a new folder, then run (or submit) the first round; the
    sweep's profile goes first, with the first round, and its GPU time counts in the budget."""
    paths = SweepPaths(plan.sweep_dir)
    lifecycle.check({c.cell_id: c.typed for c in plan.cells})
    older = autoprofile.older_folders(profile_from)
    paths.root.mkdir(parents=True, exist_ok=True)
    with intents.sweep_lock(paths):
        if is_adaptive(paths) or paths.cell_ids():
            raise CommandError(
                f"{paths.root} holds a sweep already; an adaptive sweep starts in a folder of its own "
                f"(`--dir NEW`), and `{folder.shell_hint('gpudays', 'resume', paths.root)}` goes on with one"
            )
        append_jsonl(
            paths.sweep_log,
            {"at": now(), "command": "sweep --adaptive", "overrides": plan.overrides,
             "cells": [c.cell_id for c in plan.cells], "skipped": [c.cell_id for c in plan.skipped]},
        )  # fmt: skip
        for cell in plan.skipped:
            reasons = [str(r) for r in cell.refusals]
            append_jsonl(paths.skipped, {"cell_id": cell.cell_id, "label": cell.label, "overrides": cell.overrides,
                                         "reasons": reasons})  # fmt: skip
        write_grid(paths, [(c.cell_id, c.config) for c in plan.cells])
        write_state(paths, AdaptiveState(goal.target_pct, goal.budget_gpu_hours, goal.round_cells))
        autoprofile.ensure(paths, {c.cell_id: c.typed for c in plan.cells}, older)  # the grid's every GPU and layout
    console.out(
        f"adaptive sweep of {len(plan.cells)} cell(s): rounds of up to {goal.round_cells}, until every unmeasured "
        f"cell's 90% interval is within ±{goal.target_pct:g}% or {folder.budget_text(goal.budget_gpu_hours)} is spent"
    )
    return advance(paths, wait, report, interval_s)


def advance(
    paths: SweepPaths,
    wait: bool,
    report: bool = True,
    interval_s: float = 5.0,
    time_limit_min: int | None = None,
    time_factor: float | None = None,
) -> Exit:
    """Go on with an adaptive sweep: rerun a round's failed cells, else choose and submit the next round; on this
    machine (or with ``wait``) until the sweep stops, then finish it (summary, report, exit code)."""
    first = True
    while True:
        with intents.sweep_lock(paths):
            state = folder.adaptive_state(paths)
            if state.stopped is not None:
                if first:  # stopped before this command: nothing new to report
                    console.out(folder.describe(paths) or "")
                    return lifecycle.finish(paths, report=False)
                break
            first = False
            try:
                states = status.cell_states(paths, holding_lock=True)
            except status.SchedulerUnavailable as e:
                raise CommandError(f"cannot tell whether the round has ended: {e}", Exit.SCHEDULER) from e
            waves: quota.Waves | None = None
            if any(is_active(s.state) for s in states):
                console.out(f"round {len(state.rounds)}: {_counts(states)}; still running")
            elif rerun := [s for s in states if needs_rerun(s.state) and s.attempt < MAX_ATTEMPTS]:
                waves = _rerun(paths, len(state.rounds), rerun, time_limit_min, time_factor)
            else:
                given_up = [s.cell_id for s in states if needs_rerun(s.state)]
                waves = _next_round(paths, state, given_up)
                if waves is None:
                    break
        if waves is not None and not waves.to_slurm:
            continue  # the round ran here
        if wait:
            folder.wait_for(paths, interval_s, waves)  # cells a job limit held back go out as others end
            continue
        console.out(
            f"follow it with: {folder.shell_hint('gpudays', 'status', paths.root)}; once the round has ended, "
            f"{folder.shell_hint('gpudays', 'resume', paths.root)} starts the next (or `resume --wait`: all)"
        )
        return Exit.OK
    return lifecycle.finish(paths, report)


def _rerun(
    paths: SweepPaths,
    number: int,
    rerun: Sequence[status.CellState],
    time_limit_min: int | None,
    time_factor: float | None,
) -> quota.Waves:
    """Resubmit a round's cells that failed (their earlier record kept aside, as ``resume`` does), and submit those
    a job limit held back (never submitted: ``new``)."""
    configs = {s.cell_id: lifecycle.rerun_config(paths, s, time_limit_min, time_factor) for s in rerun}
    by_id = {s.cell_id: s for s in rerun}
    failed = [f"{s.cell_id} ({s.state})" for s in rerun if s.state is not State.NEW]
    unsent = [s.cell_id for s in rerun if s.state is State.NEW]
    if failed:
        console.out(f"round {number}: rerunning " + ", ".join(failed))
    if unsent:
        console.out(f"round {number}: submitting {len(unsent)} cell(s) not submitted yet: " + ", ".join(unsent))
    return lifecycle.submit_cells(paths, configs, lambda cid: lifecycle.archive_record(paths, by_id[cid]))


def _next_round(paths: SweepPaths, state: AdaptiveState, given_up: Sequence[str]) -> quota.Waves | None:
    """Decide from the records; submit the round chosen (its submissions) or record why the sweep stops (None)."""
    grid_cells = read_grid(paths.adaptive_grid)
    configs = {cid: config for cid, config in grid_cells}
    grid = pd.DataFrame([{**flat_cell(config), "cell_id": cid} for cid, config in grid_cells])
    loaded = load_cells([paths.root]).frame
    measured = loaded[loaded["status"] != UNMEASURED] if not loaded.empty else loaded
    goal = Goal(state.target_pct, state.budget_gpu_hours, state.round_cells)
    first = to_config(grid_cells[0][1]).probe
    probe = ProbeSteps(first.warmup_steps, first.max_steps, first.time_budget_s)
    history = [r.widest_pct for r in state.rounds]
    spent = _spent_gpu_s(measured, probe, paths) + profile_sweep.spent_gpu_s(paths)
    profiles, unread = profile_sweep.profiles_of([paths.root])
    for line in unread:
        console.out(f"  {line}")
    decision = decide(grid, measured, goal, spent, probe, blocked=given_up, history=history, profiles=profiles)
    for cid in given_up:
        console.out(f"  {cid} failed {MAX_ATTEMPTS} times: left to its prediction; others are chosen in its place")
    if decision.stop is not None:
        state.stopped = Stopped(decision.stop, now(), decision.widest_pct, decision.measured, decision.spent_gpu_hours)
        write_state(paths, state)
        console.out(f"adaptive sweep stopped: {STOP_REASONS[decision.stop]}; {_standing(decision, len(grid))}")
        return None
    number = len(state.rounds) + 1
    state.rounds.append(Round(number, now(), decision.chosen, decision.widest_pct, decision.spent_gpu_hours))
    chosen = {cid: to_config(configs[cid]) for cid in decision.chosen}
    for cid, cfg in chosen.items():
        launch.write_cell(paths, cid, cfg)
    write_state(paths, state)  # before submission: a round submitted is a round recorded
    console.out(f"round {number}: measuring {len(chosen)} cell(s); {_standing(decision, len(grid))}")
    return lifecycle.submit_cells(paths, chosen)


def _spent_gpu_s(measured: pd.DataFrame, probe: ProbeSteps, paths: SweepPaths | None = None) -> float:
    """GPU-seconds the measurements took: what SLURM allocated (sacct's AllocTRES GPUs × elapsed, every run; see
    usage.allocated_gpu_s) where it says; else, with a note, each record's probe wall time × its GPUs, and a cell
    that left no wall time (a failure without a record) counts as its whole probe budget."""
    if measured.empty:
        return 0.0
    wall = pd.to_numeric(measured.get("probe_wall_s"), errors="coerce").fillna(probe.time_budget_s)
    gpus = pd.to_numeric(measured["num_gpus"], errors="coerce").fillna(1.0)
    spent = wall * gpus
    if paths is not None and "cell_id" in measured:
        allocated, note = usage.allocated_gpu_s(paths, measured["cell_id"].astype(str))
        charged = measured["cell_id"].astype(str).map(allocated)
        spent = charged.where(charged > 0, spent)  # nothing allocated yet (pending): the probe's figure
        if note:
            console.note(note)
    return float(spent.sum())


def _standing(decision: Decision, size: int) -> str:
    widest = "unknown" if math.isinf(decision.widest_pct) else f"±{decision.widest_pct:.1f}%"
    return (
        f"{decision.measured} of {size} cells measured, {figure(decision.spent_gpu_hours, 3)} GPU-hours spent, "
        f"widest unmeasured interval {widest}"
    )


def _counts(states: Sequence[status.CellState]) -> str:
    return str(console.summary_line(list(states), markup=False))


__all__ = ["advance", "goal_from_flags", "is_adaptive", "start"]
