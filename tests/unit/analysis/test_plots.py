"""The report's plots: what each draws (read back from the figure's artists), and that they stay legible."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from analysis import plots, synthetic
from analysis.records import Catalog
from analysis.report import write_report


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
