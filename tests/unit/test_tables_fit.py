"""Every table ``gpudays`` prints fits the terminal it is printed in, checked without a screenshot.

``plan``, ``status``, ``report``, ``budget`` and ``shortest`` run through the real command line at 80 and 120
columns (rich takes ``TTY_COMPATIBLE=1`` and ``COLUMNS`` for a terminal of that width) and piped (pytest's
captured stdout is no terminal). The same command with ``--format json`` gives the raw rows; every value of the
columns that carry the answer must stand whole in the table's text (never cut to an ellipsis, never wrapped), and
no line may be wider than the terminal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import synthetic

from analysis.sweeps.records import Catalog
from orchestrator.cli import main as cli
from orchestrator.cli.budget import _fmt as budget_fmt
from orchestrator.cli.display.tabular import fmt

WIDTHS = (80, 120, None)  # None: piped
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _run(
    argv: list[str], width: int | None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> str:
    with monkeypatch.context() as m:
        if width is not None:
            m.setenv("TTY_COMPATIBLE", "1")
            m.setenv("COLUMNS", str(width))
            m.setenv("NO_COLOR", "1")
        else:
            m.delenv("TTY_COMPATIBLE", raising=False)
            m.delenv("COLUMNS", raising=False)
        assert cli.main(argv) in (0, 1), capsys.readouterr()
    return ANSI.sub("", capsys.readouterr().out)


def _rows(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> list[dict]:
    data = json.loads(_run([*argv, "--format", "json"], None, monkeypatch, capsys))
    return [row for table in data.values() for row in table] if isinstance(data, dict) else data


def _whole(text: str, value: str) -> bool:
    return re.search(rf"(?<!\S){re.escape(value)}(?!\S)", text) is not None


def _check(
    argv: list[str],
    answer: Sequence[str],
    show: Callable[[str, object], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> dict[int | None, str]:
    rows = _rows(argv, monkeypatch, capsys)
    assert rows, f"{argv}: no rows"
    shown: dict[int | None, str] = {}
    for width in WIDTHS:
        text = shown[width] = _run(argv, width, monkeypatch, capsys)
        assert "…" not in text, f"{argv} at {width}: a value cut to an ellipsis"
        if width is not None:
            wide = [line for line in text.splitlines() if len(line) > width]
            assert not wide, f"{argv}: lines wider than {width}: {wide[:2]}"
        for row in rows:
            for key in answer:
                if row.get(key) is not None:
                    assert _whole(text, show(key, row[key])), f"{argv} at {width}: {key}={row[key]!r} not whole"
    return shown


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep of measured cells: DeepSpeed and FSDP on A100s, one and two nodes, a failed cell, CPU cells."""
    root = tmp_path_factory.mktemp("fit") / "demo" / "2026-01-01_00-00-00"
    catalog = Catalog.load()
    cells = [
        ("zero0-a100x4", "pythia-1b", "a100-80gb", 4, 1, {}, 20.0),
        ("fsdp-a100x4", "pythia-1b", "a100-80gb", 4, 1, {"engine": "fsdp", "fsdp_sharding": "full"}, 19.0),
        ("hsdp-a100x16", "pythia-1b", "a100-80gb", 16, 2, {"engine": "fsdp", "fsdp_sharding": "hybrid"}, 5.5),
        ("zero2-a100x16", "pythia-1b", "a100-80gb", 16, 2, {"zero_stage": 2}, 5.8),
        ("tiny-cpu1", "pythia-tiny", "cpu", 1, 1, {}, 0.2),
    ]
    for cid, model, gpu, n, nodes, method, step in cells:
        config = synthetic.cell_config(model, gpu, n, nodes, catalog=catalog, **method)
        record = synthetic.record(cid, config, "ok", synthetic.metrics(config, step, 4, 20.0))
        synthetic.write_cell(root, cid, config, record)
    config = synthetic.cell_config("pythia-1b", "a100-80gb", 8, catalog=catalog, zero_stage=3)
    reason = "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, " * 3
    failed = synthetic.record("zero3-a100x8", config, "failed", synthetic.metrics(config, 1.0, 4, 20.0), reason)
    synthetic.write_cell(root, "zero3-a100x8", config, failed)
    return root


PLAN = ["plan", "model=pythia-1b", "gpu=a100-80gb", "num_gpus=4,8", "method.engine=deepspeed,fsdp"]
PLAN_ANSWER = (
    "model", "gpu", "num_gpus", "predicted_micro_batch_size", "predicted_step_time_s", "predicted_time_to_train_days",
    "predicted_gpu_hours", "predicted_cost_usd_cloud",
)  # fmt: skip
CELLS_ANSWER = ("model", "gpu", "num_gpus", "micro_batch_size", "step_time_s", "time_to_train_days", "gpu_hours",
                "cost_usd_cloud")  # fmt: skip


def test_plan_keeps_its_answer_columns_whole_at_80_and_120_and_piped(monkeypatch, capsys, tmp_path) -> None:
    argv = [*PLAN, "--dir", str(tmp_path / "p")]
    shown = _check(argv, PLAN_ANSWER, lambda _k, v: fmt(v), monkeypatch, capsys)
    assert "left out for the terminal's width: " in shown[120]
    assert "left out" not in shown[None], "piped, the table is whole"
    assert "basis" in shown[None] and "kwh" in shown[None]


def test_report_keeps_its_answer_columns_whole(measured: Path, monkeypatch, capsys, tmp_path) -> None:
    argv = ["report", str(measured), "--no-plots", "--out", str(tmp_path / "out")]
    shown = _check(argv, CELLS_ANSWER, lambda _k, v: fmt(v), monkeypatch, capsys)
    # FSDP rows say how they shard, and are not ZeRO-0 rows (item 17).
    for width in WIDTHS:
        assert _whole(shown[width], "fsdp-hybrid") and _whole(shown[width], "fsdp-full"), width


def test_status_keeps_cells_and_states_whole(measured: Path, monkeypatch, capsys) -> None:
    _check(["status", str(measured)], ("cell_id", "state"), lambda _k, v: fmt(v), monkeypatch, capsys)


def test_budget_and_shortest_keep_their_answer_columns_whole(monkeypatch, capsys) -> None:
    budget = ["budget", "--gpu-hours", "1e4", "--gpu", "a100-80gb", "--model", "pythia-1b"]
    shown = _check(budget, ("model", "gpu", "num_gpus", "days", "gpu_hours", "cloud_cost_usd"), budget_fmt,
                   monkeypatch, capsys)  # fmt: skip
    assert "smollm2-3" not in shown[None] and "│" not in shown[80], "no cell folded over lines, no borders"
    shortest = ["shortest", "--model", "pythia-1b", "--gpu", "a100-80gb,h100-80gb"]
    answer = ("model", "gpu", "parallelism", "point", "num_gpus", "days", "gpu_hours", "cloud_cost_usd")
    _check(shortest, answer, budget_fmt, monkeypatch, capsys)


# Issue 30: whatever a narrow terminal leaves out, two different rows never look the same, and a reason wraps.


def _at(view: object, width: int) -> str:
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=width, force_terminal=True, color_system=None).print(view)
    return out.getvalue()


def _table_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines()[1:] if ln.strip() and not ln.startswith(("left out", " "))]


def test_report_rows_that_differ_only_in_checkpointing_and_sharding_stay_apart_at_80() -> None:
    import pandas as pd

    from orchestrator.cli.display.views import cells_table

    base = {"cell_id": "", "model": "pythia-1b", "gpu": "a100-80gb", "num_gpus": 4, "num_nodes": 1,
            "engine": "deepspeed", "status": "ok", "micro_batch_size": 8, "step_time_s": 5.0,
            "time_to_train_days": 8.3, "gpu_hours": 794.4, "cost_usd_cloud": 2174.0}  # fmt: skip
    rows = [{**base, "cell_id": f"cell{z}{int(c)}", "zero_stage": z, "activation_checkpointing": c}
            for z in (0, 2) for c in (False, True)]  # fmt: skip
    text = _at(cells_table(pd.DataFrame(rows)), 80)
    lines = _table_lines(text.split("\n\n")[0])
    assert len(lines) == 4 and len(set(lines)) == 4, text
    assert all(len(ln) <= 80 for ln in text.splitlines())


def test_status_wraps_a_failed_cells_reason_at_80_rather_than_leaving_it_out() -> None:
    from orchestrator.cli.display.views import status_table
    from orchestrator.store.states import State
    from orchestrator.submission.status import CellState

    reason = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version 2.21.5"
    states = [CellState("b5a301e0f4df", State.FAILED, 1, "123456", reason,
                        label="pythia-1b a100-80gb x8 zero3 offload-opt ckpt bf16 mb=auto"),
              CellState("c6b402f1a5e0", State.OK, 1, "123457", label="pythia-1b a100-80gb x8 zero2 bf16 mb=auto")]  # fmt: skip
    text = _at(status_table(states), 80)
    words = " ".join(text.split())
    assert "version 2.21.5" in words and "offload-opt" in words, text
    assert "left out for the terminal's width: reason" not in words
    assert all(len(ln) <= 80 for ln in text.splitlines())


def test_the_offered_layouts_keep_gpu_and_gpu_count_at_80() -> None:
    from orchestrator.cli.display.prediction import OFFER_KEEP
    from orchestrator.cli.display.views import rows_table

    rows = [{"model": "pythia-6.9b", "gpu": gpu, "num_gpus": n, "nodes": n // 8 or 1, "layout": "tp2 pp2 dp2",
             "mb": 2, "mem_gib": 61.5, "step_s": 3.2, "bubble": 0.12, "mfu": 0.41, "gpu_h": 9505.0,
             "dp_gpu_h": "none fits"} for gpu in ("a100-80gb", "h100-80gb") for n in (8, 16)]  # fmt: skip
    text = _at(rows_table(rows, numeric=("num_gpus", "gpu_h"), keep=OFFER_KEEP), 80)
    lines = _table_lines(text)
    assert lines[0].split()[:3] == ["pythia-6.9b", "a100-80gb", "8"] and len(set(lines)) == 4, text
    assert text.split()[:3] == ["model", "gpu", "num_gpus"] and "left out for the terminal's width: " in text


def test_a_left_out_column_comes_back_where_it_alone_tells_two_rows_apart() -> None:
    from orchestrator.cli.display.tabular import Column, choose_columns

    columns = (Column("a", "a"), Column("b", "b", drop=1), Column("c", "c", drop=2), Column("d", "d", drop=3))
    rows = [["x" * 10, "same", "c1", "d1"], ["x" * 10, "same", "c2", "d1"]]
    assert choose_columns(columns, [10, 10, 10, 10], 22, rows) == [0, 2], "c instead of b, which tells nothing"
    assert choose_columns(columns, [10, 10, 10, 10], 22, [rows[0], rows[0]]) == [0, 1], "alike in every column"
    assert choose_columns(columns, [10, 10, 10, 10], 11, rows) is None, "no room for c: the rows fold"
