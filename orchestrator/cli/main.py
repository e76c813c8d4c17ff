"""The ``gpudays`` command: its arguments, and the exit code of each outcome.

``gpudays sweep [-m] OVERRIDES...`` takes Hydra overrides (``model=pythia-70m,pythia-160m num_gpus=1,2``);
with none, it runs the demo sweep (``+experiment=demo``) on this machine and ends with ``cells.csv``. What a
command does lives in ``orchestrator.cli.flow`` (submit, wait, finish, resume), the plan's predictions in
``orchestrator.cli.display.prediction``, and what it shows in ``orchestrator.cli.display.console``.
"""

from __future__ import annotations

import argparse
import errno
import math
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.cli import budget as budget_cli
from orchestrator.cli.display import console
from orchestrator.cli.display.tabular import FORMATS
from orchestrator.cli.flow import EXIT_MEANING, Exit, LifecycleError
from orchestrator.planning import plan as sweep_mod
from orchestrator.store.durable import FULL_OR_BROKEN, WriteFailed

EXIT_BAD_INPUT = Exit.BAD_INPUT

_FILE_IN_THE_WAY = frozenset({errno.EEXIST, errno.ENOTDIR})
IN_THE_WAY = (
    ": a file is in the way, where gpudays needs a folder (it or a folder above it is a file); give --dir "
    "(or hydra.sweep.dir) a sweep folder, or a path that does not exist yet"
)
EPILOG = "exit codes:\n" + "\n".join(f"  {code.value:<4} {meaning}" for code, meaning in EXIT_MEANING.items())
DESCRIPTION = (
    "How long, and for how many GPU-hours and dollars, would pre-training this model take on these GPUs? "
    "gpudays measures it: a grid of model x GPU x count x method, each cell a short training probe (DeepSpeed, "
    "PyTorch FSDP2, or a tensor x pipeline x data-parallel mesh: method.engine)."
)


def _version() -> str:
    try:
        return metadata.version("gpudays")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def cmd_sweep(args: argparse.Namespace) -> int:
    """``sweep`` and ``plan``: compose and judge the cells, predict them, then submit (or only show) them."""
    from orchestrator.cli import flow as lifecycle
    from orchestrator.cli.display import prediction, preview

    overrides = list(args.overrides)
    if not overrides and not args.planning:
        console.out("no overrides given: running the demo sweep (+experiment=demo) on this machine")
    search_dirs = [Path(d) for d in args.config_dir]
    _interval(args.interval)
    if args.margin is not None and not (0 <= args.margin < 1):
        raise LifecycleError(f"--margin {args.margin}: give the share of GPU memory kept free, from 0 up to below 1")
    if args.cfg:
        return _print_config(overrides, search_dirs, args.cfg, args.resolve)
    adaptive_flags = [
        f for f in ("target_pct", "budget_gpu_hours", "round_cells") if getattr(args, f, None) is not None
    ]
    if adaptive_flags and not getattr(args, "adaptive", False):
        named = ", ".join("--" + f.replace("_", "-") for f in adaptive_flags)
        raise LifecycleError(f"{named}: only with --adaptive (measure part of the grid, predict the rest)")
    plan = sweep_mod.plan(overrides, search_dirs, Path(args.dir) if args.dir else None, costing=args.planning)
    if not args.dry_run:  # what this machine cannot take, said before seconds of predicting (the scheduler later)
        lifecycle.check({c.cell_id: c.typed for c in plan.cells if c.typed.cluster.backend == "local"})
    prediction.predict(plan, margin=args.margin, run_anyway=args.run_unfit, calibrate_from=[plan.sweep_dir])
    goal = None
    if getattr(args, "adaptive", False):
        from orchestrator.cli import adaptive

        goal = adaptive.goal_from_flags(args.target_pct, args.budget_gpu_hours, args.round_cells, len(plan.cells))
    if args.dry_run:
        return preview.preview(plan, ask_scheduler=not args.planning)
    preview.show_plan(plan, predictions=False)
    if not plan.cells:
        raise LifecycleError("no cell of this sweep can run (reasons above); nothing was submitted")
    if goal is not None:
        return adaptive.start(plan, goal, wait=args.wait, report=not args.no_report, interval_s=args.interval)
    from orchestrator.store.adaptive_state import is_adaptive
    from orchestrator.store.paths import SweepPaths

    if is_adaptive(SweepPaths(plan.sweep_dir)):
        raise LifecycleError(
            f"{plan.sweep_dir} is an adaptive sweep, which chooses the cells it measures: `gpudays resume` goes on "
            "with it; a sweep of every cell goes to a folder of its own (--dir)"
        )
    return lifecycle.start(plan, wait=args.wait, report=not args.no_report, interval_s=args.interval)


def _print_config(overrides: list[str], search_dirs: list[Path], which: str, resolve: bool) -> int:
    from omegaconf import OmegaConf

    cfg = sweep_mod.compose_one(overrides or sweep_mod.DEMO_OVERRIDES, search_dirs)
    node: Any = cfg
    if which == "job":
        node = OmegaConf.masked_copy(cfg, [str(k) for k in cfg.keys() if k != "hydra"])
    elif which == "hydra":
        node = cfg.hydra
    print(OmegaConf.to_yaml(node, resolve=resolve))
    return Exit.OK


def _parse_states(arg: str | None, flag: str) -> set[str] | None:
    """``--only timeout,failed`` -> {"timeout", "failed"}; LifecycleError naming what is accepted."""
    from orchestrator.submission import status

    if not arg:
        return None
    wanted = {s.strip() for s in arg.split(",") if s.strip()}
    unknown = sorted(wanted - set(status.STATES))
    if unknown:
        raise LifecycleError(f"{flag} {arg}: unknown state(s) {', '.join(unknown)}; use {', '.join(status.STATES)}")
    return wanted


def _interval(value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise LifecycleError(f"--interval {value}: give the seconds between checks, above 0")
    return value


def cmd_status(args: argparse.Namespace) -> int:
    """Counts per state and a table of cells; ``--watch`` refreshes it; ``--check`` exits 1 if any needs a rerun."""
    from orchestrator.cli import flow as lifecycle

    only = _parse_states(args.state, "--state")
    interval = _interval(args.interval)
    if args.watch and args.format != "table":
        raise LifecycleError(f"--watch refreshes a table on the terminal; --format {args.format} prints one snapshot")
    paths = lifecycle.sweep_folder(args.sweep_dir)
    from orchestrator.cli import adaptive

    if line := adaptive.describe(paths):
        console.out(line)
    code = lifecycle.show_status(paths, only, args.summary, args.watch, interval, args.check)
    if args.check and code == Exit.OK and adaptive.rounds_to_go(paths):
        return Exit.ACTIVE  # an adaptive sweep with rounds to go is not done
    return code


def cmd_show(args: argparse.Namespace) -> int:
    """One cell in detail: state, reason, attempts, log files and the tail of its traceback."""
    from orchestrator.cli import flow as lifecycle

    if not args.cell.strip():
        raise LifecycleError("give a cell id (or its first characters), as `gpudays status` lists them")
    return lifecycle.show_cell(lifecycle.sweep_folder(args.sweep_dir), args.cell)


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrator.cli import flow as lifecycle

    only = _parse_states(args.only, "--only")
    if args.time_limit is not None and args.time_limit < 1:
        raise LifecycleError(f"--time-limit {args.time_limit}: give the new limit in whole minutes, 1 or more")
    if args.time_factor is not None and not (math.isfinite(args.time_factor) and args.time_factor > 0):
        raise LifecycleError(f"--time-factor {args.time_factor}: give a factor above 0, e.g. 2 to double the limit")
    interval = _interval(args.interval)
    paths = lifecycle.sweep_folder(args.sweep_dir)
    from orchestrator.cli import adaptive

    if adaptive.is_adaptive(paths):
        if only is not None:
            raise LifecycleError("--only: an adaptive sweep chooses which cells to measure; resume it without --only")
        return adaptive.advance(paths, args.wait, True, interval, args.time_limit, args.time_factor)
    return lifecycle.resume(paths, only, args.time_limit, args.time_factor, args.wait, interval)


def cmd_report(args: argparse.Namespace) -> int:
    from orchestrator.cli import flow as lifecycle

    folders = [lifecycle.sweep_folder(d) for d in args.sweep_dirs]
    out = Path(args.out) if args.out else None
    return lifecycle.report(folders, out, args.tokens, plots=not args.no_plots)


def cmd_cluster(args: argparse.Namespace) -> int:
    from orchestrator import cluster

    return cluster.main(args.cluster_args)


def _format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format", choices=FORMATS, default="table",
        help="table: fitted to the terminal, the one-line answers under it; csv or json: every column, on stdout "
        "alone (every other line on stderr)",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpudays",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpudays {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=help, description=help, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
        )

    sw = command("sweep", "expand Hydra overrides into cells and run or submit them")
    pl = command("plan", "every cell with its predicted memory, time and cost; nothing submitted, no scheduler asked")
    for sp in (sw, pl):
        sp.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=pythia-70m,pythia-160m num_gpus=1,2")
        sp.add_argument(
            "-m", "--multirun", action="store_true", help="accepted for Hydra habit: a sweep always expands"
        )
        sp.add_argument("-cd", "--config-dir", action="append", default=[], help="extra config folder to search")
        sp.add_argument("--dir", help="the sweep folder (default: hydra.sweep.dir)")
        sp.add_argument("--margin", type=float, help="share of GPU memory kept free when predicting fit (default 0.10)")
        sp.add_argument("--run-unfit", action="store_true", help="also run cells predicted not to fit")
    _format(pl)
    pl.set_defaults(
        func=cmd_sweep, planning=True, dry_run=True, cfg=None, resolve=False, wait=False, no_report=True, interval=5.0
    )
    sw.add_argument("--cfg", choices=["job", "hydra", "all"], help="print the composed config and exit")
    sw.add_argument("--resolve", action="store_true", help="with --cfg: resolve interpolations")
    sw.add_argument("--dry-run", action="store_true", help="plan, and check with the scheduler; submit nothing")
    sw.add_argument("--wait", action="store_true", help="on SLURM, wait for the cells to end and write the report")
    sw.add_argument("--no-report", action="store_true", help="do not write cells.csv at the end")
    sw.add_argument("--interval", type=float, default=5.0, help="seconds between checks with --wait")
    sw.add_argument(
        "--adaptive", action="store_true",
        help="measure part of the grid in rounds, the cells that teach the most per GPU-second, and predict the rest",
    )  # fmt: skip
    sw.add_argument("--target-pct", type=float, help="with --adaptive: stop once every unmeasured cell's 90%% "
                    "interval of step time is within +- this %% (default 10)")  # fmt: skip
    sw.add_argument("--budget-gpu-hours", type=float, help="with --adaptive: stop before spending more (default: none)")
    sw.add_argument("--round-cells", type=int, help="with --adaptive: cells per round (default 1%% of the grid, >= 2)")
    sw.set_defaults(func=cmd_sweep, planning=False, format="table")

    st = command("status", "state of every cell of a sweep (one sacct call); --check: exit 1 if any needs a rerun")
    st.add_argument("sweep_dir")
    st.add_argument("--watch", action="store_true", help="refresh until no cell is pending or running")
    st.add_argument("--interval", type=float, default=10.0, help="seconds between refreshes with --watch")
    st.add_argument("--state", help="show only cells in these states, e.g. failed,timeout")
    st.add_argument("--summary", action="store_true", help="only the counts per state, no table")
    st.add_argument("--check", action="store_true", help=f"exit {Exit.CELLS_FAILED.value} if any cell needs a rerun")
    _format(st)
    st.set_defaults(func=cmd_status)

    sh = command("show", "one cell: state, reason, attempts, log files, the tail of its traceback")
    sh.add_argument("sweep_dir")
    sh.add_argument("cell", help="the cell's id (or the start of it), as `gpudays status` lists it")
    sh.set_defaults(func=cmd_show)

    rs = command("resume", "resubmit only the cells that need it (failed, timed out, lost, ...)")
    rs.add_argument("sweep_dir")
    rs.add_argument("--only", help="comma-separated states to resubmit, e.g. timeout,failed")
    rs.add_argument("--time-limit", type=int, help="new time limit in minutes for cells that timed out")
    rs.add_argument("--time-factor", type=float, help="multiply the time limit of cells that timed out")
    rs.add_argument("--wait", action="store_true", help="wait for the resubmitted cells to end, then report")
    rs.add_argument("--interval", type=float, default=5.0, help="seconds between checks with --wait")
    rs.set_defaults(func=cmd_resume)

    rp = command("report", "tables (CSV), plots and report.md from the records of one or more sweeps")
    rp.add_argument("sweep_dirs", nargs="+")
    rp.add_argument("--out", help="output folder (default: the first sweep folder)")
    rp.add_argument("--tokens", help="token budget: the model's own (default), '20x' parameters, or e.g. 300B")
    rp.add_argument("--no-plots", action="store_true")
    _format(rp)
    rp.set_defaults(func=cmd_report)

    # Everything after `cluster`, --help included, goes to the cluster's own parser, which lists its verbs.
    cl = sub.add_parser(
        "cluster", help="a throwaway real SLURM cluster on this machine: up, down, status, env", add_help=False,
        prefix_chars="+",
    )  # fmt: skip
    cl.add_argument("cluster_args", nargs=argparse.REMAINDER)
    cl.set_defaults(func=cmd_cluster)
    budget_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its outcome is the exit code (``Exit``), bad input an error line, never a traceback."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error argparse has already explained
        return e.code if isinstance(e.code, int) else int(Exit.BAD_INPUT)
    console.set_format(getattr(args, "format", "table"))
    try:
        return _run(args)
    finally:
        console.set_format("table")


def _run(args: argparse.Namespace) -> int:
    """The command, its outcome as an exit code."""
    try:
        return int(args.func(args) or 0)
    except LifecycleError as e:
        console.error(str(e))
        return int(e.code)
    except sweep_mod.SweepError as e:
        console.error(str(e))
        return int(Exit.BAD_INPUT)
    except WriteFailed as e:
        console.error(str(e))
        return int(Exit.WRITE_FAILED if e.errno in FULL_OR_BROKEN else Exit.BAD_INPUT)
    except OSError as e:
        if e.errno in FULL_OR_BROKEN:
            console.error(f"cannot write {e.filename or 'a file'}: {e.strerror or e}")
            return int(Exit.WRITE_FAILED)
        # A folder that cannot be created or written (permissions, a file in the way, a name too long).
        where = f" {e.filename}" if e.filename else ""
        console.error(f"cannot use{where}: {e.strerror or e}{IN_THE_WAY if e.errno in _FILE_IN_THE_WAY else ''}")
        return int(Exit.BAD_INPUT)
    except KeyboardInterrupt:
        console.error("interrupted")
        return int(Exit.INTERRUPTED)
    except Exception as e:  # noqa: BLE001 - a bug: one line for the user, the traceback in a file for the report
        console.error(f"internal error, a bug in gpudays: {type(e).__name__}: {e}"[:2000])
        console.note(f"the traceback is in {_save_traceback()}; please report it with the command line")
        return int(Exit.INTERNAL)


def _save_traceback() -> str:
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix="gpudays-traceback-", suffix=".txt")
    with open(fd, "w") as f:
        f.write(" ".join(map(repr, sys.argv)) + "\n\n" + traceback.format_exc())
    return path


if __name__ == "__main__":
    sys.exit(main())
