"""A plan's predictions, attached before it is shown or submitted (``gpudays plan`` and ``gpudays sweep``).

A command-line module: it joins planning (``orchestrator.sweep``) with the predictor (``analysis.predict``), which
planning, below the analysis package, must not import.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.sweep import Plan, refuse_unfit


def predict(
    p: Plan, margin: float | None = None, run_anyway: bool = False, calibrate_from: Sequence[Path] = ()
) -> None:
    """Attach a prediction to every runnable cell; those predicted not to fit even at micro-batch 1 are refused.

    The predictor is calibrated on the measured records of ``calibrate_from`` (for instance this sweep's folder,
    when it already holds records). ``run_anyway`` keeps such cells in the sweep, with the prediction shown.
    """
    from analysis.predict import DEFAULT_MARGIN
    from analysis.predict import plan as predict_plan
    from analysis.report import calibration_from

    margin = DEFAULT_MARGIN if margin is None else margin
    existing = [Path(d) for d in calibrate_from if (Path(d) / "cells").is_dir()]
    calibration = calibration_from(existing) if existing else None
    frame = predict_plan([c.config for c in p.cells], calibration, margin)
    for cell, row in zip(p.cells, frame.to_dict(orient="records"), strict=True):
        cell.prediction = row
    if not run_anyway:
        refuse_unfit(p, margin)
