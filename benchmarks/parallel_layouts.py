"""Benchmark: one small model under data, tensor and pipeline parallelism and their 2-D meshes on the CPU (4 ranks,
gloo), each layout's measured step time, peak memory and bubble beside analysis/predict/parallelism.py's prediction.

    python benchmarks/parallel_layouts.py [--ranks8] [--keep DIR]

Runs ``gpudays sweep`` with ``method.engine=mesh3d`` (one cell at a time, as this machine runs cells) on a
Pythia-shaped model of 4 layers and hidden size 256 (3.4M parameters), then checks every cell against the layout
model (``analysis.report.layout_check``: calibrated on the data-parallel cell). ``--ranks8`` adds the 3-D layout
tp2 × pp2 × dp2 on 8 ranks. On a machine with fewer cores than ranks the ranks share cores, so the step times
and the bubble say as much about the scheduling of processes as about the layout: read them as this machine's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.report.layout_check import check, check_rows  # noqa: E402
from orchestrator.store.record import Record, read_record  # noqa: E402

MODEL = [
    "model=pythia-tiny", "model.num_layers=4", "model.hidden_size=256", "model.num_parameters=null",
    "model.global_batch_size=16", "gpu=cpu", "probe=quick",
]  # fmt: skip
LAYOUTS: dict[str, list[str]] = {
    "DP": ["num_gpus=4"],
    "TP": ["num_gpus=4", "method.tp=4"],
    "PP 1F1B": ["num_gpus=4", "method.pp=4", "method.pp_microbatches=4"],
    "TP x DP": ["num_gpus=4", "method.tp=2"],
    "PP x DP": ["num_gpus=4", "method.pp=2", "method.pp_microbatches=4"],
    "PP x DP interleaved": [
        "num_gpus=4", "method.pp=2", "method.pp_microbatches=4", "method.pp_schedule=interleaved_1f1b",
    ],
    "TP x PP": ["num_gpus=4", "method.tp=2", "method.pp=2", "method.pp_microbatches=4"],
}  # fmt: skip
RANKS8 = {"TP x PP x DP": ["num_gpus=8", "method.tp=2", "method.pp=2", "method.pp_microbatches=4"]}


def run(name: str, overrides: list[str], sweep: Path) -> None:
    cmd = [sys.executable, "-m", "orchestrator.cli.main", "sweep", *MODEL, "method.engine=mesh3d", *overrides]
    cmd += ["--dir", str(sweep), "--no-report"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{name}: gpudays sweep exited {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def records(sweep: Path) -> list[Record]:
    out = []
    for cell in sorted((sweep / "cells").iterdir()) if (sweep / "cells").is_dir() else []:
        r = read_record(cell / "record.json", cell.name)
        if isinstance(r, Record):
            out.append(r)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks8", action="store_true", help="also the 3-D layout on 8 ranks")
    parser.add_argument("--keep", help="folder to keep the sweeps in (default: a temporary one)")
    args = parser.parse_args()
    layouts = {**LAYOUTS, **(RANKS8 if args.ranks8 else {})}
    names: dict[str, str] = {}  # cell id -> the layout's name here
    found: list[Record] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides) in enumerate(layouts.items()):
            sweep = Path(args.keep or tmp) / f"layout{i}"
            run(name, overrides, sweep)
            for r in records(sweep):
                names[r.cell_id] = name
                found.append(r)
    rows = check_rows(check(found))
    header = ("step_s", "pred_step_s", "mem_gib", "pred_mem_gib", "bubble", "pred_bubble")
    print(" | ".join(("layout", "mesh", *header)))
    print(" | ".join("---" for _ in range(len(header) + 2)))
    for row in rows:
        print(" | ".join([names.get(str(row["cell"]), "?"), str(row["layout"]), *(_fmt(row[k]) for k in header)]))
    extra = ("pred_compute_s", "pred_comm_s", "pred_overhead_s")
    print("\npredicted terms of each step (s): " + ", ".join(extra))
    for row in rows:
        print(f"  {names.get(str(row['cell']), '?')}: " + ", ".join(_fmt(row[k]) for k in extra))
    missing = [n for n in layouts if n not in names.values()]
    if missing:
        print(f"\nno record for: {', '.join(missing)}")
    return 0


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


if __name__ == "__main__":
    sys.exit(main())
