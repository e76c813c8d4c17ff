"""The one-line answer per model × GPU type × GPU count, under ``plan``, ``sweep --wait`` and ``report``.

``pythia-1b on 4 × A100-80GB: 36 days (90%: 20–64) of training steps, 40 wall-clock at 90% goodput, 3.5k
GPU-hours (1.9k–6.2k), $6.2k rented ($3.4k–$11k) — fastest setting: fsdp-full bf16 mb=16 (cell b5a301e0f4df)``:
the fastest cell of the group, its time to train (the steps', and the whole run's at its goodput), GPU-hours and
cloud cost, each with its interval (the plan's 90% prediction interval, or the probe's 95% confidence
interval of a measurement; a cell of a report answered by its prediction says ``predicted, not measured`` and
gives the prediction's 90% interval). A group without an answer says what each of its cells lacks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AnswerKeys:
    """Where a row holds each figure: the plan's ``predicted_*`` columns or the report's measured ones."""

    days: str
    gpu_hours: str
    usd: str
    level: str
    """The interval's confidence, as printed: ``90%`` or ``95%``."""
    wall_clock_days: str
    """The whole run's days at its goodput (restarts, evaluations, checkpoints included)."""

    @property
    def low(self) -> str:
        return f"{self.days}_low"

    @property
    def high(self) -> str:
        return f"{self.days}_high"


PREDICTED = AnswerKeys(
    "predicted_time_to_train_days",
    "predicted_gpu_hours",
    "predicted_cost_usd_cloud",
    "90%",
    "predicted_wall_clock_days",
)
MEASURED = AnswerKeys("time_to_train_days", "gpu_hours", "cost_usd_cloud", "95%", "wall_clock_days")


def number(value: float) -> str:
    """Two significant figures (more left of the point), with k, M, G for thousands, millions, billions:
    3471 -> 3.5k, 3019 -> 3.0k, 36.2 -> 36, 0.00463 -> 0.0046."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")):
        if abs(value) >= scale:
            scaled = value / scale
            return (f"{scaled:.1f}" if abs(scaled) < 10 else f"{scaled:.0f}") + suffix
    return f"{value:.2g}"


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # type: ignore[arg-type]  # numpy's scalars
        except (TypeError, ValueError):
            return None
    out = float(value)
    return out if math.isfinite(out) else None


def _bounds(best: Mapping[str, object], key: str, value: float, days: float, keys: AnswerKeys) -> str:
    """`` (low–high)`` of one figure: its own ``*_low``/``*_high`` where the row has them, else the days' interval
    carried over (GPU-hours and dollars are proportional to the days); empty where there is no interval."""
    low, high = _float(best.get(f"{key}_low")), _float(best.get(f"{key}_high"))
    if low is None or high is None:
        days_low, days_high = _float(best.get(keys.low)), _float(best.get(keys.high))
        if days_low is None or days_high is None or days <= 0:
            return ""
        low, high = value * days_low / days, value * days_high / days
    return f"{number(low)}–{number(high)}"


def is_predicted(row: Mapping[str, object]) -> bool:
    """Whether a measured table's row (cells.csv's) is answered by a prediction, not a measurement."""
    return row.get("answer") == "predicted"


def answer_line(model: str, gpu: str, num_gpus: int, best: Mapping[str, object] | None, keys: AnswerKeys,
                others: str = "") -> str:  # fmt: skip
    """One group's line; ``best`` its fastest row (None: no answer, ``others`` says what is missing). A row of a
    measured table whose ``answer`` is predicted says so, with the prediction's 90% interval."""
    head = f"{model} on {num_gpus} × {gpu.upper()}"
    days = _float(best.get(keys.days)) if best is not None else None
    if best is None or days is None:
        return f"{head}: no answer yet" + (f": {others}" if others else "")
    predicted = keys is not PREDICTED and is_predicted(best)
    level = PREDICTED.level if predicted else keys.level
    interval = _bounds(best, keys.days, days, days, keys)
    parts = [f"{number(days)} days" + (f" ({level}: {interval})" if interval else "")]
    wall, goodput = _float(best.get(keys.wall_clock_days)), _float(best.get("goodput"))
    if wall is not None and goodput is not None:
        parts[0] += f" of training steps, {number(wall)} wall-clock at {goodput:.0%} goodput"
    hours, usd = _float(best.get(keys.gpu_hours)), _float(best.get(keys.usd))
    if hours is not None:
        interval = _bounds(best, keys.gpu_hours, hours, days, keys)
        parts.append(f"{number(hours)} GPU-hours" + (f" ({interval})" if interval else ""))
    if usd is not None:
        interval = _bounds(best, keys.usd, usd, days, keys)
        parts.append(f"${number(usd)} rented" + (f" (${interval.replace('–', '–$')})" if interval else ""))
    else:
        parts.append("no rental price")
    setting = str(best.get("setting") or "")
    cell = str(best.get("cell_id") or "")
    tail = f" — fastest setting: {setting}" + (f" (cell {cell})" if cell else "") if setting or cell else ""
    mark = "predicted, not measured: " if predicted else ""
    return f"{head}: {mark}{', '.join(parts)}{tail}"


_STATUS_WORDS = {
    "ok": "measured", "does_not_fit": "too large even at micro-batch 1", "oom": "out of memory",
    "failed": "failed", "comm_error": "failed in a collective", "compile_error": "failed to compile",
    "timeout": "ran out of time", "cancelled": "cancelled", "invalid": "cannot run as configured",
    "corrupt": "left an unreadable record", "no_record": "left no record yet", "unmeasured": "not measured",
}  # fmt: skip
"""What a cell of each status has or has not given, in words (any other status, a scheduler state such as
``pending``, reads as ``not measured yet (pending)``)."""


def missing(row: Mapping[str, object]) -> str:
    """Why a row gives no answer, in plain words: the plan's ``why``, else from its ``status`` and ``answer``."""
    if "why" in row:  # a plan's row: empty where the cell is answered, or left out for a reason of its own
        return str(row.get("why") or "")
    status = str(row.get("status") or "")
    if status == "ok":
        if _float(row.get("step_time_s")) is None:
            return "measured, but recorded no step time"
        return (
            "measured, but how many steps its training run takes is unknown (the model's train_steps, or --tokens "
            "for a language model)"
        )
    words = _STATUS_WORDS.get(status, f"not measured yet ({status})" if status else "not measured")
    if row.get("answer") == "unknown":
        words += ", and no step time can be predicted yet"
    return words


def answer_lines(rows: Sequence[Mapping[str, object]], keys: AnswerKeys) -> list[str]:
    """A line per (model, gpu, num_gpus) of ``rows``, in their order of appearance; each row also names its
    ``setting`` and ``cell_id``, ``answered`` (False: a row that gives no answer, e.g. predicted not to fit), and
    ``why`` or ``status`` (and ``answer``): what a group without an answer says instead (:func:`missing`)."""
    groups: dict[tuple[str, str, int], list[Mapping[str, object]]] = {}
    for row in rows:
        gpus = _float(row.get("num_gpus"))
        key = (str(row.get("model")), str(row.get("gpu")), int(gpus) if gpus is not None else 0)
        groups.setdefault(key, []).append(row)
    lines = []
    for (model, gpu, num_gpus), group in groups.items():
        answered = [r for r in group if r.get("answered", True) and _float(r.get(keys.days)) is not None]
        best = min(answered, key=lambda r: _float(r.get(keys.days)) or math.inf, default=None)
        reasons: dict[str, int] = {}
        for r in group:
            reasons[missing(r)] = reasons.get(missing(r), 0) + 1
        others = "; ".join(f"{n} cell{'s' if n > 1 else ''} {why}" for why, n in reasons.items() if why)
        lines.append(answer_line(model, gpu, num_gpus, best, keys, others))
    return lines
