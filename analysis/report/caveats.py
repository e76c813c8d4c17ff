"""What makes a figure of the report doubtful: a measurement taken while other processes took the cell's cores, a
cell whose repeated measurements disagree beyond their own confidence intervals, and an in-sample prediction far
from its measurement.

Each is a column of cells.csv (``under_load``, ``repeat_step_times_s`` and ``repeats_disagree``, ``caveats``: the
cell's doubts in words, also in best.csv) and a line in report.md's problems. Pure functions of the cells table
and of :func:`analysis.report.repeats.repeat_measurements`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from analysis.sweeps.records import MEASURED_FITS, rows_of
from orchestrator.config.values import as_number

OTHER_CPU_LIMIT = 0.25
"""A measurement is under load when other processes took at least this share of its cores' time while it was
timed (``host_other_cpu_use``): its step time is then partly theirs."""
LOAD_PER_CORE_LIMIT = 2.0
"""Where the other processes' share is unknown: under load when the host's 1-minute load average is at least this
many times the cores the cell was given (twice as many runnable tasks as cores: the cell had about half of them)."""
LARGE_ERROR_PCT = 50.0
"""An in-sample step-time prediction this far (%) from its measurement is named: the calibration includes the
cell, so an error this large says the measurement or the model of it is off, whatever the median says (the CPU's
predictions are often 30-40% off a single probe, which the median and maximum columns show without a line each)."""

CAVEAT_COLUMNS = ("under_load", "repeat_step_times_s", "repeats_disagree", "caveats")


def _num(frame: pd.DataFrame, name: str) -> pd.Series:
    if name not in frame.columns:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[name], errors="coerce").astype(float)


def under_load(frame: pd.DataFrame) -> pd.Series:
    """Whether each row (a cell or a measurement with the host-load columns) was timed under load: others' share
    of its cores at least :data:`OTHER_CPU_LIMIT`, else (share unknown) a load average at least
    :data:`LOAD_PER_CORE_LIMIT` × its cores; empty where the record says neither."""
    other = _num(frame, "host_other_cpu_use")
    per_core = _num(frame, "host_load_avg_1m") / _num(frame, "host_cpus_given").where(lambda c: c > 0)
    loaded = other.ge(OTHER_CPU_LIMIT).where(other.notna(), per_core.ge(LOAD_PER_CORE_LIMIT))
    known = other.notna() | per_core.notna()
    return pd.Series(pd.array([bool(v) if k else None for v, k in zip(loaded, known, strict=True)], dtype="boolean"),
                     index=frame.index)  # fmt: skip


def _f(value: object) -> float:
    """A number, NaN where the value is none."""
    number = as_number(value.item() if isinstance(value, np.generic) else value)
    return math.nan if number is None else number


def _true(value: object) -> bool:
    return isinstance(value, (bool, np.bool_)) and bool(value)


def load_text(row: Mapping[str, object]) -> str:
    """The host while a cell was timed, in words: ``others took 45% of its 2 core(s), load average 5.1``."""
    parts = []
    other, cores, load = (_f(row.get(k)) for k in ("host_other_cpu_use", "host_cpus_given", "host_load_avg_1m"))
    cores_text = f"{cores:.0f} core(s)" if math.isfinite(cores) else "cores"
    if math.isfinite(other):
        parts.append(f"others took {100 * other:.0f}% of its {cores_text}")
    if math.isfinite(load):
        parts.append(f"load average {load:.1f}" + ("" if math.isfinite(other) else f" on {cores_text}"))
    return ", ".join(parts)


def disagreeing(repeats: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The cells whose measurements (rows of :func:`analysis.report.repeats.repeat_measurements`) disagree beyond
    their 95% confidence intervals: two of them have intervals that do not overlap. A measurement without an
    interval is not judged."""
    out: dict[str, pd.DataFrame] = {}
    if repeats.empty:
        return out
    judged = repeats[_num(repeats, "step_time_low_s").notna() & _num(repeats, "step_time_high_s").notna()]
    for cell_id, group in judged.groupby("cell_id", sort=True):
        if len(group) > 1 and _num(group, "step_time_low_s").max() > _num(group, "step_time_high_s").min():
            out[str(cell_id)] = group
    return out


def _times(group: pd.DataFrame) -> str:
    return " ".join(f"{float(t):.4g}" for t in _num(group, "step_time_s"))


def add_caveats(cells: pd.DataFrame, repeats: pd.DataFrame) -> pd.DataFrame:
    """:data:`CAVEAT_COLUMNS` for every cell (``caveats`` empty where there is nothing to doubt)."""
    out = cells.copy(deep=False)  # columns are added, never written into
    measured = out["status"].isin(MEASURED_FITS) if "status" in out.columns else pd.Series(False, index=out.index)
    loaded = under_load(out)
    out["under_load"] = loaded.where(measured, pd.NA).astype("boolean")
    ids = out["cell_id"].astype(str) if "cell_id" in out.columns else pd.Series("", index=out.index)
    groups = {str(cid): g for cid, g in repeats.groupby("cell_id")} if not repeats.empty else {}
    many = {cid for cid, g in groups.items() if len(g) > 1}
    judged = {cid for cid in many if _num(groups[cid], "step_time_low_s").notna().sum() > 1}
    bad = disagreeing(repeats)
    out["repeat_step_times_s"] = [(_times(groups[c]) if c in many else None) for c in ids]
    out["repeats_disagree"] = pd.array([(c in bad) if c in judged else None for c in ids], dtype="boolean")
    error = _num(out, "step_time_error_pct").where(measured).tolist()
    hot = (loaded.fillna(False).to_numpy(dtype=bool) & measured.to_numpy(dtype=bool)).tolist()
    texts = []
    load_rows = rows_of(out, ("host_other_cpu_use", "host_cpus_given", "host_load_avg_1m"))
    for cid, row, busy, miss in zip(ids.tolist(), load_rows, hot, error, strict=True):
        said = []
        if busy:
            said.append(f"measured under load ({load_text(row)})")
        if cid in bad:
            said.append(f"repeats disagree ({_times(bad[cid])} s)")
        if abs(miss) >= LARGE_ERROR_PCT:
            said.append(f"in-sample prediction {miss:+.1f}% off")
        texts.append("; ".join(said) or None)
    out["caveats"] = texts
    return out


def problems(cells: pd.DataFrame, repeats: pd.DataFrame) -> list[str]:
    """report.md's lines for the cells of :func:`add_caveats` (cells that carry its columns)."""
    out: list[str] = []
    rows = rows_of(cells, ("cell_id", "sweep", "status", "under_load", "step_time_s", "predicted_step_time_s",
                           "step_time_error_pct", "host_other_cpu_use", "host_cpus_given", "host_load_avg_1m"))  # fmt: skip

    def where(row: Mapping[str, object]) -> str:
        return f"cell {row.get('cell_id')} (sweep {row.get('sweep')})"

    for row in rows:
        if _true(row.get("under_load")):
            out.append(f"{where(row)}: measured under load ({load_text(row)}); its step time "
                       f"{_f(row.get('step_time_s')):.4g} s may measure the load too")  # fmt: skip
    kept = {str(r.get("cell_id")): r for r in rows}
    for cell_id, group in disagreeing(repeats).items():
        loaded = under_load(group).fillna(False).to_numpy(dtype=bool)
        each = [
            f"{_f(r['step_time_s']):.4g} s ±{_f(r['step_time_ci95_pct']):.1f}% (sweep {r['sweep']}, attempt "
            f"{r['attempt']}{', under load' if hot else ''})"
            for r, hot in zip(rows_of(group, group.columns), loaded, strict=True)
        ]
        step = _f(kept.get(cell_id, {}).get("step_time_s"))
        keeps = f"; cells.csv keeps {step:.4g} s" if math.isfinite(step) else ""
        out.append(f"cell {cell_id}: its measurements disagree beyond their 95% intervals: {', '.join(each)}{keeps}")
    for row in rows:
        error = _f(row.get("step_time_error_pct"))
        if row.get("status") in MEASURED_FITS and abs(error) >= LARGE_ERROR_PCT:
            out.append(
                f"{where(row)}: the predicted step time {_f(row.get('predicted_step_time_s')):.4g} s is {error:+.1f}% "
                f"off the measured {_f(row.get('step_time_s')):.4g} s, in-sample (the calibration includes this cell)"
            )
    return out


__all__ = ["CAVEAT_COLUMNS", "LARGE_ERROR_PCT", "LOAD_PER_CORE_LIMIT", "OTHER_CPU_LIMIT", "add_caveats", "problems"]
