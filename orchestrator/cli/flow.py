"""A sweep's life after planning: submit (or run here), wait, finish; and resume, which is the same life again.

``start`` (for ``gpudays sweep``) and ``resume`` each choose the cells to submit under the sweep folder's lock,
then share the rest: the pre-submission checks, submission to SLURM or a run on this machine, and, with waiting,
the wait and the report. Each returns an ``Exit`` code; bad input raises ``CommandError`` with its code, so that
the command line has only to print it.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cells import cell as cells
from orchestrator.cli.display import console
from orchestrator.cli.errors import CommandError, Exit
from orchestrator.cli.folder import say_damaged, shell_hint, states_or_records, wait_for
from orchestrator.config.schema import Config
from orchestrator.store.attempts import read_attempts
from orchestrator.store.durable import WriteFailed, append_jsonl
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import BadCellConfig, Record, aside_path, read_cell_config, read_record
from orchestrator.store.states import UNFIXABLE, parse_state, rerun_selectable
from orchestrator.submission import admission, intents, launch, local, quota, status

if TYPE_CHECKING:
    from orchestrator.planning.plan import Plan


def check(configs: Mapping[str, Config]) -> None:
    """Before anything is written: GPU types the cluster config cannot request, and what SLURM would refuse."""
    slurm = {c: v for c, v in configs.items() if v.cluster.backend == "slurm"}
    here = {c: v for c, v in configs.items() if v.cluster.backend == "local"}
    try:
        launch.check_gpu_types(slurm)
        for line in launch.untyped_gpu_notes(slurm):
            console.note(f"warning: {line}")
        for cfg in here.values():
            local.local_parameters(launch.resources(cfg))
        local.check_local_gpus(here)
        admission.check_slurm(slurm)
    except launch.SchedulerUnreachable as e:
        raise CommandError(f"the scheduler could not be asked; nothing was submitted: {e}", Exit.SCHEDULER) from e
    except launch.SubmissionRefused as e:
        raise CommandError(str(e)) from e


def _say_waiting(paths: SweepPaths, holder: str) -> None:
    console.note(f"{paths.root} is being submitted into by another gpudays command ({holder}); waiting for it")


def in_sweep_already(paths: SweepPaths, cell_id: str) -> bool:
    """A cell ``sweep`` submitted before (it has attempts): ``sweep`` leaves it to ``resume``."""
    return paths.attempts(cell_id).is_file()


def submit_cells(
    paths: SweepPaths, configs: Mapping[str, Config], before_start: Callable[[str], None] | None = None
) -> quota.Waves:
    """Submit SLURM cells within the per-user job limits (orchestrator.submission.quota: some may be held back), run local
    ones here (inside the caller's lock).

    ``before_start`` is called with each cell id once its job is accepted (SLURM) or started (local)."""
    slurm = {c: v for c, v in configs.items() if v.cluster.backend == "slurm"}
    here = {c: v for c, v in configs.items() if v.cluster.backend == "local"}
    waves = quota.Waves(paths, before_start)
    if slurm:
        try:
            subs = waves.submit(slurm)
        except WriteFailed:
            raise
        except launch.SubmissionRefused as e:  # sbatch's refusal: the cells, SLURM's words, where they stand
            raise CommandError(str(e), Exit.SCHEDULER) from e
        except (subprocess.CalledProcessError, OSError) as e:
            said = getattr(e, "stderr", None) or getattr(e, "output", None) or str(e)
            if isinstance(said, bytes):
                said = said.decode(errors="replace")
            raise CommandError(
                f"sbatch failed: {str(said).strip()[:500]}\nCells submitted before the failure are recorded; those "
                "of the array that failed are `lost` once the scheduler is seen to have no job of its name (else "
                f"adopted), and `{shell_hint('gpudays', 'resume', paths.root)}` submits them; the others are as "
                "they were.",
                Exit.SCHEDULER,
            ) from e
        console.out(waves.summary(subs))
    if here:
        run_local(paths, here, before_start)
    return waves


def run_local(
    paths: SweepPaths, configs: Mapping[str, Config], before_start: Callable[[str], None] | None = None
) -> None:
    """Run cells on this machine one after another, saying which runs, for how long, and how each ended."""
    console.out(f"running {len(configs)} cell(s) on this machine, one after another")
    progress = console.LocalProgress(len(configs))

    def done(cid: str) -> None:
        state = next(s for s in status.cell_states(paths, query_scheduler=False) if s.cell_id == cid)
        progress.done(state)

    with progress:
        local.submit_local(
            paths, configs, on_done=done, on_start=progress.start, on_poll=progress.poll, before_start=before_start
        )


def _follow(paths: SweepPaths, waves: quota.Waves, wait: bool, report: bool, interval_s: float) -> Exit:
    if waves.to_slurm and not wait:
        console.out(f"follow it with: {shell_hint('gpudays', 'status', paths.root)}")
        return Exit.OK
    if wait and (waves.held or not status.is_done(states_or_records(paths))):
        wait_for(paths, interval_s, waves)
    return finish(paths, report)


def start(
    plan: Plan, wait: bool, report: bool, interval_s: float = 5.0, profile_from: Sequence[str] | None = None
) -> Exit:
    """``gpudays sweep``: write the plan's cells into its folder, profile its hardware where the folder has no
    profile of it (``orchestrator.cli.autoprofile``), submit the cells that are new, and follow them."""
    from orchestrator.cli import autoprofile

    paths = SweepPaths(plan.sweep_dir)
    check({c.cell_id: c.typed for c in plan.cells})
    older = autoprofile.older_folders(profile_from)
    with intents.sweep_lock(paths, on_wait=lambda who: _say_waiting(paths, who)):
        append_jsonl(
            paths.sweep_log,
            {
                "at": dt.datetime.now(dt.timezone.utc).isoformat(),
                "command": sys.argv,
                "overrides": plan.overrides,
                "cells": [c.cell_id for c in plan.cells],
                "skipped": [c.cell_id for c in plan.skipped],
            },
        )
        for cell in plan.skipped:
            append_jsonl(
                paths.skipped,
                {
                    "cell_id": cell.cell_id,
                    "label": cell.label,
                    "overrides": cell.overrides,
                    "reasons": [str(r) for r in cell.refusals],
                },
            )
        # Read inside the lock: a command that held it before this one has recorded its submissions by now, and
        # one killed mid-submission left intents, whose jobs are adopted here.
        intents.reconcile(paths, {c.cell_id: read_attempts(paths, c.cell_id) for c in plan.cells}, holding_lock=True)
        new: dict[str, Config] = {}
        for cell in plan.cells:
            already = in_sweep_already(paths, cell.cell_id)
            launch.write_cell(paths, cell.cell_id, cell.typed)
            if not already:
                new[cell.cell_id] = cell.typed
        known = len(plan.cells) - len(new)
        if known:
            console.out(
                f"{known} cell(s) already in this sweep: not submitted again (`gpudays resume` reruns failures)"
            )
        autoprofile.ensure(paths, new, older)
        waves = submit_cells(paths, new)
    return _follow(paths, waves, wait, report, interval_s)


def resume(
    paths: SweepPaths,
    only: set[str] | None,
    time_limit_min: int | None,
    time_factor: float | None,
    wait: bool,
    interval_s: float = 5.0,
) -> Exit:
    """``gpudays resume``: resubmit the cells that need it (not ok, not does_not_fit, not pending or running)."""
    with intents.sweep_lock(paths, on_wait=lambda who: _say_waiting(paths, who)):
        # States are read inside the lock: cells a concurrent resume has just resubmitted are pending by now.
        try:
            states = status.cell_states(paths, holding_lock=True)
        except status.SchedulerUnavailable as e:
            raise CommandError(f"cannot tell which cells need a rerun: {e}", Exit.SCHEDULER) from e
        wanted = None if only is None else [parse_state(name) for name in only]
        say_damaged(paths)
        todo = [s for s in states if rerun_selectable(s.state, wanted)]
        # Held cells are released or cancelled for resubmission here; what was done is said.
        todo, held_said = status.settle_held(todo)
        for line in held_said:
            console.out(f"  {line}")
        if held_said:  # a released cell is pending now: what follows (and --wait) waits for it
            states = status.cell_states(paths, holding_lock=True)
        if not todo:
            console.out(f"nothing to resume: {console.summary_line(states, markup=False)}")
            if wait and not status.is_done(states):
                # --wait waits for every active cell of the sweep, whoever submitted it.
                return _follow(paths, quota.Waves(paths), True, True, interval_s)
            return Exit.OK
        configs = {s.cell_id: rerun_config(paths, s, time_limit_min, time_factor) for s in todo}
        by_id = {s.cell_id: s for s in todo}
        check(configs)
        console.out(f"resubmitting {len(configs)} cell(s): " + ", ".join(f"{s.cell_id} ({s.state})" for s in todo))
        # A record is moved aside only once its replacement is on its way: a submission that fails leaves every
        # cell as it was (the job of a new attempt replaces the record itself when it ends). Local cells run
        # inside submit_cells, so theirs are moved as each starts.
        waves = submit_cells(paths, configs, before_start=lambda cid: archive_record(paths, by_id[cid]))
    return _follow(paths, waves, wait, True, interval_s)


def rerun_config(paths: SweepPaths, s: status.CellState, time_limit: int | None, time_factor: float | None) -> Config:
    """The cell's config for its next attempt: a cell that timed out gets the new limit, if one was given.

    ``cell.yaml`` is read back as the typed cell and judged again, so an edited file with a value outside its
    domain is refused here, naming the cell and key, before anything is submitted."""
    where = paths.cell_config(s.cell_id)
    try:
        cfg, refusals = cells.typed_cell(read_cell_config(where))
    except BadCellConfig as e:
        raise CommandError(f"cell {s.cell_id}: {e}") from e
    if cfg is None:
        raise CommandError(f"cell {s.cell_id}: {where} is not a cell config: {'; '.join(refusals)}")
    if refusals:
        raise CommandError(f"cell {s.cell_id}: {where}: " + "; ".join(refusals))
    if s.state == "timeout" and (time_limit or time_factor):
        old = cells.time_limit_min(cfg)
        new = max(time_limit or int(round(old * (time_factor or 1))), 1)
        cfg = replace(cfg, cluster=replace(cfg.cluster, time_limit_min=new))
        console.out(f"  {s.cell_id}: time limit {old} -> {new} min")
        launch.write_cell(paths, s.cell_id, cfg)
    return cfg


def archive_record(paths: SweepPaths, s: status.CellState) -> None:
    """Keep the record of the attempt being replaced next to the new one, under the attempt's name (never the new
    attempt's own record, should its job have written one already)."""
    record = paths.record(s.cell_id)
    found = read_record(record, s.cell_id)
    if isinstance(found, Record) and found.attempt > s.attempt:
        return
    if found is not None:
        # A record names its own attempt (the latest may be a submission cut short, which wrote none).
        record.rename(aside_path(paths, s.cell_id, found, s.attempt))


def finish(paths: SweepPaths, report: bool) -> Exit:
    """Summarise a finished sweep (and write its report); CELLS_FAILED if any cell needs a rerun."""
    states = states_or_records(paths)
    c = console.make_console()
    if report:
        from analysis.report.writer import write_report
        from orchestrator.profile.sweep import profiles_of

        profiles, unread = profiles_of([paths.root])
        rep = write_report([paths.root], states={s.cell_id: s.state for s in states}, profiles=profiles)
        console.table_out(console.cells_table(rep.cells))
        c.print(console.problems([*unread, *rep.problems]))
        c.print(console.files_written(rep.files))
    c.print(console.summary_line(states, markup=False))
    bad = [s for s in states if status.needs_rerun(s.state)]
    if bad:
        console.out(
            f"{len(bad)} cell(s) need a rerun: see `{shell_hint('gpudays', 'status', paths.root)}`, "
            f"then `{shell_hint('gpudays', 'resume', paths.root)}`"
        )
    unfixable = [s for s in states if s.state in UNFIXABLE]
    if unfixable:
        console.out(
            f"{len(unfixable)} cell(s) cannot run as configured, and a rerun cannot fix them: see "
            f"`{shell_hint('gpudays', 'status', paths.root)}`"
        )
    return Exit.CELLS_FAILED if bad or unfixable else Exit.OK


def report(sweep_dirs: Sequence[SweepPaths], out_dir: Path | None, tokens: str | None, plots: bool) -> Exit:
    """``gpudays report``: the tables, plots and report.md of one or more sweeps; CommandError on a bad budget."""
    from analysis.predict.estimates import parse_token_budget
    from analysis.report.writer import write_report

    try:
        budget = parse_token_budget(tokens)
    except ValueError as e:
        raise CommandError(f"--tokens {tokens}: {e}") from e
    if budget.value is not None and not (0 < budget.value < 1e18):
        raise CommandError(f"--tokens {tokens}: give a budget above 0 and below 1e18 tokens, e.g. 20x or 300B")
    states: dict[str, str] = {}
    for paths in sweep_dirs:
        states.update({s.cell_id: s.state for s in states_or_records(paths)})
    from orchestrator.profile.sweep import profiles_of

    profiles, unread = profiles_of([p.root for p in sweep_dirs])
    rep = write_report(
        [p.root for p in sweep_dirs], out_dir, tokens=tokens, plots=plots, states=states, profiles=profiles
    )
    c = console.make_console()
    console.table_out(console.cells_table(rep.cells))
    c.print(console.problems([*unread, *rep.problems]))
    c.print(console.files_written(rep.files))
    return Exit.OK
