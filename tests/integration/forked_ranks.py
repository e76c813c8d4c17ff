"""Probe ranks started from one process that has already imported torch and transformers.

Each rank of a probe is its own process, as in a job, so no engine's global state passes from one cell to the
next. A fresh Python spends about 7 s of CPU importing torch and transformers' model code before the probe does
anything; the local lane starts some 75 of them. Here the ranks are forked by :mod:`multiprocessing`'s fork server,
which imports those libraries once (its preload) and touches no tensor, so each rank starts from a process in which
nothing has run: what the probe does (the engine, its process group, the model, the timed steps, the record) is
the same code in a new process. One difference shows in memory: a forked rank faults its libraries' code pages in
again as it first runs them (a fresh one did so while importing), so its first region (building the model) grows
a few MiB more. A run with extra environment (one that breaks a compiler or a cache on purpose)
starts fresh processes, as the environment may be read when a library is imported.

The tests that check the engines' splits rank by rank (:func:`spawn`, in place of ``torch.multiprocessing.spawn``)
fork their ranks from the same server.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing import forkserver
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from unittest import mock

PRELOAD = [
    "torch", "torch.distributed", "torch.distributed.tensor", "transformers", "transformers.modeling_utils",
    "transformers.models.gpt_neox.modeling_gpt_neox",
]  # fmt: skip
"""What every rank imports before it reads its cell, whichever the engine, and the model code of the family most
of these tests' cells build (pythia-tiny): about 0.4 s of a rank's start."""

SERVER_ENV = {"OMP_NUM_THREADS": "1"}
"""Read when torch's threading library loads, so set in the server before it imports torch (as in every rank's
environment; :func:`start_rank` checks)."""

_context: ForkServerContext | None = None


def _server() -> ForkServerContext:
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        with mock.patch.dict(os.environ, SERVER_ENV):
            forkserver.ensure_running()
        _context = context
    return _context


def _rank(argv: list[str], env: dict[str, str], cwd: str, log: str) -> None:
    """A rank in the forked process: its own environment, folder and log, then the probe as ``by_hand`` runs it."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    from orchestrator.job import by_hand

    code = by_hand.main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def start_rank(argv: Sequence[str], env: Mapping[str, str], cwd: str, log: str) -> BaseProcess:
    """One rank of ``python -m orchestrator.job.by_hand ARGV``, started; join it with ``join(timeout)``."""
    for key, value in SERVER_ENV.items():
        assert env.get(key) == value, f"a forked rank needs {key}={value}, as its server was started with"
    process = _server().Process(target=_rank, args=(list(argv), dict(env), cwd, log))
    process.start()
    return process


def spawn(fn: Callable[..., object], args: Sequence[object], nprocs: int, timeout_s: float = 600) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)`` from the fork server: torch's ``start_processes`` with
    the ``forkserver`` start method, whose server :func:`_server` started with its preload. torch stops the other
    ranks when one fails and raises with its traceback; a rank still running after ``timeout_s`` is killed, and
    the test fails."""
    from torch.multiprocessing.spawn import start_processes

    _server()
    context = start_processes(fn, tuple(args), nprocs, join=False, start_method="forkserver")
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for process in context.processes:
                process.kill()
            raise AssertionError(f"{nprocs} ranks of {fn.__name__} still running after {timeout_s:.0f} s")
