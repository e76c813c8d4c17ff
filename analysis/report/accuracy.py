"""report.md's "Predicted against measured": how the predictor did on the measured cells, how wide its 90%
intervals are, and what every cell's answer is (measured, or predicted with its interval).

The predictions are calibrated on the same report's measured cells, so the errors and the share of measured cells
inside their intervals are in-sample; ``benchmarks/intervals.py`` measures them out of sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.predict.calibration import Calibration
from analysis.sweeps.records import MEASURED_DOES_NOT_FIT, MEASURED_FITS, RESULT_STATUSES
from orchestrator.store.adaptive_state import STOP_REASONS, BadAdaptiveState, is_adaptive, read_grid, read_state
from orchestrator.store.paths import SweepPaths

ANSWERS = ("measured", "does_not_fit", "predicted", "unknown")
"""The ``answer`` column of cells.csv: measured (``ok``); measured not to fit (``does_not_fit``, ``oom``); predicted
with its interval (no measurement yet, or a failed one); unknown (no step time can be predicted: an uncalibrated CPU)."""


def answer_column(cells: pd.DataFrame) -> pd.Series:
    """Each cell's :data:`ANSWERS` entry, from its status and its predicted step time."""
    status = cells["status"] if "status" in cells.columns else pd.Series(None, index=cells.index, dtype=object)
    predicted = pd.to_numeric(cells.get("predicted_step_time_s"), errors="coerce")
    out = pd.Series(np.where(predicted.notna(), "predicted", "unknown"), index=cells.index, dtype=object)
    out[status.isin(MEASURED_DOES_NOT_FIT)] = "does_not_fit"
    out[status.isin(MEASURED_FITS)] = "measured"
    return out


def prediction_section(
    cells: pd.DataFrame, calibration: Calibration, table: Callable[[pd.DataFrame, Sequence[str]], str]
) -> list[str]:
    """The lines of the section; ``table`` renders a frame's columns as markdown."""
    out = ["## Predicted against measured (in-sample)", ""]
    if cells.empty:
        return [*out, "_no cells_", ""]
    judged = cells["fit_agrees"].dropna()
    if len(judged):
        share = 100.0 * float(judged.astype(bool).mean())
        out.append(
            f"Fit predicted correctly for {int(judged.astype(bool).sum())} of {len(judged)} cells ({share:.1f}%, "
            "in-sample)."
        )
    else:
        out.append("No measured fit or no-fit yet to compare the prediction with.")
    answers = cells["answer"].value_counts() if "answer" in cells.columns else pd.Series(dtype=int)
    out.append("Every cell's answer: " + ", ".join(f"{answers.get(a, 0)} {a.replace('_', ' ')}" for a in ANSWERS) + ".")
    out.append("")
    rows = []
    for gpu, group in cells[cells["status"].isin(RESULT_STATUSES)].groupby("gpu", sort=True):
        step_err = pd.to_numeric(group["step_time_error_pct"], errors="coerce").abs().dropna()
        mem_err = pd.to_numeric(group["memory_error_pct"], errors="coerce").abs().dropna()
        measured = pd.to_numeric(group["step_time_s"], errors="coerce")
        low = pd.to_numeric(group["predicted_step_time_s_low"], errors="coerce")
        high = pd.to_numeric(group["predicted_step_time_s_high"], errors="coerce")
        central = pd.to_numeric(group["predicted_step_time_s"], errors="coerce")
        known = measured.notna() & low.notna()
        inside = ((low <= measured) & (measured <= high))[known]
        cal = calibration.for_gpu(str(gpu))
        peaks = [c for c in ("gpu_peak_tflops_bf16", "gpu_peak_tflops_fp16") if c in group.columns]
        has_peak = bool(peaks) and bool(group[peaks].apply(pd.to_numeric, errors="coerce").gt(0).any(axis=None))
        rows.append(
            {
                "gpu": gpu,
                "cells": len(group),
                "in_sample_median_abs_step_time_error_pct": float(step_err.median()) if len(step_err) else np.nan,
                "in_sample_max_abs_step_time_error_pct": float(step_err.max()) if len(step_err) else np.nan,
                "in_sample_median_abs_memory_error_pct": float(mem_err.median()) if len(mem_err) else np.nan,
                "median_interval_halfwidth_pct": float((100.0 * (high / central - 1.0)).median()),
                "in_sample_inside_interval_pct": 100.0 * float(inside.mean()) if len(inside) else np.nan,
                # A share of the dense peak; where the device has none (the CPU) the calibration's rate is TFLOP/s,
                # in a column of its own.
                "efficiency": cal.efficiency if cal and has_peak else np.nan,
                "achieved_tflops_per_gpu": cal.efficiency if cal and not has_peak else np.nan,
                "fitted_terms": " ".join(cal.fitted_terms) if cal else "uncalibrated",
            }
        )
    if rows:
        out.append(table(pd.DataFrame(rows), list(rows[0])))
    out.append(
        "Efficiency: achieved share of the dense peak (0-1); `achieved_tflops_per_gpu` instead where the device has "
        "no published peak (e.g. cpu). "
        "Intervals: 90%, the larger half in % of the predicted step time; `in_sample_inside_interval_pct`: measured "
        "cells whose step time lies inside their interval. Every `in_sample_` figure compares a prediction with a "
        "measurement the calibration was fitted to, so it flatters the predictor; `benchmarks/intervals.py` "
        "measures it out of sample. In-sample errors of 50% or more are named under Problems. Every cell's "
        "interval is in cells.csv."
    )
    out.append("")
    return out


def adaptive_section(sweep_dirs: Sequence[Path], cells: pd.DataFrame) -> list[str]:
    """report.md's "Adaptive sweep": of each adaptive sweep, how many cells were measured in how many rounds and
    why it stopped, and how wide its predicted cells' intervals are (none where no sweep is adaptive)."""
    out: list[str] = []
    for folder in sweep_dirs:
        paths = SweepPaths(Path(folder))
        if not is_adaptive(paths):
            continue
        try:
            state, grid = read_state(paths), read_grid(paths.adaptive_grid)
        except BadAdaptiveState as e:
            out.append(f"`{paths.root}`: {e}")
            continue
        ids = {cid for cid, _ in grid}
        mine = cells[cells["cell_id"].isin(ids)] if "cell_id" in cells.columns else cells.iloc[:0]
        measured = int((mine.get("answer") == "measured").sum()) if len(mine) else 0
        predicted = mine[mine.get("answer") == "predicted"] if len(mine) else mine
        low = pd.to_numeric(predicted.get("predicted_step_time_s_low"), errors="coerce")
        high = pd.to_numeric(predicted.get("predicted_step_time_s_high"), errors="coerce")
        central = pd.to_numeric(predicted.get("predicted_step_time_s"), errors="coerce")
        half = (100.0 * np.maximum(high / central - 1.0, 1.0 - low / central)).dropna()
        line = f"`{paths.root}`: {measured} of {len(ids)} cells measured in {len(state.rounds)} round(s)"
        if state.stopped is not None:
            line += f" ({state.stopped.spent_gpu_hours:.3g} GPU-hours); stopped: {STOP_REASONS.get(state.stopped.reason, state.stopped.reason)}"
        else:
            line += "; not stopped yet (`gpudays resume` goes on)"
        target = f"±{state.target_pct:g}%"
        if len(half):
            line += (f". The {len(predicted)} predicted cells' 90% intervals: median ±{half.median():.1f}%, widest "
                     f"±{half.max():.1f}% (target {target}).")  # fmt: skip
        out.append(line)
    if not out:
        return []
    return [
        "## Adaptive sweep",
        "",
        *out,
        "",
        "Each cell's `answer` in cells.csv says whether it was measured or predicted; a predicted cell's 90% interval "
        "is `predicted_step_time_s_low` to `predicted_step_time_s_high`, and its days, GPU-hours and cost are those "
        "of its predicted step time (days with the same interval: `time_to_train_days_low` to `_high`).",
        "",
    ]
