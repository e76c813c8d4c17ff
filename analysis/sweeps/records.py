"""Read sweep folders into one table: a row per cell, with its settings, status, measurements and inputs.

Each cell folder holds ``cell.yaml`` (the resolved config, written before submission) and, once its job ran,
``record.json`` (written by the job). Both are read by :mod:`orchestrator.store.record`, the one reader ``status`` and
``resume`` use too, so a record is ``corrupt`` here exactly when it is there. Anything can be wrong: a record that
is missing (job still queued, or lost) or corrupt, a GPU that ``conf/gpu`` no longer knows. None of that stops
the table: the cell gets a status that says so and a line in ``problems``.

The ``status`` column holds the record's status (``ok``, ``does_not_fit``, ``oom``, ``failed``, ``comm_error``,
``compile_error``, ``timeout``, ``invalid``), ``corrupt`` for a record that cannot be used, and for a cell
without a record its state from ``status`` when given (``pending``, ``lost``...), else ``no_record``.

Rows are flattened to scalars as each record is read, and the parsed JSON is dropped at once, so memory grows
with the table, not with the records' size. Several sweeps merge on the cell id: a cell measured more than once
keeps its newest ``ok`` record (or, with none ok, its newest record of any kind). The id leaves the probe's kind
out, so a plumbing check (``probe.kind=sleep`` or ``fail``) of a cell has the id of its measurement: its record,
which measures nothing, is kept only where no sweep holds a measurement's record of the cell, whatever either's
status and age.
"""

from __future__ import annotations

import contextlib
import gc
import json
import operator
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

import pandas as pd

from analysis.sweeps.catalog import Catalog
from analysis.sweeps.columns import as_int, as_name, as_number
from orchestrator.cells.row import figure_columns, setting_columns
from orchestrator.config.choices import MEASURING_PROBE_KINDS
from orchestrator.config.schema import ProbeConfig
from orchestrator.config.values import ConfigValue, Container, Row, Scalar
from orchestrator.engines.allocator import recorded_expandable
from orchestrator.store import states as vocab
from orchestrator.store.adaptive_state import BadAdaptiveState, read_grid
from orchestrator.store.attempts import damaged_lines
from orchestrator.store.paths import CELL_CONFIG_NAME, RECORD_NAME, SweepPaths
from orchestrator.store.record import (
    METRIC_KINDS,
    BadCellConfig,
    BadRecord,
    Metrics,
    Record,
    read_cell_config,
    read_record,
)

__all__ = ["MEASURED_DOES_NOT_FIT", "MEASURED_FITS", "RESULT_STATUSES", "Catalog", "LoadedCells", "load_cells"]

NO_RECORD = "no_record"
UNMEASURED = "unmeasured"
"""The status of an adaptive sweep's cell that no round chose (``adaptive-grid.jsonl``): its answer is predicted."""
CORRUPT_RECORD = vocab.State.CORRUPT.value
MEASURED_FITS = frozenset(s.value for s in vocab.MEASURED_FITS)
MEASURED_DOES_NOT_FIT = frozenset(s.value for s in vocab.MEASURED_DOES_NOT_FIT)
RESULT_STATUSES = MEASURED_FITS | MEASURED_DOES_NOT_FIT
"""Statuses that are an answer about the cell; every other status is a problem to look at."""

METRIC_KEYS: tuple[str, ...] = tuple(name for name, kind in METRIC_KINDS.items() if kind in (int, float))
"""The metrics that are one number (every field of :class:`orchestrator.store.record.Metrics` but its lists and words),
each a column of the table (``peak_memory_allocated_gib`` as ``peak_memory_gib``)."""
WHOLE_METRIC_KEYS: tuple[str, ...] = tuple(name for name in METRIC_KEYS if METRIC_KINDS[name] is int)
"""Those that count something: whole numbers in the table."""
SKIPPED_COLUMNS = ("sweep", "cell_id", "label", "reasons")
_METRIC_COLUMNS = tuple("peak_memory_gib" if key == "peak_memory_allocated_gib" else key for key in METRIC_KEYS)
_metric_values = operator.attrgetter(*METRIC_KEYS)


@dataclass
class LoadedCells:
    """What :func:`load_cells` found: the table, the cells refused before submission, and the problems."""

    frame: pd.DataFrame
    problems: list[str]
    skipped: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(SKIPPED_COLUMNS)))


WAITING_STATES = frozenset({vocab.State.NEW.value, vocab.State.UNKNOWN.value} | {s.value for s in vocab.ACTIVE})
"""States of a cell that is simply not done yet: not a problem."""


def read_skipped(paths: SweepPaths, problems: list[str]) -> list[dict[str, str | None]]:
    """The cells a sweep refused before submission (``skipped.jsonl``), one dict per line that can be read."""
    try:
        lines = paths.skipped.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"sweep {paths.root}: cannot read {paths.skipped.name}: {exc}")
        return []
    out, bad = [], 0
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if not isinstance(entry, dict):
            bad += 1
            continue
        reasons = entry.get("reasons")
        out.append(
            {
                "sweep": paths.root.name,
                "cell_id": as_name(entry.get("cell_id")),
                "label": as_name(entry.get("label")),
                "reasons": "; ".join(map(str, reasons)) if isinstance(reasons, list) else as_name(reasons),
            }
        )
    if bad:
        problems.append(f"sweep {paths.root}: {bad} line(s) of {paths.skipped.name} could not be read")
    return out


def scheduler_job_id(environment: Mapping[str, object]) -> str | None:
    """The job's id as ``gpudays status`` and ``squeue`` show it: ``ARRAY_TASK`` (``9_0``) for an array task, else
    the plain job id. SLURM_JOB_ID alone (``18``) names an array task by a number nobody sees elsewhere."""
    array, task = as_name(environment.get("slurm_array_job_id")), as_name(environment.get("slurm_array_task_id"))
    if array and task:
        return f"{array}_{task}"
    return as_name(environment.get("job_id")) or as_name(environment.get("slurm_job_id"))


def flatten_cell(
    cell_id: str,
    sweep: str,
    config: Mapping[str, ConfigValue],
    record: Record | None,
    catalog: Catalog,
    problems: list[str],
) -> Row:
    """One table row from a cell's stored config and (optional) record; appends what was wrong to ``problems``.

    The cell's own columns are :func:`orchestrator.cells.row.row`'s, of the typed cell (:meth:`Catalog.cell`); the
    record's status, metrics and environment come between its two parts."""
    cell, cell_problems = catalog.cell(config, record.settings if record else {})
    where = f"cell {cell_id} (sweep {sweep})"
    problems.extend(f"{where}: {problem}" for problem in cell_problems)
    row: Row = {"sweep": sweep, "cell_id": cell_id}
    row.update(setting_columns(cell))

    metrics = Metrics()
    environment: Mapping[str, object] = {}
    if record is not None:
        row["status"] = record.status.value
        row["reason"] = as_name(record.reason)
        row["attempt"] = record.attempt
        metrics = record.metrics
        environment = record.environment
        if row["status"] == "ok" and as_number(metrics.step_time_s) is None:
            problems.append(f"{where}: status ok but no step_time_s in its metrics; estimates left empty")
    row.update(zip(_METRIC_COLUMNS, map(as_number, _metric_values(metrics)), strict=True))
    for key in WHOLE_METRIC_KEYS:
        row[key] = as_int(row[key])

    hostnames = environment.get("hostnames")
    row["hostnames"] = " ".join(map(str, hostnames)) if isinstance(hostnames, list) else as_name(hostnames)
    row["device_name"] = as_name(environment.get("device_name"))
    row["torch_version"] = as_name(environment.get("torch"))
    row["deepspeed_version"] = as_name(environment.get("deepspeed"))
    row["slurm_job_id"] = scheduler_job_id(environment)
    shared = environment.get("shared_node")
    row["shared_node"] = shared if isinstance(shared, bool) else None
    if shared is True:
        others = [*_listed(environment.get("node_jobs_at_start")), *_listed(environment.get("node_jobs_at_end"))]
        problems.append(
            f"{where}: measured on a node shared with other jobs ({', '.join(dict.fromkeys(map(str, others)))}); "
            "its timing may be theirs too (cluster.exclusive)"
        )
    elif shared is None and environment.get("other_users_jobs_hidden") is True:
        problems.append(
            f"{where}: whether its node was shared is unknown: the cluster hides other users' jobs (PrivateData=jobs), "
            "so only yours could be seen (cluster.exclusive makes sure)"
        )
    row.update(host_load_columns(record.host_load if record else {}))
    row["started_at"] = as_name(record.started_at) if record else None
    row["finished_at"] = as_name(record.finished_at) if record else None

    row.update(figure_columns(cell))
    if record is not None and row.get("allocator_expandable_segments") is not None:
        # What the probe ran with, whatever the config asked: a record made before gpudays set the allocator, or
        # one whose scheduler's environment set it, says so (environment pytorch_*alloc_conf, None where unset).
        row["allocator_expandable_segments"] = recorded_expandable(environment)
    return row


def _listed(value: object) -> list[object]:
    """The entries of an environment's list (``node_jobs_at_start``): none where it is null or empty, and a damaged
    record's single value (a number, a string, a mapping) as one entry, to be named rather than end the report."""
    if isinstance(value, (list, tuple)):
        return list(value)
    return [] if value is None or value == "" else [value]


HOST_LOAD_COLUMNS = ("host_load_avg_1m", "host_cpus_given", "host_other_cpu_use")
"""The host while the cell was timed (a record's ``host_load``, ``orchestrator.job.host_load``): the larger of the
1-minute load averages at the start and end of the timed steps, the cores the rank was given, and the share of
those cores' time other processes took (0-1)."""


def host_load_columns(load: Mapping[str, object]) -> Row:
    """:data:`HOST_LOAD_COLUMNS` of a record's ``host_load`` (empty where the record has none)."""
    averages = [as_number(load.get(key)) for key in ("load_avg_1m_start", "load_avg_1m_end")]
    return {
        "host_load_avg_1m": max((a for a in averages if a is not None), default=None),
        "host_cpus_given": as_int(load.get("host_cpus_given")),
        "host_other_cpu_use": as_number(load.get("other_cpu_use")),
    }


def _cell_config(cell_dir: str, record: Record | None, problems: list[str], where: str) -> Container:
    if record is not None and record.config:
        return record.config
    try:
        return read_cell_config(Path(cell_dir, CELL_CONFIG_NAME))
    except BadCellConfig as e:
        problems.append(f"{where}: {e}; its settings are taken from the record, if any")
        return {}


def _cell_dirs(cells_dir: Path) -> list[tuple[str, str]]:
    """(cell id, folder) of every real folder under ``cells/`` (a link is never followed into another cell), sorted;
    plain strings, as pathlib costs add up."""
    try:
        entries = [(e.name, e.path) for e in os.scandir(cells_dir) if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []
    return sorted(entries)


def measures(config: Mapping[str, ConfigValue]) -> bool:
    """Whether a record of this stored config is a measurement: its probe's kind is a training probe's (a config
    that names none is, as the schema's default kind); ``sleep`` and ``fail`` measure nothing."""
    probe = config.get("probe")
    kind = probe.get("kind", ProbeConfig.kind) if isinstance(probe, Mapping) else ProbeConfig.kind
    return kind in MEASURING_PROBE_KINDS


Rank: TypeAlias = tuple[int, int, int, str, int]


def _rank(row: Mapping[str, Scalar], measured: bool, has_record: bool, order: int) -> Rank:
    """Which of two rows for the same cell wins: a measurement's record over any other (a plumbing check's, or
    none), then ok over not ok, a record over none, then the newest."""
    ok = int(row.get("status") == "ok")
    return (int(measured and has_record), ok, int(has_record), str(row.get("finished_at") or ""), order)


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsing thousands of records makes millions of short-lived objects
    without a single reference cycle, and the collector's passes over them cost a tenth of the load time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_cells(
    sweep_dirs: Iterable[Path],
    states: Mapping[str, str] | None = None,
    catalog: Catalog | None = None,
) -> LoadedCells:
    """Read every cell of every sweep folder into one table (see the module docstring).

    ``states`` maps a cell id to a scheduler state (``PENDING``, ``RUNNING``...) used as the status of a cell
    that has no record yet; without one such a cell's status is ``no_record``.
    """
    with _no_cyclic_gc():
        return _load_cells(sweep_dirs, states, catalog)


def _load_cells(sweep_dirs: Iterable[Path], states: Mapping[str, str] | None, catalog: Catalog | None) -> LoadedCells:
    catalog = catalog if catalog is not None else Catalog.load()
    problems: list[str] = []
    best: dict[str, tuple[Rank, Row, list[str]]] = {}
    seen: set[Path] = set()
    skipped: list[dict[str, str | None]] = []
    for order, sweep_dir in enumerate(sweep_dirs):
        paths = SweepPaths(Path(sweep_dir))
        if paths.root in seen:
            continue
        seen.add(paths.root)
        sweep = paths.root.name
        if not paths.root.is_dir():
            problems.append(f"sweep {paths.root}: folder does not exist")
            continue
        refused = read_skipped(paths, problems)
        skipped.extend(refused)
        cell_dirs = _cell_dirs(paths.cells_dir)
        problems.extend(f"sweep {paths.root}: {line}" for line in [*paths.damaged_cells(), *damaged_lines(paths)])
        found = 0
        for cell_id, cell_dir in cell_dirs:
            where = f"cell {cell_id} (sweep {sweep})"
            cell_problems: list[str] = []
            read = read_record(Path(cell_dir, RECORD_NAME), cell_id)
            if read is None and not os.path.isfile(os.path.join(cell_dir, CELL_CONFIG_NAME)):
                continue  # not a cell (SweepPaths.cell_ids has the same rule)
            record = read if isinstance(read, Record) else None
            record_error = read.reason if isinstance(read, BadRecord) else None
            found += 1
            config = _cell_config(cell_dir, record, cell_problems, where)
            row = flatten_cell(cell_id, sweep, config, record, catalog, cell_problems)
            if record is None:
                if record_error:
                    row["status"], row["reason"] = CORRUPT_RECORD, record_error
                    cell_problems.append(f"{where}: cells/{cell_id}/{RECORD_NAME}: {record_error}")
                else:
                    state = (states or {}).get(cell_id)
                    row["status"], row["reason"] = (state or NO_RECORD), None
                    if str(state).lower() not in WAITING_STATES:
                        cell_problems.append(f"{where}: no record" + (f" (state {state})" if state else " yet"))
            if row["status"] not in RESULT_STATUSES and record is not None and not record_error:
                reason = f": {row['reason']}" if row.get("reason") else ""
                cell_problems.append(f"{where}: status {row['status']}{reason}")
            rank = _rank(row, measures(config), record is not None, order)
            previous = best.get(cell_id)
            if previous is None or rank > previous[0]:
                best[cell_id] = (rank, row, cell_problems)
        found += _unmeasured_cells(paths, {cid for cid, _ in cell_dirs}, catalog, order, best, problems)
        if not found and not refused:
            problems.append(f"sweep {paths.root}: no cells in it (expected cells/<cell_id>/cell.yaml)")
    rows = []
    for _, row, cell_problems in best.values():
        problems.extend(cell_problems)
        rows.append(row)
    frame = pd.DataFrame(rows)
    refused = pd.DataFrame(skipped, columns=list(SKIPPED_COLUMNS)).drop_duplicates(["cell_id"], keep="last")
    return LoadedCells(frame=frame, problems=problems, skipped=refused.reset_index(drop=True))


def _unmeasured_cells(
    paths: SweepPaths,
    written: set[str],
    catalog: Catalog,
    order: int,
    best: dict[str, tuple[Rank, Row, list[str]]],
    problems: list[str],
) -> int:
    """Rows of an adaptive sweep's cells that no round chose (status :data:`UNMEASURED`, no problem: predicted
    by design); how many."""
    try:
        grid = read_grid(paths.adaptive_grid)
    except BadAdaptiveState as e:
        problems.append(f"sweep {paths.root}: {e}; its unmeasured cells are left out")
        return 0
    count = 0
    for cell_id, config in grid:
        if cell_id in written or cell_id in best:
            continue
        row = flatten_cell(cell_id, paths.root.name, config, None, catalog, problems)
        row["status"], row["reason"] = UNMEASURED, None
        best[cell_id] = (_rank(row, False, False, order), row, [])
        count += 1
    return count


def rows_of(frame: pd.DataFrame, columns: Iterable[str]) -> list[Row]:
    """The rows of ``frame`` as plain dicts of the given columns (those it has); missing values stay NaN or NA.

    Much faster than ``DataFrame.to_dict("records")`` on wide frames, which boxes every value of every column.
    """
    names = [c for c in dict.fromkeys(columns) if c in frame.columns]
    values = [frame[c].tolist() for c in names]
    return [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)] if names else [{}] * len(frame)
