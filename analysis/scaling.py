"""The scaling table: throughput against GPU count and nodes, and the return on each added GPU.

A pure function of the cells table (:mod:`analysis.tables` adds the estimates it reads).
"""

from __future__ import annotations

import pandas as pd

from analysis.records import rows_of
from analysis.tables import _col, _measured, _model_order, settings_label

SCALING_COLUMNS = (
    "model", "gpu", "num_gpus", "num_nodes", "tokens_per_s", "tokens_per_s_per_gpu", "speedup", "ideal_speedup",
    "scaling_efficiency", "marginal_speedup_per_added_gpu", "time_to_train_days", "settings", "cell_id",
)  # fmt: skip


def scaling(cells: pd.DataFrame) -> pd.DataFrame:
    """Throughput against GPU count and nodes for each model × GPU type, with the return on each added GPU.

    Each (GPU count, nodes) takes its fastest measured cell. ``speedup`` is throughput over that of the smallest
    count measured; ``scaling_efficiency`` is speedup over the ideal (GPU count ratio); the marginal speed-up
    per added GPU is the throughput gained since the next smaller count, per added GPU, in units of the base
    count's throughput per GPU (1.0: each added GPU is worth as much as the first ones).
    """
    measured = _measured(cells)
    if measured.empty:
        return pd.DataFrame(columns=list(SCALING_COLUMNS))
    rows = measured.assign(
        _tps=_col(measured, "tokens_per_s"),
        _n=_col(measured, "num_gpus"),
        _nodes=_col(measured, "num_nodes").fillna(1.0),
        _order=_model_order(measured),
    )
    rows = rows[rows["_tps"].gt(0) & rows["_n"].gt(0)]
    if rows.empty:
        return pd.DataFrame(columns=list(SCALING_COLUMNS))
    group = ["model", "gpu"]
    # The fastest cell of each (model, GPU, count, nodes), in the order the table is read.
    rows = rows.sort_values([*group, "_n", "_nodes", "_tps"], ascending=[True, True, True, True, False])
    rows = rows.drop_duplicates([*group, "_n", "_nodes"]).copy()
    base_tps = rows.groupby(group, sort=False)["_tps"].transform("first")
    base_n = rows.groupby(group, sort=False)["_n"].transform("first")
    rows["speedup"] = rows["_tps"] / base_tps
    rows["ideal_speedup"] = rows["_n"] / base_n
    rows["scaling_efficiency"] = rows["speedup"] / rows["ideal_speedup"]
    rows["tokens_per_s_per_gpu"] = rows["_tps"] / rows["_n"]
    # Marginal return: against the best layout of the next smaller GPU count measured for the same model × GPU.
    per_count = rows.groupby([*group, "_n"], sort=True)["_tps"].max().reset_index()
    per_count["_prev_n"] = per_count.groupby(group, sort=False)["_n"].shift()
    per_count["_prev_tps"] = per_count.groupby(group, sort=False)["_tps"].shift()
    rows = rows.merge(per_count[[*group, "_n", "_prev_n", "_prev_tps"]], on=[*group, "_n"], how="left")
    base_per_gpu = (base_tps / base_n).to_numpy()
    rows["marginal_speedup_per_added_gpu"] = (
        (rows["_tps"] - rows["_prev_tps"]) / (rows["_n"] - rows["_prev_n"]) / base_per_gpu
    )
    rows["settings"] = [settings_label(r) for r in rows_of(rows, rows.columns)]
    rows = rows.sort_values(["_order", "model", "gpu", "_n", "_nodes"], kind="stable")
    return rows.reindex(columns=list(SCALING_COLUMNS)).reset_index(drop=True)
