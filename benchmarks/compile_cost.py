"""Benchmark: what ``method.compile`` costs a cell, regional against whole-model compilation, cold and warm.

For each model: the probe as a job runs it (``python -m orchestrator.job.by_hand``, one process per rank) uncompiled,
then with ``compile_scope=regional`` and ``compile_scope=whole`` (DeepSpeed, whose ``engine.compile()`` is the
whole-model compile), each first with an empty Inductor cache (cold: everything compiled) and then again with the
cache the cold run filled (warm: a later cell of the same shapes in the same sweep). Printed per run: the job's wall time, the probe's phases
(start-up, micro-batch search, warm-up: the compile happens in the first forward, inside search or warm-up), and the
step time; per model, the step time of each compiled scope over the uncompiled one and regional over whole, and
the spread of the uncompiled runs' step times as the noise to judge them by (medians over ``--repeat`` sequences).

    python benchmarks/compile_cost.py [--models tiny,13m,13m-12l] [--repeat 1] [--json OUT]

Runs on the CPU in fp32 (``gpu=cpu``: Inductor's CPU backend fails on these models in bf16, torch 2.13), one
thread per rank; on a GPU the same split comes from ``benchmarks/probe_gpu.py --method free-lunch`` with
``method.compile_scope=regional`` or ``whole``. ``13m-12l`` is ``13m`` with 12 layers: whole-model compilation
compiles every layer, regional compilation one, whatever the depth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from probe_fidelity import MODELS, compose_cell, run_cell

MODEL_CELLS: dict[str, list[str]] = {
    **MODELS,
    "13m-12l": [*MODELS["13m"], "model.name=neox-13m-12l", "model.num_layers=12", "model.num_parameters=null"],
}
SETTINGS = ["method.precision=fp32", "method.micro_batch_size=4", "probe=default"]
RUNS: tuple[tuple[str, list[str], bool], ...] = (
    ("eager", [], False),
    ("regional cold", ["method.compile=true", "method.compile_scope=regional"], True),
    ("regional warm", ["method.compile=true", "method.compile_scope=regional"], False),
    ("whole cold", ["method.compile=true", "method.compile_scope=whole"], True),
    ("whole warm", ["method.compile=true", "method.compile_scope=whole"], False),
    ("eager again", [], False),
)
"""Each run's name, overrides and whether it starts from an empty Inductor cache (a warm run reuses the one its
cold run filled; the two scopes never share one)."""
PHASES = ("startup_s", "search_s", "warmup_s", "timed_s")


def measure(model: str, workdir: Path, repeat: int = 1) -> list[dict[str, Any]]:
    """Every run of :data:`RUNS` on ``model``, the whole sequence ``repeat`` times (each time with new caches)."""
    workdir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for round_ in range(repeat):
        rows += _sequence(model, workdir / f"r{round_}", round_)
    return rows


def _sequence(model: str, workdir: Path, round_: int) -> list[dict[str, Any]]:
    workdir.mkdir(parents=True, exist_ok=True)
    rows, cache = [], None
    for name, overrides, cold in RUNS:
        if cold or cache is None:
            cache = Path(tempfile.mkdtemp(prefix="inductor-", dir=workdir))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)  # the ranks inherit it (run_cell passes os.environ)
        cell = compose_cell([*MODEL_CELLS[model], *SETTINGS, *overrides])
        result, wall_s = run_cell(cell, workdir / name.replace(" ", "-"))
        m = result["metrics"]
        rows.append(
            {
                "model": model,
                "repeat": round_,
                "run": name,
                "wall_s": wall_s,
                **{phase: m[phase] for phase in PHASES},
                "step_time_s": m["step_time_s"],
                "steps_timed": m["steps_timed"],
                "compiled": result["environment"].get("compiled"),
                "compile_scope": result["environment"].get("compile_scope"),
            }
        )
        print_row(rows[-1])
    return rows


def print_row(row: dict[str, Any]) -> None:
    print(
        f"{row['model']:<8} {row['run']:<14} "
        + " ".join(f"{row[c]:>9.2f}" for c in ("wall_s", *PHASES))
        + f" {row['step_time_s']:>11.5f} {row['steps_timed']:>6} {row['compile_scope'] or '-':>9}",
        flush=True,
    )


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Ratios of the runs' medians over the repeats; the noise is the spread of every uncompiled run's step time
    (largest over smallest), the yardstick for the step-time ratios."""
    step = {name: statistics.median(r["step_time_s"] for r in rows if r["run"] == name) for name, _, _ in RUNS}
    wall = {name: statistics.median(r["wall_s"] for r in rows if r["run"] == name) for name, _, _ in RUNS}
    eager = [r["step_time_s"] for r in rows if r["run"].startswith("eager")]
    return {
        "noise: uncompiled step times, largest / smallest": max(eager) / min(eager),
        "noise: eager again / eager": step["eager again"] / step["eager"],
        "step: regional warm / eager": step["regional warm"] / step["eager"],
        "step: whole warm / eager": step["whole warm"] / step["eager"],
        "step: regional / whole (warm)": step["regional warm"] / step["whole warm"],
        "step: regional / whole (cold)": step["regional cold"] / step["whole cold"],
        "cell: regional cold / whole cold": wall["regional cold"] / wall["whole cold"],
        "cell: regional warm / eager": wall["regional warm"] / wall["eager"],
        "cell: whole warm / eager": wall["whole warm"] / wall["eager"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,13m,13m-12l", help=f"comma list of {', '.join(MODEL_CELLS)}")
    parser.add_argument("--repeat", type=int, default=1, help="run the whole sequence this many times (medians)")
    parser.add_argument("--json", type=Path, help="also write the rows and ratios here")
    args = parser.parse_args(argv)
    print(
        f"{'model':<8} {'run':<14} "
        + " ".join(f"{c:>9}" for c in ("wall_s", *PHASES))
        + "      step_s  steps     scope"
    )
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="compile-cost-") as tmp:
        for model in args.models.split(","):
            rows = measure(model, Path(tmp) / model, args.repeat)
            found = ratios(rows)
            for key, value in found.items():
                print(f"  {model}: {key}: {value:.3f}")
            out[model] = {"rows": rows, "ratios": found}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
