"""Everything the ``gpudays`` command shows on a terminal, rendered with rich in one place.

Tables (the plan with its predictions, the measured cells, the state of every cell, one cell in detail), the
lines a local run prints while it goes, and the messages on stderr. Output that is piped or captured gets a wide
fixed width, so that ids and states never wrap and a script can read the lines.
"""

from __future__ import annotations

import math
import sys
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from orchestrator.attempts import Attempt
from orchestrator.states import ACTIVE, UNFIXABLE, State
from orchestrator.status import counts

# Columns of the measured-cells table, with their short headers; cost columns are shown where the frame has them.
CELL_COLUMNS = {
    "cell_id": "cell",
    "model": "model",
    "gpu": "gpu",
    "num_gpus": "gpus",
    "num_nodes": "nodes",
    "engine": "engine",
    "zero_stage": "zero",
    "activation_checkpointing": "ckpt",
    "status": "status",
    "micro_batch_size": "mb",
    "step_time_s": "step_s",
    "peak_memory_gib": "mem_gib",
    "time_to_train_days": "days",
    "gpu_hours": "gpu_h",
    "cost_usd_cloud": "usd_cloud",
    "cost_usd_amortised": "usd_amortised",
    "energy_kwh": "kwh",
    "predicted_step_time_s": "pred_step_s",
    "reason": "reason",
}
# The plan's prediction columns (analysis.predict), shown where present, so older and newer predictors both work.
PLAN_PREDICTION_COLUMNS = {
    "predicted_micro_batch_size": "mb",
    "predicted_peak_memory_gib": "mem_gib",
    "predicted_peak_memory_gib_90": "mem_gib_90%",
    "predicted_step_time_s": "step_s",
    "predicted_step_time_s_90": "step_s_90%",
    "predicted_time_to_train_days": "days",
    "predicted_time_to_train_days_90": "days_90%",
    "predicted_gpu_hours": "gpu_h",
    "predicted_cost_usd_cloud": "usd_cloud",
    "predicted_cost_usd_amortised": "usd_amortised",
    "predicted_energy_kwh": "kwh",
    "predicted_basis": "basis",
}
STATE_STYLE: dict[State, str] = {
    State.NEW: "white",
    State.PENDING: "cyan",
    State.HELD: "yellow",
    State.RUNNING: "blue",
    State.OK: "green",
    State.DOES_NOT_FIT: "yellow",
    State.OOM: "yellow",
    State.INVALID: "red",
    State.FAILED: "red",
    State.HOST_OOM: "red",
    State.TIMEOUT: "magenta",
    State.PREEMPTED: "magenta",
    State.NODE_FAIL: "magenta",
    State.CANCELLED: "bright_black",
    State.CORRUPT: "red",
    State.LOST: "red",
    State.UNKNOWN: "white",
}
"""The colour of every cell state; a status that is no state (a record's ``comm_error``) is a problem, in red."""
SHOW_ORDER: tuple[State, ...] = (
    # Problems first, then what waits for a person, then what is still going on, then the answers.
    *(State.CORRUPT, State.LOST, State.INVALID, State.FAILED, State.HOST_OOM, State.TIMEOUT, State.NODE_FAIL),
    *(State.PREEMPTED, State.CANCELLED, State.HELD, State.NEW, State.UNKNOWN),
    *(State.PENDING, State.RUNNING, State.OK, State.DOES_NOT_FIT, State.OOM),
)
"""The order of the rows of ``gpudays status``: every state once."""


def state_style(state: Any) -> str:
    """The colour of a state (or a state's name); red for anything else."""
    return STATE_STYLE.get(state, "red")


def make_console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr); not a terminal: no colours and a width that never wraps ids."""
    stream = sys.stderr if stderr else sys.stdout
    tty = stream.isatty()
    return Console(file=stream, highlight=False, width=None if tty else 200, soft_wrap=not tty)


def printable(text: str) -> str:
    """Text any terminal can take: undecodable bytes (surrogates) as ``\\udcff``, control characters escaped."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    # Control characters (a terminal's escape sequences) in a record or a name are shown, not obeyed.
    return "".join(c if c in "\n\t" or unicodedata.category(c) != "Cc" else repr(c)[1:-1] for c in text)


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


def fmt(value: Any) -> str:
    """A number with four significant digits (thousands grouped), yes/no, or a dash for a missing value."""
    if value is None or value is _NA or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return "yes" if value else "no"
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        v = float(value)
        if v == 0:
            return "0"
        return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    return printable(" ".join(str(value).split()))


def _na() -> Any:
    try:
        import pandas as pd

        return pd.NA
    except ImportError:  # pragma: no cover - pandas is a dependency
        return object()


_NA = _na()


def _table(columns: dict[str, str], rows: Iterable[dict[str, Any]], numeric: Sequence[str] = ()) -> Table:
    t = Table(show_edge=False, pad_edge=False, header_style="bold", box=None)
    for key, header in columns.items():
        t.add_column(header, justify="right" if key in numeric else "left", no_wrap=key != "reason")
    for row in rows:
        t.add_row(*(_cell_text(key, row.get(key)) for key in columns))
    return t


def _cell_text(key: str, value: Any) -> Text:
    text = fmt(value)
    if key in ("status", "state"):
        return _t(text, style=state_style(text))
    return _t(text[:117] + "..." if len(text) > 120 else text)


def _numeric(frame: Any, columns: Iterable[str]) -> list[str]:
    import pandas as pd

    return [c for c in columns if c in frame.columns and pd.api.types.is_numeric_dtype(frame[c])]


def cells_table(frame: Any, max_rows: int | None = None) -> RenderableType:
    """The measured cells (the report's cells frame): settings, outcome, time, GPU-hours, cost and energy."""
    if frame is None or len(frame) == 0:
        return _t("(no cells)")
    columns = {k: v for k, v in CELL_COLUMNS.items() if k in frame.columns}
    if "reason" in columns and not frame["reason"].notna().any():
        del columns["reason"]
    shown = frame if max_rows is None else frame.head(max_rows)
    t = _table(columns, shown.to_dict(orient="records"), _numeric(frame, columns))
    if max_rows is not None and len(frame) > max_rows:
        t.caption = f"... and {len(frame) - max_rows} more (all in cells.csv)"
    return t


def plan_table(plan: Any) -> RenderableType:
    """Every cell of a plan with its prediction: fit, micro-batch, memory, step time, days, GPU-hours, cost, kWh."""
    rows = []
    for cell, runs in [(c, "yes") for c in plan.cells] + [(c, "no") for c in plan.skipped if c.prediction]:
        p = cell.prediction
        fits = p.get("predicted_fits")
        row = {
            "cell_id": cell.cell_id,
            "cell": cell.label,
            "runs": runs,
            "fits": "?" if fits is None or fits is _NA else ("yes" if bool(fits) else "NO"),
            "of_gib": cell.config["gpu"]["memory_gib"],
        }
        row.update({k: p.get(k) for k in PLAN_PREDICTION_COLUMNS if k in p})
        rows.append(row)
    present = [k for k in PLAN_PREDICTION_COLUMNS if any(k in r for r in rows)]
    columns = {"cell_id": "cell_id", "cell": "cell", "runs": "runs", "fits": "fits"}
    columns.update({k: PLAN_PREDICTION_COLUMNS[k] for k in present})
    if "predicted_peak_memory_gib" in columns:
        # The GPU's memory right after the prediction of its use.
        ordered = {}
        for k, v in columns.items():
            ordered[k] = v
            if k == "predicted_peak_memory_gib":
                ordered["of_gib"] = "of_gib"
        columns = ordered
    numeric = [*present, "of_gib"]
    return _table(columns, rows, numeric)


def rows_table(rows: Sequence[Mapping[str, object]], numeric: Sequence[str] = ()) -> RenderableType:
    """Rows of plain values as a table, their keys as the headers."""
    return _table({k: k for k in (rows[0] if rows else {})}, [dict(r) for r in rows], numeric)


def plan_summary(plan: Any) -> RenderableType:
    """Where the sweep goes, how many cells run, which are refused and why."""
    lines = [_t(f"sweep folder: {plan.sweep_dir}")]
    dup = f", {plan.duplicates} duplicate(s) merged" if plan.duplicates else ""
    lines.append(_t(f"{len(plan.cells)} cell(s) to measure, {len(plan.skipped)} refused before submission{dup}"))
    for cell in plan.skipped:
        reasons = "; ".join(str(r) for r in cell.refusals)
        lines.append(_t(f"  skipped {cell.label} ({' '.join(cell.overrides)}): {reasons}"))
    return Group(*lines)


def summary_line(states: Sequence[Any], markup: bool = True) -> Text:
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


UNFIXABLE_NOTE = "a rerun cannot fix this; not resubmitted"
_STATUS_COLUMNS = ("cell", "state", "try", "job", "settings", "reason")


def status_table(states: Sequence[Any], only: set[str] | None = None, max_rows: int | None = None) -> Table:
    """A table of cells, problems first (``SHOW_ORDER``); ``only`` keeps those states, ``max_rows`` cuts the rest."""
    order = {s: i for i, s in enumerate(SHOW_ORDER)}
    shown = sorted(
        (s for s in states if only is None or s.state in only),
        key=lambda s: (order.get(s.state, len(order)), s.label or "", s.cell_id),
    )
    rows = []
    for s in shown if max_rows is None else shown[:max_rows]:
        reason = s.reason if s.reason and s.state != State.OK else ""
        if s.state in UNFIXABLE:
            reason = f"{reason} ({UNFIXABLE_NOTE})" if reason else UNFIXABLE_NOTE
        row = (s.cell_id, s.state, s.attempt, s.job_id or "-", s.label or "", reason)
        rows.append(dict(zip(_STATUS_COLUMNS, row, strict=True)))
    t = _table({k: k for k in _STATUS_COLUMNS}, rows, numeric=["try"])
    if max_rows is not None and len(shown) > max_rows:
        t.caption = f"... and {len(shown) - max_rows} more (gpudays status shows all)"
    return t


def status_view(states: Sequence[Any], only: set[str] | None, summary_only: bool, max_rows: int | None) -> Any:
    """What ``gpudays status`` shows: the counts per state, and the table unless ``summary_only``."""
    line = summary_line(states)
    return line if summary_only else Group(line, status_table(states, only, max_rows))


def cell_detail(state: Any, attempts: Sequence[Attempt], logs: Sequence[Path], traceback: str | None) -> Group:
    """One cell: state, reason, attempts with their job ids, log files, the tail of its traceback."""
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
    return Group(*parts)


def files_written(files: Sequence[Path]) -> Group:
    """``wrote PATH``, a line for every file a command wrote."""
    return Group(*(_t(f"wrote {f}") for f in files))


def problems(found: Sequence[str]) -> Group:
    """The report's problems (missing, corrupt or failed records...), a line each."""
    return Group(*(_t(f"  problem: {p}") for p in found))


def _last_line(logs: Sequence[Path], max_bytes: int = 4096) -> str:
    """The last non-empty line of the most recently written log (what the job said last), or an empty string."""
    try:
        log = max((p for p in logs if p.is_file()), key=lambda p: p.stat().st_mtime_ns)
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - max_bytes))
            tail = f.read().decode(errors="replace")
    except (OSError, ValueError):  # no log yet (max of nothing), or one that went away
        return ""
    lines = [" ".join(line.split()) for line in tail.splitlines() if line.strip()]
    return printable(lines[-1][:100]) if lines else ""


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
        self.run: Any = None
        self.live: Any = None
        self.last_said = 0.0

    def __enter__(self) -> LocalProgress:
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(_t(""), console=self.console, auto_refresh=False, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def _elapsed_s(self) -> float:
        import time

        return time.monotonic() - self.run.started_s if self.run is not None else 0.0

    def _now_line(self) -> Text:
        said = _last_line(self.run.logs)
        text = _t(
            f"  [{self.index}/{self.total}] {self.run.cell_id} {self.run.label}: running, {self._elapsed_s():.0f} s"
        )
        if said:
            text.append(f"  | {said}", style="dim")
        return text

    def start(self, run: Any) -> None:
        import time

        self.run, self.index, self.last_said = run, self.index + 1, time.monotonic()
        if self.live is not None:
            self.live.update(self._now_line(), refresh=True)
        else:
            self.console.print(_t(f"  [{self.index}/{self.total}] {run.cell_id} {run.label}: started"))

    def poll(self, run: Any) -> None:
        import time

        if self.live is not None:
            self.live.update(self._now_line(), refresh=True)
        elif time.monotonic() - self.last_said >= self.QUIET_S:
            self.last_said = time.monotonic()
            self.console.print(self._now_line())

    def done(self, state: Any) -> None:
        step = state.record.metrics.step_time_s if state.record is not None else None
        step_txt = f", {step:.4g} s/step" if isinstance(step, (int, float)) else ""
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
        self.progress: Any = None
        self.task: Any = None

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

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def update(self, states: Sequence[Any]) -> None:
        import time

        line = summary_line(states, markup=False)
        plain = line.plain if isinstance(line, Text) else str(line)
        if self.progress is not None:
            ended = sum(1 for s in states if s.state not in ACTIVE)
            self.progress.update(self.task, completed=ended, total=len(states), description=plain)
        elif plain != self.last:
            self.console.print(_t(f"  [{time.strftime('%H:%M:%S')}] {plain}"))
        self.last = plain
