"""PNG plots of the report: days against GPU count, cost against days with the frontier, scaling efficiency.

Figures are drawn with matplotlib's object API on an Agg canvas, so no display and no global backend switch is
needed (the report runs on login nodes and in CI).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter, NullLocator

DAYS_PLOT = "days_vs_gpus.png"
COST_PLOT = "cost_vs_days.png"
SCALING_PLOT = "scaling_efficiency.png"
MAX_PANELS = 12
"""More models than this are drawn in the first twelve panels only; the tables hold them all."""


def _panels(models: list[str], title: str) -> tuple[Figure, list]:
    shown = models[:MAX_PANELS] or [""]
    ncols = min(3, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    # A fixed layout: constrained layout and "best" legend placement cost seconds with thousands of points.
    fig = Figure(figsize=(4.6 * ncols + 1.6, 3.6 * nrows))
    height_in = 3.6 * nrows
    fig.subplots_adjust(
        left=0.08, right=0.84, bottom=0.55 / height_in, top=1 - 0.8 / height_in, wspace=0.3, hspace=0.45
    )
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(len(shown))]  # no hidden spare panels
    fig.suptitle(title)
    return fig, axes


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def _models(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["model"].dropna().astype(str))) if "model" in frame.columns else []


def _gpu_colours(frames: Iterable[pd.DataFrame]) -> dict[str, tuple]:
    names: list[str] = []
    for frame in frames:
        if "gpu" in frame.columns:
            names.extend(frame["gpu"].dropna().astype(str))
    unique = sorted(dict.fromkeys(names))
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {name: cmap(i % 10) for i, name in enumerate(unique)}


def _tick_label(value: float, _position: Any = None) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def _log_ticks(ax: Any, which: str, base: int = 10, max_ticks: int = 6) -> None:
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
    if len(ticks) < 2:  # less than a tenth of a decade: three ticks across it, two significant digits
        ticks = sorted({float(f"{v:.2g}") for v in np.geomspace(low, high, 5)[1:-1]})
    stride = max(1, math.ceil(len(ticks) / max_ticks))
    axis.set_major_locator(FixedLocator(ticks[::stride]))
    axis.set_major_formatter(FuncFormatter(_tick_label))
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def _legend(fig: Figure, axes: list) -> None:
    """One legend for the figure, right of the panels: colours mean the same GPU in every panel."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    # Marks that mean the same in every colour go last, drawn in black.
    for label in ("frontier", "more than one node"):
        handle = entries.pop(label, None)
        if handle is not None:
            entries[label] = Line2D(
                [],
                [],
                marker="o",
                markersize=9,
                linestyle="-" if label == "frontier" else "",
                color="black",
                markerfacecolor="none",
                markeredgecolor="black",
            )
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="center right", fontsize="small")


def _save(fig: Figure, path: Path) -> Path:
    # zlib level 3: a quarter of the encoding time of the default for a slightly larger file.
    fig.savefig(path, dpi=100, pil_kwargs={"compress_level": 3})
    return path


def plot_days_vs_gpus(best: pd.DataFrame, path: Path) -> Path:
    """Days to train (fastest setting, with its 95% interval) against GPU count, a panel per model."""
    models = _models(best)
    fig, axes = _panels(models, "Time to train with the fastest measured setting")
    colours = _gpu_colours([best])
    if not models:
        _empty(axes[0], "no measured cells")
        return _save(fig, path)
    for ax, model in zip(axes, models, strict=False):
        part = best[best["model"] == model]
        for gpu, line in part.groupby("gpu", sort=True):
            line = line.sort_values("num_gpus")
            ax.plot(
                line["num_gpus"].astype(float),
                line["time_to_train_days"].astype(float),
                marker="o",
                label=str(gpu),
                color=colours[str(gpu)],
            )
        # The intervals as one collection per panel: one errorbar() per line costs more than the rest together.
        low = part["time_to_train_days_low"].astype(float).to_numpy()
        high = part["time_to_train_days_high"].astype(float).to_numpy()
        shown = np.isfinite(low) & np.isfinite(high)
        ax.vlines(
            part["num_gpus"].astype(float).to_numpy()[shown],
            low[shown],
            high[shown],
            colors=[colours[str(g)] for g in part["gpu"].to_numpy()[shown]],
            linewidth=2,
        )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _log_ticks(ax, "x", base=2)
        _log_ticks(ax, "y")
        ax.set_title(model, y=1.0, pad=4)  # a fixed position skips a costly layout pass
        ax.set_xlabel("GPUs")
        ax.set_ylabel("days to train")
        ax.grid(True, alpha=0.3)
    _legend(fig, axes)
    return _save(fig, path)


def plot_cost_vs_days(cells: pd.DataFrame, frontier: pd.DataFrame, path: Path) -> Path:
    """Every measured cell's cost against its days, a panel per model, the Pareto frontier drawn as a line."""
    measured = cells[cells["status"].eq("ok") & cells["time_to_train_days"].notna()] if len(cells) else cells
    models = _models(frontier)
    fig, axes = _panels(models, "Cost against time to train (frontier: nothing beats it on both)")
    colours = _gpu_colours([measured])
    if not models:
        _empty(axes[0], "no measured cells")
        return _save(fig, path)
    for ax, model in zip(axes, models, strict=False):
        front = frontier[frontier["model"] == model].sort_values("time_to_train_days")
        basis = str(front["cost_basis"].iloc[0])
        part = measured[measured["model"] == model]
        for gpu, points in part.groupby("gpu", sort=True):
            ax.plot(
                points["time_to_train_days"].astype(float),
                points[basis].astype(float),
                linestyle="",
                marker="o",
                markersize=4,
                alpha=0.7,
                color=colours.get(str(gpu)),
                label=str(gpu),
            )
        # The frontier as a staircase (everything above and right of it is beaten), its cells ringed so their
        # GPU's colour still shows.
        ax.plot(
            front["time_to_train_days"].astype(float),
            front[basis].astype(float),
            drawstyle="steps-post",
            color="black",
            linewidth=1,
            marker="o",
            markersize=8,
            markerfacecolor="none",
            label="frontier",
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        _log_ticks(ax, "x")
        _log_ticks(ax, "y")
        ax.set_title(model, y=1.0, pad=4)  # a fixed position skips a costly layout pass
        ax.set_xlabel("days to train")
        ax.set_ylabel("cloud cost (USD)" if basis == "cost_usd_cloud" else "GPU-hours (no price known)")
        ax.grid(True, alpha=0.3)
    _legend(fig, axes)
    return _save(fig, path)


def plot_scaling(scaling: pd.DataFrame, path: Path) -> Path:
    """Scaling efficiency (throughput per GPU relative to the smallest count) against GPU count."""
    models = _models(scaling)
    fig, axes = _panels(models, "Scaling efficiency: speed-up over ideal")
    colours = _gpu_colours([scaling])
    if not models:
        _empty(axes[0], "no measured cells")
        return _save(fig, path)
    for ax, model in zip(axes, models, strict=False):
        part = scaling[scaling["model"] == model]
        for gpu, rows in part.groupby("gpu", sort=True):
            # One line per GPU type through the best layout of each count; counts spread over several nodes
            # are ringed, so the cost of leaving the node shows as a kink in the same line.
            rows = rows.sort_values(["num_gpus", "scaling_efficiency"], ascending=[True, False])
            line = rows.drop_duplicates("num_gpus")
            ax.plot(
                line["num_gpus"].astype(float),
                line["scaling_efficiency"].astype(float),
                marker="o",
                color=colours.get(str(gpu)),
                label=str(gpu),
            )
            # The other layouts of a count are measurements too: drawn unconnected, never dropped.
            others = rows.drop(index=line.index)
            if len(others):
                ax.plot(
                    others["num_gpus"].astype(float),
                    others["scaling_efficiency"].astype(float),
                    linestyle="",
                    marker="o",
                    color=colours.get(str(gpu)),
                )
            multi = rows[rows["num_nodes"].astype(float) > 1]
            if len(multi):
                ax.plot(
                    multi["num_gpus"].astype(float),
                    multi["scaling_efficiency"].astype(float),
                    linestyle="",
                    marker="o",
                    markersize=9,
                    markerfacecolor="none",
                    markeredgecolor=colours.get(str(gpu)),
                    label="more than one node",
                )
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        _log_ticks(ax, "x", base=2)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.set_title(model, y=1.0, pad=4)  # a fixed position skips a costly layout pass
        ax.set_xlabel("GPUs")
        ax.set_ylabel("scaling efficiency")
        ax.grid(True, alpha=0.3)
    _legend(fig, axes)
    return _save(fig, path)


def write_plots(
    cells: pd.DataFrame, best: pd.DataFrame, frontier: pd.DataFrame, scaling: pd.DataFrame, out_dir: Path
) -> list[Path]:
    """Draw the three plots into ``out_dir``; returns their paths."""
    return [
        plot_days_vs_gpus(best, out_dir / DAYS_PLOT),
        plot_cost_vs_days(cells, frontier, out_dir / COST_PLOT),
        plot_scaling(scaling, out_dir / SCALING_PLOT),
    ]
