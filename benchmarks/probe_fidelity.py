"""Benchmark: does the probe's step time predict the steady state of a longer run with the same settings?

For each model and setting: the probe as a job runs it (``python -m orchestrator.job.by_hand``, one process per rank,
``probe=default``: warm-up, then optimizer steps, composed from their parts, until the 95% CI is under 2%), then the
same cell with ten times as many timed whole steps and no early stop, then the probe again. The steady state is the median step time of
the long run after its first tenth; the figure of merit is the probes' mean step time over the steady state,
which should be within 3%. Bracketing the long run with two probes cancels a slow drift of the machine's speed
(other work on a shared host) to first order; each probe's own ratio is reported too.

    python benchmarks/probe_fidelity.py [--models tiny,13m] [--settings zero0-bf16,...] [--factor 10] [--json OUT]

Runs on the CPU (gpu=cpu, one thread per rank). Models: pythia-tiny (166k parameters) and ``13m``, a pythia-tiny
widened to 13.4M parameters. The load average is printed with each row: on a shared two-core machine the noise of
the neighbours' work, not the probe, is what limits the agreement.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from orchestrator.planning.compose_cache import register_configs

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"

MODELS: dict[str, list[str]] = {
    "tiny": ["model=pythia-tiny"],
    # 4 layers, h=384, V=8192: 4*(12h^2 + 13h) + 2h + 2Vh = 13,390,080 parameters; seq 128, 8 sequences a step.
    "13m": [
        "model=pythia-tiny",
        "model.name=neox-13m",
        "model.num_layers=4",
        "model.hidden_size=384",
        "model.num_heads=6",
        "model.vocab_size=8192",
        "model.num_parameters=13390080",
        "model.global_batch_size=8",
    ],
}
SETTINGS: dict[str, list[str]] = {
    "zero0-bf16": ["method.zero_stage=0", "method.precision=bf16", "method.micro_batch_size=4"],
    "zero2-fp32-ckpt": [
        "method.zero_stage=2",
        "method.precision=fp32",
        "method.activation_checkpointing=true",
        "method.micro_batch_size=8",
    ],
    "zero3-offload": [
        "method.zero_stage=3",
        "method.offload_optimizer=true",
        "method.offload_params=true",
        "method.micro_batch_size=4",
    ],
    "zero1-2ranks": ["num_gpus=2", "method.zero_stage=1", "method.micro_batch_size=4"],
}


def compose_cell(overrides: list[str]) -> dict[str, Any]:
    """A resolved cell config composed from conf/, as ``gpudays sweep`` composes it."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["gpu=cpu", *overrides])
    container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return container


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world_size: int, port: str) -> dict[str, str]:
    """The environment of one rank of a CPU probe on this machine (one thread, gloo on 127.0.0.1:``port``)."""
    return {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "OMP_NUM_THREADS": "1",
    }


def run_cell(cell: dict[str, Any], workdir: Path, timeout_s: float = 3600) -> tuple[dict[str, Any], float]:
    """Run the probe on ``cell`` with one process per rank; rank 0's result and the wall time of the job."""
    workdir.mkdir(parents=True, exist_ok=True)
    cell_yaml = workdir / "cell.yaml"
    OmegaConf.save(OmegaConf.create(cell), cell_yaml)
    world_size, port = int(cell["num_gpus"]), str(_free_port())
    started = time.perf_counter()
    procs = []
    for rank in range(world_size):
        env = rank_env(rank, world_size, port)
        log = open(workdir / f"rank{rank}.log", "w")  # noqa: SIM115 - closed after the wait
        cmd = [
            sys.executable,
            "-m",
            "orchestrator.job.by_hand",
            str(cell_yaml),
            "--out",
            str(workdir / "rank{rank}.json"),
        ]
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log), log))
    for proc, log in procs:
        proc.wait(timeout=timeout_s)
        log.close()
    wall_s = time.perf_counter() - started
    result = json.loads((workdir / "rank0.json").read_text())
    if result["status"] != "ok":
        raise RuntimeError(f"{workdir}: {result['status']}: {result['reason']}")
    return result, wall_s


def steady_state_s(step_times_s: list[float]) -> float:
    """Median step time after the first tenth of the run."""
    return statistics.median(step_times_s[len(step_times_s) // 10 :])


def tenths(step_times_s: list[float]) -> list[float]:
    """Median step time of each tenth of a run: shows a drift of the machine, or a trend of the run itself."""
    size = max(1, len(step_times_s) // 10)
    return [statistics.median(step_times_s[i : i + size]) for i in range(0, len(step_times_s), size)]


def measure(model: str, setting: str, factor: int, workdir: Path) -> dict[str, Any]:
    overrides = [*MODELS[model], *SETTINGS[setting]]
    load_before = os.getloadavg()[0]
    before, before_wall_s = run_cell(compose_cell([*overrides, "probe=default"]), workdir / "probe-before")
    steps = int(before["metrics"]["steps_timed"])
    long_steps = factor * steps
    long_cell = compose_cell(
        [
            *overrides,
            "probe=default",
            f"probe.min_steps={long_steps}",
            f"probe.max_steps={long_steps}",
            "probe.target_ci_pct=0",
            "probe.time_budget_s=1e9",
            "probe.step_timing=whole",  # the reference is whole accumulation cycles, however the probe times
        ]
    )
    long_result, long_wall_s = run_cell(long_cell, workdir / "long")
    after, _ = run_cell(compose_cell([*overrides, "probe=default"]), workdir / "probe-after")
    steady = steady_state_s(long_result["metrics"]["step_times_s"])
    probe_s = (before["metrics"]["step_time_s"], after["metrics"]["step_time_s"])
    return {
        "model": model,
        "setting": setting,
        "num_parameters": before["metrics"]["num_parameters"],
        "probe_steps": (steps, after["metrics"]["steps_timed"]),
        "probe_step_time_s": probe_s,
        "probe_ci95_pct": (before["metrics"]["step_time_ci95_pct"], after["metrics"]["step_time_ci95_pct"]),
        "probe_wall_s": before_wall_s,
        "long_steps": long_result["metrics"]["steps_timed"],
        "long_steady_step_time_s": steady,
        "long_median_by_tenth_s": tenths(long_result["metrics"]["step_times_s"]),
        "long_wall_s": long_wall_s,
        "ratio_before": probe_s[0] / steady,
        "ratio_after": probe_s[1] / steady,
        "ratio": statistics.fmean(probe_s) / steady,
        "load_average": (load_before, os.getloadavg()[0]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list of {', '.join(SETTINGS)}")
    parser.add_argument("--factor", type=int, default=10, help="how many times longer the reference run is")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)

    rows = []
    header = (
        f"{'model':<6} {'setting':<16} {'probe steps':>11} {'probe s/step':>15} {'long steps':>10} "
        f"{'steady s/step':>13} {'ratios':>13} {'ratio':>6} {'load':>9}  within 3%"
    )
    print(header)
    with tempfile.TemporaryDirectory(prefix="probe-fidelity-") as tmp:
        for model in args.models.split(","):
            for setting in args.settings.split(","):
                row = measure(model, setting, args.factor, Path(tmp) / f"{model}-{setting}")
                rows.append(row)
                steps = "/".join(map(str, row["probe_steps"]))
                probe = "/".join(f"{t:.4f}" for t in row["probe_step_time_s"])
                ratios = f"{row['ratio_before']:.3f}/{row['ratio_after']:.3f}"
                load = "-".join(f"{x:.1f}" for x in row["load_average"])
                print(
                    f"{model:<6} {setting:<16} {steps:>11} {probe:>15} {row['long_steps']:>10} "
                    f"{row['long_steady_step_time_s']:>13.4f} {ratios:>13} {row['ratio']:>6.3f} {load:>9}  "
                    f"{'yes' if abs(row['ratio'] - 1) <= 0.03 else 'NO'}",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    within = sum(abs(r["ratio"] - 1) <= 0.03 for r in rows)
    print(f"{within}/{len(rows)} settings within 3% of the steady state")
    return 0


if __name__ == "__main__":
    sys.exit(main())
