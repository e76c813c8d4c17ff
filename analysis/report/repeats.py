"""Every measurement of a cell measured more than once: the same cell id in several merged sweeps, or an earlier
attempt's record kept aside beside a newer one (``record.attempt<N>.json``, ``orchestrator.store.paths``).

The cells table (:mod:`analysis.sweeps.records`) keeps one record a cell; this reads the others, so that the
report can say where repeats of one cell disagree. Only cells with more than one record are read again.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from analysis.predict.estimates import ci95_halfwidth_pct
from analysis.sweeps.records import MEASURED_FITS, host_load_columns
from orchestrator.store.paths import RECORD_NAME, SweepPaths
from orchestrator.store.record import Record, read_record

REPEAT_COLUMNS = (
    "cell_id", "sweep", "attempt", "file", "step_time_s", "step_time_ci95_pct", "step_time_low_s",
    "step_time_high_s", "host_load_avg_1m", "host_cpus_given", "host_other_cpu_use",
)  # fmt: skip
"""One row a measurement: where it is, its step time and the 95% confidence interval of its mean, and the host
while it was timed."""

_ASIDE_PREFIX = "record.attempt"


def _record_files(sweep_dirs: Iterable[Path]) -> dict[str, list[tuple[str, str, str]]]:
    """(sweep, cell folder, file name) of every record of every cell, the kept one and those kept aside, by cell id
    (plain strings: a path is made only for the cells read again)."""
    found: dict[str, list[tuple[str, str, str]]] = {}
    for sweep_dir in dict.fromkeys(Path(d) for d in sweep_dirs):
        paths = SweepPaths(sweep_dir)
        try:
            cells = [e for e in os.scandir(paths.cells_dir) if e.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            continue
        for cell in cells:
            try:
                names = os.listdir(cell.path)
            except OSError:
                continue
            files = [n for n in names if n == RECORD_NAME or (n.startswith(_ASIDE_PREFIX) and n.endswith(".json"))]
            found.setdefault(cell.name, []).extend((paths.root.name, cell.path, n) for n in sorted(files))
    return found


def repeat_measurements(sweep_dirs: Iterable[Path]) -> pd.DataFrame:
    """Every measured (``ok``) record of each cell that has more than one record (columns :data:`REPEAT_COLUMNS`);
    a record that cannot be read is left out (the cells table names it)."""
    rows: list[dict[str, object]] = []
    for cell_id, files in _record_files(sweep_dirs).items():
        if len(files) < 2:
            continue
        for sweep, folder, name in files:
            path = Path(folder, name)
            record = read_record(path, cell_id)
            if not isinstance(record, Record) or record.status.value not in MEASURED_FITS:
                continue
            m = record.metrics
            rows.append({
                "cell_id": cell_id, "sweep": sweep, "attempt": record.attempt, "file": str(path),
                "step_time_s": m.step_time_s, "step_time_ci95_pct": m.step_time_ci95_pct,
                "step_time_mean_s": m.step_time_mean_s, "step_time_std_s": m.step_time_std_s,
                "steps_timed": m.steps_timed, **host_load_columns(record.host_load),
            })  # fmt: skip
    frame = pd.DataFrame(rows, columns=[*REPEAT_COLUMNS, "step_time_mean_s", "step_time_std_s", "steps_timed"])
    step = pd.to_numeric(frame["step_time_s"], errors="coerce")
    half = ci95_halfwidth_pct(
        frame["step_time_ci95_pct"], frame["step_time_mean_s"], frame["step_time_std_s"], frame["steps_timed"]
    )
    frame["step_time_ci95_pct"] = half.to_numpy()
    frame["step_time_low_s"] = step * (1.0 - half.to_numpy() / 100.0)
    frame["step_time_high_s"] = step * (1.0 + half.to_numpy() / 100.0)
    return frame.reindex(columns=list(REPEAT_COLUMNS))


__all__ = ["REPEAT_COLUMNS", "repeat_measurements"]
