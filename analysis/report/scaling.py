"""The scaling table: where adding GPUs stops paying, for each model × GPU type × engine and sharding option.

A pure function of the cells table (:func:`analysis.report.tables.add_estimates` has added the prices and power it
reads). Rows of ``scaling.csv``, one per (model, GPU type, sharding option, GPU count, nodes), each the fastest
measured cell of that layout (micro-batch, checkpointing, compilation... are whatever was fastest). The columns
beyond those of cells.csv:

- ``sharding``: a short label of the sharding option the line follows, its engine's label (``EngineSpec.label``),
  e.g. ``zero2 offload-opt`` or ``fsdp-full offload``. A line is one value of :data:`SHARDING_COLUMNS`.
- ``speedup``: tokens/s over that of the line's base, the fastest layout of its smallest GPU count;
  ``ideal_speedup``: GPU count over the base's; ``scaling_efficiency`` = speedup ÷ ideal.
- ``marginal_speedup_per_added_gpu``: tokens/s gained since the fastest layout of the next smaller GPU count,
  per GPU added, in units of the base's tokens/s per GPU (1.0: an added GPU is worth as much as each of the
  first ones; 0.2: a fifth of one). Empty for the base.
- ``knee_num_gpus``: the largest GPU count of the line before the first step up whose marginal speed-up per added
  GPU falls below the knee threshold (:data:`KNEE_MARGINAL_SPEEDUP` unless asked otherwise); empty while every
  measured step stays above it. ``beyond_knee``: True for GPU counts above the knee.
- ``tokens_per_s_per_gpu`` (tokens/s); ``tokens_per_kwh``: tokens trained per kWh drawn by the GPU boards at
  rated power (empty without a board power); ``usd_per_billion_tokens_cloud``: renting the GPUs for as long as
  a billion tokens take, at the cloud price (USD); ``usd_per_billion_tokens_amortised``: the share of buying the
  machines (base machines and GPUs, written off over five years) used up in that time (USD).

The energy and money come from :mod:`analysis.predict.estimates`, as the cells table's do. Why per GPU added and per
token: Fernandez et al. 2024, "Hardware Scaling Trends and Diminishing Returns in Large-Scale Distributed
Training" (arXiv 2411.13055), find that adding accelerators soon yields poor marginal throughput per GPU-hour
and per unit of power; the knee threshold here is this project's own choice, not a figure from that paper.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from analysis.predict import estimates as est
from analysis.report.tables import engine_label, settings_label
from analysis.sweeps.records import MEASURED_FITS, rows_of
from orchestrator.engines.registry import identity_keys_if_set, sharding_keys

KNEE_MARGINAL_SPEEDUP = 0.5
"""Default knee threshold: beyond the knee an added GPU buys less than half of what each of the first GPUs does
(marginal speed-up per added GPU < 0.5). At 0.5, doubling a count that scaled perfectly so far gains 1.5× the
throughput for 2× the GPUs: a third less time for a third more money and energy per token."""

SHARDING_COLUMNS = ("engine", *sharding_keys())
"""Method settings that make a scaling line of their own (those the cells have): the training engine, once the
cells name one, and how it shards and offloads (each engine's ``EngineSpec.sharding``, the default engine's
first). The other settings are tuned per count: the fastest is taken."""
OPTIONAL_COLUMNS = ("engine", *(key for key in sharding_keys() if key in identity_keys_if_set()))
"""Those of :data:`SHARDING_COLUMNS` that scaling.csv has only where the cells do: the engine, and the fields of
the engines after the first (``fsdp_sharding``, ``fsdp_offload``)."""

SCALING_COLUMNS = (
    "model", "gpu", *SHARDING_COLUMNS, "sharding", "num_gpus",
    "num_nodes", "tokens_per_s", "tokens_per_s_per_gpu", "speedup", "ideal_speedup", "scaling_efficiency",
    "marginal_speedup_per_added_gpu", "knee_num_gpus", "beyond_knee", "tokens_per_kwh",
    "usd_per_billion_tokens_cloud", "usd_per_billion_tokens_amortised", "time_to_train_days", "settings", "cell_id",
)  # fmt: skip
"""Columns of scaling.csv, in order; :data:`OPTIONAL_COLUMNS` only where the cells have them."""

TOKENS_PER_BILLION = 1e9


def _num(frame: pd.DataFrame, name: str) -> pd.Series:
    if name not in frame.columns:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[name], errors="coerce").astype(float)


def scaling_columns(cells: pd.DataFrame) -> list[str]:
    """The columns of the scaling table for these cells: the engine's columns are left out where they have none."""
    return [c for c in SCALING_COLUMNS if c not in OPTIONAL_COLUMNS or c in cells.columns]


def sharding_label(row: Mapping[str, Any]) -> str:
    """A short label of a line's sharding option, its engine's label: ``zero3 offload-opt offload-params``,
    ``fsdp-full offload``."""
    return engine_label(row)


def _on_cpu(frame: pd.DataFrame) -> pd.Series:
    """Rows measured on the CPU (``gpu_accelerator`` cpu; the ``cpu`` GPU type where a frame has no such column)."""
    if "gpu_accelerator" in frame.columns:
        return frame["gpu_accelerator"].eq("cpu").fillna(False).astype(bool)
    return frame["gpu"].eq("cpu").fillna(False).astype(bool)


def shared_cpu_probes(cells: pd.DataFrame) -> list[str]:
    """The CPU cells whose probes ran at the same time as another's on a host they shared, a line each (with the
    cells it overlapped): their step times measure the cores they shared as much as the settings, so comparing
    them with each other misleads."""
    if cells.empty or not {"started_at", "finished_at", "hostnames", "status"} <= set(cells.columns):
        return []
    cpu = cells[_on_cpu(cells) & cells["status"].isin(MEASURED_FITS)]
    start = pd.to_datetime(cpu["started_at"], utc=True, errors="coerce")
    end = pd.to_datetime(cpu["finished_at"], utc=True, errors="coerce")
    known = start.notna() & end.notna()
    ids, start, end = cpu.loc[known, "cell_id"].astype(str).tolist(), start[known].tolist(), end[known].tolist()
    hosts = [set(str(h).split()) for h in cpu.loc[known, "hostnames"]]
    out = []
    for i, cid in enumerate(ids):
        others = [
            ids[j] for j in range(len(ids))
            if j != i and hosts[i] & hosts[j] and start[i] < end[j] and start[j] < end[i]
        ]  # fmt: skip
        if others:
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            out.append(f"`{cid}` ran on {' '.join(sorted(hosts[i]))} while {shown} did")
    return out


def check_knee(knee: float) -> float:
    """The knee threshold as a float, or a ValueError that says what is accepted."""
    try:
        value = float(knee)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"knee threshold {knee!r} is not accepted: give the marginal speed-up per added GPU below which "
            f"returns count as diminished, a positive number such as {KNEE_MARGINAL_SPEEDUP} (1.0 = as much as "
            "each of the first GPUs)"
        )
    return value


def scaling(cells: pd.DataFrame, knee: float = KNEE_MARGINAL_SPEEDUP) -> pd.DataFrame:
    """Throughput, energy and cost per token against GPU count and nodes, with the knee of each line marked.

    A line is a model × GPU type × sharding option (:data:`SHARDING_COLUMNS`); each (GPU count, nodes) of it
    takes its fastest measured cell. ``knee`` is the marginal speed-up per added GPU below which returns count as
    diminished (see the module docstring for every column).
    """
    knee = check_knee(knee)
    columns = scaling_columns(cells)
    if cells.empty or "status" not in cells.columns:
        return pd.DataFrame(columns=columns)
    tps, n = _num(cells, "tokens_per_s"), _num(cells, "num_gpus")
    keep = cells["status"].isin(MEASURED_FITS) & _num(cells, "time_to_train_days").notna() & tps.gt(0) & n.gt(0)
    rows = cells.loc[keep].assign(
        _tps=tps[keep],
        _n=n[keep],
        _nodes=_num(cells, "num_nodes").fillna(1.0)[keep],
        _order=_num(cells, "num_parameters").fillna(_num(cells, "model_num_parameters"))[keep],
    )
    if rows.empty:
        return pd.DataFrame(columns=columns)
    line = ["model", "gpu", *(c for c in SHARDING_COLUMNS if c in rows.columns)]
    rows["_line"] = rows.groupby(line, sort=True, dropna=False).ngroup()
    # The fastest cell of each (line, count, nodes).
    rows = rows.sort_values(["_line", "_n", "_nodes", "_tps"], ascending=[True, True, True, False], kind="stable")
    rows = rows.drop_duplicates(["_line", "_n", "_nodes"]).copy()

    # The best layout of each count: the base (smallest count), the step from the next smaller count, the knee.
    counts = rows.groupby(["_line", "_n"], sort=True)["_tps"].max().reset_index()
    by_line = counts.groupby("_line", sort=False)
    counts["_base_tps"], counts["_base_n"] = by_line["_tps"].transform("first"), by_line["_n"].transform("first")
    counts["_prev_n"], counts["_prev_tps"] = by_line["_n"].shift(), by_line["_tps"].shift()
    base_per_gpu = counts["_base_tps"] / counts["_base_n"]
    step_gain = (counts["_tps"] - counts["_prev_tps"]) / (counts["_n"] - counts["_prev_n"]) / base_per_gpu
    # The knee: the count before the first step whose added GPUs each buy less than the threshold. None on the
    # CPU: its processes share the host's cores, so a step that slows the run measures contention, not scaling.
    on_cpu = counts["_line"].isin(rows.loc[_on_cpu(rows), "_line"].unique())
    knees = counts[(step_gain < knee) & ~on_cpu].groupby("_line", sort=False)["_prev_n"].first().rename("_knee_n")
    counts = counts.merge(knees, left_on="_line", right_index=True, how="left")
    rows = rows.merge(
        counts[["_line", "_n", "_base_tps", "_base_n", "_prev_n", "_prev_tps", "_knee_n"]], on=["_line", "_n"]
    )

    rows["speedup"] = rows["_tps"] / rows["_base_tps"]
    rows["ideal_speedup"] = rows["_n"] / rows["_base_n"]
    rows["scaling_efficiency"] = rows["speedup"] / rows["ideal_speedup"]
    rows["tokens_per_s_per_gpu"] = rows["_tps"] / rows["_n"]
    rows["marginal_speedup_per_added_gpu"] = (
        (rows["_tps"] - rows["_prev_tps"]) / (rows["_n"] - rows["_prev_n"]) / (rows["_base_tps"] / rows["_base_n"])
    )
    rows["knee_num_gpus"] = rows["_knee_n"].round().astype("Int64")
    rows["beyond_knee"] = (rows["_n"] > rows["_knee_n"]).astype(bool)  # no knee measured: never beyond it

    # A billion tokens at this throughput: the GPU-hours, energy and money of that stretch, as for a whole run.
    seconds = TOKENS_PER_BILLION / rows["_tps"]
    gpu_hours = est.gpu_hours(rows["_n"], 1.0, seconds)
    rows["tokens_per_kwh"] = TOKENS_PER_BILLION / est.energy_kwh(gpu_hours, _num(rows, "board_power_w"))
    rows["usd_per_billion_tokens_cloud"] = est.cloud_cost_usd(gpu_hours, _num(rows, "cloud_usd_per_gpu_hour"))
    rows["usd_per_billion_tokens_amortised"] = est.amortised_cost_usd(
        _num(rows, "machine_price_usd"), est.time_to_train_days(1.0, seconds)
    )

    labelled = rows_of(rows, rows.columns)
    rows["sharding"] = [sharding_label(r) for r in labelled]
    rows["settings"] = [settings_label(r) for r in labelled]
    rows = rows.sort_values(["_order", "model", "gpu", "_line", "_n", "_nodes"], kind="stable", na_position="last")
    return rows.reindex(columns=columns).reset_index(drop=True)


KNEES_COLUMNS = ("model", "gpu", "sharding", "num_gpus_measured", "knee_num_gpus", "marginal_speedup_past_knee")


def knees(table: pd.DataFrame) -> pd.DataFrame:
    """One row per line of a scaling table: its GPU counts measured, its knee and the step that passed it.

    Columns: model, gpu, sharding, num_gpus_measured (e.g. ``1 2 4 8``), knee_num_gpus (empty: no knee
    measured), marginal_speedup_past_knee (the marginal speed-up per added GPU of the first count beyond it).
    """
    if table.empty:
        return pd.DataFrame(columns=list(KNEES_COLUMNS))
    line = ["model", "gpu", "sharding"]
    # Whole-table operations: a loop over the lines costs seconds with thousands of them.
    counts = table[[*line, "num_gpus"]].drop_duplicates().astype({"num_gpus": str})
    out = counts.groupby(line, sort=False, dropna=False)["num_gpus"].agg(" ".join).rename("num_gpus_measured")
    out = out.to_frame().join(table.groupby(line, sort=False, dropna=False)["knee_num_gpus"].first())
    past = table[table["beyond_knee"].astype(bool)]
    first_past = past.groupby(line, sort=False, dropna=False)["num_gpus"].transform("min")
    step = past[past["num_gpus"] == first_past].groupby(line, sort=False, dropna=False)
    out = out.join(step["marginal_speedup_per_added_gpu"].max().rename("marginal_speedup_past_knee"))
    return out.reset_index().reindex(columns=list(KNEES_COLUMNS))


MARKDOWN_COLUMNS = (
    "model", "gpu", "sharding", "num_gpus", "num_nodes", "tokens_per_s_per_gpu", "scaling_efficiency",
    "marginal_speedup_per_added_gpu", "beyond_knee", "tokens_per_kwh", "usd_per_billion_tokens_cloud",
)  # fmt: skip
"""The columns of scaling.csv that report.md shows."""


def describe_knee(summary: pd.DataFrame, knee: float = KNEE_MARGINAL_SPEEDUP) -> str:
    """A paragraph for report.md: what the knee is, at which threshold, and in how many of the lines of
    ``summary`` (:func:`knees`) it was reached."""
    reached = int(summary["knee_num_gpus"].notna().sum())
    return (
        f"One line per model × GPU type × sharding option. The knee of a line is the last GPU count before an "
        f"added GPU buys less than {knee:g} of what each of its first GPUs does (marginal speed-up per added GPU "
        f"below {knee:g}): beyond it more GPUs still shorten the run, but each buys little and the cost per "
        f"token climbs. "
        f"Returns diminish within the measured counts in {reached} of {len(summary)} line(s); "
        f"`scaling_efficiency.png` marks each knee with a star. A line on the CPU gets no knee: its processes "
        f"share the host's cores, so a speed-up there (below 1 too) measures contention, not scaling."
    )
