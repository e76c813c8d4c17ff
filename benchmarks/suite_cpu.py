"""Benchmark: where the test suite's CPU time goes, by kind of process.

Runs a command (by default the whole suite, as CI runs it) and, every half second, reads every process on the
machine with psutil: its command line and its CPU time (user + system, all threads) at each look. At the end it
sums the last CPU time seen of each process by kind: the pytest workers, the probe's ranks forked by the tests
(``tests/integration/forked_ranks.py``), the jobs of sweeps (submitit's, on SLURM and on this machine), `gpudays`
commands, SLURM's and MariaDB's daemons, and the rest. A process that lives less than half a second may be missed;
the CPU of one that exits between two looks is counted up to the last look.

    python benchmarks/suite_cpu.py [-- COMMAND ...]

It also prints the wall time and the machine's busy fraction over the run (``psutil.cpu_times``): a suite whose
cores are busy all the time gets faster only by doing less, not by more workers.
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass

import psutil

KINDS = (
    ("forked probe rank", ("multiprocessing.forkserver",)),
    ("sweep job (submitit)", ("submitit.core._submit",)),
    ("pytest worker", ("exec(eval(sys.stdin.readline()))",)),
    ("pytest", ("pytest",)),
    ("gpudays command", ("bin/gpudays", "-m orchestrator.cli")),
    ("probe by hand", ("orchestrator.job.by_hand",)),
    ("SLURM daemon or step", ("slurmctld", "slurmd", "slurmdbd", "slurmstepd", "srun", "sbatch", "sacct", "squeue")),
    ("MariaDB, munge", ("mariadbd", "munged")),
)


def kind(cmdline: str) -> str:
    for name, needles in KINDS:
        if any(needle in cmdline for needle in needles):
            return name
    return "other (" + (cmdline.split(" ", 1)[0].rsplit("/", 1)[-1] or "no command line") + ")"


@dataclass
class Seen:
    """One process as last seen."""

    kind: str
    cpu_s: float
    """Its CPU seconds since the run started."""
    base_s: float
    """Its CPU seconds before the run started (0 for a process started since)."""


def watch(seen: dict[tuple[int, float], Seen], since: float, stop: threading.Event) -> None:
    """Every half second: each process's kind and its CPU seconds since ``since`` (epoch seconds; a process already
    running then counts from its first look), keyed by pid and start time."""
    while not stop.is_set():
        for proc in psutil.process_iter(["pid", "create_time", "cmdline", "cpu_times"]):
            info = proc.info
            if info["cpu_times"] is None or info["create_time"] is None:
                continue
            key, cpu_s = (info["pid"], info["create_time"]), info["cpu_times"].user + info["cpu_times"].system
            proc_seen = seen.setdefault(key, Seen("", 0.0, cpu_s if info["create_time"] < since else 0.0))
            # The kind at every look: a child seen between its fork and its exec still has its parent's command.
            proc_seen.kind = kind(" ".join(info["cmdline"] or []))
            proc_seen.cpu_s = cpu_s - proc_seen.base_s
        stop.wait(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="*", default=["python", "-m", "pytest", "-q"])
    args = parser.parse_args()
    seen: dict[tuple[int, float], Seen] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(seen, time.time(), stop), daemon=True)
    before, started = psutil.cpu_times(), time.monotonic()
    watcher.start()
    code = subprocess.call(args.command)
    stop.set()
    watcher.join()
    wall, after = time.monotonic() - started, psutil.cpu_times()
    busy = sum(after) - after.idle - sum(before) + before.idle
    total = Counter[str]()
    count = Counter[str]()
    for proc in seen.values():
        total[proc.kind] += proc.cpu_s
        count[proc.kind] += 1
    print(
        f"\n{' '.join(args.command)}: exit {code}, {wall:.0f} s wall, {busy:.0f} s of CPU busy on "
        f"{psutil.cpu_count()} CPUs ({busy / (wall * (psutil.cpu_count() or 1)):.0%} of their time)"
    )
    print(f"{'CPU s':>8}  {'processes':>9}  kind")
    for name, cpu_s in total.most_common():
        print(f"{cpu_s:8.1f}  {count[name]:9d}  {name}")
    raise SystemExit(code)


if __name__ == "__main__":
    main()
