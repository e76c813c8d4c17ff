"""Processes of the local cluster: which are alive, their trees, stopping and killing them (through psutil)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

# A process's start time, as psutil gives it, is derived from the boot time, which the kernel may report a
# fraction of a second differently from one read to the next: start times this close are the same start.
SAME_START_S = 1.0

# Popen objects of the daemons this process started, kept so that they are reaped when they exit.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def start_time(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch); None if there is no such process or it has exited."""
    try:
        proc = psutil.Process(pid)
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return None
        return float(proc.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def is_running(pid: int, started_at: float) -> bool:
    """True while the process ``pid`` that started at ``started_at`` runs (a reused pid has another start)."""
    now = start_time(pid)
    return now is not None and abs(now - started_at) < SAME_START_S


@dataclass(frozen=True)
class DaemonRecord:
    """One daemon started by ``up``: enough to find exactly that process again."""

    name: str
    pid: int
    started_at: float
    """The process's start time (psutil's ``create_time``); -1 for one that had exited already."""

    def alive(self) -> bool:
        return is_running(self.pid, self.started_at)

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> DaemonRecord:
        if "start_ticks" in entry:
            # Written by an earlier version, in clock ticks since boot.
            ticks = int(entry["start_ticks"])
            started_at = psutil.boot_time() + ticks / os.sysconf("SC_CLK_TCK") if ticks >= 0 else -1.0
            return cls(entry["name"], int(entry["pid"]), started_at)
        return cls(entry["name"], int(entry["pid"]), float(entry["started_at"]))


def spawn(argv: list[str], stdout: Path, cwd: Path, env: dict[str, str], **popen_kwargs: Any) -> tuple[int, float]:
    """Start a daemon in the foreground of its own session; return its pid and start time (-1 if gone)."""
    with stdout.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
            env=env,
            **popen_kwargs,
        )
    _CHILDREN[proc.pid] = proc
    started_at = start_time(proc.pid)
    return proc.pid, started_at if started_at is not None else -1.0


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).send_signal(sig)


def working_folder(pid: int) -> Path | None:
    """The current folder of ``pid``; None if it is gone."""
    try:
        return Path(psutil.Process(pid).cwd())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def processes_in(folder: Path, name_prefix: str) -> list[int]:
    """Processes named ``name_prefix...`` whose working folder is ``folder``, and all their descendants."""
    found: list[int] = []
    for proc in psutil.process_iter(["name", "cwd"]):
        name, cwd = proc.info["name"] or "", proc.info["cwd"]
        if name.startswith(name_prefix) and cwd == str(folder):
            found += [proc.pid, *descendants(proc.pid)]
    return found


def reap(pid: int) -> None:
    """Collect the exit status of ``pid`` if this process started it, so it leaves no zombie behind."""
    proc = _CHILDREN.get(pid)
    if proc is not None and proc.poll() is not None:
        del _CHILDREN[pid]


def gone(record: DaemonRecord) -> bool:
    """True once the daemon has exited (and is reaped, when this process started it)."""
    reap(record.pid)
    return not record.alive()


def stop(record: DaemonRecord, timeout_s: float) -> None:
    """SIGTERM the daemon, SIGKILL it if it is still there after ``timeout_s``; return once it is gone."""
    if gone(record):
        return
    kill([record.pid], signal.SIGTERM)
    if not wait_until(lambda: gone(record), timeout_s, 0.05):
        kill([record.pid])
        wait_until(lambda: gone(record), 10, 0.05)


def wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` has passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True


def host_memory_mib() -> int:
    return int(psutil.virtual_memory().total // 2**20)


def tail(path: Path, num_lines: int = 15) -> str:
    """The last lines of a log, for an error message."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return f"({path} does not exist)"
    return "\n".join(lines[-num_lines:])
