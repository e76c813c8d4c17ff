"""Fit the discrepancy's growth rates (:mod:`analysis.predict.discrepancy`) on the unfittable generator.

The generator of ``tests/truth_grid.py`` has physics of its own, so the predictor's error on it grows with the
distance to what was measured as it would on a real grid; it is not the real CPU grid, the H100 records or the
published runs the scorecard judges intervals on. For each seed's grid and each share of it measured (cells drawn at
random), the predictor is calibrated on the draw with every rate at zero, and each cell never measured gives its
squared log error less the variance the calibration already gave it; non-negative least squares of that on the
squared log distances (GPUs, nodes, parameters, micro-steps) to the nearest measured record and the indicators of a family and a
method no record had gives the squared rates.

    python benchmarks/discrepancy_rates.py [--seeds 2] [--draws 3]

Prints the fitted rates and, beside them, the generator's coverage of 90% intervals before and after (in-sample).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import optimize

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import truth_grid  # noqa: E402

from analysis.predict import discrepancy  # noqa: E402
from analysis.predict.calibration import calibrate  # noqa: E402
from analysis.predict.discrepancy import nearest_log_distance, positions  # noqa: E402
from analysis.predict.inputs import inputs_from_columns  # noqa: E402
from analysis.predict.predictor import prediction_detail  # noqa: E402
from analysis.predict.uncertainty import quantile  # noqa: E402
from analysis.sweeps.records import load_cells  # noqa: E402

RATES = ("GPU_RATE", "NODE_RATE", "SIZE_RATE", "MICRO_STEP_RATE", "FAMILY_SD", "METHOD_SD")
SHARES = (0.01, 0.02, 0.05)
CPU_SHARES = (0.05, 0.1, 0.2)


def set_rates(values: dict[str, float]) -> None:
    for name, value in values.items():
        setattr(discrepancy, name, value)


def draws(seeds: int, per_share: int, cpu: bool = False) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """(measured, never measured) pairs of every seed's grid and share (``cpu``: of the real CPU grid instead, a
    diagnostic only, in-sample for the scorecard's CPU figures)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="rates-") as tmp:
        for seed in range(seeds):
            if cpu:
                import scorecard

                truth = scorecard.cpu_grid_truths(1)
                assert truth is not None, "tests/data/cpu-grid is not in this checkout"
                frame = truth[1][0]
            else:
                folder = Path(tmp) / f"truth-{seed}"
                truth_grid.write_grid(folder, seed=seed)
                frame = load_cells([folder]).frame
            ok = frame[frame["status"] == "ok"].reset_index(drop=True)
            for share in CPU_SHARES if cpu else SHARES:
                for draw in range(per_share):
                    chosen = ok.sample(frac=share, random_state=1000 * seed + draw)
                    out.append((chosen, ok[~ok["cell_id"].isin(chosen["cell_id"])]))
    return out


def features(chosen: pd.DataFrame, rest: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per never-measured cell: the squared distances and indicators, its squared log error less its variance,
    and whether its interval holds the truth."""
    calibration = calibrate(chosen)
    d = prediction_detail(rest, calibration)
    x = inputs_from_columns({c: rest[c] for c in rest.columns}, len(rest))
    cells = positions(x, d["grad_accum_steps"])
    rows = np.zeros((len(rest), len(RATES)))
    for name, gcal in calibration.by_gpu.items():
        on = x.gpu == name
        near = gcal.spread.neighbourhood if gcal.spread else None
        if near is None:
            continue
        at, r = cells.take(on), near.records
        rows[on, 0] = nearest_log_distance(at.gpus, r.gpus) ** 2
        rows[on, 1] = nearest_log_distance(at.nodes, r.nodes) ** 2
        rows[on, 2] = nearest_log_distance(at.params, r.params) ** 2
        rows[on, 3] = nearest_log_distance(at.micro_steps, r.micro_steps) ** 2
        rows[on, 4] = ~np.isin(at.family.astype(str), r.family.astype(str))
        rows[on, 5] = ~np.isin(at.method.astype(str), r.method.astype(str))
    truth = pd.to_numeric(rest["step_time_s"], errors="coerce").to_numpy(dtype=float)
    central, sd = d["step_time_s"], d["step_time_sd"]
    error = np.log(truth / central)
    dof = np.array([4.0 + (calibration.by_gpu[g].num_records if g in calibration.by_gpu else 0) for g in x.gpu])
    inside = np.abs(error) <= quantile(dof) * sd
    keep = np.isfinite(error) & np.isfinite(sd)
    return rows[keep], (error**2 - sd**2)[keep], inside[keep]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--draws", type=int, default=3, help="random draws of each share of each seed's grid")
    parser.add_argument("--cpu-grid", action="store_true", help="fit on the real CPU grid instead (diagnostic only)")
    args = parser.parse_args()
    np.seterr(all="ignore")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    pairs = draws(args.seeds, args.draws, args.cpu_grid)
    set_rates(dict.fromkeys(RATES, 0.0))
    parts = [features(chosen, rest) for chosen, rest in pairs]
    x = np.vstack([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    before = float(np.mean(np.concatenate([p[2] for p in parts])))
    # An intercept takes what grows with nothing here (the neighbourhood's discrepancy estimated from few records),
    # so that the rates take only what grows with distance; it is reported, not used.
    squared, _ = optimize.nnls(np.column_stack([x, np.ones(len(y))]), y)
    fitted = dict(zip(RATES, np.sqrt(squared[:-1]).tolist(), strict=True))
    shares = CPU_SHARES if args.cpu_grid else SHARES
    print(
        f"{len(pairs)} calibrations ({args.seeds} seeds x shares {shares} x {args.draws} draws), {len(y)} cells judged"
    )
    for name, value in fitted.items():
        print(f"  {name} = {value:.4f}")
    print(f"  (beyond the neighbourhood's discrepancy everywhere: {np.sqrt(squared[-1]):.4f}, not used)")
    each = np.array([np.sqrt(optimize.nnls(np.column_stack([p[0], np.ones(len(p[1]))]), p[1])[0][:-1]) for p in parts])
    low, high = np.percentile(each, [10, 90], axis=0)
    print("  each calibration's own fit, 10th-90th percentile: "
          + ", ".join(f"{n} {lo:.3f}-{hi:.3f}" for n, lo, hi in zip(RATES, low, high, strict=True)))  # fmt: skip
    set_rates(fitted)
    after = float(np.mean(np.concatenate([features(chosen, rest)[2] for chosen, rest in pairs])))
    print(f"inside the 90% interval on the generator (in-sample): {100 * before:.1f}% with every rate 0, "
          f"{100 * after:.1f}% with the fitted rates")  # fmt: skip


if __name__ == "__main__":
    main()
