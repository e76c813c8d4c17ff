"""Command line: ``gpudays cluster up | down | status | env``."""

from __future__ import annotations

import argparse
import sys

from orchestrator.cluster.layout import DEFAULT_STATE_DIR, STATE_DIR_ENV, ClusterError
from orchestrator.cluster.lifecycle import LocalCluster

EXIT_BAD_INPUT = 2
EXIT_SCHEDULER = 3
"""gpudays' exit codes (``orchestrator.cli.errors.Exit``, which this layer may not import; a test keeps them equal):
a bad option value is bad input; a cluster that cannot be started or stopped (packages missing, a daemon that
does not come up), or ``status`` of one that is not up, is the scheduler that cannot be asked."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpudays cluster",
        description="A throwaway real SLURM cluster on this machine, for trying and testing gpudays. "
        f"State in ${STATE_DIR_ENV} (default {DEFAULT_STATE_DIR}); sockets in a short folder of its own, "
        "/tmp/gd-HASH.",
        # One line per verb, whatever the terminal's width.
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=12, width=110),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{up,down,status,env}")
    up = sub.add_parser("up", help="start munged, MariaDB, slurmdbd, slurmctld and the nodes")
    up.add_argument("--max-array-size", type=int, default=1001, help="SLURM's MaxArraySize (default 1001)")
    up.add_argument("--timeout-s", type=float, default=60, help="give up after this many seconds (default 60)")
    down = sub.add_parser("down", help="cancel every job and stop exactly what `up` started")
    down.add_argument("--purge", action="store_true", help="also delete the state folder (accounting, logs)")
    sub.add_parser(
        "status", help=f"each daemon with its pid, alive or dead, and sinfo; exit status {EXIT_SCHEDULER} when not up"
    )
    sub.add_parser("env", help="print `export SLURM_CONF=...`; use as: eval $(gpudays cluster env)")
    return parser


def main(argv: list[str]) -> int:
    """``gpudays cluster SUBCOMMAND [OPTIONS]``; returns the exit status."""
    args = build_parser().parse_args(argv)
    cluster = LocalCluster()
    try:
        if args.command == "up":
            cluster.up(max_array_size=args.max_array_size, timeout_s=args.timeout_s)
        elif args.command == "down":
            cluster.down(purge=args.purge)
        elif args.command == "env":
            for key, value in cluster.env().items():
                print(f"export {key}={value}")
        else:
            return _print_status(cluster.status())
    except ClusterError as error:
        print(f"gpudays cluster {args.command}: {error}", file=sys.stderr)
        return EXIT_SCHEDULER
    except ValueError as error:
        print(f"gpudays cluster {args.command}: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def _print_status(status: dict[str, object]) -> int:
    print(f"state folder: {status['state_dir']}")
    print(f"SLURM_CONF:   {status['slurm_conf']}")
    print(f"sockets in:   {status['runtime_dir']}")
    print(f"cluster:      {'up' if status['up'] else 'down'}")
    for daemon in status["daemons"]:  # type: ignore[attr-defined]
        print(f"  {daemon['name']:<14} pid {daemon['pid']:<8} {'alive' if daemon['alive'] else 'dead'}")
    if status["sinfo"]:
        print(str(status["sinfo"]).rstrip())
    return 0 if status["up"] else EXIT_SCHEDULER
