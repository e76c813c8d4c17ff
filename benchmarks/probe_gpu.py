"""Benchmark: what a cell costs on a real GPU, and how its step time compares with whole accumulation cycles.

Each cell runs through the product's own path, one ``gpudays sweep`` per cell with ``cluster=local`` (submitit's
LocalExecutor, one process per GPU), at the default probe settings. Printed per cell:

    wall_s     the ``gpudays sweep`` invocation, planning and submission included: what the user waits
    job_s      the job, from the record's ``started_at`` to ``finished_at``: the GPU-seconds of a one-GPU cell
    startup_s, search_s, warmup_s, timed_s   the probe's phases (orchestrator/job/probe.py)
    step_s     the probe's step time, and how it was obtained (``composed`` by default)

With ``--reference N`` each cell is then run again at the micro-batch the probe found, timing N whole accumulation
cycles with no early stop (``probe.step_timing=whole``), and the ratio of the probe's step time to the reference's
median is printed: the probe's fidelity.

    python benchmarks/probe_gpu.py --gpu h100-80gb --models pythia-160m,pythia-1b [--method free-lunch]
        [--reference 10] [--dir DIR] [--json OUT]

Needs the GPUs it names; on a machine without them every cell fails, and the benchmark says so.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PHASES = ("startup_s", "search_s", "warmup_s", "timed_s")


def run_sweep(sweep_dir: Path, overrides: list[str]) -> tuple[dict[str, Any], float]:
    """Run one cell with ``gpudays sweep``; its record and the invocation's wall time."""
    cmd = [sys.executable, "-m", "orchestrator.cli.main", "sweep", "--dir", str(sweep_dir), "--run-unfit", *overrides]
    began = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - began
    records = sorted(sweep_dir.glob("cells/*/record.json"))
    if len(records) != 1:
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"{sweep_dir}: expected one record, found {len(records)} (exit {done.returncode})")
    record: dict[str, Any] = json.loads(records[0].read_text())
    return record, wall_s


def job_s(record: dict[str, Any]) -> float | None:
    started, finished = record.get("started_at"), record.get("finished_at")
    if not started or not finished:
        return None
    return (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds()


def row_of(name: str, record: dict[str, Any], wall_s: float) -> dict[str, Any]:
    m = record.get("metrics") or {}
    row: dict[str, Any] = {"cell": name, "status": record.get("status"), "reason": record.get("reason")}
    row.update({"wall_s": wall_s, "job_s": job_s(record)})
    row.update({phase: m.get(phase) for phase in PHASES})
    for key in (
        "step_time_s",
        "step_time_method",
        "micro_batch_size",
        "grad_accum_steps",
        "micro_step_time_s",
        "boundary_time_s",
        "steps_timed",
        "stop_reason",
        "ci95_pct",
        "mfu",
        "peak_memory_reserved_gib",
    ):
        row[key] = m.get(key)
    row["search_trials"] = len(m.get("search_tried") or [])
    return row


def fmt(value: Any, width: int = 9) -> str:
    if isinstance(value, float):
        return f"{value:>{width}.4g}"
    return f"{'-' if value is None else value!s:>{width}}"


COLUMNS = ("wall_s", "job_s", *PHASES, "step_time_s")


def print_row(row: dict[str, Any]) -> None:
    """One line of the table: the figures, then the ratio to the probe (a reference) or why the cell failed."""
    if row["status"] != "ok":
        tail = f"  {row['status']}: {row['reason']}"
    elif "ratio_probe_over_whole" in row:
        tail = f"  probe/whole {row['ratio_probe_over_whole']:.4f}"
    else:
        tail = ""
    print(
        f"{row['cell']:<28} "
        + " ".join(fmt(row[c]) for c in COLUMNS)
        + f" {fmt(row['step_time_method'])} {fmt(row['micro_batch_size'], 4)} {fmt(row['search_trials'], 6)}{tail}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="h100-80gb")
    parser.add_argument("--models", default="pythia-160m,pythia-410m,pythia-1b,pythia-1.4b")
    parser.add_argument("--method", default="free-lunch")
    parser.add_argument("--reference", type=int, default=0, help="whole cycles timed for the reference (0: none)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/probe-gpu"))
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for every cell")
    args = parser.parse_args(argv)

    base = [f"gpu={args.gpu}", "num_gpus=1", "cluster=local", f"method={args.method}", *args.overrides]
    print(f"{'cell':<28} " + " ".join(f"{c:>9}" for c in COLUMNS) + f" {'method':>9} {'mb':>4} {'trials':>6}")
    rows = []
    for model in args.models.split(","):
        record, wall_s = run_sweep(args.dir / f"{model}-probe", [f"model={model}", *base])
        row = row_of(f"{model} probe", record, wall_s)
        rows.append(row)
        print_row(row)
        if not args.reference or row["status"] != "ok":
            continue
        whole = [
            f"method.micro_batch_size={row['micro_batch_size']}",
            "probe.step_timing=whole",
            "probe.warmup_steps=1",
            f"probe.min_steps={args.reference}",
            f"probe.max_steps={args.reference}",
            "probe.target_ci_pct=0",
            "probe.time_budget_s=1500",
        ]
        ref_record, ref_wall = run_sweep(args.dir / f"{model}-whole", [f"model={model}", *base, *whole])
        ref = row_of(f"{model} whole x{args.reference}", ref_record, ref_wall)
        if ref["status"] == "ok":
            ref["ratio_probe_over_whole"] = row["step_time_s"] / ref["step_time_s"]
        rows.append(ref)
        print_row(ref)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
