"""Benchmark: a step composed from micro-steps and the boundary step against whole accumulation cycles.

For each cell, one probe job (one process per rank) builds the engine at a fixed micro-batch with gradient
accumulation, warms up, then alternates the two ways of timing on that one engine, ``--rounds`` times each::

    composed  COMPOSED_MICRO_STEPS micro-steps inside the cycle and the boundary micro-step, per sample;
              step = grad_accum_steps * micro_step + boundary
    whole     whole accumulation cycles

each until the probe's stopping rule (``probe=default``: 95% CI under 2%, at most 50 samples, the budget below)
says enough. Alternating often, in short blocks, on one engine in one process cancels a drift of a shared
machine's speed and any difference between two builds. Printed per cell: the mean step of each way over all its
samples, their ratio, what measuring one step cost each way (timing wall time over steps measured) and the saving
(1 - composed/whole), and the load average.

    python benchmarks/probe_timing.py [--cells tiny-z0-1r,...] [--rounds 6] [--budget-s 4] [--json OUT]

Runs on the CPU (gpu=cpu, one thread per rank). Models: pythia-tiny (166k parameters) and ``13m`` (13.4M), both
with 16 sequences a step, so micro-batch 1 accumulates 16 micro-steps on one rank and 8 on two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from probe_fidelity import MODELS, REPO, _free_port, compose_cell, rank_env

SIXTEEN = ["model.global_batch_size=16", "method.micro_batch_size=1"]
CELLS: dict[str, list[str]] = {
    "tiny-z0-1r": [*MODELS["tiny"], *SIXTEEN, "method.zero_stage=0"],
    "tiny-z1-2r": [*MODELS["tiny"], *SIXTEEN, "num_gpus=2", "method.zero_stage=1"],
    "tiny-z2-2r-ckpt": [
        *MODELS["tiny"], *SIXTEEN, "num_gpus=2", "method.zero_stage=2", "method.activation_checkpointing=true",
    ],
    "tiny-z3-2r": [*MODELS["tiny"], *SIXTEEN, "num_gpus=2", "method.zero_stage=3"],
    "13m-z0-1r": [*MODELS["13m"], *SIXTEEN, "method.zero_stage=0"],
    "13m-z1-1r-ckpt": [*MODELS["13m"], *SIXTEEN, "method.zero_stage=1", "method.activation_checkpointing=true"],
    "13m-z2-2r": [*MODELS["13m"], *SIXTEEN, "num_gpus=2", "method.zero_stage=2"],
    "13m-z3-2r-ckpt": [
        *MODELS["13m"], *SIXTEEN, "num_gpus=2", "method.zero_stage=3", "method.activation_checkpointing=true",
    ],
}  # fmt: skip
WAYS = ("composed", "whole")


def worker(cell_yaml: Path, out: Path, rounds: int) -> None:
    """One rank: build, warm up, then time each way ``rounds`` times, alternating; rank 0 writes the figures."""
    from orchestrator.job.build_cache import pin_build_environment

    pin_build_environment()  # before torch is imported, as a job does
    from orchestrator.config.batch import plan_batch
    from orchestrator.config.schema import to_config
    from orchestrator.job.failures import Ending
    from orchestrator.job.probe import _Probe

    cell = to_config(OmegaConf.to_container(OmegaConf.load(cell_yaml), resolve=True))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    probe = _Probe(cell, rank, world_size, int(os.environ["LOCAL_RANK"]))
    probe.guarded(probe.setup)
    model = probe.config.model
    plan = plan_batch(model.global_batch_size, probe.num_gpus, int(probe.config.method.micro_batch_size))
    probe.guarded(probe.build, plan)
    probe.config.probe.step_timing = "whole"  # warm up on whole cycles: every way then starts warm
    if probe.warm_up(plan).oom_reason:
        raise RuntimeError("warm-up ran out of memory")
    rows: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    for _ in range(rounds):
        for way in WAYS:
            probe.config.probe.step_timing = way
            began = time.perf_counter()
            samples, _, stop, _ = probe.timed_steps(plan)
            wall_s = time.perf_counter() - began
            steps = [s.step_s for s in samples]
            rows[way].append({"steps_s": steps, "wall_s": wall_s, "stop": stop})
    probe.release()
    probe.close(Ending.COMPLETED)
    if rank == 0:
        out.write_text(json.dumps({"grad_accum_steps": plan.grad_accum_steps, **rows}, indent=2))


def run(name: str, workdir: Path, rounds: int, budget_s: float) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    cell = compose_cell([*CELLS[name], "probe=default", f"probe.time_budget_s={budget_s}"])
    cell_yaml = workdir / "cell.yaml"
    OmegaConf.save(OmegaConf.create(cell), cell_yaml)
    world_size, port = int(cell["num_gpus"]), str(_free_port())
    load_before = os.getloadavg()[0]
    procs = []
    for rank in range(world_size):
        env = rank_env(rank, world_size, port)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")])
        log = open(workdir / f"rank{rank}.log", "w")  # noqa: SIM115 - closed after the wait
        cmd = [sys.executable, __file__, "--worker", str(cell_yaml), "--out", str(workdir / "result.json")]
        cmd += ["--rounds", str(rounds)]
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log), log))
    for proc, log in procs:
        proc.wait(timeout=1800)
        log.close()
        if proc.returncode:
            tail = Path(log.name).read_text()[-2000:]
            raise RuntimeError(f"{name}: a rank exited with {proc.returncode}:\n{tail}")
    result = json.loads((workdir / "result.json").read_text())
    steps = {way: [t for r in result[way] for t in r["steps_s"]] for way in WAYS}
    wall = {way: sum(r["wall_s"] for r in result[way]) for way in WAYS}
    # What one timed step costs to measure: the wall time of a way's timing over the steps it measured.
    per_step = {way: wall[way] / len(steps[way]) for way in WAYS}
    return {
        "cell": name,
        "grad_accum_steps": result["grad_accum_steps"],
        "composed_s": statistics.fmean(steps["composed"]),
        "whole_s": statistics.fmean(steps["whole"]),
        "ratio": statistics.fmean(steps["composed"]) / statistics.fmean(steps["whole"]),
        "composed_cost_s": per_step["composed"],
        "whole_cost_s": per_step["whole"],
        "saving": 1 - per_step["composed"] / per_step["whole"],
        "samples": (len(steps["composed"]), len(steps["whole"])),
        "load_average": (load_before, os.getloadavg()[0]),
        "rounds": result,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", default=",".join(CELLS), help=f"comma list of {', '.join(CELLS)}")
    parser.add_argument("--rounds", type=int, default=6, help="how often each way is timed, alternating")
    parser.add_argument("--budget-s", type=float, default=4.0, help="probe.time_budget_s of each timing")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.out, args.rounds)
        return 0

    print(
        f"{'cell':<16} {'accum':>5} {'composed s':>10} {'whole s':>9} {'ratio':>6} {'cost/step c/w s':>15} "
        f"{'saving':>6} {'samples c/w':>11} {'load':>9}"
    )
    rows = []
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="probe-timing-") as tmp:
        for name in args.cells.split(","):
            row = run(name, Path(tmp) / name, args.rounds, args.budget_s)
            rows.append(row)
            costs = f"{row['composed_cost_s']:.2f}/{row['whole_cost_s']:.2f}"
            samples = "/".join(map(str, row["samples"]))
            load = "-".join(f"{x:.1f}" for x in row["load_average"])
            print(
                f"{name:<16} {row['grad_accum_steps']:>5} {row['composed_s']:>10.4f} {row['whole_s']:>9.4f} "
                f"{row['ratio']:>6.3f} {costs:>15} {row['saving']:>6.0%} {samples:>11} {load:>9}",
                flush=True,
            )
    ratios = [r["ratio"] for r in rows]
    print(
        f"ratio composed/whole: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}, "
        f"{sum(abs(x - 1) <= 0.02 for x in ratios)}/{len(ratios)} within 2%; measuring a step costs "
        f"{statistics.median(r['saving'] for r in rows):.0%} less composed (median over cells); "
        f"benchmark {time.perf_counter() - began:.0f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
