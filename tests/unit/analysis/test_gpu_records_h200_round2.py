"""The uncalibrated predictor against the second H200 round (tests/data/gpu-records/h200-round2, README there):
eight cells no constant was set on, predicted before they ran, with the first round's profile and without it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis.predict.predictor import flat_cell, predict_frame
from analysis.sweeps.catalog import recorded_cell
from orchestrator.profile.record import Profile, read_profile

DATA = Path(__file__).resolve().parents[2] / "data" / "gpu-records"
RECORDS = sorted((DATA / "h200-round2").glob("*.json"))


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    rows = []
    for path in RECORDS:
        record = json.loads(path.read_text())
        m = record["metrics"]
        rows.append({**flat_cell(recorded_cell(record["config"])), "name": path.stem, "measured_s": m["step_time_s"],
                     "reserved_gib": m["peak_memory_reserved_gib"], "micro_batch_size": m["micro_batch_size"],
                     "grad_accum_steps": m["grad_accum_steps"], "device": record["environment"]["device_name"]})  # fmt: skip
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def profile() -> Profile:
    (path,) = sorted((DATA / "h200" / "profile").glob("*.json"))
    return read_profile(path)


def frame(table: pd.DataFrame, profile: Profile | None) -> pd.DataFrame:
    return predict_frame(
        table,
        profiles={"h200": profile} if profile is not None else None,
        micro_batch_size=table["micro_batch_size"],
        grad_accum_steps=table["grad_accum_steps"],
    )


def test_the_round_holds_fsdp2_and_mesh3d_on_larger_models_and_checkpointed_cells(table: pd.DataFrame) -> None:
    assert len(table) == 8 and set(table["device"]) == {"NVIDIA H200"}
    assert table["engine"].value_counts().to_dict() == {"fsdp": 4, "mesh3d": 2, "deepspeed": 2}
    assert table["activation_checkpointing"].astype(bool).sum() == 2 and table["compile"].astype(bool).sum() == 1


@pytest.mark.parametrize("with_profile", [True, False], ids=["profile", "cited"])
def test_every_cell_is_within_9_percent_of_its_step_time(
    table: pd.DataFrame, profile: Profile, with_profile: bool
) -> None:
    # Predicted before they ran: with the profile -0.8% to -6.7% (with the peak's rates, before the cited profile,
    # -8.0% to +7.4%); without it the H200 takes the cited profile, which is its own.
    predicted = frame(table, profile if with_profile else None)["predicted_step_time_s"].to_numpy()
    errors = pd.Series(predicted / table["measured_s"].to_numpy() - 1, table["name"])
    assert errors.abs().max() < 0.09, errors.round(3).to_dict()


def test_every_reserved_peak_falls_inside_its_interval(table: pd.DataFrame, profile: Profile) -> None:
    f = frame(table, profile)
    low, high = f["predicted_peak_memory_gib_low"].to_numpy(), f["predicted_peak_memory_gib_high"].to_numpy()
    measured = table["reserved_gib"].to_numpy()
    assert ((low <= measured) & (measured <= high)).all(), dict(zip(table["name"], measured, strict=True))
    ratio = f["predicted_peak_memory_gib"].to_numpy() / measured - 1
    assert abs(ratio).max() < 0.11, dict(zip(table["name"], ratio.round(3), strict=True))


def test_with_the_profile_every_step_time_falls_inside_a_narrower_interval(
    table: pd.DataFrame, profile: Profile
) -> None:
    profiled, cited = frame(table, profile), frame(table, None)
    measured = table["measured_s"].to_numpy()
    low, high = profiled["predicted_step_time_s_low"].to_numpy(), profiled["predicted_step_time_s_high"].to_numpy()
    assert ((low <= measured) & (measured <= high)).all()
    ratio = high / low
    assert (
        ratio < cited["predicted_step_time_s_high"].to_numpy() / cited["predicted_step_time_s_low"].to_numpy()
    ).all()
