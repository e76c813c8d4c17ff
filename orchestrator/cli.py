"""The ``gpudays`` command: sweep, plan, status, report, cluster.

``gpudays sweep [-m] OVERRIDES...`` takes Hydra overrides (``model=pythia-70m,pythia-160m num_gpus=1,2``);
with none, it runs the demo sweep (``+experiment=demo``) on this machine and ends with ``cells.csv``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
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
    """Only one command submits into a sweep folder at a time, so no cell is submitted twice."""
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
    print_plan(plan)
    if not plan.cells:
        _err("no cell of this sweep can run (reasons above); nothing was submitted")
        return EXIT_BAD_INPUT
    if args.dry_run:
        for cell in plan.cells:
            print(f"  would run {cell.cell_id} {cell.label}")
        return 0
    return submit_plan(plan, wait=args.wait, report=not args.no_report)


def submit_plan(plan: sweep_mod.Plan, wait: bool, report: bool) -> int:
    from orchestrator import launch, status

    paths = SweepPaths(plan.sweep_dir)
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
        new: dict[str, dict[str, Any]] = {}
        for cell in plan.cells:
            already = paths.attempts(cell.cell_id).is_file()
            launch.write_cell(paths, cell.cell_id, cell.config)
            if not already:
                new[cell.cell_id] = cell.config
        known = len(plan.cells) - len(new)
        if known:
            print(
                f"{known} cell(s) already in this sweep: not submitted again (use `gpudays resume` to rerun failures)"
            )
        by_backend: dict[str, dict[str, dict[str, Any]]] = {}
        for cid, cfg in new.items():
            by_backend.setdefault(cfg["cluster"]["backend"], {})[cid] = cfg
        if "slurm" in by_backend:
            subs = launch.submit_slurm(paths, by_backend["slurm"])
            arrays = sorted({s.job_id.split("_")[0] for s in subs})
            print(f"submitted {len(subs)} cell(s) to SLURM as {len(arrays)} array job(s): {', '.join(arrays)}")

    if "local" in by_backend:
        cells_local = by_backend["local"]
        print(f"running {len(cells_local)} cell(s) on this machine, one after another")
        start = time.monotonic()

        def done(cid: str) -> None:
            state = {s.cell_id: s for s in status.cell_states(paths, query_scheduler=False)}[cid]
            step = (state.record or {}).get("metrics", {}).get("step_time_s")
            step_txt = f", {step:.4g} s/step" if isinstance(step, (int, float)) else ""
            print(f"  {cid} {state.state}{step_txt} ({time.monotonic() - start:.0f} s){_reason(state)}")

        launch.submit_local(paths, cells_local, on_done=done)
    elif wait:
        wait_for(paths)
    if "slurm" in by_backend and not wait:
        print(f"follow it with: gpudays status {paths.root}")
        return 0
    return finish(paths, report)


def _reason(state: Any) -> str:
    return f": {state.reason}" if state.reason and state.state != "ok" else ""


def wait_for(paths: SweepPaths, poll_s: float = 5.0) -> None:
    from orchestrator import status

    last = ""
    while True:
        states = status.cell_states(paths)
        line = ", ".join(f"{k} {v}" for k, v in status.counts(states).items())
        if line != last:
            print(f"  [{time.strftime('%H:%M:%S')}] {line}")
            last = line
        if status.is_done(states):
            return
        time.sleep(poll_s)


def finish(paths: SweepPaths, report: bool) -> int:
    """Summarise a finished sweep; exit non-zero if any cell failed (its record says why)."""
    from orchestrator import status

    states = status.cell_states(paths)
    if report:
        from analysis.report import format_table, write_report

        rep = write_report([paths.root], states={s.cell_id: s.state for s in states})
        print(format_table(rep.cells))
        for problem in rep.problems:
            print(f"  problem: {problem}")
        print(f"wrote {paths.output('cells.csv')}")
    bad = [s for s in states if s.state not in status.FINAL_GOOD and s.state not in status.ACTIVE]
    return 1 if bad else 0


def cmd_status(args: argparse.Namespace) -> int:
    from orchestrator import status

    paths = SweepPaths(Path(args.sweep_dir))
    if not paths.cells_dir.is_dir():
        _err(f"{paths.root} is not a sweep folder (no cells/ in it)")
        return EXIT_BAD_INPUT
    while True:
        states = status.cell_states(paths)
        print(", ".join(f"{k}: {v}" for k, v in status.counts(states).items()) or "no cells")
        for s in states:
            print(f"  {s.cell_id}  {s.state:<12} attempt {s.attempt}  job {s.job_id or '-'}{_reason(s)}")
        if not args.watch or status.is_done(states):
            return 0
        time.sleep(args.interval)


def cmd_resume(args: argparse.Namespace) -> int:
    """Resubmit the cells that need it: not ok, not does_not_fit, not pending or running."""
    from omegaconf import OmegaConf as OC

    from orchestrator import launch, status

    paths = SweepPaths(Path(args.sweep_dir))
    if not paths.cells_dir.is_dir():
        _err(f"{paths.root} is not a sweep folder (no cells/ in it)")
        return EXIT_BAD_INPUT
    only = set(args.only.split(",")) if args.only else None
    if only and not only <= set(status.STATES):
        _err(
            f"--only {args.only}: unknown state(s) {sorted(only - set(status.STATES))}; use {', '.join(status.STATES)}"
        )
        return EXIT_BAD_INPUT
    with sweep_lock(paths):
        # Read states inside the lock: a resume that ran while this one waited has made its cells pending.
        states = status.cell_states(paths)
        todo = [s for s in states if status.needs_rerun(s.state) and (only is None or s.state in only)]
        if not todo:
            print(
                "nothing to resume: " + (", ".join(f"{k} {v}" for k, v in status.counts(states).items()) or "no cells")
            )
            return 0
        configs: dict[str, dict[str, Any]] = {}
        for s in todo:
            cfg = OC.to_container(OC.load(paths.cell_config(s.cell_id)), resolve=True)
            assert isinstance(cfg, dict)
            if s.state == "timeout" and (args.time_limit or args.time_factor):
                old = int(cfg["cluster"]["time_limit_min"])
                new = args.time_limit or int(round(old * args.time_factor))
                cfg["cluster"]["time_limit_min"] = max(new, 1)
                launch.write_cell(paths, s.cell_id, cfg)
            if s.state == "corrupt":
                record = paths.record(s.cell_id)
                record.rename(record.with_name(f"record.corrupt-attempt{s.attempt}.json"))
            configs[s.cell_id] = cfg
        print(f"resubmitting {len(configs)} cell(s): " + ", ".join(f"{s.cell_id} ({s.state})" for s in todo))
        slurm = {c: v for c, v in configs.items() if v["cluster"]["backend"] == "slurm"}
        local = {c: v for c, v in configs.items() if v["cluster"]["backend"] == "local"}
        if slurm:
            subs = launch.submit_slurm(paths, slurm)
            print(f"submitted {len(subs)} cell(s) as {len({s.job_id.split('_')[0] for s in subs})} array job(s)")
    if local:
        launch.submit_local(paths, local)
    elif args.wait:
        wait_for(paths)
    if slurm and not args.wait:
        return 0
    return finish(paths, report=True)


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
    sw.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=pythia-70m,pythia-160m num_gpus=1,2")
    sw.add_argument("-m", "--multirun", action="store_true", help="accepted for Hydra habit: a sweep always expands")
    sw.add_argument("--cfg", choices=["job", "hydra", "all"], help="print the composed config and exit")
    sw.add_argument("--resolve", action="store_true", help="with --cfg: resolve interpolations")
    sw.add_argument("-cd", "--config-dir", action="append", default=[], help="extra config folder to search")
    sw.add_argument("--dir", help="the sweep folder (default: hydra.sweep.dir)")
    sw.add_argument("--dry-run", action="store_true", help="plan and check the cells, submit nothing")
    sw.add_argument("--wait", action="store_true", help="on SLURM, wait for the cells to end and write the report")
    sw.add_argument("--no-report", action="store_true", help="do not write cells.csv at the end")
    sw.set_defaults(func=cmd_sweep)

    st = sub.add_parser("status", help="state of every cell of a sweep (one sacct call)")
    st.add_argument("sweep_dir")
    st.add_argument("--watch", action="store_true", help="refresh until no cell is pending or running")
    st.add_argument("--interval", type=float, default=10.0, help="seconds between refreshes with --watch")
    st.set_defaults(func=cmd_status)

    rs = sub.add_parser("resume", help="resubmit only the cells that need it (failed, timed out, lost, ...)")
    rs.add_argument("sweep_dir")
    rs.add_argument("--only", help="comma-separated states to resubmit, e.g. timeout,failed")
    rs.add_argument("--time-limit", type=int, help="new time limit in minutes for cells that timed out")
    rs.add_argument("--time-factor", type=float, help="multiply the time limit of cells that timed out")
    rs.add_argument("--wait", action="store_true", help="wait for the resubmitted cells to end, then report")
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
