"""DeepSpeed and FSDP side by side: for each model × GPU type × GPU count, the fastest measured cell of each
engine, and how far apart they are (``engines.csv``).

Columns: ``model``, ``gpu``, ``num_gpus``; per engine E (``deepspeed``, ``fsdp``): ``E_settings`` (the short label
of its fastest cell's settings, as in best.csv), ``E_step_time_s``, ``E_time_to_train_days``,
``E_peak_memory_gib``, ``E_cells_compared`` (measured cells of that engine), ``E_cell_id``; then
``faster_engine`` (empty unless both were measured) and ``fsdp_vs_deepspeed_step_time_pct`` = 100 × (FSDP's
step time ÷ DeepSpeed's − 1): negative where FSDP is faster. A pure function of the cells table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.report.tables import settings_label
from analysis.sweeps.records import MEASURED_FITS, rows_of

ENGINES = ("deepspeed", "fsdp")
KEYS = ("model", "gpu", "num_gpus")
PER_ENGINE = ("settings", "step_time_s", "time_to_train_days", "peak_memory_gib", "cells_compared", "cell_id")
ENGINE_COLUMNS = (
    *KEYS,
    *(f"{engine}_{name}" for engine in ENGINES for name in PER_ENGINE),
    "faster_engine",
    "fsdp_vs_deepspeed_step_time_pct",
)
"""Columns of engines.csv, in order."""
MARKDOWN_COLUMNS = (
    "model", "gpu", "num_gpus", "deepspeed_settings", "deepspeed_step_time_s", "fsdp_settings", "fsdp_step_time_s",
    "faster_engine", "fsdp_vs_deepspeed_step_time_pct",
)  # fmt: skip


def compare_engines(cells: pd.DataFrame) -> pd.DataFrame:
    """The fastest measured cell of each engine per model × GPU type × GPU count, side by side."""
    needed = {"status", "step_time_s", *KEYS}
    if cells.empty or not needed <= set(cells.columns):
        return pd.DataFrame(columns=list(ENGINE_COLUMNS))
    step = pd.to_numeric(cells["step_time_s"], errors="coerce")
    measured = cells[cells["status"].isin(MEASURED_FITS) & step.notna()].copy()
    if measured.empty:
        return pd.DataFrame(columns=list(ENGINE_COLUMNS))
    engine = measured["engine"] if "engine" in measured.columns else pd.Series("deepspeed", index=measured.index)
    measured["_engine"] = engine.fillna("deepspeed")
    measured["_step"] = step[measured.index]
    measured = measured.sort_values([*KEYS, "_engine", "_step", "cell_id"], kind="stable")
    order = pd.to_numeric(measured.get("num_parameters"), errors="coerce")
    keys = measured[list(KEYS)].assign(_order=order).drop_duplicates(list(KEYS))
    out = keys.reset_index(drop=True)
    for name in ENGINES:
        mine = measured[measured["_engine"] == name]
        best = mine.groupby(list(KEYS), sort=False).head(1)
        best = best.assign(settings=[settings_label(r) for r in rows_of(best, best.columns)])  # the fastest only
        counts = mine.groupby(list(KEYS)).size().rename(f"{name}_cells_compared").reset_index()
        best = best.reindex(columns=[*KEYS, *(c for c in PER_ENGINE if c != "cells_compared")])
        best = best.rename(columns={c: f"{name}_{c}" for c in PER_ENGINE})
        out = out.merge(best, on=list(KEYS), how="left").merge(counts, on=list(KEYS), how="left")
    ds = pd.to_numeric(out["deepspeed_step_time_s"], errors="coerce")
    fsdp = pd.to_numeric(out["fsdp_step_time_s"], errors="coerce")
    both = ds.notna() & fsdp.notna()
    out["faster_engine"] = pd.Series(np.where(fsdp < ds, "fsdp", "deepspeed"), index=out.index).where(both)
    out["fsdp_vs_deepspeed_step_time_pct"] = (100.0 * (fsdp / ds - 1.0)).where(both).round(4) + 0.0
    for name in ENGINES:
        out[f"{name}_cells_compared"] = out[f"{name}_cells_compared"].fillna(0).astype("Int64")
    out = out.sort_values(["_order", "model", "gpu", "num_gpus"], kind="stable", na_position="last")
    return out.reindex(columns=list(ENGINE_COLUMNS)).reset_index(drop=True)


def both_measured(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of an engines table where both engines were measured."""
    return table[table["faster_engine"].notna()] if not table.empty else table


def describe(table: pd.DataFrame) -> str:
    """A sentence for report.md: how many model × GPU × count have both engines measured, and who wins."""
    both = both_measured(table)
    if both.empty:
        return (
            "No model × GPU type × GPU count has cells of both engines measured yet (`method.engine=deepspeed,fsdp` "
            "in a sweep measures both)."
        )
    wins = both["faster_engine"].value_counts()
    median = float(pd.to_numeric(both["fsdp_vs_deepspeed_step_time_pct"]).median())
    return (
        f"{len(both)} model × GPU type × GPU count measured with both engines: FSDP faster in "
        f"{int(wins.get('fsdp', 0))}, DeepSpeed in {int(wins.get('deepspeed', 0))}; median FSDP step time "
        f"{median:+.1f}% against DeepSpeed's (each engine's fastest setting)."
    )
