"""The arguments of every ``gpudays`` command, and nothing else: parsing loads no command's code, so that
``gpudays --help`` answers at once. ``orchestrator.cli.main`` hands each command its handler."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from importlib import metadata

from orchestrator.cli.errors import EXIT_MEANING, Exit

Handler = Callable[[argparse.Namespace], int]
"""A command: its parsed arguments in, its exit code out."""

FORMATS = ("table", "csv", "json")
"""``--format``: a table fitted to the terminal, or every column as CSV or JSON on stdout alone."""

HELP_DEFAULTS = {"efficiency": 0.54, "max_days": 90.0, "overrun_pct": 25.0, "max_gpus": 1 << 20}
"""The defaults the help text quotes; the values used come from analysis (a test keeps the two equal)."""

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


def _format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format", choices=FORMATS, default="table",
        help="table: fitted to the terminal, the one-line answers under it; csv or json: every column, on stdout "
        "alone (every other line on stderr)",
    )  # fmt: skip


def build_parser(handlers: Mapping[str, Handler]) -> argparse.ArgumentParser:
    """Every command's arguments; ``handlers`` runs each command (by name) once its arguments are parsed."""
    parser = argparse.ArgumentParser(
        prog="gpudays",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpudays {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return _command(sub, name, help)

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
        func=handlers["sweep"],
        planning=True,
        dry_run=True,
        cfg=None,
        resolve=False,
        wait=False,
        no_report=True,
        interval=5.0,
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
    sw.add_argument("--profile-from", action="append", metavar="SWEEP_DIR",
                    help="reuse this sweep's profile of the same hardware instead of measuring one (copied in)")  # fmt: skip
    sw.set_defaults(func=handlers["sweep"], planning=False, format="table")

    st = command("status", "state of every cell of a sweep (one sacct call); --check: exit 1 if any needs a rerun")
    st.add_argument("sweep_dir")
    st.add_argument("--watch", action="store_true", help="refresh until no cell is pending or running")
    st.add_argument("--interval", type=float, default=10.0, help="seconds between refreshes with --watch")
    st.add_argument("--state", help="show only cells in these states, e.g. failed,timeout")
    st.add_argument("--summary", action="store_true", help="only the counts per state, no table")
    st.add_argument("--check", action="store_true", help=f"exit {Exit.CELLS_FAILED.value} if any cell needs a rerun")
    _format(st)
    st.set_defaults(func=handlers["status"])

    sh = command("show", "one cell: state, reason, attempts, log files, the tail of its traceback")
    sh.add_argument("sweep_dir")
    sh.add_argument("cell", help="the cell's id (or the start of it), as `gpudays status` lists it; `profile`: the "
                    "sweep's profile runs and their jobs' logs")  # fmt: skip
    sh.set_defaults(func=handlers["show"])

    rs = command("resume", "resubmit only the cells that need it (failed, timed out, lost, ...)")
    rs.add_argument("sweep_dir")
    rs.add_argument("--only", help="comma-separated states to resubmit, e.g. timeout,failed")
    rs.add_argument("--time-limit", type=int, help="new time limit in minutes for cells that timed out")
    rs.add_argument("--time-factor", type=float, help="multiply the time limit of cells that timed out")
    rs.add_argument("--wait", action="store_true", help="wait for the resubmitted cells to end, then report")
    rs.add_argument("--interval", type=float, default=5.0, help="seconds between checks with --wait")
    rs.set_defaults(func=handlers["resume"])

    cn = command(
        "cancel", "scancel a sweep's queued and running jobs (or the named cells'), recorded as cancelled for resume"
    )
    cn.add_argument("sweep_dir")
    cn.add_argument("cells", nargs="*", metavar="CELL", help="cells to cancel (ids or their starts); default: every "
                    "cell pending, held or running")  # fmt: skip
    cn.set_defaults(func=handlers["cancel"])

    rp = command("report", "tables (CSV), plots and report.md from the records of one or more sweeps")
    rp.add_argument("sweep_dirs", nargs="+")
    rp.add_argument("--out", help="output folder (default: the first sweep folder)")
    rp.add_argument("--tokens", help="token budget: the model's own (default), '20x' parameters, or e.g. 300B")
    rp.add_argument("--no-plots", action="store_true")
    _format(rp)
    rp.set_defaults(func=handlers["report"])

    # Everything after `cluster`, --help included, goes to the cluster's own parser, which lists its verbs.
    cl = sub.add_parser(
        "cluster", help="a throwaway real SLURM cluster on this machine: up, down, status, env", add_help=False,
        prefix_chars="+",
    )  # fmt: skip
    cl.add_argument("cluster_args", nargs=argparse.REMAINDER)
    cl.set_defaults(func=handlers["cluster"])
    _budget_parsers(sub, handlers["budget"])
    _profile_parser(sub, handlers["profile"])
    return parser


def _command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str
) -> argparse.ArgumentParser:
    """A command: ``help`` is its line in ``gpudays --help`` and its description, the exit codes its epilog."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=help, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return parser


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", help="GPU types on offer, comma-separated (conf/gpu; default: every GPU with a peak)")
    p.add_argument("--model", help="models from conf/model, comma-separated")
    p.add_argument("--size", help="models described by size, comma-separated (70B, 350M, 1.3e9)")
    p.add_argument("--cluster", help="conf/cluster file for GPUs per node and the inter-node network "
                   "(default: 8 GPUs a node, 8 x 200 Gb/s InfiniBand)")  # fmt: skip
    p.add_argument(
        "--efficiency",
        type=float,
        help="achieved share of the bf16 peak in the matrix products (default: the median HFU of --from records "
        f"for that GPU type, else {HELP_DEFAULTS['efficiency']:g})",
    )
    p.add_argument(
        "--from",
        dest="sweeps",
        action="append",
        metavar="SWEEP_DIR",
        help="this sweep's records: measured throughput where it measured the model on the GPU (budget), and "
        "the efficiency of each GPU type, the achieved rate of its mesh3d cells where it measured 3D layouts",
    )
    p.add_argument("--out", help="folder for the CSV files (default: print only)")
    p.add_argument("--width", type=int, help="fit the table to this many columns (default: the terminal's; piped: "
                   "all of it)")  # fmt: skip
    p.add_argument("--format", choices=FORMATS, default="table",
                   help="table: fitted to the terminal; csv or json: every column of every table, on stdout alone")  # fmt: skip


def _budget_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], handler: Handler) -> None:
    """The ``budget`` and ``shortest`` commands."""
    bp = _command(subparsers, "budget", "what a budget (GPU-hours, dollars, GPUs x days) trains, and the "
                  "compute-optimal model for it")  # fmt: skip
    amount = bp.add_mutually_exclusive_group(required=True)
    amount.add_argument("--gpu-hours", help="a budget of GPU-hours: 50000, 2.5e4, 100k, 1M")
    amount.add_argument("--usd", help="a budget in dollars (see --pricing): 250000, 100k, 1.5M")
    amount.add_argument("--gpus", type=int, help="a budget of GPUs (with --days)")
    bp.add_argument(
        "--pricing",
        choices=("cloud", "purchase"),
        default="cloud",
        help="dollars buy cloud GPU-hours (conf/gpu cloud_usd_per_gpu_hour) or GPUs with their servers",
    )
    bp.add_argument("--days", type=float, help="days the GPUs are used (with --gpus or --pricing purchase)")
    bp.add_argument(
        "--max-days",
        type=float,
        help="spread the budget over enough GPUs to end within this many days; (b)'s cheapest "
        f"configuration ends within it (default {HELP_DEFAULTS['max_days']:g})",
    )
    bp.add_argument(
        "--overrun-pct",
        type=float,
        help=f"(b) the fastest configuration may spend this much more (default {HELP_DEFAULTS['overrun_pct']:g})",
    )
    _common(bp)
    bp.set_defaults(func=handler, budget_command="budget")

    sp = _command(subparsers, "shortest", "the critical batch and the shortest possible training of a model")
    sp.add_argument(
        "--tokens",
        help="tokens to train: 20x (per parameter), 300B; default: a conf/model's own run, 20x for --size models",
    )
    sp.add_argument("--loss", type=float, help="loss (nats a token) for the critical batch (default: Hoffmann fit)")
    sp.add_argument("--global-batch", type=int, help="global batch in sequences, instead of the critical batch")
    sp.add_argument("--max-gpus", type=int, help=f"most GPUs considered (default {HELP_DEFAULTS['max_gpus']})")
    _common(sp)
    sp.set_defaults(func=handler, budget_command="shortest")


def _profile_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], handler: Handler) -> None:
    """The ``profile`` command."""
    pf = _command(subparsers, "profile", "measure this machine's rates (matrix products, attention, memory, "
                  "collectives) once per hardware identity, into SWEEP_DIR/profiles/")  # fmt: skip
    pf.add_argument("--dir", required=True, help="the sweep folder; the profile goes into its profiles/ folder")
    pf.add_argument("--model", help="conf/model names whose shapes to time, comma-separated (default: the models "
                    "of the cells already in --dir)")  # fmt: skip
    pf.add_argument("--precision", help="bf16, fp16, fp32, tf32, comma-separated (default: the cells', else bf16)")
    pf.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where torch sees a GPU, else cpu")
    pf.add_argument("--ranks", type=int, help="processes on this machine (default: every GPU; 2 on the CPU)")
    pf.add_argument("--tokens", type=int, help="rows of each product (default: the model's sequence, at most 128 "
                    "on the CPU)")  # fmt: skip
    pf.add_argument("--max-message", help="largest collective message, from 4K (default 64M on GPUs, 4M on the CPU)")
    pf.add_argument("--seconds-each", type=float, help="time spent on each figure (default: two minutes in all)")
    pf.add_argument("--from", dest="sweeps", action="append", metavar="SWEEP_DIR",
                    help="reuse a profile of this hardware found in this sweep folder (copied into --dir)")  # fmt: skip
    pf.add_argument("--again", action="store_true", help="measure even where a profile of this hardware exists")
    pf.set_defaults(func=handler)
