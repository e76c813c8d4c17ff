"""A plan's predictions, attached before it is shown or submitted (``gpudays plan`` and ``gpudays sweep``).

A command-line module: it joins planning (``orchestrator.planning.plan``) with the predictor (``analysis.predict.predictor``), which
planning, below the analysis package, must not import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Group, RenderableType
from rich.text import Text

from orchestrator.cli.display.console import rows_table
from orchestrator.cli.display.figures import interval
from orchestrator.planning.plan import Plan, refuse_unfit

INTERVALS = {
    "predicted_step_time_s": "predicted_step_time_s_90",
    "predicted_time_to_train_days": "predicted_time_to_train_days_90",
    "predicted_peak_memory_gib": "predicted_peak_memory_gib_90",
}
"""The predictions whose 90% interval the plan shows, and the key of its text."""


OFFER_KEEP = ("model", "gpu", "num_gpus", "layout", "step_s", "gpu_h")
"""The offered layouts' columns never left out: which layout of which cell, and its answer."""


def interval_texts(row: Mapping[str, object]) -> dict[str, str]:
    """``low–high`` (``figures.interval``: three significant digits, an en dash) of each prediction's 90% interval, and ``basis``: how many records
    calibrated the cell's GPU type, or ``uncalibrated`` (the interval is the prior's, wide)."""
    out: dict[str, str] = {}
    for key, text in INTERVALS.items():
        low, high = row.get(f"{key}_low"), row.get(f"{key}_high")
        if isinstance(low, float) and isinstance(high, float) and math.isfinite(low) and math.isfinite(high):
            out[text] = interval(low, high)
    records = row.get("predicted_from_records")
    count = int(records) if isinstance(records, (int, float)) and math.isfinite(records) else 0
    out["predicted_basis"] = f"{count} records" if count else "uncalibrated"
    return out


def predict(
    p: Plan, margin: float | None = None, run_anyway: bool = False, calibrate_from: Sequence[Path] = ()
) -> None:
    """Attach a prediction to every runnable cell; those predicted not to fit even at micro-batch 1 are refused.

    The predictor is calibrated on the measured records of ``calibrate_from`` (for instance this sweep's folder,
    when it already holds records). ``run_anyway`` keeps such cells in the sweep, with the prediction shown.
    """
    from analysis.predict.predictor import DEFAULT_MARGIN
    from analysis.predict.predictor import plan as predict_plan
    from analysis.report.writer import calibration_from

    margin = DEFAULT_MARGIN if margin is None else margin
    existing = [Path(d) for d in calibrate_from if (Path(d) / "cells").is_dir()]
    from orchestrator.profile.sweep import profiles_of

    profiles, _unread = profiles_of(existing)  # a damaged profile: the cited links, as `report` says
    calibration = calibration_from(existing, profiles=profiles) if existing else None
    frame = predict_plan([c.typed for c in p.cells], calibration, margin)
    for cell, row in zip(p.cells, frame.to_dict(orient="records"), strict=True):
        row.update(interval_texts(row))
        cell.prediction = row
    if not run_anyway:
        refuse_unfit(p, margin)


def layout_offers(p: Plan) -> RenderableType | None:
    """The tensor × pipeline × data-parallel layouts (``method.engine=mesh3d``) a plan offers where data
    parallelism alone does not fit, cannot run, or is slower (analysis/predict/layouts.py), each with the ``gpudays sweep`` line that
    measures it; None where there is none to offer."""
    from analysis.predict.layouts import offer_rows, offers

    # Refused cells count too: a model whose batch splits over no data-parallel cell's GPUs still gets a layout.
    found = offers((cell.typed, cell.prediction) for cell in [*p.cells, *p.skipped])
    if not found:
        return None
    numeric = ("num_gpus", "nodes", "mb", "mem_gib", "step_s", "bubble", "mfu", "gpu_h", "dp_gpu_h")
    return Group(
        Text(
            "offered: 3D layouts (method.engine=mesh3d) where data parallelism alone does not fit, cannot run or "
            "is slower, each predicted as the mesh3d cell its sweep line runs (uncalibrated):"
        ),
        rows_table(offer_rows(found), numeric=numeric, keep=OFFER_KEEP),
        *(Text(f"  {o.model} x{o.num_gpus} {o.layout}: {o.sweep}") for o in found),
    )
