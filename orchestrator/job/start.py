"""The first Python of a SLURM job: ``PYTHON -u -m orchestrator.job.start -u -m submitit.core._submit FOLDER``.

SLURM checks every job's time limit on one 30-second tick, and a job whose limit is already inside its warning
window (``--signal=USR2@90`` with a limit under 90 s plus a tick) is warned at the first tick after it starts: up
to 30 s later, or in its first second. Python dies of SIGUSR2 by default, and submitit puts its handler in place
only once it has loaded the job's pickle, a second or more on a busy node; a warning that came before ended the
job FAILED, with no record and no requeue. This module takes the warning from Python's first moment, notes when
it came, and runs submitit's job runner; the cell's own handler (``orchestrator.job.entry``) takes up a warning
held here as soon as it is installed. Nothing here imports more than the standard library.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from types import FrameType

WARNING = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), signal.SIGUSR2)
"""submitit's warning signal, chosen as submitit chooses it (``SUBMITIT_PREEMPT_SIGNAL``, USR2 by default)."""

_held: float | None = None


def _hold(signum: int, frame: FrameType | None) -> None:
    global _held
    if _held is None:
        _held = time.time()


def hold_warning() -> None:
    """Note a warning signal, instead of dying of it, until a handler of the job's own replaces this one."""
    signal.signal(WARNING, _hold)


def held_warning() -> float | None:
    """When a warning came before the job's own handler was in place (``time.time()``), once; None if none came."""
    global _held
    when, _held = _held, None
    return when


def runner(argv: list[str]) -> tuple[str, list[str]]:
    """The module to run and its arguments, from this module's arguments (Python's own flags, ``-u``, are
    skipped: the interpreter that runs this module was started with them)."""
    args = [a for a in argv if a != "-u"]
    if len(args) < 2 or args[0] != "-m":
        raise SystemExit(f"usage: python -u -m orchestrator.job.start -u -m MODULE ARG...; got {' '.join(argv)}")
    return args[1], args[2:]


def main(argv: list[str]) -> None:
    hold_warning()
    module, args = runner(argv)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    # Run as the module the job's handler imports, not as __main__, so that both see one held warning.
    from orchestrator.job import start

    start.main(sys.argv[1:])
