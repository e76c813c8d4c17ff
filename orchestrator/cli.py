"""The ``gpudays`` command: sweep, plan, status, report, cluster.

``gpudays sweep [-m] OVERRIDES...`` takes Hydra overrides (``model=pythia-70m,pythia-160m num_gpus=1,2``);
with none, it runs the demo sweep (``+experiment=demo``) on this machine and ends with ``cells.csv``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from orchestrator import sweep as sweep_mod
from orchestrator.paths import SweepPaths, append_jsonl

EXIT_BAD_INPUT = 2


def _err(msg: str) -> None:
    print(f"gpudays: error: {msg}", file=sys.stderr)


@contextmanager
def sweep_lock(paths: SweepPaths) -> Iterator[None]:
    """Only one command submits into a sweep folder at a time, so no cell is submitted twice.

    An flock on ``.submit.lock`` in the folder: held by the process, so a crashed command leaves no stale lock; on
    NFS, Linux turns it into a lock the server holds (NFSv4, or v3 with lockd), which submit hosts share.
    """
    paths.root.mkdir(parents=True, exist_ok=True)
    with open(paths.lock, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def print_plan(plan: sweep_mod.Plan) -> None:
    print(f"sweep folder: {plan.sweep_dir}")
    print(f"{len(plan.cells)} cell(s) to measure, {len(plan.skipped)} refused before submission", end="")
    print(f", {plan.duplicates} duplicate(s) merged" if plan.duplicates else "")
    for cell in plan.skipped:
        reasons = "; ".join(str(r) for r in cell.refusals)
        print(f"  skipped {cell.label} ({' '.join(cell.overrides)}): {reasons}")


def cmd_sweep(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if not overrides:
        print("no overrides given: running the demo sweep (+experiment=demo) on this machine")
    search_dirs = [Path(d) for d in args.config_dir]
    if args.cfg:
        cfg = sweep_mod.compose_one(overrides or sweep_mod.DEMO_OVERRIDES, search_dirs)
        node: Any = cfg
        if args.cfg == "job":
            node = OmegaConf.masked_copy(cfg, [str(k) for k in cfg.keys() if k != "hydra"])
        elif args.cfg == "hydra":
            node = cfg.hydra
        print(OmegaConf.to_yaml(node, resolve=args.resolve))
        return 0
    try:
        plan = sweep_mod.plan(overrides, search_dirs, Path(args.dir) if args.dir else None)
    except sweep_mod.SweepError as e:
        _err(str(e))
        return EXIT_BAD_INPUT
    sweep_mod.predict(plan, margin=args.margin, run_anyway=args.run_unfit, calibrate_from=[plan.sweep_dir])
    print_plan(plan)
    if args.dry_run:
        print_predictions(plan)
    if not plan.cells:
        _err("no cell of this sweep can run (reasons above); nothing was submitted")
        return EXIT_BAD_INPUT
    if args.dry_run:
        from orchestrator import launch

        try:
            launch.check_slurm({c.cell_id: c.config for c in plan.cells if c.config["cluster"]["backend"] == "slurm"})
        except launch.SubmissionRefused as e:
            _err(str(e))
            return EXIT_BAD_INPUT
        print(f"dry run: {len(plan.cells)} cell(s) would be submitted; nothing was")
        return 0
    return submit_plan(plan, wait=args.wait, report=not args.no_report, interval_s=args.interval)


def print_predictions(plan: sweep_mod.Plan) -> None:
    """Every cell with its predicted memory, step time and training time (``--dry-run``, ``gpudays plan``)."""
    import pandas as pd

    from analysis.report import format_table

    rows = []
    for cell, runs in [(c, "yes") for c in plan.cells] + [(c, "no") for c in plan.skipped if c.prediction]:
        p = cell.prediction
        rows.append(
            {
                "cell_id": cell.cell_id,
                "cell": cell.label,
                "runs": runs,
                "fits": {True: "yes", False: "NO"}.get(bool(p["predicted_fits"]), "?")
                if "predicted_fits" in p
                else "?",
                "mb": p.get("predicted_micro_batch_size"),
                "mem_gib": p.get("predicted_peak_memory_gib"),
                "of_gib": cell.config["gpu"]["memory_gib"],
                "step_s": p.get("predicted_step_time_s"),
                "days": p.get("predicted_time_to_train_days"),
                "gpu_hours": p.get("predicted_gpu_hours"),
            }
        )
    if rows:
        print("predicted (before any measurement; calibrated on this folder's records when it has some):")
        frame = pd.DataFrame(rows)
        print(format_table(frame, columns=list(frame.columns)))


def submit_plan(plan: sweep_mod.Plan, wait: bool, report: bool, interval_s: float = 5.0) -> int:
    """Write the plan's cells into its folder and submit those that are new; with ``wait``, wait and report."""
    from orchestrator import launch, status

    paths = SweepPaths(plan.sweep_dir)
    slurm_configs = {c.cell_id: c.config for c in plan.cells if c.config["cluster"]["backend"] == "slurm"}
    try:
        # Before anything is written: a partition, account or request the cluster refuses stops the sweep here.
        launch.check_slurm(slurm_configs)
    except launch.SubmissionRefused as e:
        _err(str(e))
        return EXIT_BAD_INPUT
    with sweep_lock(paths):
        append_jsonl(
            paths.sweep_log,
            {
                "at": dt.datetime.now(dt.timezone.utc).isoformat(),
                "command": sys.argv,
                "overrides": plan.overrides,
                "cells": [c.cell_id for c in plan.cells],
                "skipped": [c.cell_id for c in plan.skipped],
            },
        )
        for cell in plan.skipped:
            append_jsonl(
                paths.skipped,
                {
                    "cell_id": cell.cell_id,
                    "label": cell.label,
                    "overrides": cell.overrides,
                    "reasons": [str(r) for r in cell.refusals],
                },
            )
        # Read inside the lock: a command that held it before this one has recorded its submissions by now.
        new: dict[str, dict[str, Any]] = {}
        for cell in plan.cells:
            already = paths.attempts(cell.cell_id).is_file()
            launch.write_cell(paths, cell.cell_id, cell.config)
            if not already:
                new[cell.cell_id] = cell.config
        known = len(plan.cells) - len(new)
        if known:
            print(f"{known} cell(s) already in this sweep: not submitted again (`gpudays resume` reruns failures)")
        by_backend: dict[str, dict[str, dict[str, Any]]] = {}
        for cid, cfg in new.items():
            by_backend.setdefault(cfg["cluster"]["backend"], {})[cid] = cfg
        if "slurm" in by_backend:
            try:
                subs = launch.submit_slurm(paths, by_backend["slurm"], launch.scheduler_max_array_size())
            except (subprocess.CalledProcessError, OSError) as e:
                _submission_failed(paths, e)
                return 1
            print(f"submitted {len(subs)} cell(s) to SLURM as {_arrays(subs)}")
        if "local" in by_backend:
            # Inside the lock: another command on this folder waits instead of running the same cells.
            run_local(paths, by_backend["local"])
    if "slurm" in by_backend and not wait:
        print(f"follow it with: gpudays status {paths.root}")
        return 0
    if wait and not status.is_done(_states_or_records(paths)):
        wait_for(paths, interval_s)
    return finish(paths, report)


def _submission_failed(paths: SweepPaths, e: Exception) -> None:
    said = getattr(e, "stderr", None) or getattr(e, "output", None) or str(e)
    if isinstance(said, bytes):
        said = said.decode(errors="replace")
    _err(
        f"sbatch failed: {str(said).strip()[:500]}\nCells submitted before the failure are recorded; "
        f"`gpudays resume {paths.root}` submits the others (their state is `new`)."
    )


def _arrays(subs: list[Any]) -> str:
    arrays = sorted({s.job_id.split("_")[0] for s in subs}, key=lambda j: (len(j), j))
    return f"{len(arrays)} array job(s): {', '.join(arrays)}"


def run_local(paths: SweepPaths, configs: dict[str, dict[str, Any]]) -> None:
    """Run cells on this machine one after another, a line for each as it ends."""
    from orchestrator import launch, status

    print(f"running {len(configs)} cell(s) on this machine, one after another")
    start = time.monotonic()

    def done(cid: str) -> None:
        state = {s.cell_id: s for s in status.cell_states(paths, query_scheduler=False)}[cid]
        step = state.record.metrics.get("step_time_s") if state.record else None
        step_txt = f", {step:.4g} s/step" if isinstance(step, (int, float)) else ""
        print(f"  {cid} {state.state}{step_txt} ({time.monotonic() - start:.0f} s){_reason(state)}")

    launch.submit_local(paths, configs, on_done=done)


def _reason(state: Any) -> str:
    return f": {state.reason}" if state.reason and state.state != "ok" else ""


def _console() -> Any:
    from rich.console import Console

    # Piped or captured output gets a wide fixed width, so that ids and states never wrap.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _states_or_records(paths: SweepPaths) -> list[Any]:
    """Every cell's state; from the records alone (with a note) when the scheduler cannot be asked."""
    from orchestrator import status

    try:
        return status.cell_states(paths)
    except status.SchedulerUnavailable as e:
        print(f"  note: the scheduler could not be asked ({e}); states come from the records alone")
        return status.cell_states(paths, query_scheduler=False)


def wait_for(paths: SweepPaths, interval_s: float = 5.0) -> None:
    """Block until no cell is pending or running, with a progress bar (a line per change when piped)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from orchestrator import status

    console = _console()
    states = _states_or_records(paths)
    if status.is_done(states):
        return
    if not console.is_terminal:
        last = ""
        while not status.is_done(states):
            line = status.summary_line(states, markup=False)
            if line != last:
                print(f"  [{time.strftime('%H:%M:%S')}] {line}", flush=True)
                last = line
            time.sleep(interval_s)
            states = _states_or_records(paths)
        return
    with Progress(
        TextColumn("waiting"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
    ) as progress:
        task = progress.add_task(status.summary_line(states), total=len(states))
        while True:
            ended = sum(1 for s in states if s.state not in status.ACTIVE)
            progress.update(task, completed=ended, total=len(states), description=status.summary_line(states))
            if status.is_done(states):
                return
            time.sleep(interval_s)
            states = _states_or_records(paths)


def finish(paths: SweepPaths, report: bool) -> int:
    """Summarise a finished sweep; exit non-zero if any cell failed (its record or ``status`` says why)."""
    from orchestrator import status
    from orchestrator.states import UNFIXABLE

    states = _states_or_records(paths)
    if report:
        from analysis.report import format_table, write_report

        rep = write_report([paths.root], states={s.cell_id: s.state for s in states})
        print(format_table(rep.cells))
        for problem in rep.problems:
            print(f"  problem: {problem}")
        print(f"wrote {paths.output('cells.csv')}")
    print(status.summary_line(states, markup=False))
    bad = [s for s in states if status.needs_rerun(s.state)]
    if bad:
        print(f"{len(bad)} cell(s) need a rerun: see `gpudays status {paths.root}`, then `gpudays resume {paths.root}`")
    unfixable = [s for s in states if s.state in UNFIXABLE]
    if unfixable:
        print(f"{len(unfixable)} cell(s) cannot run as configured; a rerun cannot fix them: see `gpudays status {paths.root}`")
    return 1 if bad or unfixable else 0


def _sweep_paths(arg: str) -> SweepPaths | None:
    paths = SweepPaths(Path(arg))
    if not paths.cells_dir.is_dir():
        _err(f"{paths.root} is not a sweep folder (no cells/ in it)")
        return None
    return paths


def _parse_states(arg: str | None, flag: str) -> set[str] | None:
    """``--only timeout,failed`` -> {"timeout", "failed"}; raises ValueError naming what is accepted."""
    from orchestrator import status

    if not arg:
        return None
    wanted = {s.strip() for s in arg.split(",") if s.strip()}
    unknown = sorted(wanted - set(status.STATES))
    if unknown:
        raise ValueError(f"{flag} {arg}: unknown state(s) {', '.join(unknown)}; use {', '.join(status.STATES)}")
    return wanted


def cmd_status(args: argparse.Namespace) -> int:
    """Counts per state and a table of cells (``--watch``: refreshed until no cell is pending or running)."""
    from rich.console import Group
    from rich.live import Live

    from orchestrator import status

    paths = _sweep_paths(args.sweep_dir)
    if paths is None:
        return EXIT_BAD_INPUT
    try:
        only = _parse_states(args.state, "--state")
    except ValueError as e:
        _err(str(e))
        return EXIT_BAD_INPUT
    console = _console()

    def view(states: list[Any], live: bool = False) -> Any:
        summary = status.summary_line(states)
        if args.summary:
            return summary
        # A live view fits the terminal: problems and running cells first, the rest cut.
        rows = max(5, console.height - 8) if live else None
        return Group(summary, status.table(states, only, max_rows=rows))

    states = _states_or_records(paths)
    if not args.watch or status.is_done(states) or not console.is_terminal:
        console.print(view(states))
        while args.watch and not status.is_done(states):
            # Not a terminal: a summary line each time something changed.
            last = status.summary_line(states, markup=False)
            time.sleep(args.interval)
            states = _states_or_records(paths)
            if status.summary_line(states, markup=False) != last:
                console.print(f"[{time.strftime('%H:%M:%S')}] " + status.summary_line(states))
        return 0
    with Live(view(states, live=True), console=console, auto_refresh=False, screen=False) as live:
        while not status.is_done(states):
            time.sleep(args.interval)
            states = _states_or_records(paths)
            live.update(view(states, live=True), refresh=True)
    console.print(view(states))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """Resubmit the cells that need it: not ok, not does_not_fit, not pending or running."""
    from orchestrator import launch, status
    from orchestrator.states import parse_state, rerun_selectable

    paths = _sweep_paths(args.sweep_dir)
    if paths is None:
        return EXIT_BAD_INPUT
    try:
        only = _parse_states(args.only, "--only")
    except ValueError as e:
        _err(str(e))
        return EXIT_BAD_INPUT
    if args.time_limit is not None and args.time_limit < 1:
        _err(f"--time-limit {args.time_limit}: give the new limit in whole minutes, 1 or more")
        return EXIT_BAD_INPUT
    if args.time_factor is not None and args.time_factor <= 0:
        _err(f"--time-factor {args.time_factor}: give a factor above 0, e.g. 2 to double the limit")
        return EXIT_BAD_INPUT
    with sweep_lock(paths):
        # States are read inside the lock: cells a concurrent resume has just resubmitted are pending by now.
        try:
            states = status.cell_states(paths)
        except status.SchedulerUnavailable as e:
            _err(f"cannot tell which cells need a rerun: {e}")
            return 1
        todo = [s for s in states if rerun_selectable(s.state, None if only is None else map(parse_state, only))]
        todo, held_said = status.settle_held(todo)
        for line in held_said:
            print(f"  {line}")
        if not todo:
            print(f"nothing to resume: {status.summary_line(states, markup=False)}")
            return 0
        configs: dict[str, dict[str, Any]] = {}
        for s in todo:
            configs[s.cell_id] = _rerun_config(paths, s, args.time_limit, args.time_factor)
        slurm = {c: v for c, v in configs.items() if v["cluster"]["backend"] == "slurm"}
        local = {c: v for c, v in configs.items() if v["cluster"]["backend"] == "local"}
        try:
            launch.check_slurm(slurm)
        except launch.SubmissionRefused as e:
            _err(str(e))
            return EXIT_BAD_INPUT
        for s in todo:
            _archive_record(paths, s)
        print(f"resubmitting {len(configs)} cell(s): " + ", ".join(f"{s.cell_id} ({s.state})" for s in todo))
        if slurm:
            try:
                subs = launch.submit_slurm(paths, slurm, launch.scheduler_max_array_size())
            except (subprocess.CalledProcessError, OSError) as e:
                _submission_failed(paths, e)
                return 1
            print(f"submitted {len(subs)} cell(s) to SLURM as {_arrays(subs)}")
        if local:
            run_local(paths, local)
    if slurm and not args.wait:
        print(f"follow it with: gpudays status {paths.root}")
        return 0
    if args.wait:
        wait_for(paths, args.interval)
    return finish(paths, report=True)


def _rerun_config(paths: SweepPaths, s: Any, time_limit: int | None, time_factor: float | None) -> dict[str, Any]:
    """The cell's config for its next attempt: a cell that timed out gets the new limit, if one was given."""
    from orchestrator import launch
    from orchestrator.record import read_cell_config

    cfg = read_cell_config(paths.cell_config(s.cell_id))
    if s.state == "timeout" and (time_limit or time_factor):
        old = int(cfg["cluster"]["time_limit_min"])
        new = time_limit or int(round(old * (time_factor or 1)))
        cfg["cluster"]["time_limit_min"] = max(new, 1)
        print(f"  {s.cell_id}: time limit {old} -> {cfg['cluster']['time_limit_min']} min")
        launch.write_cell(paths, s.cell_id, cfg)
    return cfg


def _archive_record(paths: SweepPaths, s: Any) -> None:
    """Keep the record of the attempt being replaced next to the new one, under the attempt's name."""
    record = paths.record(s.cell_id)
    if not record.exists():
        return
    record.rename(paths.archived_record(s.cell_id, s.attempt, corrupt=s.state == "corrupt"))


def cmd_report(args: argparse.Namespace) -> int:
    from analysis.report import format_table, write_report
    from orchestrator import status

    dirs = [Path(d) for d in args.sweep_dirs]
    states: dict[str, str] = {}
    for d in dirs:
        paths = SweepPaths(d)
        if paths.cells_dir.is_dir():
            try:
                states.update({s.cell_id: s.state for s in status.cell_states(paths)})
            except (RuntimeError, FileNotFoundError, OSError) as e:
                print(f"  note: scheduler not asked ({e}); states come from records only")
                states.update({s.cell_id: s.state for s in status.cell_states(paths, query_scheduler=False)})
    rep = write_report(
        dirs, Path(args.out) if args.out else None, tokens=args.tokens, plots=not args.no_plots, states=states
    )
    print(format_table(rep.cells))
    for problem in rep.problems:
        print(f"  problem: {problem}")
    for f in rep.files:
        print(f"wrote {f}")
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    from orchestrator import cluster

    return cluster.main(args.cluster_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpudays", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    sw = sub.add_parser("sweep", help="expand Hydra overrides into cells and run or submit them")
    pl = sub.add_parser("plan", help="the same as sweep --dry-run: every cell with its prediction, nothing submitted")
    for sp in (sw, pl):
        sp.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=pythia-70m,pythia-160m num_gpus=1,2")
        sp.add_argument(
            "-m", "--multirun", action="store_true", help="accepted for Hydra habit: a sweep always expands"
        )
        sp.add_argument("-cd", "--config-dir", action="append", default=[], help="extra config folder to search")
        sp.add_argument("--dir", help="the sweep folder (default: hydra.sweep.dir)")
        sp.add_argument("--margin", type=float, help="share of GPU memory kept free when predicting fit (default 0.10)")
        sp.add_argument("--run-unfit", action="store_true", help="also run cells predicted not to fit")
    pl.set_defaults(func=cmd_sweep, dry_run=True, cfg=None, resolve=False, wait=False, no_report=True, interval=5.0)
    sw.add_argument("--cfg", choices=["job", "hydra", "all"], help="print the composed config and exit")
    sw.add_argument("--resolve", action="store_true", help="with --cfg: resolve interpolations")
    sw.add_argument("--dry-run", action="store_true", help="plan and check the cells, submit nothing")
    sw.add_argument("--wait", action="store_true", help="on SLURM, wait for the cells to end and write the report")
    sw.add_argument("--no-report", action="store_true", help="do not write cells.csv at the end")
    sw.add_argument("--interval", type=float, default=5.0, help="seconds between checks with --wait")
    sw.set_defaults(func=cmd_sweep)

    st = sub.add_parser("status", help="state of every cell of a sweep (one sacct call)")
    st.add_argument("sweep_dir")
    st.add_argument("--watch", action="store_true", help="refresh until no cell is pending or running")
    st.add_argument("--interval", type=float, default=10.0, help="seconds between refreshes with --watch")
    st.add_argument("--state", help="show only cells in these states, e.g. failed,timeout")
    st.add_argument("--summary", action="store_true", help="only the counts per state, no table")
    st.set_defaults(func=cmd_status)

    rs = sub.add_parser("resume", help="resubmit only the cells that need it (failed, timed out, lost, ...)")
    rs.add_argument("sweep_dir")
    rs.add_argument("--only", help="comma-separated states to resubmit, e.g. timeout,failed")
    rs.add_argument("--time-limit", type=int, help="new time limit in minutes for cells that timed out")
    rs.add_argument("--time-factor", type=float, help="multiply the time limit of cells that timed out")
    rs.add_argument("--wait", action="store_true", help="wait for the resubmitted cells to end, then report")
    rs.add_argument("--interval", type=float, default=5.0, help="seconds between checks with --wait")
    rs.set_defaults(func=cmd_resume)

    rp = sub.add_parser("report", help="tables (CSV), plots and report.md from the records of one or more sweeps")
    rp.add_argument("sweep_dirs", nargs="+")
    rp.add_argument("--out", help="output folder (default: the first sweep folder)")
    rp.add_argument("--tokens", help="token budget: the model's own (default), '20x' parameters, or e.g. 300B")
    rp.add_argument("--no-plots", action="store_true")
    rp.set_defaults(func=cmd_report)

    cl = sub.add_parser("cluster", help="a throwaway real SLURM cluster on this machine: up, down, status, env")
    cl.add_argument("cluster_args", nargs=argparse.REMAINDER)
    cl.set_defaults(func=cmd_cluster)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
