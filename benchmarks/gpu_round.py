"""Benchmark: one short round on one GPU, under a deadline: the machine's profile, then quick probes.

What runs, in this order, each through the product's own commands (``gpudays profile``, then one ``gpudays sweep``
per cell with ``cluster=local probe=quick probe.profile=false`` at a fixed micro-batch):

    the profile's single-GPU part: matrix products of the probed models' shapes, attention, memory bandwidth
    (one GPU has no link to measure collectives over)
    up to eight cells: pythia-160m under DeepSpeed, FSDP2 and mesh3d, with compile cold and then warm (the same
    cell again, Inductor's cache left from the first); pythia-410m with activation checkpointing; pythia-1b
    under FSDP2; pythia-1.4b under DeepSpeed (the default round; ``--only`` names others of :data:`CELLS` too)

A cell starts only while the time it is allowed fits before the deadline; one that overruns is killed with its
processes and reported as such. After each step everything measured is packed again into ``OUT/gpu-round.tar.gz``
(the sweep folders without the jobs' logs of ranks) and the rows into ``OUT/rows.json``, so that whatever ends the
round, what it measured comes back.

    python benchmarks/gpu_round.py --gpu h200 --out DIR [--deadline-s 450] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from probe_gpu import REPO, print_row, row_of

MODELS = "pythia-160m,pythia-410m,pythia-1b,pythia-1.4b"
CELLS: list[tuple[str, float, list[str]]] = [
    # (name, the most seconds it may take, overrides)
    ("160m-ds", 75, ["model=pythia-160m", "method.micro_batch_size=32"]),
    ("1.4b-ds", 100, ["model=pythia-1.4b", "method.micro_batch_size=16"]),
    ("160m-fsdp", 75, ["model=pythia-160m", "method.micro_batch_size=32", "method.engine=fsdp"]),
    ("410m-ds-ckpt", 80, ["model=pythia-410m", "method.micro_batch_size=32", "method.activation_checkpointing=true"]),
    ("1b-fsdp", 95, ["model=pythia-1b", "method.micro_batch_size=16", "method.engine=fsdp"]),
    ("160m-mesh3d", 75, ["model=pythia-160m", "method.micro_batch_size=32", "method.engine=mesh3d"]),
    ("160m-ds-compile-cold", 110, ["model=pythia-160m", "method.micro_batch_size=32", "method.compile=true"]),
    ("160m-ds-compile-warm", 90, ["model=pythia-160m", "method.micro_batch_size=32", "method.compile=true"]),
    # Beyond the first eight, named with --only: checkpointing's pairs, compile under FSDP2 and on larger models.
    ("410m-ds", 80, ["model=pythia-410m", "method.micro_batch_size=16"]),
    ("1.4b-ds-ckpt", 100, ["model=pythia-1.4b", "method.micro_batch_size=32", "method.activation_checkpointing=true"]),
    (
        "160m-fsdp-compile",
        110,
        ["model=pythia-160m", "method.micro_batch_size=32", "method.engine=fsdp", "method.compile=true"],
    ),
    ("410m-ds-compile", 90, ["model=pythia-410m", "method.micro_batch_size=16", "method.compile=true"]),
    ("1.4b-ds-compile", 110, ["model=pythia-1.4b", "method.micro_batch_size=16", "method.compile=true"]),
    # A second round, each predicted before it ran: FSDP2 and mesh3d on the larger models, checkpointed memory.
    ("1.4b-fsdp", 80, ["model=pythia-1.4b", "method.micro_batch_size=16", "method.engine=fsdp"]),
    ("410m-mesh3d", 70, ["model=pythia-410m", "method.micro_batch_size=16", "method.engine=mesh3d"]),
    ("1b-ds-ckpt", 80, ["model=pythia-1b", "method.micro_batch_size=32", "method.activation_checkpointing=true"]),
    ("1b-ds", 70, ["model=pythia-1b", "method.micro_batch_size=16"]),
    ("410m-fsdp", 70, ["model=pythia-410m", "method.micro_batch_size=16", "method.engine=fsdp"]),
    (
        "1.4b-fsdp-ckpt",
        80,
        [
            "model=pythia-1.4b",
            "method.micro_batch_size=32",
            "method.engine=fsdp",
            "method.activation_checkpointing=true",
        ],
    ),
    ("1b-mesh3d", 70, ["model=pythia-1b", "method.micro_batch_size=16", "method.engine=mesh3d"]),
    ("1.4b-mesh3d", 80, ["model=pythia-1.4b", "method.micro_batch_size=16", "method.engine=mesh3d"]),
    # A llama-family cell: does its element-wise work cost what pythia's does per hidden unit (the memory-bound
    # term's one constant, 3.97 s predicted) or what its counted bytes say (2.5 times as many, 5.46 s)?
    ("smollm2-135m-ds", 70, ["model=smollm2-135m", "method.micro_batch_size=16"]),
    (
        "410m-fsdp-compile",
        90,
        ["model=pythia-410m", "method.micro_batch_size=16", "method.engine=fsdp", "method.compile=true"],
    ),
]
"""The cells, most wanted first: the baseline beside the H100 records, the largest model, each engine, checkpointed
memory, then compile's cold and warm cost. Every cell keeps the model's own global batch (1,024 sequences), so its
step time compares with the H100 records' at the same micro-batch."""


def run(cmd: list[str], limit_s: float, log: Path) -> tuple[int | None, float]:
    """Run ``cmd`` from the repository with its output in ``log``; its exit status (None: killed at ``limit_s``,
    its whole process group with it, the probe's job included) and its wall time."""
    began = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    return rc, time.perf_counter() - began


def pack(work: Path, out: Path, rows: list[dict[str, Any]]) -> None:
    """The sweep folders and logs as one archive, the rows as JSON: both rewritten whole each time."""
    (out / "rows.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    partial = out / "gpu-round.tar.gz.part"
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(work, arcname="gpu-round", filter=lambda t: None if "/ranks/" in t.name else t)
    partial.replace(out / "gpu-round.tar.gz")


def environment() -> dict[str, Any]:
    import torch

    found: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name(0)
        found["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 2)
        found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
    for name in ("deepspeed", "transformers"):
        try:
            found[name] = __import__(name).__version__
        except Exception as e:  # noqa: BLE001 - reported, not raised: the round goes on without it
            found[name] = f"not importable: {e}"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-round"))
    parser.add_argument("--deadline-s", type=float, default=450.0, help="no step starts that could end after it")
    parser.add_argument("--profile-s", type=float, default=75.0, help="the most the profile may take")
    parser.add_argument("--only", help="the cells to run, comma-separated (default: the first eight, in order)")
    parser.add_argument("--skip-profile", action="store_true")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    gpudays = [sys.executable, "-m", "orchestrator.cli.main"]
    env = environment()
    print(json.dumps(env), flush=True)
    (args.work / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
    rows: list[dict[str, Any]] = []

    def left() -> float:
        return float(args.deadline_s) - (time.perf_counter() - began)

    if not args.skip_profile and left() > args.profile_s:
        cmd = [*gpudays, "profile", "--dir", str(args.work / "profile"), "--model", MODELS, "--precision", "bf16",
               "--seconds-each", "0.1"]  # fmt: skip
        rc, wall = run(cmd, args.profile_s, args.work / "profile.log")
        rows.append({"cell": "profile", "status": "ok" if rc == 0 else f"exit {rc}", "wall_s": wall})
        print(f"profile: exit {rc} in {wall:.1f} s", flush=True)
        print((args.work / "profile.log").read_text()[-6000:], flush=True)
        pack(args.work, args.out, rows)
    wanted = args.only.split(",") if args.only else [name for name, _, _ in CELLS[:8]]
    for name, limit_s, overrides in CELLS:
        if name not in wanted:
            continue
        if left() < limit_s:
            print(f"{name}: not started, {left():.0f} s left and it may take {limit_s:.0f} s", flush=True)
            rows.append({"cell": name, "status": "not started", "reason": f"{left():.0f} s left"})
            continue
        sweep = args.work / name
        common = [f"gpu={args.gpu}", "num_gpus=1", "cluster=local", "probe=quick", "probe.profile=false"]
        cmd = [*gpudays, "sweep", "--dir", str(sweep), "--run-unfit", *common, *overrides]
        rc, wall = run(cmd, limit_s, args.work / f"{name}.log")
        records = sorted(sweep.glob("cells/*/record.json"))
        if records:
            row = row_of(name, json.loads(records[0].read_text()), wall)
        else:
            row = {
                "cell": name,
                "status": "killed" if rc is None else f"exit {rc}",
                "reason": "no record",
                "wall_s": wall,
            }
        row["exit"] = rc
        rows.append(row)
        if "step_time_method" in row:
            print_row(row)
        else:
            print(f"{name}: {row['status']} after {wall:.0f} s", flush=True)
        if row.get("status") != "ok":
            print((args.work / f"{name}.log").read_text()[-2500:], flush=True)
        pack(args.work, args.out, rows)
    print(f"round done in {time.perf_counter() - began:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
