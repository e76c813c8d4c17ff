"""Benchmark: how long ``gpudays --help`` and ``gpudays status`` take to start, against the goal of 0.4 s for
``--help`` and against a bare ``python -c pass``.

Each command is run ``--runs`` times in a fresh interpreter (the installed ``gpudays`` console script's Python),
after one unmeasured run that warms the file cache; printed: the median and the spread of the wall times, the
median over ``python -c pass``, and whether ``--help`` is within its goal. ``status`` reads a two-cell sweep
folder this benchmark writes into a temporary folder (one cell ok, one failed, no scheduler asked).

    python benchmarks/start_time.py [--runs 10]

For where the time goes: ``python -X importtime -c "from orchestrator.cli.main import main; main(['--help'])"``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HELP_GOAL_S = 0.4


def _time(argv: list[str], runs: int) -> list[float]:
    subprocess.run(argv, capture_output=True, check=False)  # warm the file cache
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=False)
        walls.append(time.perf_counter() - start)
    return walls


def _sweep_folder(root: Path) -> Path:
    from orchestrator.planning.plan import plan
    from orchestrator.store.durable import append_jsonl
    from orchestrator.store.paths import SweepPaths
    from orchestrator.store.record import RECORD_SCHEMA_VERSION
    from orchestrator.submission import launch

    config = plan(["model=pythia-tiny", "gpu=cpu", "num_gpus=1"], sweep_dir=None).cells[0]
    paths = SweepPaths(root / "sweep")
    for status in ("ok", "failed"):
        cid = f"{status}0"
        launch.write_cell(paths, cid, config.typed)
        append_jsonl(paths.attempts(cid), {"cell_id": cid, "attempt": 1, "job_id": "999999999", "backend": "local"})
        record = {"schema_version": RECORD_SCHEMA_VERSION, "status": status, "cell_id": cid, "attempt": 1}
        paths.record(cid).write_text(json.dumps({**record, "config": config.config, "metrics": {}, "environment": {}}))
    return paths.root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    gpudays = [sys.executable, "-m", "orchestrator.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = _sweep_folder(Path(tmp))
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "gpudays --help": [*gpudays, "--help"],
            "gpudays status SWEEP": [*gpudays, "status", str(folder)],
        }
        medians = {}
        print(
            f"{'command':<22} {'median s':>9} {'min s':>7} {'max s':>7} {'over python':>12}   ({args.runs} runs each)"
        )
        for name, argv in cases.items():
            walls = _time(argv, args.runs)
            medians[name] = statistics.median(walls)
            over = medians[name] - medians["python -c pass"]
            print(f"{name:<22} {medians[name]:>9.3f} {min(walls):>7.3f} {max(walls):>7.3f} {over:>12.3f}")
    help_s = medians["gpudays --help"]
    verdict = "within" if help_s <= HELP_GOAL_S else "over"
    print(f"gpudays --help: median {help_s:.3f} s, {verdict} the goal of {HELP_GOAL_S} s")


if __name__ == "__main__":
    main()
