"""The report's tables, from the cells table: estimates and predictions per cell, best, frontier, scaling.

Pure functions of DataFrames; :mod:`analysis.report.writer` reads the records and writes the files.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.predict import estimates as est
from analysis.predict.inputs import inputs_from_columns
from analysis.predict.predictor import DEFAULT_MARGIN, Calibration, predict_frame
from analysis.report.accuracy import answer_column
from analysis.sweeps.catalog import method_column, method_kinds
from analysis.sweeps.records import MEASURED_DOES_NOT_FIT, MEASURED_FITS, rows_of
from orchestrator.config.schema import MethodConfig
from orchestrator.engines.registry import engine_specs, identity_keys, identity_keys_if_set, method_label

_ENGINE_KINDS = {key: method_kinds()[key] for spec in engine_specs() for key in spec.fields}
"""Every engine's method fields, with their kinds (which decide how the CSV writes them)."""
INT_COLUMNS = (
    "num_gpus", "num_nodes", *(k for k, kind in _ENGINE_KINDS.items() if kind == "int"), "attempt",
    "micro_batch_size", "grad_accum_steps", "per_gpu_batch_size", "steps_timed", "tokens_per_step", "num_parameters",
    "train_steps", "predicted_micro_batch_size", "predicted_from_records",
)  # fmt: skip
BOOL_COLUMNS = (
    *(k for k, kind in _ENGINE_KINDS.items() if kind == "bool"), "activation_checkpointing", "compile", "tf32",
    "predicted_fits", "measured_fits", "fit_agrees",
)  # fmt: skip
_METHOD_KEYS = (*method_kinds(), *(method_column(key) for key in method_kinds()))
"""Every key a method label may read from a row: each method field by its name and by its column's."""
SETTING_COLUMNS = (
    "engine", *identity_keys_if_set(), *identity_keys(), "activation_checkpointing", "precision", "micro_batch_size",
    "grad_accum_steps", "compile", "compile_scope", "tf32", "attention",
)  # fmt: skip
"""The engine, every engine's fields (the later engines' first, as the columns have always been ordered), then the
method's own."""


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    """A numeric column, NaN where absent or not a number."""
    if name not in frame.columns:
        return pd.Series(np.nan, index=frame.index, dtype=float)
    return pd.to_numeric(frame[name], errors="coerce").astype(float)


def add_estimates(frame: pd.DataFrame, budget: est.TokenBudget) -> pd.DataFrame:
    """Add the training-run estimates to every measured (``ok``) cell; other cells get empty estimates."""
    out = frame.copy()
    ok = out["status"].isin(MEASURED_FITS) if "status" in out.columns else pd.Series(False, index=out.index)
    # The probe's count of the built module where measured, else the family's formula (a published
    # model_num_parameters is only a check of the architecture, never a figure).
    x = inputs_from_columns({c: out[c] for c in out.columns}, len(out))
    formula = pd.Series(x.params, index=out.index)
    params = _col(out, "num_parameters").fillna(formula)
    out["num_parameters"] = params

    # Tokens only where the family's samples are tokens: an image classifier's token figures stay empty.
    seq, batch = pd.Series(x.tokens_per_sample, index=out.index), _col(out, "model_global_batch_size")
    model_tokens_per_step = batch * seq
    tokens_per_step = _col(out, "tokens_per_step").fillna(model_tokens_per_step)
    out["tokens_per_step"] = tokens_per_step
    tokens, steps = _training_run(out, budget, model_tokens_per_step, tokens_per_step)
    out["train_tokens"] = tokens.where(ok)
    out["train_steps"] = steps.where(ok)

    step = _col(out, "step_time_s").where(ok)
    num_gpus = _col(out, "num_gpus")
    halfwidth = est.ci95_halfwidth_pct(
        out.get("step_time_ci95_pct"), out.get("step_time_mean_s"), out.get("step_time_std_s"), out.get("steps_timed")
    )
    out["cloud_usd_per_gpu_hour"] = _col(out, "gpu_cloud_usd_per_gpu_hour")
    out["machine_price_usd"] = est.purchase_cost_usd(
        num_gpus, _col(out, "num_nodes").fillna(1.0), _col(out, "gpu_purchase_price_usd")
    )
    out["board_power_w"] = _col(out, "gpu_board_power_w")
    for key, value in _run_figures(out, steps, step).items():
        out[key] = value
    low, high = est.interval(out["time_to_train_days"], halfwidth.to_numpy())
    out["time_to_train_days_low"] = low
    out["time_to_train_days_high"] = high
    for key in ("cloud_price_source", "cloud_price_date"):  # text: where the price comes from, or why none
        out[key] = out[f"gpu_{key}"] if f"gpu_{key}" in out.columns else None

    tokens_per_s = _col(out, "tokens_per_s").fillna(tokens_per_step / step)
    out["tokens_per_s"] = tokens_per_s
    out["tokens_per_s_per_gpu"] = _col(out, "tokens_per_s_per_gpu").fillna(tokens_per_s / num_gpus)
    # Each cell's throughput in its family's own unit: tokens/s for a language model, images/s for a vision one.
    unit = pd.Series(x.throughput_unit, index=out.index, dtype=object)
    samples_per_s = _col(out, "samples_per_s").fillna(batch / step)
    out["throughput_unit"] = unit
    out["throughput_per_s"] = tokens_per_s.where(unit == "tokens", samples_per_s.where(unit == "images"))
    out["throughput_per_s_per_gpu"] = out["throughput_per_s"] / num_gpus
    return out


def _training_run(
    out: pd.DataFrame, budget: est.TokenBudget, model_tokens_per_step: pd.Series, tokens_per_step: pd.Series
) -> tuple[pd.Series, pd.Series]:
    """Tokens and optimizer steps of every cell's training run (whether or not it was measured)."""
    model_steps = _col(out, "model_train_steps")
    tokens = pd.Series(
        est.train_tokens(budget, model_steps * model_tokens_per_step, out["num_parameters"]), index=out.index
    )
    if budget.kind == "model":
        # The model's own run is exactly its train_steps, whatever the measured step's token count.
        return tokens, model_steps
    return tokens, pd.Series(est.train_steps_for(tokens, tokens_per_step), index=out.index)


RUN_FIGURES = (
    "time_to_train_days", "gpu_hours", "cost_usd_cloud", "cost_usd_amortised", "energy_kwh", "wall_clock_days",
    "wall_clock_gpu_hours",
)  # fmt: skip
"""The figures of a training run, each proportional to the step time: a step time's interval carries over as it is.
The first five are the training steps' (steady state); ``wall_clock_*`` the whole run's, over its cluster's
``goodput`` (restarts, evaluations and checkpoints included: what published totals count)."""


def _run_figures(out: pd.DataFrame, steps: pd.Series, step: pd.Series) -> dict[str, pd.Series]:
    """:data:`RUN_FIGURES` of ``steps`` optimizer steps of ``step`` seconds each, at each cell's prices and power
    (``cloud_usd_per_gpu_hour``, ``machine_price_usd``, ``board_power_w``, set by :func:`add_estimates`)."""
    days = pd.Series(est.time_to_train_days(steps, step), index=out.index)
    hours = pd.Series(est.gpu_hours(_col(out, "num_gpus"), steps, step), index=out.index)
    goodput = pd.Series(est.goodput_of(_col(out, "cluster_goodput")), index=out.index)
    return {
        "time_to_train_days": days,
        "gpu_hours": hours,
        "cost_usd_cloud": pd.Series(est.cloud_cost_usd(hours, out["cloud_usd_per_gpu_hour"]), index=out.index),
        "cost_usd_amortised": pd.Series(est.amortised_cost_usd(out["machine_price_usd"], days), index=out.index),
        "energy_kwh": pd.Series(est.energy_kwh(hours, out["board_power_w"]), index=out.index),
        "goodput": goodput,
        "wall_clock_days": pd.Series(est.wall_clock(days, goodput), index=out.index),
        "wall_clock_gpu_hours": pd.Series(est.wall_clock(hours, goodput), index=out.index),
    }


def add_predicted_estimates(cells: pd.DataFrame, budget: est.TokenBudget) -> pd.DataFrame:
    """The training run's figures of every cell whose answer is predicted (``answer`` of :func:`add_predictions`),
    from its predicted step time: days with the prediction's 90% interval, GPU-hours, costs and energy; the
    measured cells' figures stay as they are. An adaptive sweep's unmeasured cells are answered this way."""
    predicted = cells["answer"].eq("predicted") if "answer" in cells.columns else pd.Series(False, index=cells.index)
    if not predicted.any():
        return cells
    rows = cells.loc[predicted]  # only these are worked out: a sweep's measured cells may be thousands
    x = inputs_from_columns({c: rows[c] for c in rows.columns}, len(rows))
    model_tokens_per_step = _col(rows, "model_global_batch_size") * pd.Series(x.tokens_per_sample, index=rows.index)
    tokens, steps = _training_run(rows, budget, model_tokens_per_step, model_tokens_per_step)
    step = _col(rows, "predicted_step_time_s")
    figures = {"train_tokens": tokens, "train_steps": steps, **_run_figures(rows, steps, step)}
    for end in ("low", "high"):
        figures[f"time_to_train_days_{end}"] = (
            figures["time_to_train_days"] * _col(rows, f"predicted_step_time_s_{end}") / step
        )
    out = cells.copy(deep=False)  # each figure's column is replaced whole, never written into
    for key, value in figures.items():
        out[key] = _col(out, key).where(~predicted, value.reindex(out.index))
    return out


INTERVAL_COLUMNS = (
    "predicted_peak_memory_gib", "predicted_peak_memory_gib_low", "predicted_peak_memory_gib_high",
    "predicted_step_time_s", "predicted_step_time_s_low", "predicted_step_time_s_high", "predicted_from_records",
)  # fmt: skip
"""The predictions cells.csv carries with their 90% intervals (:mod:`analysis.predict.uncertainty`)."""


def add_predictions(
    frame: pd.DataFrame, calibration: Calibration | None, margin: float = DEFAULT_MARGIN
) -> pd.DataFrame:
    """Add predicted memory, step time and fit, and their error against measurement where there is one.

    For a measured cell the prediction is made at the measured micro-batch and accumulation, so that memory and
    step time compare like with like; the fit prediction always follows the cell's own micro-batch setting.
    """
    out = frame.copy()
    measured = out["status"].isin(MEASURED_FITS) if "status" in out.columns else pd.Series(False, index=out.index)
    x = inputs_from_columns({c: out[c] for c in out.columns}, len(out))  # one reading for both predictions
    as_set = predict_frame(out, calibration, margin, inputs=x)
    as_run = predict_frame(
        out,
        calibration,
        margin,
        micro_batch_size=_col(out, "micro_batch_size").where(measured),
        grad_accum_steps=_col(out, "grad_accum_steps").where(measured),
        inputs=x,
    )
    out["predicted_fits"] = as_set["predicted_fits"]
    out["predicted_micro_batch_size"] = as_run["predicted_micro_batch_size"]
    for column in INTERVAL_COLUMNS:
        out[column] = as_run[column]
    # Rounded to 1e-4 %: an exact fit then reads 0, not float noise like -1.1e-14.
    # The prediction is of the reserved peak where the device has a caching allocator (CUDA); the CPU's records
    # have one figure, the resident-set growth.
    measured_peak = _col(out, "peak_memory_reserved_gib").fillna(_col(out, "peak_memory_gib"))
    memory_error = 100.0 * (out["predicted_peak_memory_gib"] / measured_peak - 1.0)
    step_error = 100.0 * (out["predicted_step_time_s"] / _col(out, "step_time_s") - 1.0)
    out["memory_error_pct"] = memory_error.round(4) + 0.0
    out["step_time_error_pct"] = step_error.round(4) + 0.0
    status = out["status"] if "status" in out.columns else pd.Series(None, index=out.index, dtype=object)
    out["measured_fits"] = pd.array(
        [True if s in MEASURED_FITS else False if s in MEASURED_DOES_NOT_FIT else None for s in status],
        dtype="boolean",
    )
    out["fit_agrees"] = out["predicted_fits"] == out["measured_fits"]
    out["answer"] = answer_column(out)
    return out


def _int(value: Any) -> int | None:
    try:
        out = int(value)
    except (TypeError, ValueError):
        return None
    return out if out >= 1 else None


def settings_label(row: Any) -> str:
    """A short label of a cell's settings, e.g. ``zero2 offload-opt ckpt compile mb8x4 bf16`` (DeepSpeed) or
    ``fsdp-full offload ckpt mb8x4 bf16`` (FSDP)."""
    parts = [engine_label(row)]
    if row.get("activation_checkpointing") is True:
        parts.append("ckpt")
    if row.get("compile") is True:
        scope = row.get("compile_scope")
        parts.append(
            f"compile-{scope}" if isinstance(scope, str) and scope != MethodConfig.compile_scope else "compile"
        )
    micro, accum = row.get("micro_batch_size"), row.get("grad_accum_steps")
    if pd.notna(micro):
        parts.append(f"mb{int(micro)}" + (f"x{int(accum)}" if pd.notna(accum) else ""))
    if isinstance(row.get("precision"), str):
        parts.append(row["precision"])
    if isinstance(row.get("attention"), str) and row["attention"] != "sdpa":
        parts.append(row["attention"])
    if row.get("num_nodes") is not None and pd.notna(row.get("num_nodes")) and int(row["num_nodes"]) > 1:
        parts.append(f"{int(row['num_nodes'])}nodes")
    return " ".join(parts)


def engine_label(row: Any) -> str:
    """How a cell shards, by its engine's label (``EngineSpec.label``): ``zero2 offload-opt`` under DeepSpeed (the
    engine of every cell without one), ``fsdp-grad_op offload reduce-bf16`` under FSDP."""
    return method_label(row)


def _model_order(frame: pd.DataFrame) -> pd.Series:
    return _col(frame, "num_parameters")


def _measured(cells: pd.DataFrame, predicted: bool = False) -> pd.DataFrame:
    """Measured cells with an estimate (and, with ``predicted``, the cells answered by a prediction), only the
    columns the summary tables use (cheaper to group and sort)."""
    if cells.empty or "status" not in cells.columns:
        return cells.iloc[0:0]
    answer = cells["status"].isin(MEASURED_FITS)
    if predicted and "answer" in cells.columns:
        answer |= cells["answer"].eq("predicted")
    keep = answer & _col(cells, "time_to_train_days").notna()
    wanted = [c for c in dict.fromkeys((*_SUMMARY_INPUTS, *BEST_COLUMNS, *FRONTIER_COLUMNS)) if c in cells.columns]
    return cells.loc[keep, wanted]


_SUMMARY_INPUTS = ("status", "num_parameters", "tokens_per_s")

BEST_COLUMNS = (
    "model", "gpu", "num_gpus", "num_nodes", "settings", *SETTING_COLUMNS, "answer", "step_time_s",
    "predicted_step_time_s", "time_to_train_days", "time_to_train_days_low", "time_to_train_days_high", "gpu_hours",
    "cost_usd_cloud", "cost_usd_amortised", "energy_kwh", "goodput", "wall_clock_days", "wall_clock_gpu_hours",
    "tokens_per_s", "mfu", "peak_memory_gib",
    "cells_compared", "caveats", "cell_id", "sweep",
)  # fmt: skip
"""``answer`` says whether the row's figures were measured or predicted; a predicted row's ``*_low``/``*_high``
bound the prediction's 90% interval, a measured row's the probe's 95% confidence interval."""


def best_cells(cells: pd.DataFrame, predicted: bool = True) -> pd.DataFrame:
    """The fastest answered cell for each model × GPU type × GPU count, settings spelled out: measured, or (unless
    ``predicted`` is False) predicted where that is faster or nothing of the group was measured."""
    measured = _measured(cells, predicted)
    if measured.empty:
        return pd.DataFrame(columns=list(BEST_COLUMNS))
    keys = ["model", "gpu", "num_gpus"]
    ordered = measured.assign(_order=_model_order(measured)).sort_values(
        [*keys, "time_to_train_days", "cell_id"], kind="stable"
    )
    best = ordered.groupby(keys, sort=False, dropna=False).head(1).copy()
    counts = measured.groupby(keys, dropna=False).size().rename("cells_compared").reset_index()
    best = best.merge(counts, on=keys, how="left")
    best["settings"] = [settings_label(r) for r in rows_of(best, best.columns)]
    best = best.sort_values(["_order", "model", "gpu", "num_gpus"], kind="stable")
    return best.reindex(columns=list(BEST_COLUMNS)).reset_index(drop=True)


FRONTIER_COLUMNS = (
    "model", "cost_basis", "cost_usd", "time_to_train_days", "gpu", "num_gpus", "num_nodes", "settings",
    "gpu_hours", "cost_usd_cloud", "cost_usd_amortised", "energy_kwh", "cell_id",
)  # fmt: skip


def pareto_mask(days: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """True for points no other point beats on both: sorted by days, keep each that is cheaper than all faster."""
    order = np.lexsort((cost, days))
    keep = np.zeros(len(days), dtype=bool)
    cheapest = math.inf
    for i in order:
        if cost[i] < cheapest:
            keep[i] = True
            cheapest = cost[i]
    return keep


def frontier(cells: pd.DataFrame) -> pd.DataFrame:
    """For each model, the measured cells that no other cell beats on both days and cost.

    Cost is the cloud cost where the model has any cell with a cloud price, else GPU-hours (the CPU, or GPUs
    without a price): the ``cost_basis`` column says which.
    """
    measured = _measured(cells)
    parts = []
    for _, group in measured.groupby("model", sort=False):
        cloud = _col(group, "cost_usd_cloud")
        if cloud.notna().any():
            basis, cost, group = "cost_usd_cloud", cloud[cloud.notna()], group[cloud.notna()]
        else:
            basis, cost = "gpu_hours", _col(group, "gpu_hours")
        mask = pareto_mask(_col(group, "time_to_train_days").to_numpy(), cost.to_numpy())
        chosen = group[mask].assign(cost_basis=basis, cost_usd=cost[mask].to_numpy(), _order=_model_order(group[mask]))
        if basis == "gpu_hours":
            chosen["cost_usd"] = np.nan
        parts.append(chosen)
    if not parts:
        return pd.DataFrame(columns=list(FRONTIER_COLUMNS))
    out = pd.concat(parts)
    out["settings"] = [settings_label(r) for r in rows_of(out, out.columns)]
    out = out.sort_values(["_order", "model", "time_to_train_days"], kind="stable")
    return out.reindex(columns=list(FRONTIER_COLUMNS)).reset_index(drop=True)


def normalise_dtypes(frame: pd.DataFrame) -> pd.DataFrame:
    """Whole numbers as nullable integers and flags as nullable booleans, so the CSV reads ``2``, not ``2.0``; a
    value no 64-bit integer holds (a damaged record's ``-1e308``) is left empty, as a fraction is."""
    out = frame.copy()
    for name in INT_COLUMNS:
        if name in out.columns:
            values = pd.to_numeric(out[name], errors="coerce")
            whole = values.where(values.isna() | ((values == values.round()) & (values.abs() < 2.0**62)))
            out[name] = whole.round().astype("Int64")
    for name in BOOL_COLUMNS:
        if name in out.columns and out[name].dtype != "boolean":
            flags = [v if isinstance(v, (bool, np.bool_)) else None for v in out[name].tolist()]
            out[name] = pd.array(flags, dtype="boolean")
    return out


def csv_cells(cells: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """The rows of cells.csv (and of ``report --format``): ``columns`` in order, ``sharding`` each cell's engine
    label (``zero2 offload-opt``, ``fsdp-hybrid``, a mesh3d layout), and the fields another engine always names
    (DeepSpeed's ZeRO stage and offload flags) empty where a cell ran under an engine of its own: an FSDP cell
    has no ZeRO stage, and must not read as ZeRO-0."""
    out = cells.reindex(columns=list(columns)).copy()
    if cells.empty:
        return out
    if "sharding" in out.columns:  # a label reads method fields only: those columns, not every one of a wide table
        out["sharding"] = [engine_label(row) for row in rows_of(cells, _METHOD_KEYS)]
    engine = cells["engine"] if "engine" in cells.columns else pd.Series(None, index=cells.index, dtype=object)
    for spec in engine_specs():
        other = engine.notna() & (engine != spec.name)
        for key in spec.identity_always:
            if key in out.columns and other.any():
                out[key] = out[key].astype(object).where(~other, None)
    return out


def floats_as_text(frame: pd.DataFrame, float_format: str) -> pd.DataFrame:
    """``frame`` with each float column written out as ``to_csv(float_format=...)`` writes it (``float_format % v``,
    empty where NaN): the same file, a tenth of pandas' cost per value on a table of thousands of rows."""
    out = frame.copy(deep=False)
    for name, column in frame.items():
        if isinstance(column.dtype, np.dtype) and column.dtype.kind == "f":
            text = [None if v != v else float_format % v for v in column.tolist()]
            out[name] = pd.Series(text, index=column.index, dtype=object)
    return out
