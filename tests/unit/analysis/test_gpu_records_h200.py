"""The uncalibrated predictor against real H200 records and the machine's profile (tests/data/gpu-records/h200,
README there): the profiled products, attention and memory-bound work, and compile's share, per engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analysis.predict.memory_bound import stream_bytes_s
from analysis.predict.predictor import flat_cell, predict_frame
from analysis.sweeps.catalog import recorded_cell
from orchestrator.profile.record import Profile, read_profile

FOLDER = Path(__file__).resolve().parents[2] / "data" / "gpu-records" / "h200"
RECORDS = sorted(FOLDER.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def profile() -> Profile:
    (path,) = sorted((FOLDER / "profile").glob("*.json"))
    return read_profile(path)


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    rows = []
    for path in RECORDS:
        record = load(path)
        m = record["metrics"]
        rows.append({**flat_cell(recorded_cell(record["config"])), "name": path.stem, "measured_s": m["step_time_s"],
                     "reserved_gib": m["peak_memory_reserved_gib"], "micro_batch_size": m["micro_batch_size"],
                     "grad_accum_steps": m["grad_accum_steps"]})  # fmt: skip
    return pd.DataFrame(rows)


def predicted(table: pd.DataFrame, profile: Profile | None) -> pd.Series:
    frame = predict_frame(
        table,
        profiles={"h200": profile} if profile is not None else None,
        micro_batch_size=table["micro_batch_size"],
        grad_accum_steps=table["grad_accum_steps"],
    )
    return pd.Series(frame["predicted_step_time_s"].to_numpy() / table["measured_s"].to_numpy() - 1, table["name"])


def test_the_records_cover_each_engine_checkpointing_and_compile(table: pd.DataFrame) -> None:
    assert len(table) == 13 and set(table["engine"]) == {"deepspeed", "fsdp", "mesh3d"}
    assert table["activation_checkpointing"].astype(bool).sum() == 2 and table["compile"].astype(bool).sum() == 5
    assert all(load(p)["environment"]["device_name"] == "NVIDIA H200" for p in RECORDS)


def test_the_profile_timed_each_figure_after_its_one_off_costs(profile: Profile) -> None:
    # A first call loads a GPU's kernels lazily (an attention backward's took 2.4 s): a figure timed from it read
    # 3 GFLOP/s. Every product of these shapes runs at 100 TFLOP/s or more, every attention at 100 or more.
    assert min(t.tflops for t in profile.matmuls) > 100
    assert min(min(a.forward_tflops, a.backward_tflops) for a in profile.attention) > 100
    assert 4.0e12 < stream_bytes_s(profile) < 4.8e12  # under the datasheet's 4.8 TB/s


def test_with_the_profile_every_cell_is_within_15_percent(table: pd.DataFrame, profile: Profile) -> None:
    errors = predicted(table, profile)
    assert errors.abs().max() < 0.15, errors.round(3).to_dict()
    plain = ~table["compile"].astype(bool).to_numpy()
    # Without compile, the products, attention and memory-bound work: within 10% (the four cells without
    # checkpointing fitted the memory-bound work's two constants; the checkpointed and mesh3d cells did not).
    assert errors[plain].abs().max() < 0.10, errors[plain].round(3).to_dict()
    for name in ("1.4b-ds-ckpt", "410m-ds-ckpt"):
        assert abs(errors[name]) < 0.03, (name, errors[name])


def test_compile_is_predicted_faster_on_both_paths(table: pd.DataFrame, profile: Profile) -> None:
    for given in (profile, None):
        frame = predict_frame(table, profiles={"h200": given} if given is not None else None,
                              micro_batch_size=table["micro_batch_size"],
                              grad_accum_steps=table["grad_accum_steps"])  # fmt: skip
        step = pd.Series(frame["predicted_step_time_s"].to_numpy(), table["name"])
        assert step["160m-ds-compile-cold"] < 0.8 * step["160m-ds"]
        assert step["160m-fsdp-compile"] < 0.8 * step["160m-fsdp"]
        # Measured after the share was set on 160m: 1.34x (410m) and 1.15x (1.4b) faster than without compile.
        assert step["410m-ds-compile"] < 0.85 * step["410m-ds"]
        assert step["1.4b-ds-compile"] < 0.97 * step["1.4b-ds"]


def test_without_a_profile_every_cell_is_within_16_percent(table: pd.DataFrame, profile: Profile) -> None:
    # Without it, the H200 takes the cited profile, which is its own (the reference): the same predictions.
    errors = predicted(table, None)
    assert errors.abs().max() < 0.16, errors.round(3).to_dict()
    assert errors.to_numpy() == pytest.approx(predicted(table, profile).to_numpy())


def test_the_reserved_peak_of_cells_without_compile_is_within_11_percent(table: pd.DataFrame) -> None:
    frame = predict_frame(table, micro_batch_size=table["micro_batch_size"])
    plain = ~table["compile"].astype(bool)
    ratio = frame["predicted_peak_memory_gib"].to_numpy() / table["reserved_gib"].to_numpy() - 1
    assert abs(ratio[plain.to_numpy()]).max() < 0.11


def test_a_regionally_compiled_cell_reserves_little_over_what_it_allocates(table: pd.DataFrame) -> None:
    # Expandable segments and compiled blocks: reserved/allocated 1.01-1.03, not the 1.12 of the other settings.
    frame = predict_frame(table, micro_batch_size=table["micro_batch_size"])
    ratio = pd.Series(frame["predicted_peak_memory_gib"].to_numpy() / table["reserved_gib"].to_numpy() - 1,
                      table["name"])  # fmt: skip
    # Every reserved peak within 11%; the compiled ones set the regional loss's bytes (in-sample) and the overhead.
    assert ratio.abs().max() < 0.11, ratio.round(3).to_dict()
    compiled = table["compile"].astype(bool).to_numpy()
    assert ratio[compiled].abs().max() < 0.03
