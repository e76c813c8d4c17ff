"""How ``gpudays`` writes a number or an interval on a terminal, the same in every table and line.

A figure has a fixed number of significant digits, in fixed point with its thousands grouped by commas
(``9,505`` above ``11,800``, never ``9505`` above ``11,801``); scientific notation only for magnitudes no
table of this tool holds (below 0.0001 or from a thousand million million on). An interval is its two ends joined
by an en dash (``4,180–13,500``), so that a minus sign is never mistaken for the range's separator.

Plain Python, no rich: any module that prints a number may import it.
"""

from __future__ import annotations

import math

SMALLEST_FIXED = 1e-4
"""Below this magnitude a figure is written in scientific notation (``1.2e-05``)."""
LARGEST_FIXED = 1e15
"""From this magnitude on a figure is written in scientific notation."""
DASH = "–"
"""Between an interval's two ends."""


def figure(value: float, digits: int = 4) -> str:
    """``value`` to ``digits`` significant digits, thousands grouped: 9505.2 -> ``9,505``, 11801 -> ``11,800``,
    33.1 -> ``33.1``, 2.0 -> ``2``, 0.004632 -> ``0.004632``; ``nan``, ``inf`` as Python writes them."""
    v = float(value)
    if not math.isfinite(v):
        return str(v)
    if v == 0:
        return "0"
    rounded = float(f"{v:.{digits}g}")
    if not SMALLEST_FIXED <= abs(rounded) < LARGEST_FIXED:
        return f"{v:.{digits}g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    text = f"{rounded:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def count(value: int) -> str:
    """A whole number exactly, thousands grouped: 11801 -> ``11,801``."""
    return f"{value:,}"


def interval(low: float, high: float, digits: int = 3) -> str:
    """An interval's two ends as figures joined by an en dash: ``4,180–13,500``."""
    return f"{figure(low, digits)}{DASH}{figure(high, digits)}"
