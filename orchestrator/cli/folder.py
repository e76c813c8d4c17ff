"""The commands that read a sweep folder and change nothing: ``status`` and ``show``, waiting for a sweep's cells,
and the line ``status`` prints about an adaptive sweep. Only the store, the scheduler's answers and the terminal:
no Hydra, submitit, pandas or torch is loaded on this path."""

from __future__ import annotations

import math
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cli.display import console
from orchestrator.cli.display.figures import figure
from orchestrator.cli.errors import CommandError, Exit
from orchestrator.store.adaptive_state import (
    STOP_REASONS,
    AdaptiveState,
    BadAdaptiveState,
    is_adaptive,
    read_grid,
    read_state,
)
from orchestrator.store.attempts import damaged_lines
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import status

if TYPE_CHECKING:
    from orchestrator.submission.quota import Waves


def shell_hint(*words: str | Path) -> str:
    """A command a user can paste: every word shell-quoted (a folder may hold spaces or ``$``)."""
    return shlex.join(str(w) for w in words)


SWEEP_FOLDER_HOLDS = (
    "a sweep folder is written by `gpudays sweep` and holds sweep.json, cells/<cell_id>/cell.yaml for each cell "
    "and, once they ran, cells/<cell_id>/record.json"
)


def sweep_folder(arg: str | Path) -> SweepPaths:
    """The sweep folder named on the command line; CommandError when it is not one (nothing is created)."""
    paths = SweepPaths(Path(arg))
    if not paths.root.exists():
        raise CommandError(f"{paths.root} does not exist; {SWEEP_FOLDER_HOLDS}")
    if not paths.root.is_dir():
        raise CommandError(f"{paths.root} is a file, not a sweep folder; {SWEEP_FOLDER_HOLDS}")
    if not paths.cell_ids():
        hint = paths.sweeps_inside_hint()
        raise CommandError(
            f"{paths.root} is not a sweep folder, or not yet one (no cells in it){hint}; {SWEEP_FOLDER_HOLDS}"
        )
    return paths


def say_damaged(paths: SweepPaths) -> None:
    """Entries under cells/ that are not cells, and attempts.jsonl lines skipped, on stderr: nothing is dropped
    from a sweep without a word."""
    for line in [*paths.damaged_cells(), *damaged_lines(paths)]:
        console.note(f"{paths.root}: {line}")


def states_or_records(paths: SweepPaths) -> list[status.CellState]:
    """Every cell's state; from the records alone (with a note) when the scheduler cannot be asked."""
    try:
        return status.cell_states(paths)
    except status.SchedulerUnavailable as e:
        console.note(f"the scheduler could not be asked ({e}); states come from the records alone")
        return status.cell_states(paths, query_scheduler=False)


MAX_INTERVAL_S = 60.0
"""The longest wait between two checks while nothing changes: fifty users waiting on one cluster make a sacct call
a second at most between them, not ten (slurmdbd answers every user of the cluster)."""


class Backoff:
    """The waits between checks: ``start_s`` first, doubled after each check that changed nothing, up to
    MAX_INTERVAL_S (never below ``start_s``); back to ``start_s`` as soon as a check changes something."""

    def __init__(self, start_s: float, max_s: float = MAX_INTERVAL_S) -> None:
        self.start_s = start_s
        self.max_s = max(start_s, max_s)
        self.next_s = start_s

    def after(self, changed: bool) -> float:
        """The wait before the next check, given whether the check just made changed anything."""
        self.next_s = self.start_s if changed else min(self.next_s * 2, self.max_s)
        return self.next_s


def _seen(states: list[status.CellState]) -> tuple[tuple[str, str, int], ...]:
    return tuple((s.cell_id, s.state.value, s.attempt) for s in states)


def wait_for(paths: SweepPaths, interval_s: float = 5.0, waves: Waves | None = None) -> None:
    """Block until no cell is pending, running or held back by a job limit (``waves``), showing the counts.
    Checks back off (Backoff) while no cell changes state and no wave goes out."""
    try:
        _wait(paths, interval_s, waves)
    except KeyboardInterrupt:
        console.note(stopped_waiting(paths, len(waves.held) if waves is not None else 0))
        raise


def stopped_waiting(paths: SweepPaths, held: int) -> str:
    """What a Ctrl-C while waiting leaves: the jobs go on without this command, and how to follow or stop them."""
    left = (
        f"; {held} cell(s) held back by a job limit were not submitted: "
        f"`{shell_hint('gpudays', 'resume', paths.root)}` submits them"
        if held
        else ""
    )
    return (
        f"stopped waiting, not the jobs: the sweep's submitted jobs keep running on the scheduler{left}; follow them "
        f"with `{shell_hint('gpudays', 'status', paths.root, '--watch')}` (or wait again and report with "
        f"`{shell_hint('gpudays', 'resume', paths.root, '--wait')}`), stop them with "
        f"`{shell_hint('gpudays', 'cancel', paths.root)}`"
    )


def _wait(paths: SweepPaths, interval_s: float, waves: Waves | None) -> None:
    states = states_or_records(paths)
    backoff = Backoff(interval_s)
    wait_s = interval_s
    with console.WaitProgress(len(states)) as progress:
        while not status.is_done(states) or (waves is not None and waves.held):
            progress.update(states)
            time.sleep(wait_s)
            sent = False
            if waves is not None and (subs := waves.refill()):
                console.out(waves.summary(subs))
                sent = True
            before = _seen(states)
            states = states_or_records(paths)
            wait_s = backoff.after(sent or _seen(states) != before)
        progress.update(states)


def show_status(
    paths: SweepPaths, only: set[str] | None, summary: bool, watch: bool, interval_s: float, check: bool
) -> Exit:
    """``gpudays status``: the table (``watch``: refreshed until no cell is pending or running); with ``check``,
    CELLS_FAILED while any cell needs a rerun."""
    c = console.make_console()
    states = states_or_records(paths)
    if watch and c.is_terminal and not status.is_done(states):
        from rich.live import Live

        rows = max(5, c.height - 8)  # a live view fits the terminal: problems and running cells first
        with Live(console.status_view(states, only, summary, rows), console=c, auto_refresh=False) as live:
            backoff, wait_s = Backoff(interval_s), interval_s
            while not status.is_done(states):
                time.sleep(wait_s)
                before = _seen(states)
                states = states_or_records(paths)
                wait_s = backoff.after(_seen(states) != before)
                live.update(console.status_view(states, only, summary, rows), refresh=True)
    elif watch:
        wait_for(paths, interval_s)
        states = states_or_records(paths)
    console.table_out(console.status_view(states, only, summary, None))
    say_damaged(paths)
    if check and any(status.needs_rerun(s.state) for s in states):
        return Exit.CELLS_FAILED
    if check and not status.is_done(states):
        return Exit.ACTIVE
    return Exit.OK


def show_cell(paths: SweepPaths, wanted: str) -> Exit:
    """``gpudays show``: one cell (its id or the start of it); CELLS_FAILED when it needs a rerun."""
    ids = paths.cell_ids()
    say_damaged(paths)
    matches = SweepPaths.named(ids, wanted)
    if len(matches) != 1:
        what = "no cell" if not matches else f"{len(matches)} cells ({', '.join(matches[:5])})"
        verb = "matches" if not matches else "match"
        more = " ..." if len(ids) > 20 else ""
        raise CommandError(f"{what} of {paths.root} {verb} {wanted!r}; its cells: {', '.join(ids[:20])}{more}")
    (cid,) = matches
    state = next(s for s in states_or_records(paths) if s.cell_id == cid)
    attempts = status.read_attempts(paths, cid)
    logs = sorted(p for a in attempts if a.job_id for p in paths.job_dir(a.job_id).glob("*_log.*") if p.is_file())
    traceback = state.record.traceback if state.record is not None else None
    if not isinstance(traceback, str) or not traceback:
        traceback = None
    logged = status.job_logs(paths, state.job_id) if state.job_id else ()
    tails = [(p, t) for p in logged if (t := _tail(p)) and t.strip()]  # the job's output and error: either may say
    console.make_console().print(console.cell_detail(state, attempts, logs, traceback, tails))
    return Exit.CELLS_FAILED if status.needs_rerun(state.state) else Exit.OK


def _tail(path: Path, max_bytes: int = 8192) -> str | None:
    """The end of a log (where a job that died without a record left its traceback)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode(errors="replace") or None
    except OSError:
        return None


def budget_text(hours: float) -> str:
    """An adaptive sweep's budget in words."""
    return "no budget limit" if math.isinf(hours) else f"{hours:g} GPU-hours"


def adaptive_state(paths: SweepPaths) -> AdaptiveState:
    """The adaptive sweep's state; CommandError where its file is damaged."""
    try:
        return read_state(paths)
    except BadAdaptiveState as e:
        raise CommandError(str(e)) from e


def describe(paths: SweepPaths) -> str | None:
    """``status``'s line about an adaptive sweep (None for any other sweep)."""
    if not is_adaptive(paths):
        return None
    state = adaptive_state(paths)
    grid = len(read_grid(paths.adaptive_grid))
    head = f"adaptive sweep: {grid} cells, {len(state.chosen())} chosen in {len(state.rounds)} round(s)"
    goal = f"target ±{state.target_pct:g}%, {budget_text(state.budget_gpu_hours)}"
    if state.stopped is not None:
        s = state.stopped
        widest = "unknown" if math.isinf(s.widest_pct) else f"±{s.widest_pct:.1f}%"
        return (f"{head}; stopped ({STOP_REASONS.get(s.reason, s.reason)}): {s.measured} measured, "
                f"{figure(s.spent_gpu_hours, 3)} GPU-hours, widest unmeasured interval {widest} ({goal})")  # fmt: skip
    return (
        f"{head}; round {len(state.rounds)} is the latest ({goal}); once it has ended, "
        f"`{shell_hint('gpudays', 'resume', paths.root)}` decides the next"
    )


def rounds_to_go(paths: SweepPaths) -> bool:
    """True for an adaptive sweep that has not stopped (``status --check`` then says it is not done)."""
    return is_adaptive(paths) and adaptive_state(paths).stopped is None


def measured_before(sweep_dir: Path, cell_ids: list[str]) -> tuple[Path, int] | None:
    """The latest other sweep folder beside ``sweep_dir`` (a sweep folder of the same default name's family, e.g.
    an earlier ``sweeps/gpudays/<time>``) holding records of some of ``cell_ids``, and how many of them it holds."""
    found: list[tuple[float, Path, int]] = []
    try:
        siblings = [p for p in sweep_dir.parent.iterdir() if p != sweep_dir and p.is_dir()]
    except OSError:
        return None
    for folder in siblings:
        paths = SweepPaths(folder)
        held = sum(1 for cid in cell_ids if paths.record(cid).is_file())
        if held:
            found.append((folder.stat().st_mtime, folder, held))
    if not found:
        return None
    _, folder, held = max(found)
    return folder, held


def say_measured_before(sweep_dir: Path, cell_ids: list[str]) -> None:
    """A sweep into a new folder of cells an earlier sweep beside it measured: said, with how to reuse those."""
    if sweep_dir.exists() or not cell_ids or (earlier := measured_before(sweep_dir, cell_ids)) is None:
        return
    folder, held = earlier
    console.note(
        f"{held} of these {len(cell_ids)} cell(s) were measured already in {folder}, and are measured again in the "
        f"new folder {sweep_dir}; to reuse them, `{shell_hint('gpudays', 'report', folder)}` reports those records "
        f"and `{shell_hint('gpudays', 'resume', folder)}` reruns only the cells there that need it (--dir "
        f"{shlex.quote(str(folder))} sweeps into that folder)"
    )
