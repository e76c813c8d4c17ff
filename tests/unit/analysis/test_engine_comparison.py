"""engines.csv: DeepSpeed's and FSDP's fastest cells side by side, the difference, and the report's section."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import synthetic

from analysis.report.engine_comparison import ENGINE_COLUMNS, compare_engines
from analysis.report.writer import write_report
from analysis.sweeps.records import Catalog


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    catalog = Catalog.load()
    sweep = tmp_path_factory.mktemp("engines") / "sweep"
    for cell_id, gpus, method, step_s in (
        ("ds-z0", 2, {}, 10.0),
        ("ds-z2", 2, {"zero_stage": 2}, 9.0),  # DeepSpeed's fastest on 2 GPUs
        ("fsdp-full", 2, {"engine": "fsdp"}, 9.9),
        ("fsdp-grad-op", 2, {"engine": "fsdp", "fsdp_sharding": "grad_op"}, 8.1),  # FSDP's fastest: 10% faster
        ("ds-1", 1, {}, 18.0),  # only DeepSpeed measured on 1 GPU
    ):
        config = synthetic.cell_config("pythia-160m", "a100-80gb", gpus, catalog=catalog, **method)
        metrics = synthetic.metrics(config, step_s, 8, 30.0)
        synthetic.write_cell(sweep, cell_id, config, synthetic.record(cell_id, config, "ok", metrics))
    return write_report([sweep], plots=False)


def test_each_engines_fastest_cell_and_the_difference(report) -> None:  # type: ignore[no-untyped-def]
    table = report.engines.set_index("num_gpus")
    assert list(report.engines.columns) == list(ENGINE_COLUMNS)
    two = table.loc[2]
    assert (two["deepspeed_cell_id"], two["fsdp_cell_id"]) == ("ds-z2", "fsdp-grad-op")
    assert two["deepspeed_settings"].startswith("zero2") and two["fsdp_settings"].startswith("fsdp-grad_op")
    assert (two["deepspeed_cells_compared"], two["fsdp_cells_compared"]) == (2, 2)
    assert two["faster_engine"] == "fsdp"
    assert two["fsdp_vs_deepspeed_step_time_pct"] == pytest.approx(-10.0)
    one = table.loc[1]
    assert one["deepspeed_cell_id"] == "ds-1" and pd.isna(one["fsdp_cell_id"]) and pd.isna(one["faster_engine"])
    assert one["fsdp_cells_compared"] == 0


def test_the_report_writes_engines_csv_and_a_section(report) -> None:  # type: ignore[no-untyped-def]
    out: Path = report.out_dir
    assert (out / "engines.csv").is_file()
    text = (out / "report.md").read_text()
    assert "## DeepSpeed against FSDP (`engines.csv`)" in text
    assert "FSDP faster in 1, DeepSpeed in 0" in text
    cells = pd.read_csv(out / "cells.csv").set_index("cell_id")
    assert cells.loc["fsdp-grad-op", "engine"] == "fsdp" and cells.loc["fsdp-grad-op", "fsdp_sharding"] == "grad_op"
    assert cells.loc["ds-z2", "engine"] == "deepspeed" and pd.isna(cells.loc["ds-z2", "fsdp_sharding"])
    scaling = report.scaling
    assert {"zero0", "zero2", "fsdp-full", "fsdp-grad_op"} <= set(scaling["sharding"])


def test_no_measured_cell_gives_the_columns_only() -> None:
    empty = compare_engines(pd.DataFrame({"status": ["oom"], "model": ["m"], "gpu": ["g"], "num_gpus": [1],
                                          "step_time_s": [None]}))  # fmt: skip
    assert empty.empty and list(empty.columns) == list(ENGINE_COLUMNS)
