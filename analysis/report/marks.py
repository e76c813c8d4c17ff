"""The marks on the report's panels: ticks a reader can read, and each point's label, placed apart.

A GPU-count axis is ticked at the whole counts measured (never 1.1, 1.4, 1.8 between 1 and 2); another log axis at
a few 1-2-5 values inside its range, written as plain numbers. A point's label names its GPU count, sharding and
micro-batch; before a figure is saved every label is moved up or down, or to the point's other side, until it
overlaps no other and stays inside its panel, where some place allows.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Literal

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

RGBA = tuple[float, float, float, float]
"""A colour as matplotlib's colormaps give it."""
Side = Literal["left", "right"]
"""Which side of its point a label is on (the label's horizontal alignment)."""
POINT_PT = 7
"""The size of a point's label."""
LINE_PT = POINT_PT * 1.3
"""A line of point labels: how far a label moves up or down at a time."""

_NOT_IN_LABEL = re.compile(r"bf16|fp16|fp32")
_ACCUMULATION = re.compile(r"^(mb\d+)x\d+$")
MAX_COUNT_TICKS = 8
"""A GPU-count axis labels every count measured, up to this many (then every second, and so on)."""
LABEL_STEPS = (0, *(k * sign for k in range(1, 7) for sign in (1, -1)))
"""Where a point's label tries to go, in lines above its place (0, 1, -1, 2, -2...), before it is left overlapping."""


def tick_label(value: float, _position: int | None = None) -> str:
    """A tick's value as a plain number, thousands grouped (the ticks are round already: every digit shown)."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.7g}"


def log_ticks(ax: Axes, which: str, base: int = 10, max_ticks: int = 6) -> None:
    """Log scale with a few ticks inside the data's range (1-2-5 or powers of two), labelled as plain numbers.

    Tick objects are the most expensive part of drawing a panel, and matplotlib's log locators create them for
    every decade in reach, so the ticks are fixed here to the handful that show.
    """
    getter, axis = (ax.get_xlim, ax.xaxis) if which == "x" else (ax.get_ylim, ax.yaxis)
    low, high = sorted(getter())
    if not (np.isfinite(low) and np.isfinite(high)) or low <= 0:
        return
    first, last = math.floor(math.log(low, base)) - 1, math.ceil(math.log(high, base)) + 1
    ticks: list[float] = []
    # Coarse to fine mantissas until at least three ticks show (a narrow range needs the finer ones).
    for steps in ((1.0,),) if base == 2 else ((1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0, 7.0), tuple(range(1, 10))):
        ticks = [m * float(base) ** e for e in range(first, last + 1) for m in steps]
        ticks = [t for t in ticks if low <= t <= high]
        if len(ticks) >= 3:
            break
    # A narrow range (under a decade or so): three ticks across it, with two significant digits, or as many more as
    # keep them apart and inside (1,010 to 1,030 rounds to 1,000 at two).
    inner = np.geomspace(low, high, 5)[1:-1]
    for digits in range(2, 8):
        if len(ticks) >= 3:
            break
        ticks = sorted(t for t in {float(f"{v:.{digits}g}") for v in inner} if low <= t <= high)
    stride = max(1, math.ceil(len(ticks) / max_ticks))
    axis.set_major_locator(FixedLocator(ticks[::stride]))
    axis.set_major_formatter(FuncFormatter(tick_label))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def count_ticks(ax: Axes, counts: Iterable[float]) -> None:
    """The GPU-count axis (log scale) ticked at the whole counts measured, labelled as such: never 1.1 or 1.4 between
    1 and 2. More counts than ``MAX_COUNT_TICKS``: every second (every third...), the first and the last kept."""
    present = sorted({int(c) for c in (float(v) for v in counts) if math.isfinite(c) and c >= 1})
    stride = max(1, math.ceil(len(present) / MAX_COUNT_TICKS))
    ticks = present[::stride] + ([present[-1]] if present and (len(present) - 1) % stride else [])
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:,.0f}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())


def short(settings: object) -> str:
    """A point's label: its settings without the precision and gradient accumulation (``zero2 ckpt mb8 2nodes``):
    two points of one GPU count and sharding differ in their micro-batch."""
    kept = (_ACCUMULATION.sub(r"\1", t) for t in str(settings).split() if not _NOT_IN_LABEL.fullmatch(t))
    return " ".join(kept)


def label_points(ax: Axes, x: Iterable[float], y: Iterable[float], labels: Iterable[str], colours: list[RGBA]) -> None:
    """Write each point's setting beside it, in its GPU's colour (left of the rightmost points, to stay inside)."""
    xs = [float(v) for v in x]
    right = max(xs, default=0.0)
    for xi, yi, text, colour in zip(xs, y, labels, colours, strict=True):
        left = xi >= right and len(xs) > 1
        ax.annotate(text, (xi, yi), xytext=(-6 if left else 4, 3), textcoords="offset points", color=colour,
                    fontsize=POINT_PT, ha="right" if left else "left", gid="point-label")  # fmt: skip


def spread_labels(fig: Figure) -> None:
    """Move each point's label up or down a line at a time, on its side of the point and then on the other, until
    it overlaps no label placed before it and stays inside its panel; where no place does both, the first that
    overlaps nothing (else where it was). Each label is measured once: another place only moves its box, and every
    place a label may take is tested against the labels placed before it at once."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's, which every figure here has
    px = renderer.points_to_pixels(1.0)
    steps = np.array([k for k in LABEL_STEPS for _ in range(2)], dtype=float)
    for ax in fig.axes:
        inside = ax.get_window_extent(renderer)
        placed = np.empty((0, 4))  # x0, y0, x1, y1 (each pair ordered) of the labels placed so far
        for label in [t for t in ax.texts if t.get_gid() == "point-label" and isinstance(t, Annotation)]:
            box = label.get_window_extent(renderer)
            x0, y0 = label.xyann
            ha: Side = "right" if label.get_horizontalalignment() == "right" else "left"
            anchor = (box.x1 if ha == "right" else box.x0) - x0 * px  # the point, in pixels
            other: Side = "right" if ha == "left" else "left"
            tries = [(side, x, k) for k in LABEL_STEPS for side, x in ((ha, x0), (other, -x0 - 2))]  # 4 pt <-> -6
            xs = np.array([x for _, x, _ in tries], dtype=float)
            right = np.array([side == "right" for side, _, _ in tries])
            left = anchor + xs * px - np.where(right, box.width, 0.0)
            bottom = box.y0 + steps * LINE_PT * px
            top, far = bottom + box.height, left + box.width
            free = ~_overlaps_any(np.column_stack([left, bottom, far, top]), placed)
            within = (
                (inside.x0 <= left) & (far <= inside.x1) & (inside.y0 <= bottom) & (bottom <= top) & (top <= inside.y1)
            )
            chosen = np.flatnonzero(free & within)
            chosen = chosen if chosen.size else np.flatnonzero(free)
            if chosen.size:
                j = int(chosen[0])
                side, x, k = tries[j]
                offset, extents = (x, y0 + k * LINE_PT), np.array([left[j], bottom[j], far[j], top[j]])
            else:
                side, offset, extents = ha, (x0, y0), np.asarray(box.extents, dtype=float)
            label.set_horizontalalignment(side)
            label.xyann = offset
            x_low, x_high = sorted(extents[0::2])
            y_low, y_high = sorted(extents[1::2])
            placed = np.vstack([placed, [x_low, y_low, x_high, y_high]])


def _overlaps_any(boxes: np.ndarray, placed: np.ndarray) -> np.ndarray:
    """For each box (x0, y0, x1, y1), whether it overlaps any of ``placed`` (ordered extents): edges that touch
    overlap, as in ``Bbox.overlaps``."""
    x0, x1 = np.minimum(boxes[:, 0], boxes[:, 2])[:, None], np.maximum(boxes[:, 0], boxes[:, 2])[:, None]
    y0, y1 = np.minimum(boxes[:, 1], boxes[:, 3])[:, None], np.maximum(boxes[:, 1], boxes[:, 3])[:, None]
    hit = (x0 <= placed[:, 2]) & (placed[:, 0] <= x1) & (y0 <= placed[:, 3]) & (placed[:, 1] <= y1)
    out: np.ndarray = hit.any(axis=1)
    return out
