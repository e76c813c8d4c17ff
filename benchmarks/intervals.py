"""Benchmark: how well an adaptive sweep answers a grid it measures only part of, and how honest its intervals are.

Three figures, each out of sample (the report's own accuracy table is in-sample):

(a) replay on a real grid measured in full: every cell of a sweep folder (``--from DIR``, e.g. a CPU grid of tiny
    models of two families, 1-2 ranks, ZeRO stages, checkpointing, both engines) is the truth; the adaptive rounds
    (:func:`analysis.planners.adaptive.decide`, the function ``gpudays sweep --adaptive`` runs) are replayed on it, each
    chosen cell "measured" by revealing its record, and the cells never chosen are judged against their records;
(b) the same replay on a synthetic grid the size of the benchmark's (``tests/synthetic.py``: 13 models x 4 GPU
    types x 6 layouts x 6 methods x checkpointing, about 3,200 cells) whose truth is a perturbed predictor with
    noise, for several seeds, beside the same number of cells chosen at random;
(c) leave-one-out on the real H100 records in ``tests/data/gpu-records``: each predicted by the calibration fitted
    to the others.

For each: cells measured, median and 90th-percentile absolute error of the predicted cells' step time, the share
within ±10%, and the share of truths inside their 90% intervals (the goal: 85-95%); after every round, the same
figures for as many cells chosen at random (``random_*``), calibrated and judged the same way.

    python benchmarks/intervals.py [--from DIR ...] [--target-pct 10] [--round-cells N] [--seeds 3] [--skip-synthetic]

A grid to replay is measured once, in full, with ordinary sweeps (``cluster=local`` runs them on this machine); the
42-cell CPU grid of the closing figures was measured into three folders (two families, 2 and 4 layers, 1-2 ranks,
ZeRO 0-3 and FSDP full/grad_op, checkpointing on and off; ZeRO 1-3 on one rank are refused, as in the $100K
paper), C being ``gpu=cpu cluster=local probe=quick model.num_parameters=null
method.activation_checkpointing=false,true``:

    gpudays sweep --no-report --dir /tmp/i20q-a -m $C model=pythia-tiny,smollm2-tiny model.num_layers=2 \
        num_gpus=1,2 method.engine=deepspeed method.zero_stage=0,1,2,3
    gpudays sweep --no-report --dir /tmp/i20q-c -m $C model=pythia-tiny model.num_layers=4 \
        num_gpus=1,2 method.engine=deepspeed method.zero_stage=0,1,2,3
    gpudays sweep --no-report --dir /tmp/i20q-f -m $C model=pythia-tiny,smollm2-tiny model.num_layers=2 \
        num_gpus=2 method.engine=fsdp method.fsdp_sharding=full,grad_op   (and num_gpus=1 method.fsdp_sharding=full)
    python benchmarks/intervals.py --from /tmp/i20q-a /tmp/i20q-c /tmp/i20q-f
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the synthetic grid (tests/synthetic.py)

import synthetic

from analysis.planners.adaptive import Goal, decide  # noqa: E402
from analysis.planners.selection import ProbeSteps  # noqa: E402
from analysis.predict.calibration import Calibration, calibrate  # noqa: E402
from analysis.predict.inputs import flat_cell  # noqa: E402
from analysis.predict.predictor import Profiles, predict_frame  # noqa: E402
from analysis.sweeps.catalog import recorded_cell  # noqa: E402
from analysis.sweeps.records import load_cells  # noqa: E402
from orchestrator.config.schema import to_config  # noqa: E402
from orchestrator.engines.allocator import recorded_expandable  # noqa: E402
from orchestrator.store.paths import SweepPaths  # noqa: E402
from orchestrator.store.record import read_cell_config  # noqa: E402

RECORDS = Path(__file__).resolve().parent.parent / "tests" / "data" / "gpu-records"


def judge(predicted: pd.DataFrame, truth: pd.DataFrame) -> dict[str, float]:
    """Errors and coverage of predictions (``step_time_s``, ``step_time_low_s``, ``step_time_high_s`` by cell id)
    against the truths' ``step_time_s``."""
    both = predicted.join(truth[["step_time_s"]].rename(columns={"step_time_s": "truth"}), how="inner").dropna(
        subset=["step_time_s", "truth"]
    )
    if both.empty:
        return {"judged": 0.0}
    signed = 100.0 * (both["step_time_s"] / both["truth"] - 1.0)
    error = signed.abs()
    inside = (both["step_time_low_s"] <= both["truth"]) & (both["truth"] <= both["step_time_high_s"])
    return {
        "judged": float(len(both)),
        "median_abs_error_pct": float(error.median()),
        "median_error_pct": float(signed.median()),
        "p90_abs_error_pct": float(error.quantile(0.9)),
        "within_10pct": 100.0 * float((error <= 10.0).mean()),
        "inside_90pct_interval": 100.0 * float(inside.mean()),
        "median_halfwidth_pct": float(
            (100.0 * np.maximum(both["step_time_high_s"] / both["step_time_s"] - 1, 0)).median()
        ),
    }


def replay(
    grid: pd.DataFrame, truth: pd.DataFrame, goal: Goal, probe: ProbeSteps, profiles: Profiles = None
) -> tuple[list[dict], set[str]]:
    """The adaptive rounds on a grid whose every cell's measurement is known: one line per round, and the cells
    measured. A cell's cost is its record's probe wall time x GPUs (or the selection's estimate). ``profiles``: a
    measured profile by GPU name, as a sweep's folder gives the adaptive sweep (and the random choices)."""
    by_id = truth.set_index("cell_id")
    wall = pd.to_numeric(by_id.get("probe_wall_s"), errors="coerce")
    gpus = pd.to_numeric(by_id["num_gpus"], errors="coerce").fillna(1.0)
    measured: set[str] = set()
    spent = 0.0
    lines = []
    answers = truth[truth["status"] == "ok"].set_index("cell_id")
    while True:
        began = time.perf_counter()
        history = [line["widest_pct"] for line in lines]
        d = decide(grid, truth[truth["cell_id"].isin(measured)], goal, spent, probe, history=history,
                   profiles=profiles)  # fmt: skip
        held = d.predicted.set_index("cell_id")
        held = held[held["answer"] == "predicted"]
        line = {
            "round": len(lines),
            "measured": len(measured),
            "spent_gpu_hours": spent / 3600.0,
            "widest_pct": d.widest_pct,
            **judge(held, answers),
            "efficiency": efficiencies(d.calibration),
            "decide_s": time.perf_counter() - began,
        }
        if measured:
            rnd = random_baseline(grid, truth, len(measured), len(lines), profiles)
            line["random_gpu_hours"] = rnd.get("spent_gpu_hours", math.nan)
            line["random_p90_pct"] = rnd.get("p90_abs_error_pct", math.nan)
            line["random_within_10pct"] = rnd.get("within_10pct", math.nan)
            line["random_inside_pct"] = rnd.get("inside_90pct_interval", math.nan)
        lines.append({**line, "stop": d.stop or ""})
        if d.stop:
            return lines, measured
        cost = d.predicted.set_index("cell_id").loc[d.chosen, "cost_gpu_s"]
        spent += float((wall.reindex(d.chosen) * gpus.reindex(d.chosen)).fillna(cost).sum())
        measured |= set(d.chosen)


def efficiencies(calibration: Calibration | None) -> str:
    """Each GPU type's fitted compute efficiency in a round's calibration (on the CPU, which has no published peak,
    the achieved TFLOP/s), ``gpu 0.52 ...``: where it drifts from round to round as cheaper cells are measured, the
    unmeasured cells' errors follow it."""
    fitted = calibration.by_gpu if calibration is not None else {}
    return " ".join(f"{gpu} {fitted[gpu].efficiency:.2f}" for gpu in sorted(fitted))


def random_baseline(
    grid: pd.DataFrame,
    truth: pd.DataFrame,
    n: int,
    seed: int,
    profiles: Profiles = None,
    budget_gpu_s: float | None = None,
) -> dict[str, float]:
    """The same number of measured cells, chosen at random among those that ran, for comparison; with
    ``budget_gpu_s``, as many as that many GPU-seconds buy instead (cells in a random order, each taken where it
    fits what is left), so that a selection that spends less is compared at its own cost too."""
    ok = truth[truth["status"] == "ok"]
    if budget_gpu_s is None:
        chosen = ok.sample(n=min(n, len(ok)), random_state=seed)
    else:
        order = ok.sample(frac=1.0, random_state=seed)
        cost = (pd.to_numeric(order.get("probe_wall_s"), errors="coerce").fillna(0.0)
                * pd.to_numeric(order["num_gpus"], errors="coerce").fillna(1.0)).to_numpy()  # fmt: skip
        keep, left = np.zeros(len(order), dtype=bool), float(budget_gpu_s)
        for i, c in enumerate(cost):
            if c <= left:
                keep[i], left = True, left - c
        chosen = order[keep]
    wall = pd.to_numeric(chosen.get("probe_wall_s"), errors="coerce").fillna(0.0)
    spent_gpu_hours = float((wall * pd.to_numeric(chosen["num_gpus"], errors="coerce").fillna(1.0)).sum()) / 3600
    rest = grid[~grid["cell_id"].isin(chosen["cell_id"])]
    pred = predict_frame(rest, calibrate(chosen, profiles)).set_axis(rest["cell_id"].to_numpy())
    renamed = pred.rename(
        columns={
            "predicted_step_time_s": "step_time_s",
            "predicted_step_time_s_low": "step_time_low_s",
            "predicted_step_time_s_high": "step_time_high_s",
        }
    )
    figures = judge(renamed[["step_time_s", "step_time_low_s", "step_time_high_s"]], ok.set_index("cell_id"))
    return {**figures, "spent_gpu_hours": spent_gpu_hours, "measured": float(len(chosen))}


def show(title: str, lines: list[dict], size: int) -> None:
    """The rounds as a table, then the figures after the last round within 5, 10, 25 and 50% of the grid, and at
    the stop."""
    print(f"\n{title}")
    frame = pd.DataFrame(lines)
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format", "{:.2f}".format):
        print(frame.to_string(index=False))
    marks = []
    for share in (0.05, 0.10, 0.25, 0.50):
        within = [line for line in lines if 0 < line["measured"] <= share * size]
        marks.append((f"measuring at most {100 * share:.0f}% of the grid", within[-1] if within else None))
    shown: list[int] = []
    for label, line in (*marks, ("at the stop", lines[-1])):
        if line is not None and line["round"] in shown and label != "at the stop":
            continue
        shown.append(-1 if line is None else line["round"])
        if line is None or not line.get("judged"):
            print(f"  {label}: nothing held out to judge")
            continue
        print(
            f"  {label}: {line['measured']} of {size} measured ({100 * line['measured'] / size:.1f}%), "
            f"{line['spent_gpu_hours']:.2f} GPU-hours; predicted cells: " + _mean_line([line])
        )


def real_grid(folders: list[Path], goal: Goal, seeds: int) -> dict:
    loaded = load_cells(folders).frame
    truth = loaded[loaded["status"].isin(["ok", "does_not_fit", "oom"])].copy()
    grid = truth.drop(columns=["status"]).copy()
    first_id = str(truth["cell_id"].iloc[0])
    (where,) = [f for f in folders if SweepPaths(f).cell_config(first_id).is_file()][:1]
    first = to_config(read_cell_config(SweepPaths(where).cell_config(first_id))).probe
    probe = ProbeSteps(first.warmup_steps, first.max_steps, first.time_budget_s)
    print(
        f"(a) real grid {', '.join(map(str, folders))}: {len(loaded)} cells, {len(truth)} with an answer to replay on"
    )
    lines, measured = replay(grid, truth, goal, probe)
    show(f"adaptive rounds (target ±{goal.target_pct:g}%, {goal.round_cells} cells a round)", lines, len(truth))
    return {"rounds": lines}


def synthetic_grid(goal: Goal, seeds: int) -> dict:
    grid = synthetic.grid()
    out = {}
    for seed in range(seeds):
        truth = synthetic.perturbed_truth(grid, seed=seed)
        truth["probe_wall_s"], truth["startup_s"], truth["search_s"] = 45.0, 10.0, 10.0
        lines, measured = replay(grid, truth, goal, ProbeSteps())
        show(f"(b) synthetic grid, seed {seed}: {len(grid)} cells (target ±{goal.target_pct:g}%)", lines, len(grid))
        baseline = random_baseline(grid, truth, len(measured), seed)
        print(f"  random choice of as many ({baseline['spent_gpu_hours']:.2f} GPU-hours): " + _mean_line([baseline]))
        out[seed] = {"rounds": lines, "random": baseline}
    return out


def records_table(folders: str = "h100-80gb*") -> pd.DataFrame:
    """The committed records of ``folders`` (a glob under :data:`RECORDS`; the H100's by default) as a cells table
    (as :func:`analysis.sweeps.records.load_cells` gives one)."""
    rows = []
    for path in sorted(RECORDS.glob(f"{folders}/*.json")):
        record = json.loads(path.read_text())
        m = record["metrics"]
        row = {
            **flat_cell(recorded_cell(record["config"])),
            "cell_id": f"{path.parent.name}/{path.stem}",
            "status": record["status"],
        }
        # The allocator it ran with, as cells.csv reads it (the H100's ran before gpudays set one).
        row["allocator_expandable_segments"] = recorded_expandable(record.get("environment") or {})
        for key in ("step_time_s", "micro_batch_size", "grad_accum_steps", "peak_memory_reserved_gib"):
            row[key] = m.get(key)
        row["peak_memory_gib"] = m.get("peak_memory_allocated_gib")
        rows.append(row)
    return pd.DataFrame(rows)


def h100_leave_one_out() -> dict:
    table = records_table()
    predicted = []
    for i in range(len(table)):
        test = table.iloc[[i]]
        cal = calibrate(table.drop(index=table.index[i]))
        p = predict_frame(
            test, cal, micro_batch_size=test["micro_batch_size"], grad_accum_steps=test["grad_accum_steps"]
        )
        u = predict_frame(test, micro_batch_size=test["micro_batch_size"], grad_accum_steps=test["grad_accum_steps"])
        predicted.append(
            {
                "cell_id": test["cell_id"].iloc[0],
                "step_time_s": p["predicted_step_time_s"].iloc[0],
                "step_time_low_s": p["predicted_step_time_s_low"].iloc[0],
                "step_time_high_s": p["predicted_step_time_s_high"].iloc[0],
                "uncalibrated_s": u["predicted_step_time_s"].iloc[0],
                "uncalibrated_low_s": u["predicted_step_time_s_low"].iloc[0],
                "uncalibrated_high_s": u["predicted_step_time_s_high"].iloc[0],
                "measured_s": test["step_time_s"].iloc[0],
            }
        )
    frame = pd.DataFrame(predicted).set_index("cell_id")
    truth = table.set_index("cell_id")
    loo = judge(frame[["step_time_s", "step_time_low_s", "step_time_high_s"]], truth)
    uncal = judge(
        frame[["uncalibrated_s", "uncalibrated_low_s", "uncalibrated_high_s"]].set_axis(
            ["step_time_s", "step_time_low_s", "step_time_high_s"], axis=1
        ),
        truth,
    )
    print(f"\n(c) leave-one-out on the {len(frame)} H100 records in {RECORDS}")
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(frame.to_string())
    print("  calibrated on the other records: " + _mean_line([loo]))
    print("  uncalibrated (the prior alone):  " + _mean_line([uncal]))
    return {"leave_one_out": loo, "uncalibrated": uncal}


def _mean_line(figures: list[dict[str, float]]) -> str:
    keys = (
        "median_abs_error_pct",
        "p90_abs_error_pct",
        "within_10pct",
        "inside_90pct_interval",
        "median_halfwidth_pct",
    )
    means = {k: float(np.mean([f.get(k, math.nan) for f in figures])) for k in keys}
    return (
        f"median |error| {means['median_abs_error_pct']:.1f}%, p90 {means['p90_abs_error_pct']:.1f}%, within ±10% "
        f"{means['within_10pct']:.1f}%, inside the 90% interval {means['inside_90pct_interval']:.1f}% "
        f"(median half-width ±{means['median_halfwidth_pct']:.1f}%)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="folders", nargs="+", help="sweep folders whose every cell was measured (a)")
    parser.add_argument("--target-pct", type=float, default=10.0)
    parser.add_argument("--round-cells", type=int, default=0, help="cells a round (default: 1%% of the grid, >= 2)")
    parser.add_argument("--budget-gpu-hours", type=float, default=math.inf)
    parser.add_argument("--seeds", type=int, default=3, help="synthetic truths (part b) and random draws (part a)")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    out: dict = {}
    if args.folders:
        folders = [Path(f) for f in args.folders]
        size = len(load_cells(folders).frame)
        goal = Goal(args.target_pct, args.budget_gpu_hours, args.round_cells or max(2, round(size / 100)))
        out["real"] = real_grid(folders, goal, args.seeds)
    if not args.skip_synthetic:
        goal = Goal(args.target_pct, args.budget_gpu_hours, args.round_cells or 32)
        out["synthetic"] = synthetic_grid(goal, args.seeds)
    out["h100"] = h100_leave_one_out()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
