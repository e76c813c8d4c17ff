"""Adaptive sweeps: the round decision (analysis/planners/adaptive.py) and the sweep's life over rounds
(orchestrator/cli/adaptive.py), with submission answered from a synthetic truth instead of probes."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import synthetic

from analysis.planners.adaptive import STOP_ALL_MEASURED, STOP_BUDGET, STOP_STALLED, STOP_TARGET, Goal, decide
from analysis.predict.inputs import flat_cell
from orchestrator.cli import adaptive
from orchestrator.cli import flow as lifecycle
from orchestrator.cli import main as cli
from orchestrator.config.schema import Config, to_config
from orchestrator.config.values import Container
from orchestrator.store.adaptive_state import (
    AdaptiveState,
    BadAdaptiveState,
    Round,
    read_state,
    write_grid,
    write_state,
)
from orchestrator.store.attempts import Attempt, append_attempt, next_attempt, read_attempts
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import write_record
from orchestrator.submission import quota
from orchestrator.submission.launch import write_cell

MODELS = ("pythia-70m", "pythia-410m", "smollm2-360m", "qwen3-0.6b")


def configs() -> dict[str, Container]:
    """A small grid on one GPU type: 4 models x 1, 2 and 8 GPUs x engines x checkpointing."""
    out: dict[str, Container] = {}
    for model, num_gpus, method, ckpt in itertools.product(MODELS, (1, 2, 8), synthetic.GRID_METHODS, (False, True)):
        if num_gpus == 1 and method != synthetic.GRID_METHODS[0]:
            continue
        config = synthetic.cell_config(
            model, "a100-80gb", num_gpus, activation_checkpointing=ckpt, engine=method.engine,
            zero_stage=method.zero_stage, fsdp_sharding=method.fsdp_sharding,
        )  # fmt: skip
        out[f"{model}-{num_gpus}-{method.label}-{int(ckpt)}"] = config
    return out


@pytest.fixture(scope="module")
def grid() -> tuple[dict[str, Container], pd.DataFrame, pd.DataFrame]:
    cells = configs()
    frame = pd.DataFrame([{**flat_cell(c), "cell_id": cid} for cid, c in cells.items()])
    truth = synthetic.perturbed_truth(frame, seed=3)
    truth["probe_wall_s"], truth["startup_s"], truth["search_s"] = 60.0, 10.0, 20.0
    return cells, frame, truth


def test_a_round_chooses_unmeasured_cells_and_the_grid_is_then_predicted_well(grid) -> None:
    _, frame, truth = grid
    goal = Goal(target_pct=12.0, round_cells=6)
    measured: set[str] = set()
    for _ in range(10):
        d = decide(frame, truth[truth["cell_id"].isin(measured)], goal, 60.0 * len(measured))
        assert not set(d.chosen) & measured
        if d.stop:
            break
        measured |= set(d.chosen)
    assert d.stop == STOP_TARGET and d.widest_pct <= 12.0
    assert len(measured) < len(frame) / 3, len(measured)
    held = truth[(truth["status"] == "ok") & ~truth["cell_id"].isin(measured)].set_index("cell_id")
    pred = d.predicted.set_index("cell_id").loc[held.index]
    assert (pred["answer"] == "predicted").all()
    error = (pred["step_time_s"] / held["step_time_s"] - 1).abs()
    assert float(error.quantile(0.9)) < 0.12
    inside = (pred["step_time_low_s"] <= held["step_time_s"]) & (held["step_time_s"] <= pred["step_time_high_s"])
    assert 0.75 <= float(inside.mean()) <= 1.0


def test_it_stops_when_the_budget_cannot_pay_for_a_cell(grid) -> None:
    _, frame, truth = grid
    d = decide(frame, truth.iloc[:0], Goal(budget_gpu_hours=0.001), 0.0)
    assert d.stop == STOP_BUDGET and d.chosen == []
    d = decide(frame, truth.iloc[:0], Goal(budget_gpu_hours=0.1, round_cells=50), 0.0)
    assert d.chosen and d.predicted.set_index("cell_id").loc[d.chosen, "cost_gpu_s"].sum() <= 360.0


def test_it_stops_when_the_intervals_have_stopped_narrowing(grid) -> None:
    _, frame, truth = grid
    some = truth[truth["status"] == "ok"].iloc[:30]
    d = decide(frame, some, Goal(target_pct=1.0), 0.0)
    assert d.stop is None and d.widest_pct > 1.0
    # as wide as three rounds ago: stalled; 10% narrower since: go on
    assert decide(frame, some, Goal(target_pct=1.0), 0.0, history=[d.widest_pct, 99.0, 99.0]).stop == STOP_STALLED
    going = decide(frame, some, Goal(target_pct=1.0), 0.0, history=[d.widest_pct / 0.9, 99.0, 99.0])
    assert going.stop is None and going.chosen


def test_it_stops_when_every_cell_is_measured(grid) -> None:
    _, frame, truth = grid
    d = decide(frame, truth, Goal(target_pct=0.001), 0.0)
    assert d.stop == STOP_ALL_MEASURED and (d.predicted["answer"] == "measured").sum() == (truth["status"] != "").sum()


def test_an_uncalibrated_device_has_no_interval_yet_and_a_round_still_chooses(grid) -> None:
    _, frame, _ = grid
    cpu = frame.copy()
    cpu["gpu"] = "cpu"
    cpu_configs = [synthetic.cell_config("pythia-70m", "cpu", n, engine="deepspeed") for n in (1, 2)]
    cpu = pd.DataFrame([{**flat_cell(c), "cell_id": f"cpu{i}"} for i, c in enumerate(cpu_configs)])
    d = decide(cpu, cpu.iloc[:0].assign(status=[]), Goal(round_cells=1), 0.0)
    assert math.isinf(d.widest_pct) and len(d.chosen) == 1 and d.stop is None


def test_goal_refuses_what_it_cannot_mean() -> None:
    for bad in ({"target_pct": 0}, {"budget_gpu_hours": -1}, {"round_cells": 0}):
        with pytest.raises(ValueError):
            Goal(**bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------------------
# The sweep's life, with submission answered from the truth
# --------------------------------------------------------------------------------------------------------------


def answering(
    paths: SweepPaths, truth: pd.DataFrame, configs_: Mapping[str, Container], fail: Callable[[str, int], bool]
) -> Callable[..., quota.Waves]:
    """A stand-in for lifecycle.submit_cells: every cell 'runs' here at once and leaves the record its truth says
    (or a failure where ``fail(cell, attempt)``)."""
    by_id = truth.set_index("cell_id")

    def submit(
        p: SweepPaths, cells: Mapping[str, Config], before_start: Callable[[str], None] | None = None
    ) -> quota.Waves:
        for cid in cells:
            if before_start is not None:
                before_start(cid)
            attempt = next_attempt(paths, cid)
            append_attempt(paths, Attempt(cid, attempt, str(10_000 + attempt), "local"), durable=False)
            row, config = by_id.loc[cid], configs_[cid]
            if fail(cid, attempt):
                rec = synthetic.record(cid, config, status="failed", reason="probe raised", attempt=attempt)
            else:
                metrics = synthetic.metrics(config, float(row["step_time_s"]), int(row["micro_batch_size"]), 10.0)
                rec = synthetic.record(cid, config, metrics_=metrics, attempt=attempt)
            write_record(paths.record(cid), rec, durable=False)
        return quota.Waves(p)  # nothing went to SLURM

    return submit


def start_folder(tmp_path: Path, cells: Mapping[str, Container], goal: Goal) -> SweepPaths:
    paths = SweepPaths(tmp_path / "adaptive")
    paths.root.mkdir()
    write_grid(paths, list(cells.items()))
    write_state(paths, AdaptiveState(goal.target_pct, goal.budget_gpu_hours, goal.round_cells))
    return paths


def test_an_adaptive_sweep_ends_with_every_cell_answered_after_measuring_a_minority(
    grid, tmp_path: Path, monkeypatch, capsys
) -> None:
    cells, _, truth = grid
    paths = start_folder(tmp_path, cells, Goal(target_pct=12.0, round_cells=6))
    monkeypatch.setattr(lifecycle, "submit_cells", answering(paths, truth, cells, lambda cid, n: False))
    assert adaptive.advance(paths, wait=False, report=False) == 0
    out = capsys.readouterr().out
    lifecycle.report([paths], None, None, plots=False)
    out_report = capsys.readouterr().out
    state = read_state(paths)
    assert state.stopped is not None and state.stopped.reason == STOP_TARGET, out
    assert len(state.rounds) >= 2 and "round 2: measuring" in out
    measured = set(paths.cell_ids())
    assert measured == state.chosen() and len(measured) < len(cells) / 3
    table = pd.read_csv(paths.root / "cells.csv")
    assert set(table["cell_id"]) == set(cells)
    answers = table.set_index("cell_id")["answer"]
    assert set(answers[list(measured)]) == {"measured"}
    rest = table[~table["cell_id"].isin(measured)]
    assert set(rest["answer"]) == {"predicted"} and set(rest["status"]) == {"unmeasured"}
    assert rest["predicted_step_time_s_low"].notna().all() and rest["predicted_step_time_s_high"].notna().all()
    # every predicted cell is answered: its run's days (within the prediction's interval), GPU-hours and dollars
    for column in ("time_to_train_days", "time_to_train_days_low", "time_to_train_days_high", "gpu_hours",
                   "cost_usd_cloud"):  # fmt: skip
        assert rest[column].gt(0).all(), column
    assert (rest["time_to_train_days_low"] < rest["time_to_train_days"]).all()
    assert (rest["time_to_train_days"] < rest["time_to_train_days_high"]).all()
    ratio = rest["time_to_train_days_high"] / rest["time_to_train_days"]
    assert (ratio - rest["predicted_step_time_s_high"] / rest["predicted_step_time_s"]).abs().max() < 1e-6
    # best.csv answers every model × GPU × count of the grid; a group nothing of which was measured, by prediction
    best = pd.read_csv(paths.root / "best.csv")
    keys = ["model", "gpu", "num_gpus"]
    assert len(best) == len(table.groupby(keys)) and best["time_to_train_days_high"].notna().all()
    unmeasured = table.groupby(keys)["answer"].agg(lambda a: "measured" not in set(a))
    assert unmeasured.any(), "the grid has a group left wholly to prediction"
    by_group = best.set_index(keys)["answer"]
    assert set(by_group[unmeasured[unmeasured].index]) == {"predicted"}
    # and so does the one-line answer of each group
    assert "no answer yet" not in out_report
    assert out_report.count("predicted, not measured: ") >= int(unmeasured.sum())
    report = (paths.root / "report.md").read_text()
    assert "Adaptive sweep" in report and f"{len(measured)} of {len(cells)} cells measured" in report
    # status says where the sweep stands, and --check calls it done
    capsys.readouterr()
    assert cli.main(["status", str(paths.root), "--summary", "--check"]) == 0
    assert "stopped (every unmeasured cell's interval is within the target)" in capsys.readouterr().out
    # a second resume has nothing to do
    assert cli.main(["resume", str(paths.root)]) == 0
    assert read_state(paths).rounds == state.rounds and "adaptive sweep: " in capsys.readouterr().out


def test_a_failed_cell_is_rerun_once_then_replaced(grid, tmp_path: Path, monkeypatch, capsys) -> None:
    cells, _, truth = grid
    paths = start_folder(tmp_path, cells, Goal(target_pct=12.0, round_cells=6))
    failing: dict[str, int] = {}

    def fail(cid: str, attempt: int) -> bool:
        # The first cell ever submitted fails on both its attempts; the second fails once.
        failing.setdefault(cid, len(failing))
        return failing[cid] == 0 or (failing[cid] == 1 and attempt == 1)

    monkeypatch.setattr(lifecycle, "submit_cells", answering(paths, truth, cells, fail))
    code = adaptive.advance(paths, wait=False, report=False)
    out = capsys.readouterr().out
    lifecycle.report([paths], None, None, plots=False)
    first, second = sorted(failing, key=failing.__getitem__)[:2]
    assert "rerunning" in out and f"{first} failed 2 times: left to its prediction" in out
    assert json.loads(paths.record(second).read_text())["status"] == "ok"
    assert paths.archived_record(second, 1).with_name("record.attempt1.json").is_file()
    assert json.loads(paths.record(first).read_text())["status"] == "failed"
    assert code == 1  # the sweep ends, and says that one cell failed
    table = pd.read_csv(paths.root / "cells.csv").set_index("cell_id")
    assert table.loc[first, "answer"] == "predicted" and np.isfinite(table.loc[first, "predicted_step_time_s_high"])
    assert read_state(paths).stopped is not None


def test_status_check_says_not_done_while_rounds_remain(grid, tmp_path: Path, capsys) -> None:
    cells, _, truth = grid
    paths = start_folder(tmp_path, cells, Goal(round_cells=2))
    first = next(iter(cells))
    state = read_state(paths)
    state.rounds.append(Round(1, "2026-11-25T00:00:00+00:00", [first], 140.0, 0.0))
    write_state(paths, state)
    write_cell(paths, first, to_config(cells[first]))
    answering(paths, truth, cells, lambda cid, n: False)(paths, {first: to_config(cells[first])})
    assert cli.main(["status", str(paths.root), "--summary", "--check"]) == 4
    out = capsys.readouterr().out
    assert "1 chosen in 1 round(s); round 1 is the latest" in out and "ok 1" in out


def test_a_damaged_state_is_named(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    paths.adaptive_state.write_text('{"target_pct": 10}')
    with pytest.raises(BadAdaptiveState, match="adaptive.json cannot be used"):
        read_state(paths)


def test_adaptive_flags_are_checked_before_anything_is_written(tmp_path: Path, capsys) -> None:
    where = tmp_path / "s"
    assert cli.main(["sweep", "--dir", str(where), "--target-pct", "5", "model=pythia-tiny", "gpu=cpu"]) == 2
    assert "--target-pct: only with --adaptive" in capsys.readouterr().err
    for flag, value in (("--target-pct", "0"), ("--budget-gpu-hours", "-1"), ("--round-cells", "0")):
        code = cli.main(["sweep", "--dir", str(where), "--adaptive", flag, value, "model=pythia-tiny", "gpu=cpu"])
        assert code == 2 and flag in capsys.readouterr().err
    assert not where.exists()


def test_a_plain_sweep_into_an_adaptive_folder_is_refused(grid, tmp_path: Path, capsys) -> None:
    cells, _, _ = grid
    paths = start_folder(tmp_path, cells, Goal())
    code = cli.main(["sweep", "--dir", str(paths.root), "model=pythia-tiny", "gpu=cpu", "cluster=local"])
    assert code == 2 and "is an adaptive sweep" in capsys.readouterr().err
    assert not paths.cell_ids()


def test_cells_a_job_limit_held_back_are_submitted_next_not_called_reruns(
    grid, tmp_path: Path, monkeypatch, capsys
) -> None:
    cells, _, truth = grid
    paths = start_folder(tmp_path, cells, Goal(target_pct=12.0, round_cells=6))
    answer = answering(paths, truth, cells, lambda cid, n: False)
    calls: list[list[str]] = []

    def limited(p: SweepPaths, chosen: Mapping[str, Config], before_start=None) -> quota.Waves:
        # The first round's submission: a per-user job limit leaves room for two cells; the rest stay `new`.
        calls.append(list(chosen))
        return answer(p, dict(list(chosen.items())[:2]) if len(calls) == 1 else chosen, before_start)

    monkeypatch.setattr(lifecycle, "submit_cells", limited)
    assert adaptive.advance(paths, wait=False, report=False) == 0
    out = capsys.readouterr().out
    first_round = read_state(paths).rounds[0].cells
    assert set(calls[1]) == set(first_round) - set(calls[0][:2]), "the held-back cells go out before a new round"
    assert f"round 1: submitting {len(first_round) - 2} cell(s) not submitted yet" in out and "rerunning" not in out
    assert all(len(read_attempts(paths, cid)) == 1 for cid in first_round), "each submitted once"
