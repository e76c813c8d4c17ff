"""Benchmark: ``gpudays report`` over 10,000 generated cell records.

Generates a sweep folder of synthetic cells (cell.yaml + record.json each, the probe's record shape; step
times and memory from the predictor with noise, some cells out of memory, failed or without a record), then
times :func:`analysis.report.writer.write_report` on it, plots included. The goal is under 5 s on a 2-core machine.

    python benchmarks/report_10k.py [--cells 10000] [--no-plots] [--memory] [--keep DIR]

``--memory`` also reports the peak Python allocation of the report for a fifth of the cells and for all of
them, to show that memory grows with the table only.
"""

from __future__ import annotations

import argparse
import itertools
import random
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import pandas as pd

from analysis.predict.predictor import flat_cell, predict_frame
from analysis.report.writer import write_report
from analysis.sweeps.records import Catalog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the synthetic grid (tests/synthetic.py)
import synthetic  # noqa: E402

GPUS = ("v100-32gb", "rtx3090", "a6000", "a100-40gb", "a100-80gb", "l40s", "h100-80gb", "h200")
METHODS = [
    {"zero_stage": z, "offload_optimizer": off, "offload_params": False, "activation_checkpointing": ck}
    for z, off, ck in itertools.product((0, 1, 2, 3), (False, True), (False, True))
    if not (off and z == 0)
]


def generate(root: Path, num_cells: int, seed: int = 0) -> None:
    """Write ``num_cells`` cells into the sweep folder ``root``."""
    rng = random.Random(seed)
    catalog = Catalog.load()
    models = [m for m in catalog.models if m.startswith("pythia-") and m != "pythia-tiny"]
    grid = list(itertools.product(models, GPUS, (1, 2, 4, 8, 16), METHODS, ("sdpa", "eager"), (False, True)))
    rng.shuffle(grid)  # every model and GPU appears, whatever the number of cells
    configs = []
    for i in range(num_cells):
        model, gpu, num_gpus, method, attention, compile_ = grid[i % len(grid)]
        v100 = gpu == "v100-32gb"
        configs.append(
            synthetic.cell_config(
                model,
                gpu,
                num_gpus,
                num_nodes=2 if num_gpus == 16 else 1,
                catalog=catalog,
                name="bench",
                precision="fp16" if v100 else "bf16",
                tf32=not v100,
                attention=attention,
                compile=compile_,
                **method,
            )
        )
    # Measurements scatter around the predictor's own figures: a realistic spread of fits and step times.
    predicted = predict_frame(pd.DataFrame([flat_cell(c) for c in configs]))
    for i, config in enumerate(configs):
        cell_id = f"{i:010x}"
        roll = rng.random()
        if roll < 0.02:
            synthetic.write_cell(root, cell_id, config)  # still queued: no record
            continue
        pred = predicted.iloc[i]
        status = "ok" if pred["predicted_fits"] else "does_not_fit"
        if roll < 0.04:
            status = "failed"
        metrics = None
        if status == "ok":
            step = float(pred["predicted_step_time_s"]) * rng.lognormvariate(0.0, 0.15)
            metrics = synthetic.metrics(
                config,
                step,
                int(pred["predicted_micro_batch_size"]),
                float(pred["predicted_peak_memory_gib"]) * rng.uniform(0.9, 1.1),
            )
        record = synthetic.record(
            cell_id,
            config,
            status,
            metrics,
            reason="NCCL watchdog timeout" if status == "failed" else None,
            sweep="bench",
            finished_at=f"2026-11-22T00:{10 + i % 50:02d}:14+00:00",
        )
        synthetic.write_cell(root, cell_id, config, record)


def time_report(root: Path, plots: bool) -> tuple[float, float, int]:
    """Wall and CPU seconds write_report takes on ``root``, and the number of rows it produced."""
    wall, cpu = time.perf_counter(), time.process_time()
    report = write_report([root], out_dir=root / "report", plots=plots)
    return time.perf_counter() - wall, time.process_time() - cpu, len(report.cells)


def peak_allocation_mib(root: Path) -> float:
    tracemalloc.start()
    write_report([root], out_dir=root / "report", plots=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def main(argv: list[str] | None = None) -> float:
    """Run the benchmark; returns the report's seconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=10_000)
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--keep", type=Path, default=None, help="generate into this folder and keep it")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="gpudays-bench-")) if args.keep is None else args.keep
    try:
        root = workdir / "sweep"
        start = time.perf_counter()
        generate(root, args.cells)
        print(f"generated {args.cells} cells in {time.perf_counter() - start:.1f} s")
        seconds, cpu_seconds, rows = time_report(root, plots=not args.no_plots)
        print(f"report over {rows} cell records: {seconds:.2f} s wall, {cpu_seconds:.2f} s CPU (goal: under 5 s)")
        if args.memory:
            small = workdir / "small"
            generate(small, args.cells // 5)
            low, high = peak_allocation_mib(small), peak_allocation_mib(root)
            print(
                f"peak Python allocation: {low:.0f} MiB for {args.cells // 5} cells, {high:.0f} MiB for {args.cells}"
                f" ({(high - low) * 2**20 / (args.cells - args.cells // 5) / 1024:.1f} KiB per added cell)"
            )
        return seconds
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
