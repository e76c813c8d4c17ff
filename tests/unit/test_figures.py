"""Numbers on the terminal (issue 30): one formatter for every table's figures and intervals; thousands grouped
the same way in a column, no scientific notation for ordinary magnitudes, an en dash between an interval's ends."""

from __future__ import annotations

import io

import numpy as np
from rich.console import Console

from orchestrator.cli.budget import _fmt as budget_fmt
from orchestrator.cli.display.figures import figure, interval
from orchestrator.cli.display.prediction import interval_texts
from orchestrator.cli.display.tabular import Column, Tabular, fmt


def test_figures_group_thousands_alike_and_keep_four_significant_digits() -> None:
    assert [fmt(v) for v in (9505.2, 11801.0, 1234567.0)] == ["9,505", "11,800", "1,235,000"]
    assert [fmt(v) for v in (33.1, 2.0, 0.004632, 999.96, 0.1 + 0.2, -0.0)] == ["33.1", "2", "0.004632", "1,000",
                                                                                 "0.3", "0"]  # fmt: skip
    assert fmt(np.float64(4183.7)) == "4,184" and fmt(np.int64(12345)) == "12,345" and fmt(7) == "7"
    assert figure(-1234.5) == "-1,234" and figure(1e-5) == "1e-05", "scientific only where no table goes"


def test_an_interval_is_two_figures_and_an_en_dash() -> None:
    assert interval(4183.0, 13479.0) == "4,180–13,500"
    assert interval(0.5, 1.25) == "0.5–1.25"
    texts = interval_texts({"predicted_step_time_s_low": 4183.0, "predicted_step_time_s_high": 13479.0})
    assert texts["predicted_step_time_s_90"] == "4,180–13,500"
    assert "e+" not in texts["predicted_step_time_s_90"]


def test_a_column_of_figures_uses_one_separator() -> None:
    out = io.StringIO()
    rows = [{"h": 9505.2}, {"h": 11801.0}, {"h": 123.456}]
    Console(file=out, width=80, color_system=None).print(Tabular([Column("h", "gpu_h", numeric=True)], rows))
    assert out.getvalue().split() == ["gpu_h", "9,505", "11,800", "123.5"]


def test_budget_tables_write_other_figures_the_same_way() -> None:
    assert budget_fmt("memory_gib", 12345.6) == "12,350" and budget_fmt("num_gpus", np.int64(1024)) == "1,024"
    assert budget_fmt("step_time_s", 0.00001234) == "1.234e-05" and budget_fmt("step_time_s", 0.5) == "0.5"
