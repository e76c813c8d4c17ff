"""The one-line answer per model × GPU type × GPU count, under ``plan``, ``sweep --wait`` and ``report``.

``pythia-1b on 4 × A100-80GB: 36 days (90%: 20–64), 3.5k GPU-hours, $6.2k rented — fastest setting: fsdp-full
bf16 mb=16 (cell b5a301e0f4df)``: the fastest cell of the group, its time to train with its interval (the plan's
90% prediction interval, or the probe's 95% confidence interval of a measurement), GPU-hours and the cloud cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.config.values import Scalar


@dataclass(frozen=True)
class AnswerKeys:
    """Where a row holds each figure: the plan's ``predicted_*`` columns or the report's measured ones."""

    days: str
    gpu_hours: str
    usd: str
    level: str
    """The interval's confidence, as printed: ``90%`` or ``95%``."""

    @property
    def low(self) -> str:
        return f"{self.days}_low"

    @property
    def high(self) -> str:
        return f"{self.days}_high"


PREDICTED = AnswerKeys("predicted_time_to_train_days", "predicted_gpu_hours", "predicted_cost_usd_cloud", "90%")
MEASURED = AnswerKeys("time_to_train_days", "gpu_hours", "cost_usd_cloud", "95%")


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


def answer_line(model: str, gpu: str, num_gpus: int, best: Mapping[str, object] | None, keys: AnswerKeys,
                others: str = "") -> str:  # fmt: skip
    """One group's line; ``best`` its fastest row (None: no answer, ``others`` says why)."""
    head = f"{model} on {num_gpus} × {gpu.upper()}"
    days = _float(best.get(keys.days)) if best is not None else None
    if best is None or days is None:
        return f"{head}: no answer yet" + (f" ({others})" if others else "")
    parts = [f"{number(days)} days"]
    low, high = _float(best.get(keys.low)), _float(best.get(keys.high))
    if low is not None and high is not None:
        parts[0] += f" ({keys.level}: {number(low)}–{number(high)})"
    hours, usd = _float(best.get(keys.gpu_hours)), _float(best.get(keys.usd))
    if hours is not None:
        parts.append(f"{number(hours)} GPU-hours")
    parts.append(f"${number(usd)} rented" if usd is not None else "no rental price")
    setting = str(best.get("setting") or "")
    cell = str(best.get("cell_id") or "")
    tail = f" — fastest setting: {setting}" + (f" (cell {cell})" if cell else "") if setting or cell else ""
    return f"{head}: {', '.join(parts)}{tail}"


def answer_lines(rows: Sequence[Mapping[str, object]], keys: AnswerKeys) -> list[str]:
    """A line per (model, gpu, num_gpus) of ``rows``, in their order of appearance; each row also names its
    ``setting`` and ``cell_id``, ``answered`` (False: a row that gives no answer, e.g. predicted not to fit), and
    ``why`` or ``status``: what a group without an answer says instead."""
    groups: dict[tuple[str, str, int], list[Mapping[str, object]]] = {}
    for row in rows:
        gpus = _float(row.get("num_gpus"))
        key = (str(row.get("model")), str(row.get("gpu")), int(gpus) if gpus is not None else 0)
        groups.setdefault(key, []).append(row)
    lines = []
    for (model, gpu, num_gpus), group in groups.items():
        answered = [r for r in group if r.get("answered", True) and _float(r.get(keys.days)) is not None]
        best = min(answered, key=lambda r: _float(r.get(keys.days)) or math.inf, default=None)
        statuses: dict[Scalar, int] = {}
        for r in group:
            why = str(r.get("why") or r.get("status") or "")
            statuses[why] = statuses.get(why, 0) + 1
        others = ", ".join(f"{s}: {n} cell(s)" for s, n in statuses.items() if s)
        lines.append(answer_line(model, gpu, num_gpus, best, keys, others))
    return lines
