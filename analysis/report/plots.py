"""PNG plots of the report: days against GPU count, cost against days with the frontier, scaling efficiency.

Figures are drawn with matplotlib's object API on an Agg canvas, so no display and no global backend switch is
needed (the report runs on login nodes and in CI). Each figure is a grid of panels, one per model, with one
legend to the right of the grid: colours mean the same GPU type in every panel. The layout is set in inches
(panels of a fixed size, margins sized for the longest tick labels, the figure widened to hold the measured
legend), so nothing is clipped whatever the number of panels, without a layout engine's extra drawing pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.gridspec import GridSpecBase
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from matplotlib.typing import LineStyleType
from numpy.typing import ArrayLike

from analysis.report.marks import POINT_PT, count_ticks, label_points, log_ticks, short, spread_labels
from analysis.report.scaling import KNEE_MARGINAL_SPEEDUP
from analysis.report.tables import settings_label
from analysis.sweeps.records import rows_of

RGBA = tuple[float, float, float, float]
"""A colour as matplotlib's colormaps give it."""

DAYS_PLOT = "days_vs_gpus.png"
COST_PLOT = "cost_vs_days.png"
SCALING_PLOT = "scaling_efficiency.png"
MAX_PANELS = 12
"""More models than this are drawn in the first twelve panels only; the tables hold them all."""

PANEL_IN = (4.6, 3.3)
"""Width and height of one panel's axes, inches (at the figure's 100 dpi: 460 × 330 pixels)."""
LEFT_IN, BETWEEN_COLUMNS_IN, LEGEND_GAP_IN, RIGHT_IN = 1.1, 0.85, 0.3, 0.25
"""Room for the y label and tick labels such as ``500,000``; between panels (tick labels only); around the legend."""
TOP_IN, BETWEEN_ROWS_IN, BOTTOM_IN = 0.9, 0.95, 0.6
"""Room for the figure title and subtitle; between rows (x label, then the next panel's title); the x label."""
FONT_PT = {"title": 14, "panel": 12, "label": 11, "tick": 10, "legend": 10, "note": 10, "point": POINT_PT}
MAX_LABELLED_POINTS = 24
"""A panel with more points than this labels its frontier (or fastest) points only; the CSV names every one."""
TEXT_MARGIN_IN = 0.2
"""Room either side of the figure's title and subtitle where they are wider than the panels."""
DPI = 100

SHARDING_STYLES: list[tuple[str, LineStyleType]] = [
    ("o", "-"),
    ("s", "--"),
    ("^", ":"),
    ("D", "-."),
    ("v", "-"),
    ("P", "--"),
    ("X", ":"),
    ("h", "-."),
]
"""Marker and line style of each sharding option in the scaling plot, in the order the options sort."""


def _panels(models: list[str], title: str, note: str) -> tuple[Figure, list[Axes]]:
    shown = models[:MAX_PANELS] or [""]
    ncols = min(3, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig = Figure(dpi=DPI)
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(len(shown))]  # no hidden spare panels
    fig.suptitle(title, fontsize=FONT_PT["title"], y=1.0 - 0.12 / (TOP_IN + nrows * PANEL_IN[1]), va="top")
    fig.text(0.5, 0.0, note, ha="center", va="top", fontsize=FONT_PT["note"], color="dimgrey", gid="note")
    _layout(fig, nrows, ncols, legend_in=0.0)
    return fig, axes


def _layout(fig: Figure, nrows: int, ncols: int, legend_in: float) -> float:
    """Size the figure around panels of a fixed size, and wide enough for its title and subtitle (the panels then
    centred); returns the x (figure fraction) where the legend starts."""
    grid_w = ncols * PANEL_IN[0] + (ncols - 1) * BETWEEN_COLUMNS_IN
    grid_h = nrows * PANEL_IN[1] + (nrows - 1) * BETWEEN_ROWS_IN
    width = LEFT_IN + grid_w + (LEGEND_GAP_IN + legend_in if legend_in else 0.0) + RIGHT_IN
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's, which every figure here has
    title = fig.suptitle(fig.get_suptitle(), fontsize=FONT_PT["title"])
    text_in = max(t.get_window_extent(renderer).width for t in [title, *fig.texts]) / fig.dpi
    left_in = LEFT_IN + max(0.0, text_in + 2 * TEXT_MARGIN_IN - width) / 2
    width = max(width, text_in + 2 * TEXT_MARGIN_IN)
    height = TOP_IN + grid_h + BOTTOM_IN
    fig.set_size_inches(width, height)
    fig.subplots_adjust(
        left=left_in / width,
        right=(left_in + grid_w) / width,
        bottom=BOTTOM_IN / height,
        top=1.0 - TOP_IN / height,
        wspace=BETWEEN_COLUMNS_IN / PANEL_IN[0],
        hspace=BETWEEN_ROWS_IN / PANEL_IN[1],
    )
    for text in fig.texts:  # the subtitle sits under the title, a fixed distance from the top
        if text.get_gid() == "note":
            text.set_position((0.5, 1.0 - 0.45 / height))
    fig.suptitle(fig.get_suptitle(), fontsize=FONT_PT["title"], y=1.0 - 0.12 / height, va="top")
    return (left_in + grid_w + LEGEND_GAP_IN) / width


def _style(ax: Axes, model: str, xlabel: str, ylabel: str, first_column: bool) -> None:
    ax.set_title(model, y=1.0, pad=5, fontsize=FONT_PT["panel"])  # a fixed position skips a costly layout pass
    ax.set_xlabel(xlabel, fontsize=FONT_PT["label"])
    if first_column:  # the same quantity in every panel: labelled once per row
        ax.set_ylabel(ylabel, fontsize=FONT_PT["label"])
    ax.tick_params(labelsize=FONT_PT["tick"])
    ax.grid(True, alpha=0.3)


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def _models(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["model"].dropna().astype(str))) if "model" in frame.columns else []


def _gpu_colours(frames: Iterable[pd.DataFrame]) -> dict[str, RGBA]:
    names: list[str] = []
    for frame in frames:
        if "gpu" in frame.columns:
            names.extend(frame["gpu"].dropna().astype(str))
    cmap = colormaps["tab10"]
    return {name: tuple(cmap(i % 10)) for i, name in enumerate(sorted(dict.fromkeys(names)))}  # type: ignore[misc]


def _grid(ax: Axes) -> GridSpecBase:
    """The grid of panels ``ax`` is one of (every axis here is made by ``subplots``, so it has one)."""
    spec = ax.get_subplotspec()
    assert spec is not None
    return spec.get_gridspec()


def _ring_nodes(ax: Axes, x: ArrayLike, y: ArrayLike, nodes: ArrayLike, colours: list[RGBA]) -> None:
    """Ring the points whose cells span more than one node."""
    multi = np.asarray(nodes, dtype=float) > 1
    ax.scatter(np.asarray(x, dtype=float)[multi], np.asarray(y, dtype=float)[multi], s=170, facecolors="none",
               zorder=3, clip_on=False, edgecolors=[c for c, m in zip(colours, multi, strict=True) if m], linewidths=1.3)  # fmt: skip


NODES_ENTRY = (
    Line2D([], [], color="black", marker="o", markersize=12, markerfacecolor="none", linestyle=""),
    "> 1 node",
)


def _header(text: str) -> tuple[Line2D, str]:
    """A legend section's heading: no mark, bold text."""
    return Line2D([], [], linestyle="", marker="", gid="header"), text


def _gpu_entries(
    colours: dict[str, RGBA], shown: Iterable[str], marker: str = "o", linestyle: LineStyleType = "-"
) -> list[tuple[Line2D, str]]:
    used = set(shown)
    entries = [_header("GPU type")]
    entries += [
        (Line2D([], [], color=c, marker=marker, linestyle=linestyle), g) for g, c in colours.items() if g in used
    ]
    return entries


def _finish(fig: Figure, axes: list[Axes], entries: list[tuple[Line2D, str]], path: Path) -> Path:
    """Put the legend right of the panels, widen the figure to hold it, and save."""
    nrows, ncols = _grid(axes[0]).get_geometry()
    if entries:
        handles, labels = zip(*entries, strict=True)
        legend = fig.legend(list(handles), list(labels), loc="upper left", fontsize=FONT_PT["legend"], frameon=False)
        for text, handle in zip(legend.get_texts(), handles, strict=True):
            if handle.get_gid() == "header":
                text.set_fontweight("bold")
        width_in = legend.get_window_extent().width / fig.dpi
        left = _layout(fig, nrows, ncols, legend_in=width_in)
        legend.set_bbox_to_anchor((left, 1.0 - TOP_IN / fig.get_figheight()), transform=fig.transFigure)
        legend.set_loc("upper left")
    return _save(fig, path)


def _save(fig: Figure, path: Path) -> Path:
    spread_labels(fig)
    # zlib level 3: a quarter of the encoding time of the default for a slightly larger file.
    fig.savefig(path, dpi=DPI, pil_kwargs={"compress_level": 3})
    return path


def _no_data(fig: Figure, axes: list[Axes], path: Path) -> Path:
    _empty(axes[0], "no measured cells")
    return _save(fig, path)


def plot_days_vs_gpus(best: pd.DataFrame, path: Path) -> Path:
    """Days to train (fastest setting, with its 95% interval) against GPU count, a panel per model."""
    models = _models(best)
    fig, axes = _panels(
        models,
        "Time to train with the fastest measured setting",
        "bars: 95% confidence interval of the measured step time; each point: GPUs × its fastest setting",
    )
    if not models:
        return _no_data(fig, axes, path)
    colours = _gpu_colours([best])
    ncols = _grid(axes[0]).ncols
    for i, (ax, model) in enumerate(zip(axes, models, strict=False)):
        part = best[best["model"] == model]
        for gpu, line in part.groupby("gpu", sort=True):
            line = line.sort_values("num_gpus")
            ax.plot(
                line["num_gpus"].astype(float),
                line["time_to_train_days"].astype(float),
                marker="o",
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
        point_colours = [colours[str(g)] for g in part["gpu"]]
        label_points(ax, part["num_gpus"].astype(float), part["time_to_train_days"].astype(float),
               [f"{n:g}× {short(t)}" for n, t in zip(part["num_gpus"], part["settings"], strict=True)], point_colours)  # fmt: skip
        _ring_nodes(ax, part["num_gpus"], part["time_to_train_days"], part["num_nodes"], point_colours)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.margins(x=0.15, y=0.1)
        count_ticks(ax, part["num_gpus"])
        log_ticks(ax, "y")
        _style(ax, model, "GPUs (count, log scale)", "time to train (days, log scale)", i % ncols == 0)
    entries = [*_gpu_entries(colours, best["gpu"].astype(str)), _header("marks"), NODES_ENTRY]
    return _finish(fig, axes, entries, path)


def plot_cost_vs_days(cells: pd.DataFrame, frontier: pd.DataFrame, path: Path) -> Path:
    """Every measured cell's cost against its days, a panel per model, the Pareto frontier drawn as a line."""
    measured = cells[cells["status"].eq("ok") & cells["time_to_train_days"].notna()] if len(cells) else cells
    models = _models(frontier)
    fig, axes = _panels(
        models,
        "Cost against time to train",
        "frontier: the cells no other cell beats on both time and cost; each point: GPUs × setting",
    )
    if not models:
        return _no_data(fig, axes, path)
    colours = _gpu_colours([measured])
    ncols = _grid(axes[0]).ncols
    bases = set()
    for i, (ax, model) in enumerate(zip(axes, models, strict=False)):
        front = frontier[frontier["model"] == model].sort_values("time_to_train_days")
        basis = str(front["cost_basis"].iloc[0])
        bases.add(basis)
        part = measured[measured["model"] == model]
        for gpu, points in part[["gpu", "time_to_train_days", basis]].groupby("gpu", sort=True):  # what is drawn
            ax.plot(
                points["time_to_train_days"].astype(float),
                points[basis].astype(float),
                linestyle="",
                marker="o",
                markersize=5,
                alpha=0.7,
                color=colours.get(str(gpu)),
            )
        # Every point named by its GPU count and setting (the frontier's alone where a panel has too many).
        named = part if len(part) <= MAX_LABELLED_POINTS else part[part["cell_id"].isin(front["cell_id"])]
        named_colours = [colours.get(str(g), (0.0, 0.0, 0.0, 1.0)) for g in named["gpu"]]
        label_points(ax, named["time_to_train_days"].astype(float), named[basis].astype(float),
               [f"{n:g}× {short(settings_label(r))}" for n, r in zip(named["num_gpus"], rows_of(named, named.columns), strict=True)],
               named_colours)  # fmt: skip
        _ring_nodes(ax, named["time_to_train_days"], named[basis], named["num_nodes"], named_colours)
        # The frontier as a staircase (everything above and right of it is beaten), its cells ringed so their
        # GPU's colour still shows.
        ax.plot(
            front["time_to_train_days"].astype(float),
            front[basis].astype(float),
            drawstyle="steps-post",
            color="black",
            linewidth=1,
            marker="o",
            markersize=9,
            markerfacecolor="none",
            clip_on=False,  # a ring at a corner of the panel drawn whole
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.margins(0.1)  # room for the frontier's ring and a label at the corner points
        log_ticks(ax, "x")
        log_ticks(ax, "y")
        ylabel = "cloud cost (USD, log scale)" if basis == "cost_usd_cloud" else "GPU-hours (no price known, log)"
        first = i % ncols == 0 or len(bases) > 1  # a panel with another cost basis than its row says so itself
        _style(ax, model, "time to train (days, log scale)", ylabel, first)
    entries = _gpu_entries(colours, measured["gpu"].astype(str), linestyle="")
    entries += [
        _header("marks"),
        (Line2D([], [], color="black", marker="o", markersize=9, markerfacecolor="none"), "frontier"),
        NODES_ENTRY,
    ]
    return _finish(fig, axes, entries, path)


def _sharding_styles(scaling: pd.DataFrame) -> dict[str, tuple[str, LineStyleType]]:
    names = sorted(dict.fromkeys(scaling["sharding"].dropna().astype(str))) if "sharding" in scaling else []
    return {name: SHARDING_STYLES[i % len(SHARDING_STYLES)] for i, name in enumerate(names)}


def plot_scaling(scaling: pd.DataFrame, path: Path, knee: float = KNEE_MARGINAL_SPEEDUP) -> Path:
    """Scaling efficiency against GPU count: a line per GPU type × sharding option, its knee starred.

    The line runs through the fastest layout of each GPU count; other layouts of a count (e.g. the same GPUs
    over two nodes) are drawn as unconnected points, and counts spread over several nodes are ringed.
    """
    models = _models(scaling)
    fig, axes = _panels(
        models,
        "Scaling efficiency: speed-up over ideal, and where returns diminish",
        f"star: the knee, after which each added GPU buys less than {knee:g} of what each of the first did",
    )
    if not models:
        return _no_data(fig, axes, path)
    colours = _gpu_colours([scaling])
    styles = _sharding_styles(scaling) if "sharding" in scaling.columns else {}
    if not styles:
        scaling = scaling.assign(sharding="")
        styles = {"": SHARDING_STYLES[0]}
    ncols = _grid(axes[0]).ncols
    for i, (ax, model) in enumerate(zip(axes, models, strict=False)):
        part = scaling[scaling["model"] == model].assign(
            _n=lambda f: f["num_gpus"].astype(float), _eff=lambda f: f["scaling_efficiency"].astype(float)
        )
        drawn = [c for c in ("gpu", "sharding", "num_nodes", "knee_num_gpus", "_n", "_eff") if c in part.columns]
        part = part[drawn].sort_values(["gpu", "sharding", "_n", "_eff"], ascending=[True, True, True, False])
        fastest = part.drop_duplicates(["gpu", "sharding", "_n"])
        # All lines of a panel as one collection, the points as one scatter per marker: a few artists per panel.
        segments, line_colours, line_styles = [], [], []
        for (gpu, sharding), line in fastest.groupby(["gpu", "sharding"], sort=False):
            segments.append(np.column_stack([line["_n"], line["_eff"]]))
            line_colours.append(colours[str(gpu)])
            line_styles.append(styles[str(sharding)][1])
        ax.add_collection(LineCollection(segments, colors=line_colours, linestyles=line_styles, linewidths=1.6))
        for sharding, points in part.groupby("sharding", sort=False):
            ax.scatter(
                points["_n"], points["_eff"], s=36, marker=styles[str(sharding)][0], zorder=3,
                c=[colours[str(g)] for g in points["gpu"]],
            )  # fmt: skip
        multi = part[part["num_nodes"].astype(float) > 1]
        ax.scatter(
            multi["_n"], multi["_eff"], s=170, facecolors="none", zorder=3,
            edgecolors=[colours[str(g)] for g in multi["gpu"]], linewidths=1.3,
        )  # fmt: skip
        knees = (
            fastest[fastest["_n"] == fastest["knee_num_gpus"].astype(float)] if "knee_num_gpus" in part else part[:0]
        )
        ax.scatter(
            knees["_n"], knees["_eff"], s=300, marker="*", zorder=4, edgecolors="black", linewidths=0.8, gid="knee",
            c=[colours[str(g)] for g in knees["gpu"]],
        )  # fmt: skip
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.autoscale_view()
        ax.margins(x=0.08)
        ax.set_xlim(*ax.get_xlim())  # the limits _log_ticks reads
        count_ticks(ax, part["_n"])
        ax.set_ylim(0, max(1.1, float(part["_eff"].max()) * 1.08))
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
        _style(ax, model, "GPUs (count, log scale)", "scaling efficiency (speed-up ÷ ideal)", i % ncols == 0)
    entries = _gpu_entries(colours, scaling["gpu"].astype(str), marker="")
    if len(styles) > 1 or "" not in styles:
        entries.append(_header("sharding"))
        entries += [(Line2D([], [], color="black", marker=m, linestyle=ls), name) for name, (m, ls) in styles.items()]
    entries += [
        _header("marks"),
        (Line2D([], [], color="black", marker="o", markersize=12, markerfacecolor="none", linestyle=""), "> 1 node"),
        (Line2D([], [], color="white", marker="*", markersize=16, markeredgecolor="black", linestyle=""), "knee"),
    ]
    return _finish(fig, axes, entries, path)


def write_plots(
    cells: pd.DataFrame,
    best: pd.DataFrame,
    frontier: pd.DataFrame,
    scaling: pd.DataFrame,
    out_dir: Path,
    knee: float = KNEE_MARGINAL_SPEEDUP,
) -> list[Path]:
    """Draw the three plots into ``out_dir``; returns their paths. ``knee``: the threshold scaling.csv used."""
    return [
        plot_days_vs_gpus(best, out_dir / DAYS_PLOT),
        plot_cost_vs_days(cells, frontier, out_dir / COST_PLOT),
        plot_scaling(scaling, out_dir / SCALING_PLOT, knee),
    ]
