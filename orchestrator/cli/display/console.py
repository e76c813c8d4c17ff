"""Everything the ``gpudays`` command shows on a terminal, rendered with rich in one place.

The tables themselves (the plan, the measured cells, the state of every cell) are ``orchestrator.cli.display.views``, fitted
to the terminal by ``orchestrator.cli.display.tabular``; here are the consoles they print on, one cell in detail, the lines a
local run prints while it goes, and the messages on stderr. Output that is piped or captured is no terminal: a
table is printed at its full width, so that ids and states never wrap and a script can read the lines. With
``--format csv|json`` stdout carries the table's data alone, and every other line goes to stderr.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from orchestrator.cli.display import tabular
from orchestrator.cli.display.figures import figure
from orchestrator.cli.display.tabular import Tabular, fmt, printable
from orchestrator.cli.display.views import SHOW_ORDER as SHOW_ORDER  # the tables, as every caller has named them
from orchestrator.cli.display.views import STATE_STYLE as STATE_STYLE
from orchestrator.cli.display.views import UNFIXABLE_NOTE as UNFIXABLE_NOTE
from orchestrator.cli.display.views import cells_table as cells_table
from orchestrator.cli.display.views import plan_table as plan_table
from orchestrator.cli.display.views import rows_table as rows_table
from orchestrator.cli.display.views import state_style as state_style
from orchestrator.cli.display.views import status_table as status_table
from orchestrator.store.attempts import Attempt
from orchestrator.store.states import ACTIVE
from orchestrator.submission.status import CellState, counts

if TYPE_CHECKING:
    from rich.live import Live
    from rich.progress import Progress, TaskID

    from orchestrator.planning.plan import Plan
    from orchestrator.submission.local import LocalRun

PIPED_WIDTH = 100_000
"""The width of a console that is no terminal: wide enough that no table or line is ever wrapped or cut."""
_FORMAT = ["table"]


def set_format(form: str) -> None:
    """``table`` (the default), ``csv`` or ``json``: how this process prints its tables (``--format``)."""
    if form not in tabular.FORMATS:
        raise ValueError(f"--format {form}: use {', '.join(tabular.FORMATS)}")
    _FORMAT[0] = form


class _Console(Console):
    """rich's console, except that a closed stdout (piped into ``head``) is the command line's to end: rich's own
    answer is ``SystemExit(1)``, which reads as "a cell needs a rerun"."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(32, "Broken pipe")


def make_console(stderr: bool = False, width: int | None = None) -> Console:
    """A console on stdout (or stderr). A terminal (rich's judgement, ``COLUMNS`` and ``TTY_COMPATIBLE`` included)
    has its own width; anything else no colours and a width that never wraps. Under ``--format csv|json`` the
    stdout console is stderr's: stdout carries the data alone (``table_out``). ``width`` fits it to that many
    columns, terminal or not."""
    stream = sys.stderr if stderr or _FORMAT[0] != "table" else sys.stdout
    if width:
        return _Console(file=stream, highlight=False, width=width)
    probe = Console(file=stream)
    tty = probe.is_terminal
    return _Console(file=stream, highlight=False, width=None if tty else PIPED_WIDTH, soft_wrap=not tty)


def table_out(view: Tabular) -> None:
    """A table on stdout: fitted to the terminal (with its header and answer lines), or its data as CSV or JSON."""
    if _FORMAT[0] == "table":
        make_console().print(view)
    else:
        sys.stdout.write(tabular.machine_text(view, _FORMAT[0]))
        sys.stdout.flush()


def _t(text: str, style: str | None = None) -> Text:
    return Text(printable(text), style=style or "")


def out(text: str) -> None:
    """A plain line on stdout (no markup interpreted: paths and overrides are shown as given)."""
    make_console().print(_t(text))


def error(text: str) -> None:
    """``gpudays: error: ...`` on stderr."""
    make_console(stderr=True).print(_t(f"gpudays: error: {text}"))


def note(text: str) -> None:
    """``gpudays: ...`` on stderr: something a reader should know that is not an error."""
    make_console(stderr=True).print(_t(f"gpudays: {text}"))


def plan_summary(plan: Plan, preview: bool = False) -> RenderableType:
    """Where the sweep goes, how many cells run, which are refused and why. A ``preview`` (plan, dry run) writes
    nothing: the folder is the one a sweep of these cells would use, and said so where it does not exist yet."""
    folder = f"sweep folder: {plan.sweep_dir}"
    if preview and not plan.sweep_dir.exists():
        folder = f"sweep folder a sweep of these cells would use (not created): {plan.sweep_dir}"
    lines = [_t(folder)]
    dup = f", {plan.duplicates} duplicate(s) merged" if plan.duplicates else ""
    lines.append(_t(f"{len(plan.cells)} cell(s) to measure, {len(plan.skipped)} refused before submission{dup}"))
    for cell in plan.skipped:
        reasons = "; ".join(str(r) for r in cell.refusals)
        lines.append(_t(f"  skipped {cell.label} ({' '.join(cell.overrides)}): {reasons}"))
    return Group(*lines)


def status_view(
    states: Sequence[CellState], only: set[str] | None, summary_only: bool, max_rows: int | None
) -> Tabular:
    """What ``gpudays status`` shows: the counts per state, and the table unless ``summary_only``."""
    view = status_table(states, only, max_rows)
    if summary_only:
        rows = [{"state": str(state), "cells": n} for state, n in counts(states).items()]
        view = Tabular(view.columns, rows, brief=True)
    view.header = summary_line(states)
    return view


def summary_line(states: Sequence[CellState], markup: bool = True) -> Text:
    """``12 cell(s): ok 9, running 2, failed 1``, in the order of ``STATES``; ``markup``: each state in its colour."""
    text = _t(f"{len(states)} cell(s): ")
    parts = counts(states)
    for i, (state, n) in enumerate(parts.items()):
        text.append(f"{state} {n}", style=state_style(state) if markup else None)
        if i < len(parts) - 1:
            text.append(", ")
    if not parts:
        text.append("none")
    return text


MEASURED_FIGURES = (
    ("micro_batch_size", ""), ("grad_accum_steps", ""), ("step_time_s", " s"), ("step_time_ci95_pct", " %"),
    ("steps_timed", ""), ("tokens_per_s", ""), ("tokens_per_s_per_gpu", ""), ("model_tflops_per_gpu", ""),
    ("mfu", ""), ("hfu", ""), ("peak_memory_allocated_gib", " GiB"), ("peak_memory_reserved_gib", " GiB"),
    ("host_rss_gib", " GiB"), ("probe_wall_s", " s"),
)  # fmt: skip
"""What ``gpudays show`` prints of a cell's record, where it has them: the figures the probe measured."""
SUBMITIT_LOG = re.compile(r"^submitit (DEBUG|INFO|WARNING|ERROR) \(")
"""submitit's own log lines in a job's output (``Loading pickle``, ``Job completed``): not what the job said."""


def cell_detail(
    state: CellState,
    attempts: Sequence[Attempt],
    logs: Sequence[Path],
    traceback: str | None,
    log_tails: Sequence[tuple[Path, str]] = (),
) -> Group:
    """One cell: state, reason, attempts with their job ids, log files, the tail of its traceback and of each of
    ``log_tails`` (its latest job's output and error)."""
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    t.add_row("cell", _t(state.cell_id))
    t.add_row("settings", _t(state.label or "-"))
    t.add_row("state", _t(state.state, style=state_style(state.state)))
    t.add_row("reason", _t(state.reason or "-"))
    if state.scheduler_state:
        t.add_row(
            "scheduler",
            _t(state.scheduler_state + (f" (before: {', '.join(state.history)})" if state.history else "")),
        )
    if state.record is not None:
        for name, unit in MEASURED_FIGURES:
            value = state.record.metrics.get(name)
            if value is not None and not isinstance(value, (list, dict)):
                t.add_row(name, _t(f"{fmt(value)}{unit}"))
    parts: list[RenderableType] = [t]
    if attempts:
        a = Table(show_edge=False, pad_edge=False, header_style="bold", box=None, title_justify="left")
        for col in ("attempt", "job", "backend", "submitted"):
            a.add_column(col, no_wrap=True)
        for entry in attempts:
            job = entry.job_id or f"(cut short: job {entry.token} not found yet)"
            a.add_row(*(_t(fmt(v)) for v in (entry.attempt, job, entry.backend, entry.submitted_at)))
        parts += [_t("attempts", style="bold"), a]
    if logs:
        parts += [_t("logs", style="bold"), *(_t(f"  {p}") for p in logs)]
    if traceback:
        lines = traceback.rstrip().splitlines()
        cut = f"  ... {len(lines) - 20} earlier line(s)\n" if len(lines) > 20 else ""
        parts += [_t("traceback (tail)", style="bold"), _t(cut + "\n".join(lines[-20:]))]
    for path, text in log_tails:
        lines = text.rstrip().splitlines()[-15:]
        parts += [_t(f"{path.name} (tail, {path})", style="bold"), _t("\n".join(lines))]
    return Group(*parts)


def files_written(files: Sequence[Path]) -> Group:
    """``wrote PATH``, a line for every file a command wrote."""
    return Group(*(_t(f"wrote {f}") for f in files))


def problems(found: Sequence[str]) -> Group:
    """The report's problems (missing, corrupt or failed records...), a line each."""
    return Group(*(_t(f"  problem: {p}") for p in found))


def _last_line(logs: Sequence[Path], max_bytes: int = 4096) -> str:
    """The last line the job said (submitit's own log lines left out), from its most recently written log that
    said one; an empty string while there is none."""
    try:
        newest = sorted((p for p in logs if p.is_file()), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    except OSError:  # a log that went away
        return ""
    for log in newest:
        try:
            with open(log, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - max_bytes))
                tail = f.read().decode(errors="replace")
        except OSError:
            continue
        lines = [" ".join(ln.split()) for ln in tail.splitlines() if ln.strip() and not SUBMITIT_LOG.match(ln)]
        if lines:
            return printable(lines[-1][:100])
    return ""


class LocalProgress:
    """What a run on this machine is doing: which cell, for how long, the job's latest log line; a line per cell.

    On a terminal the running cell is one live line; piped, a line when a cell starts, every 30 s while it runs,
    and when it ends. Each cell's time is its own, not the time since the first cell started.
    """

    QUIET_S = 30.0

    def __init__(self, total: int) -> None:
        self.total = total
        self.console = make_console()
        self.index = 0
        self.run: LocalRun | None = None
        self.live: Live | None = None
        self.last_said = 0.0

    def __enter__(self) -> LocalProgress:
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(_t(""), console=self.console, auto_refresh=False, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.live is not None:
            self.live.__exit__(kind, exc, tb)

    def _elapsed_s(self) -> float:
        return time.monotonic() - self.run.started_s if self.run is not None else 0.0

    def _now_line(self) -> Text:
        run = self.run
        assert run is not None, "a line about the running cell once one has started"
        said = _last_line(run.logs)
        text = _t(f"  [{self.index}/{self.total}] {run.cell_id} {run.label}: running, {self._elapsed_s():.0f} s")
        if said:
            text.append(f"  | {said}", style="dim")
        return text

    def start(self, run: LocalRun) -> None:
        self.run, self.index, self.last_said = run, self.index + 1, time.monotonic()
        if self.live is not None:
            self.live.update(self._now_line(), refresh=True)
        else:
            self.console.print(_t(f"  [{self.index}/{self.total}] {run.cell_id} {run.label}: started"))

    def poll(self, run: LocalRun) -> None:
        if self.live is not None:
            self.live.update(self._now_line(), refresh=True)
        elif time.monotonic() - self.last_said >= self.QUIET_S:
            self.last_said = time.monotonic()
            self.console.print(self._now_line())

    def done(self, state: CellState) -> None:
        step = state.record.metrics.step_time_s if state.record is not None else None
        step_txt = f", {figure(step)} s/step" if isinstance(step, (int, float)) else ""
        reason = f": {state.reason}" if state.reason and state.state != "ok" else ""
        line = _t(f"  [{self.index}/{self.total}] {state.cell_id} ")
        line.append(state.state, style=state_style(state.state))
        line.append(f"{step_txt} in {self._elapsed_s():.0f} s{reason}")
        if self.live is not None:
            self.live.console.print(line)
        else:
            self.console.print(line)


class WaitProgress:
    """Waiting for a sweep: a progress bar on a terminal, a line per change of the counts when piped."""

    def __init__(self, total: int) -> None:
        self.console = make_console()
        self.total = total
        self.last = ""
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    def __enter__(self) -> WaitProgress:
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                TextColumn("waiting"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=self.console,
            )
            self.progress.__enter__()
            self.task = self.progress.add_task("", total=self.total)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.progress is not None:
            self.progress.__exit__(kind, exc, tb)

    def update(self, states: Sequence[CellState]) -> None:
        line = summary_line(states, markup=False)
        plain = line.plain if isinstance(line, Text) else str(line)
        if self.progress is not None and self.task is not None:
            ended = sum(1 for s in states if s.state not in ACTIVE)
            self.progress.update(self.task, completed=ended, total=len(states), description=plain)
        elif plain != self.last:
            self.console.print(_t(f"  [{time.strftime('%H:%M:%S')}] {plain}"))
        self.last = plain
