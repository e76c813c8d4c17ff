"""Benchmark: what one probe costs in wall time, and where the time goes.

Runs the probe on several cells with ``probe=default`` as a job would (one process per rank) and splits each
run's wall time into: what happens outside ``run_probe`` (``outside``: interpreter start, imports, tear-down,
exit), start-up (process group, model, engine), micro-batch search, warm-up, timed steps, and the rest (record).

    python benchmarks/probe_cost.py [--cells tiny-fixed,...] [--json OUT]

On the CPU (gpu=cpu) these are this machine's figures; the same split on a GPU shows where a cell's
GPU-minutes go (start-up and search are paid once per cell, the timed steps follow the stopping rule).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from probe_fidelity import MODELS, compose_cell, run_cell

CELLS: dict[str, list[str]] = {
    "tiny-fixed": [*MODELS["tiny"], "method.micro_batch_size=4"],
    "tiny-auto": [*MODELS["tiny"], "method.micro_batch_size=auto"],
    "tiny-auto-limited": [
        *MODELS["tiny"],
        "method.micro_batch_size=auto",
        "probe.memory_limit_gib=0.3",
        "model.seq_length=512",
        "method.attention=eager",
        "method.precision=fp32",
    ],
    "tiny-zero3-offload": [
        *MODELS["tiny"],
        "method.zero_stage=3",
        "method.offload_optimizer=true",
        "method.offload_params=true",
        "method.micro_batch_size=4",
    ],
    "tiny-2ranks": [*MODELS["tiny"], "num_gpus=2", "method.zero_stage=1", "method.micro_batch_size=4"],
    "13m-fixed": [*MODELS["13m"], "method.micro_batch_size=4"],
    "13m-auto": [*MODELS["13m"], "method.micro_batch_size=auto"],
}
PHASES = ("startup_s", "search_s", "warmup_s", "timed_s")


def measure(name: str, workdir: Path) -> dict[str, Any]:
    result, wall_s = run_cell(compose_cell([*CELLS[name], "probe=default"]), workdir)
    m = result["metrics"]
    row = {"cell": name, "wall_s": wall_s, "outside_s": wall_s - m["probe_wall_s"]}
    row.update({phase: m[phase] for phase in PHASES})
    row["other_s"] = m["probe_wall_s"] - sum(m[phase] for phase in PHASES)
    row.update(
        {
            "steps_timed": m["steps_timed"],
            "stop_reason": m["stop_reason"],
            "micro_batch_size": m["micro_batch_size"],
            "search_trials": len(m.get("search_tried", [])),
            "step_time_s": m["step_time_s"],
            "step_time_method": m["step_time_method"],
        }
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", default=",".join(CELLS), help=f"comma list of {', '.join(CELLS)}")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)

    columns = ("wall_s", "outside_s", *PHASES, "other_s")
    print(
        f"{'cell':<20} "
        + " ".join(f"{c:>9}" for c in columns)
        + f" {'steps':>6} {'stop':>11} {'micro':>5} {'trials':>6} {'timing':>8}"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="probe-cost-") as tmp:
        for name in args.cells.split(","):
            row = measure(name, Path(tmp) / name)
            rows.append(row)
            print(
                f"{name:<20} "
                + " ".join(f"{row[c]:>9.2f}" for c in columns)
                + f" {row['steps_timed']:>6} {row['stop_reason']:>11} {row['micro_batch_size']:>5}"
                f" {row['search_trials']:>6} {row['step_time_method']:>8}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
