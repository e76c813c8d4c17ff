"""The ``gpudays`` command: each command's flow, run with its exit code.

``gpudays sweep [-m] OVERRIDES...`` takes Hydra overrides (``model=pythia-70m,pythia-160m num_gpus=1,2``);
with none, it runs the demo sweep (``+experiment=demo``) on this machine and ends with ``cells.csv``. The arguments
are ``orchestrator.cli.parser``'s, the exit codes ``orchestrator.cli.errors``'; what a command does lives in
``orchestrator.cli.flow`` (submit, wait, finish, resume) and ``orchestrator.cli.folder`` (status, show), what it
shows in ``orchestrator.cli.display``. Each command loads its own code when it runs, so that ``--help`` is quick.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli.errors import CommandError, Exit, outcome_of, save_traceback, stdout_closed
from orchestrator.cli.parser import build_parser

if TYPE_CHECKING:
    from orchestrator.store.paths import SweepPaths

EXIT_BAD_INPUT = Exit.BAD_INPUT


def cmd_sweep(args: argparse.Namespace) -> int:
    """``sweep`` and ``plan``: compose and judge the cells, predict them, then submit (or only show) them."""
    from orchestrator.cli import flow as lifecycle
    from orchestrator.cli.display import console, prediction, preview
    from orchestrator.planning import plan as sweep_mod

    overrides = list(args.overrides)
    if not overrides and not args.planning:
        console.out("no overrides given: running the demo sweep (+experiment=demo) on this machine")
    search_dirs = [Path(d) for d in args.config_dir]
    _interval(args.interval)
    if args.margin is not None and not (0 <= args.margin < 1):
        raise CommandError(f"--margin {args.margin}: give the share of GPU memory kept free, from 0 up to below 1")
    if args.cfg:
        return _print_config(overrides, search_dirs, args.cfg, args.resolve)
    adaptive_flags = [
        f for f in ("target_pct", "budget_gpu_hours", "round_cells") if getattr(args, f, None) is not None
    ]
    if adaptive_flags and not getattr(args, "adaptive", False):
        named = ", ".join("--" + f.replace("_", "-") for f in adaptive_flags)
        raise CommandError(f"{named}: only with --adaptive (measure part of the grid, predict the rest)")
    plan = sweep_mod.plan(overrides, search_dirs, _sweep_dir(args.dir, overrides), costing=args.planning)
    if not args.planning and any(c.typed.cluster.backend == "slurm" for c in plan.cells):
        _one_line_folder(plan.sweep_dir)
    if not args.dry_run:  # what this machine cannot take, said before seconds of predicting (the scheduler later)
        lifecycle.check({c.cell_id: c.typed for c in plan.cells if c.typed.cluster.backend == "local"})
    prediction.predict(plan, margin=args.margin, run_anyway=args.run_unfit, calibrate_from=[plan.sweep_dir])
    goal = None
    if getattr(args, "adaptive", False):
        from orchestrator.cli import adaptive

        goal = adaptive.goal_from_flags(args.target_pct, args.budget_gpu_hours, args.round_cells, len(plan.cells))
    from orchestrator.cli.folder import say_measured_before

    say_measured_before(plan.sweep_dir, [c.cell_id for c in plan.cells])
    if args.dry_run:
        return preview.preview(plan, ask_scheduler=not args.planning)
    preview.show_plan(plan, predictions=False)
    if not plan.cells:
        raise CommandError("no cell of this sweep can run (reasons above); nothing was submitted")
    if goal is not None:
        return adaptive.start(
            plan,
            goal,
            wait=args.wait,
            report=not args.no_report,
            interval_s=args.interval,
            profile_from=args.profile_from,
        )
    from orchestrator.store.adaptive_state import is_adaptive
    from orchestrator.store.paths import SweepPaths

    if is_adaptive(SweepPaths(plan.sweep_dir)):
        raise CommandError(
            f"{plan.sweep_dir} is an adaptive sweep, which chooses the cells it measures: `gpudays resume` goes on "
            "with it; a sweep of every cell goes to a folder of its own (--dir)"
        )
    return lifecycle.start(
        plan, wait=args.wait, report=not args.no_report, interval_s=args.interval, profile_from=args.profile_from
    )


def _sweep_dir(given: str | None, overrides: list[str]) -> Path | None:
    """``--dir``, where given; both it and a ``hydra.sweep.dir=`` override naming another folder is bad input (which
    one was meant cannot be told). None: the composed ``hydra.sweep.dir``."""
    named = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").split("=", 1)[0].strip() == "hydra.sweep.dir"]
    if not given:
        return None
    for value in named:
        value = value.strip()
        if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if Path(value).expanduser().absolute() != Path(given).expanduser().absolute():
            raise CommandError(
                f"--dir {given} and hydra.sweep.dir={value} name two sweep folders; give one of them (or both the same)"
            )
    return Path(given)


def _print_config(overrides: list[str], search_dirs: list[Path], which: str, resolve: bool) -> int:
    from omegaconf import OmegaConf

    from orchestrator.planning import plan as sweep_mod

    cfg = sweep_mod.compose_one(overrides or sweep_mod.DEMO_OVERRIDES, search_dirs)
    node: Any = cfg
    if which == "job":
        node = OmegaConf.masked_copy(cfg, [str(k) for k in cfg.keys() if k != "hydra"])
    elif which == "hydra":
        node = cfg.hydra
    print(OmegaConf.to_yaml(node, resolve=resolve))
    return Exit.OK


def _parse_states(arg: str | None, flag: str) -> set[str] | None:
    """``--only timeout,failed`` -> {"timeout", "failed"}; CommandError naming what is accepted."""
    from orchestrator.submission import status

    if not arg:
        return None
    wanted = {s.strip() for s in arg.split(",") if s.strip()}
    unknown = sorted(wanted - set(status.STATES))
    if unknown:
        raise CommandError(f"{flag} {arg}: unknown state(s) {', '.join(unknown)}; use {', '.join(status.STATES)}")
    return wanted


def _interval(value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise CommandError(f"--interval {value}: give the seconds between checks, above 0")
    return value


def cmd_status(args: argparse.Namespace) -> int:
    """Counts per state and a table of cells; ``--watch`` refreshes it; ``--check`` exits 1 if any needs a rerun."""
    from orchestrator.cli import folder
    from orchestrator.cli.display import console

    only = _parse_states(args.state, "--state")
    interval = _interval(args.interval)
    if args.watch and args.format != "table":
        raise CommandError(f"--watch refreshes a table on the terminal; --format {args.format} prints one snapshot")
    paths = folder.sweep_folder(args.sweep_dir)
    if line := folder.describe(paths):
        console.out(line)
    if args.format == "table":
        from orchestrator.cli.autoprofile import status_lines

        for line in status_lines(paths):
            console.out(line)
    code = folder.show_status(paths, only, args.summary, args.watch, interval, args.check)
    if args.check and code == Exit.OK and folder.rounds_to_go(paths):
        return Exit.ACTIVE  # an adaptive sweep with rounds to go is not done
    return code


def cmd_show(args: argparse.Namespace) -> int:
    """One cell in detail: state, reason, attempts, log files and the tail of its traceback."""
    from orchestrator.cli import folder

    if not args.cell.strip():
        raise CommandError("give a cell id (or its first characters), as `gpudays status` lists them")
    if args.cell.strip() == "profile":  # no cell id (hexadecimal) starts so
        from orchestrator.cli import autoprofile

        return autoprofile.show(folder.sweep_folder(args.sweep_dir))
    return folder.show_cell(folder.sweep_folder(args.sweep_dir), args.cell)


def cmd_resume(args: argparse.Namespace) -> int:
    from orchestrator.cli import flow as lifecycle
    from orchestrator.cli import folder

    only = _parse_states(args.only, "--only")
    if args.time_limit is not None and args.time_limit < 1:
        raise CommandError(f"--time-limit {args.time_limit}: give the new limit in whole minutes, 1 or more")
    if args.time_factor is not None and not (math.isfinite(args.time_factor) and args.time_factor > 0):
        raise CommandError(f"--time-factor {args.time_factor}: give a factor above 0, e.g. 2 to double the limit")
    interval = _interval(args.interval)
    paths = folder.sweep_folder(args.sweep_dir)
    if _has_line_break(paths.root) and _slurm_cells(paths):
        _one_line_folder(paths.root)
    from orchestrator.cli import adaptive

    if adaptive.is_adaptive(paths):
        if only is not None:
            raise CommandError("--only: an adaptive sweep chooses which cells to measure; resume it without --only")
        return adaptive.advance(paths, args.wait, True, interval, args.time_limit, args.time_factor)
    return lifecycle.resume(paths, only, args.time_limit, args.time_factor, args.wait, interval)


def cmd_cancel(args: argparse.Namespace) -> int:
    """scancel the sweep's queued and running jobs (or the named cells'), each recorded as cancelled."""
    from orchestrator.cli import folder
    from orchestrator.cli.display import console
    from orchestrator.submission import cancel, status

    paths = folder.sweep_folder(args.sweep_dir)
    try:
        done = cancel.cancel(paths, [c.strip() for c in args.cells if c.strip()])
    except cancel.UnknownCells as e:
        raise CommandError(f"{paths.root}: {e}") from e
    except status.SchedulerUnavailable as e:
        raise CommandError(f"cannot cancel: the scheduler could not be asked or refused: {e}", Exit.SCHEDULER) from e
    for cid, why in done.left:
        console.note(f"{cid}: not cancelled: {why}")
    if not done.cancelled:
        console.out(f"nothing to cancel: no cell of {paths.root} is pending, held or running")
        return Exit.OK
    shown = [f"{s.cell_id} (job {s.job_id}, was {s.state})" for s in done.cancelled[:10]]
    more = f" and {len(done.cancelled) - 10} more" if len(done.cancelled) > 10 else ""
    console.out(
        f"cancelled {len(done.cancelled)} cell(s) of {paths.root}: {', '.join(shown)}{more}; "
        f"`{folder.shell_hint('gpudays', 'resume', paths.root)}` reruns them"
    )
    for cid, answer in done.answered.items():
        console.note(f"{cid}: its job had ended {answer} before the cancel reached it; the record stands")
    return Exit.OK


def _has_line_break(path: Path) -> bool:
    return "\n" in str(path) or "\r" in str(path)


def _one_line_folder(path: Path) -> None:
    """SLURM cells cannot be submitted from a sweep folder whose path holds a line break: sbatch reads the job
    script, which names the folder (the jobs' logs, their pickles), a line at a time. Cells on this machine can."""
    if _has_line_break(path):
        raise CommandError(
            f"sweep folder {str(path)!r}: SLURM cells cannot be submitted from a folder whose path holds a line "
            "break (sbatch reads the job script, which names it, a line at a time); choose a folder without one"
        )


def _slurm_cells(paths: SweepPaths) -> bool:
    """Whether any cell of the sweep goes to SLURM (read only where the folder's path holds a line break)."""
    from orchestrator.store.record import BadCellConfig, read_cell_config

    for cid in paths.cell_ids():
        try:
            cluster = read_cell_config(paths.cell_config(cid)).get("cluster")
        except BadCellConfig:
            continue
        if isinstance(cluster, dict) and cluster.get("backend") == "slurm":
            return True
    return False


def cmd_report(args: argparse.Namespace) -> int:
    """Tables, plots and report.md from the records of one or more sweeps."""
    from orchestrator.cli import flow as lifecycle
    from orchestrator.cli import folder

    folders = [folder.sweep_folder(d) for d in args.sweep_dirs]
    out = Path(args.out) if args.out else None
    return lifecycle.report(folders, out, args.tokens, plots=not args.no_plots)


def cmd_cluster(args: argparse.Namespace) -> int:
    from orchestrator import cluster

    return cluster.main(args.cluster_args)


def cmd_budget(args: argparse.Namespace) -> int:
    """``budget`` and ``shortest``: what a budget trains, and the shortest possible training."""
    from orchestrator.cli import budget

    return budget.run(args)


def cmd_profile(args: argparse.Namespace) -> int:
    """This machine's measured rates, kept in the sweep folder's ``profiles/``."""
    from orchestrator.cli import profiling

    return profiling.run(args)


HANDLERS = {
    "sweep": cmd_sweep,
    "status": cmd_status,
    "show": cmd_show,
    "resume": cmd_resume,
    "cancel": cmd_cancel,
    "report": cmd_report,
    "cluster": cmd_cluster,
    "budget": cmd_budget,
    "profile": cmd_profile,
}


def main(argv: list[str] | None = None) -> int:
    """Run one command; its outcome is the exit code (``Exit``), bad input an error line, never a traceback. A
    closed stdout (piped into ``head``) ends it quietly with SIGPIPE's status: it says nothing of the cells."""
    try:
        code = _run(argv)
        sys.stdout.flush()  # what is still buffered fails here, not in Python's last flush at exit
        return code
    except BrokenPipeError:
        if stdout_closed():
            return int(Exit.STDOUT_CLOSED)
        raise


def _run(argv: list[str] | None) -> int:
    try:
        args = build_parser(HANDLERS).parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error argparse has already explained
        return e.code if isinstance(e.code, int) else int(Exit.BAD_INPUT)
    from orchestrator.cli.display import console

    console.set_format(getattr(args, "format", "table"))
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError as e:
        if stdout_closed():
            return int(Exit.STDOUT_CLOSED)
        return _ended(e)  # a pipe of the command's own (a subprocess's stdin): said like any other error
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - every ending is an exit code and one line
        return _ended(e)
    finally:
        console.set_format("table")


def _ended(e: BaseException) -> int:
    from orchestrator.cli.display import console

    code, line = outcome_of(e)
    console.error(line)
    if code is Exit.INTERNAL:
        console.note(f"the traceback is in {save_traceback()}; please report it with the command line")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
