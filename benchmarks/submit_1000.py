"""Benchmark: submit a 1,000-cell sweep to the local SLURM cluster, ask its status, and compare with stock Hydra.

With a probe that returns at once (``probe.kind=sleep probe.sleep_s=0``), on the local cluster of
``gpudays cluster up`` (started here, and stopped again, if it is not up):

1. ``gpudays sweep`` of 1,000 cells in two resource groups (1 and 2 tasks): wall time until the command returns,
   the time from its start to its first scheduler call (start-up and planning), and its scheduler calls by
   command (goal: one sbatch call per resource group);
2. ``gpudays status`` on that sweep, once right after submission and once after the jobs were cancelled (every
   task then has a state): wall time, in-process time, its own scheduler calls by command (goal: under 2 s, one
   sacct call), and the files it opened and folders it listed (in-process, a cell's share too);
3. the same 1,000 cells submitted by stock Hydra with hydra-submitit-launcher, timed until its sbatch call
   returns (it then blocks until every job ends; it is stopped there), as a ratio to step 1 (goal: 20x).

Every call to SLURM's commands goes through a logging shim on PATH that runs the real command. The shims are on
the jobs' PATH too (sbatch exports the environment), so a call made inside a job (``SLURM_JOB_ID`` set) is logged
as the jobs' and counted apart from gpudays' own. The jobs of both sweeps are cancelled at the end. Figures are
printed, never asserted.

    python benchmarks/submit_1000.py [--cells 1000] [--keep DIR] [--no-hydra]

Step 3 needs the launcher plugin, installed into the project's environment for this benchmark only:

    .venv/bin/pip install hydra-submitit-launcher
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import importlib.util
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHIMMED = ("sbatch", "sacct", "squeue", "scontrol", "sinfo", "sacctmgr", "scancel")
HYDRA_INSTALL = f"{REPO / '.venv/bin/pip'} install hydra-submitit-launcher"


def make_shims(folder: Path, log: Path) -> Path:
    """Shims of SLURM's commands that log ``name who start_s end_s rc=N args => stdout`` and pass the real output on.

    ``who`` is ``job`` for a call from inside a job (``SLURM_JOB_ID`` is set: the shims are on the jobs' PATH too,
    as sbatch exports the submitting environment), else ``gpudays``: only those are the command's own calls.
    """
    shims = folder / "shims"
    shims.mkdir(parents=True, exist_ok=True)
    for name in SHIMMED:
        real = shutil.which(name)
        if real is None:
            sys.exit(f"{name} is not on PATH: install SLURM's clients (apt-get install slurm-client)")
        (shims / name).write_text(
            "#!/bin/bash\n"
            "t0=$(date +%s.%N)\n"
            f'out=$({real} "$@")\n'
            "rc=$?\n"
            'who=gpudays; [ -n "$SLURM_JOB_ID" ] && who=job\n'
            f'echo "{name} $who $t0 $(date +%s.%N) rc=$rc $* => ${{out:0:80}}" >> {log}\n'
            'printf "%s\\n" "$out"\n'
            "exit $rc\n"
        )
        (shims / name).chmod(0o755)
    return shims


def calls(log: Path, name: str | None, since: int = 0, who: str = "gpudays") -> list[list[str]]:
    """Logged calls of ``name`` (None: of every command) by ``who`` after line ``since``: [name, start, end, rc,
    args...], the caller dropped."""
    lines = log.read_text().splitlines()[since:] if log.exists() else []
    rows = [line.split() for line in lines]
    return [[r[0], *r[2:]] for r in rows if len(r) > 2 and r[1] == who and (name is None or r[0] == name)]


def line_count(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def by_command(rows: list[list[str]]) -> str:
    """``3 call(s): sacct 1, squeue 2``."""
    counts: dict[str, int] = {}
    for row in rows:
        name = f"{row[0]} --test-only" if "--test-only" in row else row[0]
        counts[name] = counts.get(name, 0) + 1
    return f"{len(rows)} call(s)" + (": " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) if rows else "")


@contextlib.contextmanager
def counting_reads() -> Iterator[dict[str, int]]:
    """Count the files opened (``open``, ``os.open``) and folders listed (``os.scandir``, ``os.listdir``) in this
    process meanwhile."""
    counts = {"open": 0, "scandir": 0}
    originals = (builtins.open, io.open, os.open, os.scandir, os.listdir)

    def counted(fn: Any, key: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return fn(*args, **kwargs)

        return wrapper

    builtins.open = io.open = counted(originals[0], "open")
    os.open = counted(originals[2], "open")
    os.scandir, os.listdir = counted(originals[3], "scandir"), counted(originals[4], "scandir")
    try:
        yield counts
    finally:
        builtins.open, io.open, os.open, os.scandir, os.listdir = originals


def submits(log: Path, since: int = 0) -> list[list[str]]:
    return [c for c in calls(log, "sbatch", since) if "--test-only" not in c]


def overrides(num_cells: int) -> list[str]:
    """``num_cells`` distinct cells (a cell's identity includes its sequence length) in two resource groups."""
    half = num_cells // 2
    return [
        "cluster=slurm",
        "model=pythia-tiny",
        "gpu=cpu",
        "probe.kind=sleep",
        "probe.sleep_s=0",
        "cluster.cpus_per_gpu=1",
        "cluster.time_limit_min=5",
        # Few tasks at once: the jobs are cancelled at the end, and the machine stays usable meanwhile.
        "cluster.array_parallelism=2",
        "num_gpus=1,2",
        f"model.seq_length=range(64,{64 + half})",
    ]


def run_timed(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    return time.perf_counter() - start, result


def job_ids(sweep_dir: Path) -> list[str]:
    from orchestrator.store.paths import SweepPaths
    from orchestrator.submission import status

    paths = SweepPaths(sweep_dir)
    return sorted({a.job_id.split("_")[0] for c in paths.cell_ids() for a in status.read_attempts(paths, c)})


def _launcher_installed() -> bool:
    """Whether hydra-submitit-launcher can be imported; its parent package may be missing altogether."""
    try:
        return importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None
    except ModuleNotFoundError:  # no hydra_plugins package at all: find_spec imports the parent first
        return False


def hydra_stock(work: Path, shim_env: dict[str, str], log: Path, num_cells: int) -> tuple[float, int, str] | None:
    """Submit the same cells through hydra-submitit-launcher; (seconds to the end of sbatch, sbatch calls, job id)."""
    if not _launcher_installed():
        print(
            f"  stock Hydra: skipped, hydra-submitit-launcher is not installed. Install it with:\n    {HYDRA_INSTALL}"
        )
        return None
    app = work / "stock_app.py"
    app.write_text(
        "import hydra\n"
        "from orchestrator.planning.compose_cache import register_configs\n\n"
        "register_configs()\n\n\n"
        f"@hydra.main(config_path={str(REPO / 'conf')!r}, config_name='config', version_base='1.3')\n"
        "def main(cfg):\n"
        "    return None\n\n\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    )
    cmd = [
        sys.executable,
        str(app),
        "-m",
        "hydra/launcher=submitit_slurm",
        f"hydra.sweep.dir={work / 'stock'}",
        "hydra.launcher.timeout_min=5",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.array_parallelism=2",
        *overrides(num_cells),
    ]
    since = line_count(log)
    start = time.perf_counter()
    start_epoch_s = time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=work,
        env=shim_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = start + 1200
        while not submits(log, since):
            if proc.poll() is not None:
                print(f"  stock Hydra: exited ({proc.returncode}) before submitting:\n{proc.stderr.read()[-2000:]}")
                return None
            if time.perf_counter() > deadline:
                print("  stock Hydra: no sbatch call within 20 minutes; stopped")
                return None
            time.sleep(0.2)
        (call,) = submits(log, since)[:1]
        submitted_s = float(call[2]) - start_epoch_s
    finally:
        # It would now poll until all jobs end; the figure is taken, so stop it.
        with contextlib.suppress(ProcessLookupError):  # it may have ended already
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    job = call[-1] if call[-1].isdigit() else ""
    return submitted_s, len(submits(log, since)), job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--keep", help="keep the sweep folders here (default: a temporary folder, deleted)")
    parser.add_argument("--no-hydra", action="store_true", help="skip the stock Hydra comparison")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from orchestrator.cli.display import console
    from orchestrator.cluster import LocalCluster
    from orchestrator.store.paths import SweepPaths
    from orchestrator.submission import status

    cluster = LocalCluster()
    started_here = not cluster.is_up()
    if started_here:
        cluster.up()
    os.environ.update(cluster.env())
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpudays-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "slurm-calls.log"
    shims = make_shims(work, log)
    env = {**os.environ, **cluster.env(), "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    gpudays = [sys.executable, "-m", "orchestrator.cli.main"]
    sweep_dir = work / "gpudays"
    to_cancel: list[str] = []
    try:
        print(f"{args.cells} cells, probe.kind=sleep, local cluster {cluster.state_dir}; shim log {log}")
        since = line_count(log)
        start_epoch_s = time.time()
        sweep_s, result = run_timed([*gpudays, "sweep", "--dir", str(sweep_dir), *overrides(args.cells)], env)
        if result.returncode != 0:
            print(result.stdout[-3000:], result.stderr[-3000:])
            return 1
        to_cancel += job_ids(sweep_dir)
        cells = len(SweepPaths(sweep_dir).cell_ids())
        print(f"gpudays sweep: {sweep_s:.2f} s wall for {cells} cells, {len(submits(log, since))} sbatch call(s), "
              f"{len(calls(log, 'sbatch', since)) - len(submits(log, since))} sbatch --test-only")  # fmt: skip
        print("  " + result.stdout.strip().splitlines()[-2])
        first = calls(log, None, since)[0]
        first_s = float(first[1]) - start_epoch_s
        last_s = float(submits(log, since)[-1][2]) - start_epoch_s
        print(f"  start to the first scheduler call ({first[0]}; start-up, planning): {first_s:.2f} s; from there to "
              f"the last sbatch returned (checks, cell files, pickles, submission): {last_s - first_s:.2f} s")  # fmt: skip
        print(f"  the sweep's own scheduler calls: {by_command(calls(log, None, since))}")

        def status_figures(when: str) -> None:
            since = line_count(log)
            wall_s, result = run_timed([*gpudays, "status", str(sweep_dir), "--summary"], env)
            own = by_command(calls(log, None, since))
            jobs = len(calls(log, None, since, who="job"))
            os.environ["PATH"] = env["PATH"]
            start = time.perf_counter()
            with counting_reads() as reads:
                states = status.cell_states(SweepPaths(sweep_dir))
            inproc_s = time.perf_counter() - start
            print(f"gpudays status ({when}): {wall_s:.2f} s wall ({inproc_s:.2f} s in-process); its scheduler calls: "
                  f"{own}; file reads: {reads['open']} opened, {reads['scandir']} folders listed "
                  f"({reads['open'] / max(1, len(states)):.1f} a cell); meanwhile {jobs} call(s) from the jobs: "
                  f"{console.summary_line(states, markup=False)}")  # fmt: skip
            if result.returncode != 0:
                print(result.stderr[-2000:])

        status_figures("just submitted")
        cluster.run_client(["scancel", *to_cancel], check=False)
        time.sleep(3)
        status_figures("after scancel")

        if not args.no_hydra:
            stock = hydra_stock(work, env, log, args.cells)
            if stock is not None:
                stock_s, stock_calls, job = stock
                if job:
                    to_cancel.append(job)
                print(f"stock Hydra + hydra-submitit-launcher: {stock_s:.2f} s until its sbatch returned, "
                      f"{stock_calls} sbatch call(s); ratio to gpudays sweep: {stock_s / sweep_s:.1f}x")  # fmt: skip
    finally:
        if to_cancel:
            cluster.run_client(["scancel", *to_cancel], check=False)
        if started_here:
            cluster.down()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
