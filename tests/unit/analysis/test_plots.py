"""The report's plots: what each draws (read back from the figure's artists), and that they stay legible."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import synthetic
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure

from analysis.report import marks, plots
from analysis.report.writer import write_report
from analysis.sweeps.records import Catalog


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def _measure(sweep: Path, cell_id: str, config: dict, step_time_s: float) -> None:
    metrics = synthetic.metrics(config, step_time_s, 4, 20.0)
    synthetic.write_cell(sweep, cell_id, config, synthetic.record(cell_id, config, "ok", metrics))


def _drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Keep every figure the plot functions save, so a test can read what was drawn."""
    figures: list[Figure] = []
    save = plots._save

    def keep(fig: Figure, path: Path) -> Path:
        figures.append(fig)
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return figures


def _points(ax) -> set[tuple[float, float]]:
    """Every (x, y) marked in a panel, by lines or scatter collections, rounded to compare."""
    found: set[tuple[float, float]] = set()
    for line in ax.lines:
        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
            found.add((round(float(x), 6), round(float(y), 6)))
    for collection in ax.collections:
        for x, y in np.asarray(collection.get_offsets()).reshape(-1, 2):
            found.add((round(float(x), 6), round(float(y), 6)))
    return found


def test_scaling_plot_keeps_the_one_node_point_beside_a_faster_two_node_one(
    tmp_path: Path, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8 GPUs measured on one node (0.8 s) and on two (0.7 s, faster): both are measurements and both must show.
    sweep = tmp_path / "nodes"
    for cell_id, gpus, nodes, step in (("one", 1, 1, 4.0), ("eight", 8, 1, 0.8), ("eight-2n", 8, 2, 0.7)):
        _measure(sweep, cell_id, synthetic.cell_config("pythia-160m", "a100-80gb", gpus, nodes, catalog=catalog), step)
    report = write_report([sweep], plots=False)
    figures = _drawn(monkeypatch)
    plots.plot_scaling(report.scaling, tmp_path / "scaling.png")

    shown = _points(figures[0].axes[0])
    one_node, two_nodes = round(4.0 / 0.8 / 8, 6), round(4.0 / 0.7 / 8, 6)  # scaling efficiency 0.625 and 0.714
    assert (8.0, one_node) in shown
    assert (8.0, two_nodes) in shown
    assert (1.0, 1.0) in shown


@pytest.fixture(scope="module")
def knee_report(tmp_path_factory: pytest.TempPathFactory, catalog: Catalog):
    """One model on A100s: 1, 2, 4, 8 GPUs at 1000, 1900, 3400, 4000 tokens/s (knee at 4), 8 on two nodes too."""
    sweep = tmp_path_factory.mktemp("plots") / "sweep"
    tokens_per_step = 1024 * 2048
    for gpus, nodes, tokens_per_s in ((1, 1, 1000.0), (2, 1, 1900.0), (4, 1, 3400.0), (8, 1, 4000.0), (8, 2, 3800.0)):
        config = synthetic.cell_config("pythia-160m", "a100-80gb", gpus, nodes, catalog=catalog)
        _measure(sweep, f"a{gpus}-{nodes}", config, tokens_per_step / tokens_per_s)
    return write_report([sweep], plots=False)


def _all_plots(report, out: Path) -> list[Path]:
    return plots.write_plots(report.cells, report.best, report.frontier, report.scaling, out)


def test_each_plot_fits_its_labels_and_legend_inside_the_figure(
    knee_report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = _drawn(monkeypatch)
    _all_plots(knee_report, tmp_path)
    assert len(figures) == 3
    for fig in figures:
        renderer = fig.canvas.get_renderer()
        width, height = fig.get_size_inches() * fig.dpi
        assert width >= 700 and height >= 450, "one panel must still be large enough to read"
        whole = fig.bbox
        legend = fig.legends[0].get_window_extent(renderer)
        for ax in fig.axes:
            # Tick labels, axis labels and the panel title all inside the picture, none cut at an edge.
            box = ax.get_tightbbox(renderer)
            assert box.x0 >= whole.x0 and box.y0 >= whole.y0 and box.x1 <= whole.x1 and box.y1 <= whole.y1
            assert not legend.overlaps(ax.get_window_extent(renderer)), "the legend sits beside the data"
            assert "log" in ax.get_xlabel() and ax.get_xscale() == "log"
            assert "(" in ax.get_ylabel(), "y label with its unit"
        assert legend.x0 >= whole.x0 and legend.x1 <= whole.x1


def test_scaling_plot_stars_the_knee_and_names_its_threshold(
    knee_report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = _drawn(monkeypatch)
    plots.plot_scaling(knee_report.scaling, tmp_path / "scaling.png", knee=0.5)
    ax = figures[0].axes[0]
    stars = [c for c in ax.collections if c.get_gid() == "knee"]
    assert len(stars) == 1
    assert np.asarray(stars[0].get_offsets()).tolist() == [[4.0, pytest.approx(0.85)]]  # 3400 / 1000 / 4
    assert any("less than 0.5" in t.get_text() for t in figures[0].texts)
    legend_texts = [t.get_text() for t in figures[0].legends[0].get_texts()]
    assert {"a100-80gb", "zero0", "> 1 node", "knee"} <= set(legend_texts)


def test_each_point_of_cost_and_days_plots_names_its_setting_and_multi_node_points_are_ringed(
    tmp_path: Path, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = tmp_path / "labels"
    for cell_id, gpus, nodes, method, step in (
        ("z0", 8, 1, {"zero_stage": 0}, 1.0),
        ("fsdp", 8, 1, {"engine": "fsdp", "fsdp_sharding": "full"}, 0.95),
        ("hsdp", 16, 2, {"engine": "fsdp", "fsdp_sharding": "hybrid"}, 0.5),
        ("z2", 16, 2, {"zero_stage": 2}, 0.52),
    ):
        config = synthetic.cell_config("pythia-160m", "a100-80gb", gpus, nodes, catalog=catalog, **method)
        _measure(sweep, cell_id, config, step)
    report = write_report([sweep], plots=False)
    figures = _drawn(monkeypatch)
    plots.plot_cost_vs_days(report.cells, report.frontier, tmp_path / "cost.png")
    plots.plot_days_vs_gpus(report.best, tmp_path / "days.png")
    cost, days = (fig.axes[0] for fig in figures)
    labels = {t.get_text() for t in cost.texts if t.get_gid() == "point-label"}
    assert labels == {"8× zero0 mb4", "8× fsdp-full mb4", "16× fsdp-hybrid mb4 2nodes", "16× zero2 mb4 2nodes"}
    assert {t.get_text() for t in days.texts if t.get_gid() == "point-label"} == {
        "8× fsdp-full mb4",
        "16× fsdp-hybrid mb4 2nodes",
    }
    for ax, ringed in ((cost, 2), (days, 1)):
        scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
        rings = [c for c in scatters if len(c.get_offsets()) and not c.get_facecolor().any()]
        assert sum(len(c.get_offsets()) for c in rings) == ringed, "the points of two nodes are ringed"
    for fig in figures:
        assert "> 1 node" in [t.get_text() for t in fig.legends[0].get_texts()]
    for ax in (cost, days):
        assert len(ax.yaxis.get_majorticklocs()) >= 3, "a log axis needs at least three labelled ticks"


def test_a_narrow_log_range_still_gets_three_ticks() -> None:
    fig = Figure()
    ax = fig.add_subplot()
    ax.set_yscale("log")
    ax.set_ylim(1450, 3200)  # under half a decade: 1-2-5 and finer mantissas give two ticks at most
    marks.log_ticks(ax, "y")
    assert len(ax.yaxis.get_majorticklocs()) >= 3


# Issue 30: GPU-count ticks at the counts measured, labels that name the micro-batch and do not overlap, corner
# points drawn whole, an empty plot's subtitle whole.


@pytest.fixture(scope="module")
def two_counts(tmp_path_factory: pytest.TempPathFactory, catalog: Catalog):
    """One model on 1 and 2 A100s at micro-batches 4 and 8, the two settings of a count nearly as fast."""
    sweep = tmp_path_factory.mktemp("counts") / "sweep"
    for gpus in (1, 2):
        for mb, step in ((4, 3.0 / gpus), (8, 2.99 / gpus)):
            config = synthetic.cell_config("pythia-160m", "a100-80gb", gpus, catalog=catalog)
            metrics = synthetic.metrics(config, step, mb, 20.0)
            synthetic.write_cell(
                sweep, f"g{gpus}mb{mb}", config, synthetic.record(f"g{gpus}mb{mb}", config, "ok", metrics)
            )
    return write_report([sweep], plots=False)


def test_a_gpu_count_axis_is_ticked_at_the_whole_counts_measured(
    two_counts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = _drawn(monkeypatch)
    plots.plot_days_vs_gpus(two_counts.best, tmp_path / "days.png")
    plots.plot_scaling(two_counts.scaling, tmp_path / "scaling.png")
    for fig in figures:
        axis = fig.axes[0].xaxis
        assert list(axis.get_majorticklocs()) == [1.0, 2.0], "not 1.1, 1.4, 1.8"
        assert [axis.get_major_formatter()(v, i) for i, v in enumerate((1.0, 2.0))] == ["1", "2"]
        assert not len(axis.get_minorticklocs())
    fig = Figure()
    ax = fig.add_subplot()
    ax.set_xscale("log", base=2)
    marks.count_ticks(ax, [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64])
    assert list(ax.xaxis.get_majorticklocs()) == [1, 3, 6, 12, 24, 48, 64], "every second count, and the last"


def test_point_labels_name_the_micro_batch_and_do_not_overlap(
    two_counts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = _drawn(monkeypatch)
    plots.plot_cost_vs_days(two_counts.cells, two_counts.frontier, tmp_path / "cost.png")
    ax = figures[0].axes[0]
    renderer = figures[0].canvas.get_renderer()
    labels = [t for t in ax.texts if t.get_gid() == "point-label"]
    assert sorted(t.get_text() for t in labels) == ["1× zero0 mb4", "1× zero0 mb8", "2× zero0 mb4", "2× zero0 mb8"]
    boxes = [t.get_window_extent(renderer) for t in labels]
    panel = ax.get_window_extent(renderer)
    for i, box in enumerate(boxes):
        assert not any(box.overlaps(other) for other in boxes[i + 1 :]), labels[i].get_text()
        assert panel.x0 <= box.x0 and box.x1 <= panel.x1, f"{labels[i].get_text()} leaves its panel"


def test_the_frontiers_corner_points_have_room_for_their_ring_and_label(
    two_counts, tmp_path: Path, monkeypatch
) -> None:
    figures = _drawn(monkeypatch)
    plots.plot_cost_vs_days(two_counts.cells, two_counts.frontier, tmp_path / "cost.png")
    ax = figures[0].axes[0]
    panel = ax.get_window_extent(figures[0].canvas.get_renderer())
    # Room for the widest ring (a multi-node point's, 170 square points) and a line of its label beside it.
    ring_px = (np.sqrt(170) / 2 + marks.POINT_PT * 1.3) * figures[0].dpi / 72
    for line in ax.lines:
        for x, y in ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()])):
            assert panel.x0 + ring_px <= x <= panel.x1 - ring_px and panel.y0 + ring_px <= y <= panel.y1 - ring_px


def test_an_empty_plot_keeps_its_subtitle_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd

    figures = _drawn(monkeypatch)
    plots.plot_days_vs_gpus(pd.DataFrame(), tmp_path / "days.png")
    fig = figures[0]
    renderer = fig.canvas.get_renderer()
    for text in fig.texts:
        box = text.get_window_extent(renderer)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1, text.get_text()


def test_a_very_narrow_log_range_gets_ticks_inside_it_and_apart() -> None:
    fig = Figure()
    ax = fig.add_subplot()
    ax.set_yscale("log")
    ax.set_ylim(1010, 1030)  # at two significant digits every tick would be 1,000, outside the range
    marks.log_ticks(ax, "y")
    ticks = list(ax.yaxis.get_majorticklocs())
    labels = [ax.yaxis.get_major_formatter()(t, i) for i, t in enumerate(ticks)]
    assert len(ticks) >= 3 and all(1010 <= t <= 1030 for t in ticks) and len(set(labels)) == len(labels), labels
    ax.set_ylim(1.001, 1.009)
    marks.log_ticks(ax, "y")
    labels = [ax.yaxis.get_major_formatter()(t, i) for i, t in enumerate(ax.yaxis.get_majorticklocs())]
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
