"""Op builds a killed job cannot poison.

torch.utils.cpp_extension guards each op's build folder (``$TORCH_EXTENSIONS_DIR/<op>/``) with a FileBaton: the
builder creates ``<op>/lock`` and removes it when done; everyone else polls until it is gone, with no staleness
check. A job killed while building (time limit, preemption, scancel) leaves the file behind, and since the folder
is one per user (often on NFS), every later job of that user polls it for its whole time limit, writing nothing,
then requeues and hangs again.

So, on every rank, before any op is built (``guard_op_builds``):

* the builder writes who holds the baton into it: pid, host and the process's start time (JSON);
* batons whose holder is gone (same host, no such process, or another process under that pid) or that are older
  than a build can take (``$GPUDAYS_OP_BUILD_MAX_S``, 30 minutes by default, from the file's time) are removed,
  under a ``filelock`` lock in the extensions folder so that two jobs never judge and remove one baton at once;
* a wait for a baton says in the job's log what it waits for and for how long, judges it again every few seconds,
  and ends once it is stale (the baton is removed and the cell fails as an op build, which the next attempt
  rebuilds), so that no wait outlasts a build.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_BUILD_ENV = "GPUDAYS_OP_BUILD_MAX_S"
DEFAULT_MAX_BUILD_S = 1800.0
JUDGE_EVERY_S = 5.0
"""How often a wait judges the baton it waits for."""
GUARD_LOCK = ".gpudays-baton.lock"


def max_build_s() -> float:
    try:
        return float(os.environ.get(MAX_BUILD_ENV, DEFAULT_MAX_BUILD_S))
    except ValueError:
        return DEFAULT_MAX_BUILD_S


def _start_time(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def holder_text() -> str:
    """This process as a baton's holder: pid, host, start time."""
    pid = os.getpid()
    return json.dumps({"pid": pid, "host": socket.gethostname(), "started": _start_time(pid), "at": time.time()})


def describe(path: Path) -> str:
    """Who holds the baton at ``path``, as its file says."""
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return "gone"
    try:
        held = json.loads(text)
        return f"pid {held.get('pid')} on {held.get('host')}"
    except (ValueError, AttributeError):
        return "an unnamed holder (written by a build without gpudays)"


def stale_reason(path: Path, max_age_s: float | None = None, now: float | None = None) -> str | None:
    """Why the baton at ``path`` is stale, or None when its holder may still be building (or it is gone)."""
    limit = max_build_s() if max_age_s is None else max_age_s
    try:
        age = (time.time() if now is None else now) - path.stat().st_mtime
        text = path.read_text(errors="replace").strip()
    except OSError:
        return None
    if age > limit:
        return f"it is {age:.0f} s old, more than an op build may take ({MAX_BUILD_ENV}={limit:.0f})"
    try:
        held = json.loads(text) if text else None
    except ValueError:
        held = None
    if not isinstance(held, dict) or held.get("host") != socket.gethostname():
        return None  # another host's holder cannot be asked: only the age rule applies
    pid = held.get("pid")
    if not isinstance(pid, int):
        return None
    started = _start_time(pid)
    if started is None:
        return f"its holder, pid {pid} on {held['host']}, is gone"
    recorded = held.get("started")
    if isinstance(recorded, (int, float)) and abs(started - recorded) > 1.0:
        return f"its holder, pid {pid} on {held['host']}, is gone (that pid is another process now)"
    return None


def remove_if_stale(path: Path, say: Callable[[str], None], max_age_s: float | None = None) -> bool:
    """Remove the baton at ``path`` if it is stale (judged under the extensions folder's guard lock)."""
    from filelock import FileLock, Timeout

    try:
        with FileLock(str(path.parent.parent / GUARD_LOCK), timeout=60):
            reason = stale_reason(path, max_age_s)
            if reason is None:
                return False
            holder = describe(path)
            path.unlink(missing_ok=True)
    except (Timeout, OSError) as exc:
        say(f"could not judge the op build lock {path}: {exc}")
        return False
    say(f"removed the stale op build lock {path} (held by {holder}): {reason}")
    return True


def clear_stale_batons(extensions_dir: Path, say: Callable[[str], None], max_age_s: float | None = None) -> list[Path]:
    """Remove every stale ``<op>/lock`` under ``extensions_dir``; returns those removed."""
    try:
        batons = sorted(extensions_dir.glob("*/lock"))
    except OSError:
        return []
    return [b for b in batons if remove_if_stale(b, say, max_age_s)]


class StaleOpBuild(RuntimeError):
    """The op build this rank waited for was abandoned by its holder; its lock was removed."""


def guard_op_builds(extensions_dir: Path, say: Callable[[str], None]) -> list[Path]:
    """Clear stale batons under ``extensions_dir`` and make torch's FileBaton name its holder and judge the batons
    it waits for (see the module docstring). Returns the batons removed."""
    removed = clear_stale_batons(extensions_dir, say)
    from torch.utils import file_baton

    baton_class: Any = file_baton.FileBaton
    if getattr(baton_class, "_gpudays_guarded", False):
        return removed
    plain_try_acquire = baton_class.try_acquire

    def try_acquire(self: Any) -> bool | None:
        acquired: bool | None = plain_try_acquire(self)
        if acquired:
            try:
                Path(self.lock_file_path).write_text(holder_text())
            except OSError:
                pass  # the age rule still applies
        return acquired

    def wait(self: Any) -> None:
        path = Path(self.lock_file_path)
        start = last_said = time.monotonic()
        judged = start
        said = False
        while path.exists():
            now = time.monotonic()
            if not said or now - last_said >= 60:
                say(f"waiting {now - start:.0f} s for the op build lock {path}, held by {describe(path)}")
                said, last_said = True, now
            if now - judged >= JUDGE_EVERY_S:
                judged = now
                if remove_if_stale(path, say):
                    raise StaleOpBuild(
                        f"the op build guarded by {path} was abandoned by its holder (lock removed); "
                        "the next attempt builds the op again"
                    )
            time.sleep(self.wait_seconds)

    baton_class.try_acquire = try_acquire
    baton_class.wait = wait
    baton_class._gpudays_guarded = True
    return removed
