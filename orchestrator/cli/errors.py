"""What ``gpudays`` says when a command cannot go on, and the exit code of every outcome, in one place: ``Exit``
and its meanings (``gpudays --help`` lists them), ``CommandError`` (a message a user can act on, with its code),
and ``outcome_of``, which maps every exception a command may end with to its code and its line."""

from __future__ import annotations

import errno
import sys
from enum import IntEnum

from orchestrator.store.durable import FULL_OR_BROKEN, WriteFailed


class Exit(IntEnum):
    """Exit codes of ``gpudays``; ``EXIT_MEANING`` says what each means (``gpudays --help`` lists them)."""

    OK = 0
    CELLS_FAILED = 1
    BAD_INPUT = 2
    SCHEDULER = 3
    ACTIVE = 4
    WRITE_FAILED = 5
    INTERNAL = 70
    INTERRUPTED = 130
    STDOUT_CLOSED = 141


EXIT_MEANING = {
    Exit.OK: "done: every cell that ended has an answer (ok, does_not_fit), or the jobs were submitted",
    Exit.CELLS_FAILED: "some cell failed, timed out, was lost...: it needs a rerun (gpudays resume)",
    Exit.BAD_INPUT: "bad input (config, override, flag, folder): nothing was submitted",
    Exit.SCHEDULER: "the scheduler refused the submission or could not be asked",
    Exit.ACTIVE: "status --check: no cell needs a rerun, but some are still pending or running",
    Exit.WRITE_FAILED: "a file could not be written (disk full, quota, read-only): the message names it; "
    "the old file is kept",
    Exit.INTERNAL: "a bug in gpudays: the message names the file with the traceback; please report it",
    Exit.INTERRUPTED: "stopped with Ctrl-C",
    Exit.STDOUT_CLOSED: "its output was closed before it ended (piped into head): ended quietly, as SIGPIPE ends a "
    "command (128 + 13)",
}


class CommandError(Exception):
    """A command cannot go on; the message says why and what to do, ``code`` is its exit code."""

    def __init__(self, message: str, code: Exit = Exit.BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


_FILE_IN_THE_WAY = frozenset({errno.EEXIST, errno.ENOTDIR})
IN_THE_WAY = (
    ": a file is in the way, where gpudays needs a folder (it or a folder above it is a file); give --dir "
    "(or hydra.sweep.dir) a sweep folder, or a path that does not exist yet"
)


def outcome_of(e: BaseException) -> tuple[Exit, str]:
    """The exit code of a command that ended with ``e``, and the one line said for it: bad input, a refusal or a
    full disk is the user's to act on; anything else is a bug (``Exit.INTERNAL``), its traceback for a file."""
    if isinstance(e, CommandError):
        return e.code, str(e)
    if isinstance(e, WriteFailed):
        return (Exit.WRITE_FAILED if e.errno in FULL_OR_BROKEN else Exit.BAD_INPUT), str(e)
    if isinstance(e, OSError):
        if e.errno in FULL_OR_BROKEN:
            return Exit.WRITE_FAILED, f"cannot write {e.filename or 'a file'}: {e.strerror or e}"
        # A folder that cannot be created or written (permissions, a file in the way, a name too long).
        where = f" {e.filename}" if e.filename else ""
        return (
            Exit.BAD_INPUT,
            f"cannot use{where}: {e.strerror or e}{IN_THE_WAY if e.errno in _FILE_IN_THE_WAY else ''}",
        )
    if isinstance(e, KeyboardInterrupt):
        return Exit.INTERRUPTED, "interrupted"
    if _is_sweep_error(e):
        return Exit.BAD_INPUT, str(e)
    return Exit.INTERNAL, f"internal error, a bug in gpudays: {type(e).__name__}: {e}"[:2000]


def _is_sweep_error(e: BaseException) -> bool:
    """Bad input found while planning (``orchestrator.planning.plan.SweepError``). Only a loaded planning module
    raises one, so it is looked up where it is loaded: a command that plans nothing never loads Hydra for it."""
    planning = sys.modules.get("orchestrator.planning.plan")
    return planning is not None and isinstance(e, planning.SweepError)


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (``gpudays status DIR | head``): a write to it raised the
    BrokenPipeError being handled, not a pipe of the command's own (a subprocess's stdin). Then stdout is pointed
    at /dev/null, so that nothing more (Python's last flush at exit included) fails on it."""
    import os
    import select

    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        closed = any(revents & select.POLLERR for _, revents in poll.poll(0))
    except (OSError, ValueError):
        return False
    if closed:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    return closed


def save_traceback() -> str:
    """The traceback being handled, with the command line, in a new file; its path."""
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix="gpudays-traceback-", suffix=".txt")
    with open(fd, "w") as f:
        f.write(" ".join(map(repr, sys.argv)) + "\n\n" + traceback.format_exc())
    return path
