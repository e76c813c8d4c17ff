"""The tables ``gpudays`` prints (the plan with its predictions, the measured cells, the state of every cell),
each a :class:`orchestrator.cli.display.tabular.Tabular`: fitted to the terminal, or every column as CSV or JSON.

Each table states the order its columns are left out in on a narrow terminal (``Column.drop``: the highest first;
0 never): the columns that carry the answer (model, GPU, GPU count, micro-batch, step time, days, GPU-hours,
dollars) are never left out. The README's "Tables on a narrow terminal" lists the orders.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from rich.text import Text

from orchestrator.cells.row import CELL_KEYS
from orchestrator.cells.row import row as row_of
from orchestrator.cli.display.answers import MEASURED, PREDICTED, answer_lines
from orchestrator.cli.display.tabular import Column, Tabular, fmt, missing, printable
from orchestrator.config.prices import cloud_prices, price_note
from orchestrator.config.values import Row
from orchestrator.store.states import UNFIXABLE, State

if TYPE_CHECKING:
    import pandas as pd

    from orchestrator.planning.plan import Plan
    from orchestrator.submission.status import CellState

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


def state_style(state: object) -> str:
    """The colour of a state (or a state's name); red for anything else."""
    return next((style for known, style in STATE_STYLE.items() if known == state), "red")


def _text(key: str, value: object) -> Text:
    text = fmt(value)
    return Text(text, style=state_style(text) if key in ("status", "state") else "")


CELL_COLUMNS = (
    Column("cell_id", "cell", drop=4),
    Column("model", "model"),
    Column("gpu", "gpu"),
    Column("num_gpus", "gpus", numeric=True),
    Column("num_nodes", "nodes", numeric=True, drop=6),
    Column("sharding", "sharding", drop=2),
    Column("activation_checkpointing", "ckpt", drop=3),
    Column("status", "status", drop=1),
    Column("micro_batch_size", "mb", numeric=True),
    Column("step_time_s", "step_s", numeric=True),
    Column("peak_memory_gib", "mem_gib", numeric=True, drop=8),
    Column("time_to_train_days", "days", numeric=True),
    Column("gpu_hours", "gpu_h", numeric=True),
    Column("cost_usd_cloud", "usd_cloud", numeric=True),
    Column("cost_usd_amortised", "usd_amortised", numeric=True, drop=9),
    Column("energy_kwh", "kwh", numeric=True, drop=10),
    Column("predicted_step_time_s", "pred_step_s", numeric=True, drop=11),
    Column("reason", "reason", wrap=True, drop=5),
)
"""The measured-cells table (``report``, the end of a sweep); left out first: pred_step_s, kwh, usd_amortised,
mem_gib, nodes, reason, cell, ckpt, sharding, status. Where what is left makes two rows alike, the first column of
that order read backwards (status, sharding, ckpt, cell...) that tells them apart is kept (``choose_columns``)."""

PLAN_COLUMNS = (
    Column("cell_id", "cell", drop=5),
    Column("model", "model"),
    Column("gpu", "gpu"),
    Column("num_gpus", "gpus", numeric=True),
    Column("num_nodes", "nodes", numeric=True, drop=6),
    Column("setting", "setting"),
    Column("runs", "runs", drop=8),
    Column("fits", "fits", drop=2),
    Column("predicted_micro_batch_size", "mb", numeric=True),
    Column("predicted_peak_memory_gib", "mem_gib", numeric=True, drop=3),
    Column("of_gib", "of_gib", numeric=True, drop=4),
    Column("predicted_peak_memory_gib_90", "mem_gib_90%", drop=10),
    Column("predicted_step_time_s", "step_s", numeric=True),
    Column("predicted_step_time_s_90", "step_s_90%", drop=11),
    Column("predicted_time_to_train_days", "days", numeric=True),
    Column("predicted_time_to_train_days_90", "days_90%", drop=7),
    Column("predicted_wall_clock_days", "wall_days", numeric=True, drop=14),
    Column("predicted_gpu_hours", "gpu_h", numeric=True),
    Column("predicted_cost_usd_cloud", "usd_cloud", numeric=True),
    Column("predicted_cost_usd_amortised", "usd_amortised", numeric=True, drop=9),
    Column("predicted_energy_kwh", "kwh", numeric=True, drop=12),
    Column("predicted_basis", "basis", drop=13),
)
"""The plan; left out first: wall_days (the one-line answer gives it), basis, kwh, step_s_90%, mem_gib_90%, usd_amortised, runs, days_90%, nodes, cell,
of_gib, mem_gib, fits."""

STATUS_COLUMNS = (
    Column("cell_id", "cell"),
    Column("state", "state"),
    Column("attempt", "try", numeric=True, drop=3),
    Column("slurm_job_id", "job", drop=2),
    Column("label", "settings", wrap=True),
    Column("reason", "reason", wrap=True, drop=1),
)
"""``gpudays status``; left out first: try, job, reason; the settings and the reason wrap (down to
``MIN_WRAP_WIDTH`` each) before any of them is left out."""

# The tables of ``gpudays budget`` and ``gpudays shortest`` (orchestrator/cli/budget.py).
MODEL_COLUMNS = (
    Column("model", "model"), Column("gpu", "gpu"), Column("source", "source", drop=3),
    Column("num_gpus", "num_gpus", numeric=True), Column("layout", "layout", drop=4),
    Column("days", "days", numeric=True), Column("wall_clock_days", "wall_clock_days", numeric=True, drop=8),
    Column("gpu_hours", "gpu_hours", numeric=True), Column("tokens", "tokens", numeric=True, drop=1),
    Column("tokens_per_parameter", "tokens_per_parameter", numeric=True, drop=5),
    Column("tokens_vs_compute_optimal", "tokens_vs_compute_optimal", numeric=True, drop=6),
    Column("mfu", "mfu", numeric=True, drop=7), Column("cloud_cost_usd", "cloud_cost_usd", numeric=True),
)  # fmt: skip
"""``budget``'s (a) on a terminal; left out for width first: wall_clock_days, mfu, tokens_vs_compute_optimal, tokens_per_parameter,
layout, source, tokens."""
OPTIMAL_COLUMNS = (
    Column("gpu", "gpu"), Column("choice", "choice"), Column("model", "model"),
    Column("tokens", "tokens", numeric=True, drop=2), Column("num_gpus", "num_gpus", numeric=True),
    Column("layout", "layout", drop=4), Column("memory_gib", "memory_gib", numeric=True, drop=6),
    Column("mfu", "mfu", numeric=True, drop=7), Column("days", "days", numeric=True),
    Column("wall_clock_days", "wall_clock_days", numeric=True, drop=8),
    Column("gpu_hours", "gpu_hours", numeric=True), Column("budget_used_pct", "budget_used_pct", numeric=True, drop=5),
    Column("cloud_cost_usd", "cloud_cost_usd", numeric=True),
)  # fmt: skip
"""``budget``'s (b); left out first: wall_clock_days, mfu, memory_gib, budget_used_pct, layout, tokens."""
SHORTEST_COLUMNS = (
    Column("model", "model"), Column("gpu", "gpu"), Column("parallelism", "parallelism"),
    Column("point", "point"), Column("global_batch_size", "global_batch_size", numeric=True, drop=5),
    Column("num_gpus", "num_gpus", numeric=True), Column("layout", "layout", drop=4),
    Column("step_time_s", "step_time_s", numeric=True, drop=3), Column("mfu", "mfu", numeric=True, drop=6),
    Column("days", "days", numeric=True), Column("wall_clock_days", "wall_clock_days", numeric=True, drop=8),
    Column("gpu_hours", "gpu_hours", numeric=True), Column("cloud_cost_usd", "cloud_cost_usd", numeric=True),
)  # fmt: skip
"""``shortest``; left out first: wall_clock_days, mfu, global_batch_size, layout, step_time_s."""


UNFIXABLE_NOTE = "a rerun cannot fix this; not resubmitted"


def _setting(label: str, prefix: str) -> str:
    """A cell's label without its model, GPU and count (``zero0 bf16 mb=auto``)."""
    return label[len(prefix) :].strip() if label.startswith(prefix) else label


def _present(columns: Iterable[Column], rows: Sequence[Mapping[str, object]]) -> list[Column]:
    """The columns some row has a value for (older predictors and frames lack some)."""
    return [c for c in columns if any(not missing(r.get(c.key)) for r in rows)]


def cells_table(frame: pd.DataFrame | None, max_rows: int | None = None) -> Tabular:
    """The measured cells (the report's cells frame) and, under them, the one-line answers; ``--format``
    prints cells.csv's columns."""
    if frame is None or len(frame) == 0:
        return Tabular(CELL_COLUMNS, [], empty="(no cells)")
    from analysis.report.tables import csv_cells, settings_label
    from analysis.report.writer import CELLS_COLUMNS

    data = csv_cells(frame, CELLS_COLUMNS)
    rows = data.to_dict(orient="records")
    for row, full in zip(rows, frame.to_dict(orient="records"), strict=True):
        row["setting"] = settings_label(full)
    shown = rows if max_rows is None else rows[:max_rows]
    caption = f"... and {len(rows) - max_rows} more (all in cells.csv)" if max_rows and len(rows) > max_rows else None
    answers = ["", "the answer, fastest measured setting per model × GPU type × count:"]
    return Tabular(_present(CELL_COLUMNS, rows), shown, caption=caption, data=data.to_dict(orient="records"),
                   footer=[*answers, *(f"  {a}" for a in answer_lines(rows, MEASURED))], text=_text)  # fmt: skip


def plan_rows(plan: Plan) -> list[Row]:
    """Every cell of a plan with its prediction, those refused for not fitting included (``runs`` no): the cell's
    columns (``orchestrator.cells.row``, as every table of cells has them; the prediction's settings are the same
    row's), its label, whether it runs and fits, and the prediction."""
    rows: list[Row] = []
    for cell, runs in [(c, "yes") for c in plan.cells] + [(c, "no") for c in plan.skipped if c.prediction]:
        p, t, flat = cell.prediction, cell.typed, row_of(cell.typed)
        fits = p.get("predicted_fits")
        prefix = f"{t.model.name} {t.gpu.name} x{t.num_gpus}" + (f" on {t.num_nodes} nodes" if t.num_nodes > 1 else "")
        row: Row = {"cell_id": cell.cell_id, **{k: flat[k] for k in CELL_KEYS}}
        row.update(label=cell.label, setting=_setting(cell.label, prefix), runs=runs)
        row.update(fits="?" if missing(fits) else ("yes" if fits else "NO"), of_gib=flat["gpu_memory_gib"])
        row.update(p)
        row["answered"] = runs == "yes" and not missing(fits) and bool(fits)
        no_time = missing(p.get("predicted_time_to_train_days"))
        row["why"] = "predicted not to fit" if row["fits"] == "NO" else "no step time predicted" if no_time else ""
        rows.append(row)
    return rows


HIDDEN = ("answered", "why", "fits", "setting")
"""Keys of a plan row the terminal reads and ``--format`` leaves out (``fits`` is ``predicted_fits``; ``label``,
the cell's whole label as ``status`` gives it, holds ``setting``)."""
MACHINE_NAMES = {"of_gib": "gpu_memory_gib"}
"""A plan row's keys as ``--format`` names them: the GPU's memory with its unit."""


def _own_engine(row: Row) -> Row:
    """The row with every other engine's settings empty, as in cells.csv: an FSDP cell has no ZeRO stage."""
    from orchestrator.engines.registry import engine_specs

    for spec in engine_specs():
        if spec.name != row.get("engine"):
            row.update(dict.fromkeys(k for k in (*spec.identity_always, *spec.identity_if_set) if k in row))
    return row


def plan_table(plan: Plan) -> Tabular:
    """Every cell of a plan with its prediction, then the one-line answers; ``--format`` prints every column."""
    rows = plan_rows(plan)
    answers = ["", "the answer, fastest predicted setting per model × GPU type × count:"]
    for row in rows:
        mb = row.get("predicted_micro_batch_size")
        if not missing(mb):
            row["setting"] = str(row["setting"]).replace("mb=auto", f"mb={fmt(mb)}")
    data = [_own_engine({MACHINE_NAMES.get(k, k): v for k, v in r.items() if k not in HIDDEN and not k.endswith("_90")})
            for r in rows]  # fmt: skip
    lines = [*answers, *(f"  {a}" for a in answer_lines(rows, PREDICTED))]
    priced = [*plan.cells, *(c for c in plan.skipped if c.prediction)]
    lines.append(price_note(cloud_prices(c.typed.gpu for c in priced)))
    return Tabular(_present(PLAN_COLUMNS, rows), rows, footer=lines, data=data, text=_text)


def rows_table(rows: Sequence[Mapping[str, object]], numeric: Sequence[str] = (), keep: Sequence[str] = ()) -> Tabular:
    """Rows of plain values as a table, their keys as the headers; the first column and those of ``keep`` are never
    left out, the others from the last."""
    keys = list(rows[0]) if rows else []
    columns = [Column(k, k, numeric=k in numeric, drop=0 if i == 0 or k in keep else i) for i, k in enumerate(keys)]
    return Tabular(columns, rows, text=_text)


def status_rows(states: Sequence[CellState]) -> list[Row]:
    """One row a cell: its state, attempt, job, settings, reason, what the scheduler said (``--format``)."""
    rows: list[Row] = []
    for s in states:
        reason = s.reason if s.reason and s.state != State.OK else ""
        if s.state in UNFIXABLE:
            reason = f"{reason} ({UNFIXABLE_NOTE})" if reason else UNFIXABLE_NOTE
        rows.append({
            "cell_id": s.cell_id, "state": str(s.state), "attempt": s.attempt, "slurm_job_id": s.job_id,
            "label": printable(s.label or ""), "reason": reason, "scheduler_state": s.scheduler_state,
        })  # fmt: skip
    return rows


def status_table(states: Sequence[CellState], only: set[str] | None = None, max_rows: int | None = None) -> Tabular:
    """A table of cells, problems first (``SHOW_ORDER``); ``only`` keeps those states, ``max_rows`` cuts the rest."""
    order = {s: i for i, s in enumerate(SHOW_ORDER)}
    shown = sorted(
        (s for s in states if only is None or s.state in only),
        key=lambda s: (order.get(s.state, len(order)), s.label or "", s.cell_id),
    )
    rows = status_rows(shown if max_rows is None else shown[:max_rows])
    cut = max_rows is not None and len(shown) > max_rows
    caption = f"... and {len(shown) - (max_rows or 0)} more (gpudays status shows all)" if cut else None
    return Tabular(STATUS_COLUMNS, rows, caption=caption, data=status_rows(shown), text=_text, empty="(no cells)")
