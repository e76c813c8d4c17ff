"""What the tables say, apart from their width (tests/unit/test_tables_fit.py): the order columns are left out in,
folding, ``--format``, the one-line answers, FSDP rows that say how they shard, and the smaller things a user
read wrong (submitit's log lines as the job's last word, ``show`` without figures, ``--help``, a folder of
sweeps, a file in the way)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest
import synthetic
from rich.console import Console

from analysis.report.writer import CELLS_COLUMNS, write_report
from analysis.sweeps.records import Catalog
from orchestrator.cli import main as cli
from orchestrator.cli.display import answers, console
from orchestrator.cli.display.tabular import Column, Tabular, choose_columns
from orchestrator.cli.errors import Exit

COLUMNS = (Column("a", "a"), Column("b", "b", drop=2), Column("c", "c", drop=1), Column("d", "d", drop=3))


def _render(view: Tabular, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=True, color_system=None).print(view)
    return out.getvalue()


def test_columns_are_left_out_in_their_stated_order_and_rows_fold_when_the_answer_does_not_fit() -> None:
    natural = [10, 10, 10, 10]
    assert choose_columns(COLUMNS, natural, 46) == [0, 1, 2, 3]
    assert choose_columns(COLUMNS, natural, 45) == [0, 1, 2], "d (rank 3) first"
    assert choose_columns(COLUMNS, natural, 33) == [0, 2], "then b (rank 2); c (rank 1) last"
    assert choose_columns(COLUMNS, natural, 10) == [0]
    assert choose_columns(COLUMNS, natural, 9) is None, "a (rank 0) never: the rows fold"
    rows = [{"a": "x" * 10, "b": "bbb", "c": "ccc", "d": "ddd"}]
    folded = _render(Tabular(COLUMNS, rows), 9).splitlines()
    assert {"b bbb", "c ccc", "d ddd"} <= set(folded), "one block per row: each header beside its value"
    narrow = " ".join(_render(Tabular(COLUMNS, rows), 20).split())
    assert "left out for the terminal's width: d" in narrow and "ddd" not in narrow


def test_a_wrapping_reason_makes_room_before_any_column_is_left_out() -> None:
    columns = (Column("cell", "cell"), Column("reason", "reason", wrap=True, drop=1))
    text = _render(Tabular(columns, [{"cell": "c1", "reason": "word " * 20}]), 40)
    assert "left out" not in text and text.count("word") == 20


def test_the_one_line_answer_names_each_figure_with_its_interval_and_the_fastest_setting() -> None:
    rows = [
        {"model": "pythia-1b", "gpu": "a100-80gb", "num_gpus": 4, "predicted_time_to_train_days": 36.16,
         "predicted_time_to_train_days_low": 34.2, "predicted_time_to_train_days_high": 38.4,
         "predicted_gpu_hours": 3471.0, "predicted_cost_usd_cloud": 6213.0, "setting": "zero0 bf16 mb=8",
         "cell_id": "slow"},
        {"model": "pythia-1b", "gpu": "a100-80gb", "num_gpus": 4, "predicted_time_to_train_days": 34.5,
         "predicted_time_to_train_days_low": 33.0, "predicted_time_to_train_days_high": 36.0,
         "predicted_gpu_hours": 3317.0, "predicted_gpu_hours_low": 3100.0, "predicted_gpu_hours_high": 3500.0,
         "predicted_cost_usd_cloud": 5937.0, "setting": "fsdp-full bf16 mb=16", "cell_id": "fast"},
        {"model": "pythia-12b", "gpu": "a100-80gb", "num_gpus": 4, "answered": False, "why": "predicted not to fit"},
    ]  # fmt: skip
    # GPU-hours from their own bounds; dollars, which have none here, from the days' interval
    assert answers.answer_lines(rows, answers.PREDICTED) == [
        "pythia-1b on 4 × A100-80GB: 34 days (90%: 33–36), 3.3k GPU-hours (3.1k–3.5k), $5.9k rented ($5.7k–$6.2k) "
        "— fastest setting: fsdp-full bf16 mb=16 (cell fast)",
        "pythia-12b on 4 × A100-80GB: no answer yet: 1 cell predicted not to fit",
    ]
    assert [answers.number(v) for v in (3019.0, 0.00463, 1.2e6, 150.0)] == ["3.0k", "0.0046", "1.2M", "150"]


def test_a_reports_answer_says_when_it_is_predicted_and_what_a_group_without_one_lacks() -> None:
    measured = {"model": "m", "gpu": "cpu", "num_gpus": 1, "answer": "measured", "status": "ok",
                "time_to_train_days": 2.0, "time_to_train_days_low": 1.9, "time_to_train_days_high": 2.1,
                "gpu_hours": 48.0, "setting": "zero0 fp32", "cell_id": "a"}  # fmt: skip
    predicted = {**measured, "answer": "predicted", "status": "unmeasured", "time_to_train_days": 1.0,
                 "time_to_train_days_low": 0.8, "time_to_train_days_high": 1.5, "gpu_hours": 24.0, "cell_id": "b"}  # fmt: skip
    lines = answers.answer_lines([measured, predicted], answers.MEASURED)
    assert lines == [
        "m on 1 × CPU: predicted, not measured: 1.0 days (90%: 0.8–1.5), 24 GPU-hours (19–36), no rental price "
        "— fastest setting: zero0 fp32 (cell b)"
    ]
    assert answers.answer_lines([measured], answers.MEASURED)[0].startswith(
        "m on 1 × CPU: 2.0 days (95%: 1.9–2.1), 48 GPU-hours (46–50)"
    )
    no_length = {**measured, "time_to_train_days": None, "step_time_s": 0.2, "gpu_hours": None}
    failed = {**no_length, "status": "failed", "answer": "unknown", "step_time_s": None}
    line = answers.answer_lines([no_length, failed, failed], answers.MEASURED)[0]
    assert line == (
        "m on 1 × CPU: no answer yet: 1 cell measured, but how many steps its training run takes is unknown (the "
        "model's train_steps, or --tokens for a language model); 2 cells failed, and no step time can be predicted yet"
    )
    assert "ok:" not in line and "cell(s)" not in line


@pytest.fixture(scope="module")
def engines_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("engines") / "sweep"
    catalog = Catalog.load()
    for cid, nodes, method in (
        ("ds", 1, {"zero_stage": 0}),
        ("full", 1, {"engine": "fsdp", "fsdp_sharding": "full"}),
        ("hybrid", 2, {"engine": "fsdp", "fsdp_sharding": "hybrid"}),
    ):
        config = synthetic.cell_config("pythia-160m", "a100-80gb", 16, nodes, catalog=catalog, **method)
        synthetic.write_cell(
            root, cid, config, synthetic.record(cid, config, "ok", synthetic.metrics(config, 1.0, 4, 20.0))
        )
    return root


def test_fsdp_cells_are_not_zero0_cells_in_cells_csv(engines_sweep: Path, tmp_path: Path) -> None:
    write_report([engines_sweep], tmp_path, plots=False)
    table = pd.read_csv(tmp_path / "cells.csv").set_index("cell_id")
    assert "sharding" in table.columns
    assert table.loc["ds", "zero_stage"] == 0 and table.loc["ds", "sharding"] == "zero0"
    assert pd.isna(table.loc["full", "zero_stage"]) and table.loc["full", "sharding"] == "fsdp-full"
    assert pd.isna(table.loc["hybrid", "zero_stage"]) and table.loc["hybrid", "sharding"] == "fsdp-hybrid"
    assert pd.isna(table.loc["full", "offload_optimizer"])


def test_report_format_csv_is_cells_csv_and_nothing_else_on_stdout(engines_sweep: Path, tmp_path: Path, capsys) -> None:
    assert cli.main(["report", str(engines_sweep), "--no-plots", "--out", str(tmp_path), "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    printed = pd.read_csv(io.StringIO(out))
    assert list(printed.columns) == list(CELLS_COLUMNS)
    assert len(printed) == 3 and "wrote" in err and "wrote" not in out
    on_disk = pd.read_csv(tmp_path / "cells.csv")
    assert printed["sharding"].tolist() == on_disk["sharding"].tolist()


def test_plan_format_json_leaves_another_engines_settings_empty(tmp_path: Path, capsys) -> None:
    argv = ["plan", "model=pythia-160m", "gpu=a100-80gb", "num_gpus=2", "method.engine=deepspeed,fsdp"]
    assert cli.main([*argv, "--dir", str(tmp_path / "p"), "--format", "json"]) == 0
    rows = {r["engine"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["deepspeed"]["zero_stage"] == 0 and rows["deepspeed"]["fsdp_sharding"] is None
    assert rows["fsdp"]["zero_stage"] is None and rows["fsdp"]["fsdp_sharding"] == "full"
    assert rows["fsdp"]["predicted_time_to_train_days"] > 0 and "predicted_time_to_train_days_low" in rows["fsdp"]


def test_status_format_refuses_watch(engines_sweep: Path, capsys) -> None:
    assert cli.main(["status", str(engines_sweep), "--watch", "--format", "csv"]) == Exit.BAD_INPUT
    assert "--watch" in capsys.readouterr().err


def test_the_live_line_skips_submitits_own_log_lines(tmp_path: Path) -> None:
    out, err = tmp_path / "0_log.out", tmp_path / "0_log.err"
    err.write_text("step 3 of the search: mb=8\n")
    out.write_text(
        "submitit INFO (2026-11-25 10:00:00,000) - Starting with JobEnvironment(job_id=1)\n"
        "submitit INFO (2026-11-25 10:00:01,000) - Loading pickle: /tmp/x_submitted.pkl\n"
    )
    assert console._last_line([out, err]) == "step 3 of the search: mb=8"


def test_show_prints_the_measured_figures(engines_sweep: Path, capsys) -> None:
    assert cli.main(["show", str(engines_sweep), "full"]) == Exit.OK
    out = capsys.readouterr().out
    for name in ("step_time_s", "micro_batch_size", "tokens_per_s_per_gpu", "peak_memory_allocated_gib"):
        assert name in out, name


def test_help_names_every_engine(capsys) -> None:
    assert cli.main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "each cell a short DeepSpeed probe" not in text and "FSDP2" in text


def test_a_folder_of_dated_sweeps_names_them(engines_sweep: Path, capsys) -> None:
    assert cli.main(["report", str(engines_sweep.parent)]) == Exit.BAD_INPUT
    assert f"the sweep folders inside it: {engines_sweep}" in capsys.readouterr().err


def test_a_file_where_the_sweep_folder_goes_is_named_as_such(tmp_path: Path, capsys) -> None:
    in_the_way = tmp_path / "somefile"
    in_the_way.write_text("x")
    argv = ["sweep", "--dir", str(in_the_way), "model=pythia-tiny", "gpu=cpu", "num_gpus=1", "--no-report"]
    assert cli.main(argv) == Exit.BAD_INPUT
    assert "a file is in the way" in capsys.readouterr().err
    assert in_the_way.read_text() == "x"


def test_efficiency_is_a_fraction_and_the_cpu_rate_a_column_of_its_own(tmp_path: Path) -> None:
    catalog = Catalog.load()
    sweep = tmp_path / "mixed"
    for cid, gpu, step in (("g1", "a100-80gb", 1.0), ("g2", "a100-80gb", 1.1), ("c1", "cpu", 9.0), ("c2", "cpu", 9.5)):
        config = synthetic.cell_config("pythia-tiny", gpu, 1, catalog=catalog)
        synthetic.write_cell(
            sweep, cid, config, synthetic.record(cid, config, "ok", synthetic.metrics(config, step, 4))
        )
    report = write_report([sweep], plots=False)
    section = (sweep / "report.md").read_text().split("## Predicted against measured")[1]
    header = next(line for line in section.splitlines() if line.startswith("| gpu |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    rows = {
        cells[0]: dict(zip(columns, cells, strict=True))
        for line in section.splitlines()
        if line.startswith("| a100") or line.startswith("| cpu")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert rows["cpu"]["efficiency"] == "-" and rows["cpu"]["achieved_tflops_per_gpu"] != "-"
    assert rows["a100-80gb"]["achieved_tflops_per_gpu"] == "-"
    assert 0 < float(rows["a100-80gb"]["efficiency"]) <= 1, report.calibration
