"""The state of every cell of a sweep, from its record and the scheduler's accounting together.

``sacct`` is asked once for the whole sweep (every job id in one call), never once per cell. A record decides
when it belongs to the cell's latest attempt; otherwise the scheduler's view of the latest attempt does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.paths import SweepPaths

# Every state a cell can be in. "new": written into the sweep but never submitted.
STATES = (
    "new",
    "pending",
    "running",
    "ok",
    "does_not_fit",
    "failed",
    "oom",
    "timeout",
    "preempted",
    "node_fail",
    "cancelled",
    "corrupt",
    "lost",
)
FINAL_GOOD = ("ok", "does_not_fit")
ACTIVE = ("pending", "running")
# Record statuses written by the probe that are failures of the cell itself.
FAILED_STATUSES = ("failed", "comm_error", "compile_error")

SACCT_STATE = {
    "PENDING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_HOLD": "pending",
    "REQUEUE_FED": "pending",
    "RESIZING": "running",
    "RUNNING": "running",
    "SUSPENDED": "running",
    "COMPLETING": "running",
    "CONFIGURING": "running",
    "STAGE_OUT": "running",
    "SIGNALING": "running",
    "COMPLETED": "failed",  # finished but left no record: the probe died before writing it
    "FAILED": "failed",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "PREEMPTED": "preempted",
    "NODE_FAIL": "node_fail",
    "BOOT_FAIL": "node_fail",
    "CANCELLED": "cancelled",
    "REVOKED": "cancelled",
    "OUT_OF_MEMORY": "oom",
}


@dataclass
class CellState:
    cell_id: str
    state: str
    attempt: int
    job_id: str | None
    reason: str | None = None
    scheduler_state: str | None = None
    record: dict[str, Any] | None = None


def read_attempts(paths: SweepPaths, cell_id: str) -> list[dict[str, Any]]:
    path = paths.attempts(cell_id)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash mid-write; the attempts before it still count
    return out


def read_record(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The record, or None and why it cannot be used (None, None when there is none)."""
    if not path.is_file():
        return None, None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"record unreadable: {type(e).__name__}: {str(e)[:120]}"
    if not isinstance(record, dict) or "status" not in record or "cell_id" not in record:
        return None, "record lacks its status or cell id"
    return record, None


_ARRAY_RANGE = re.compile(r"^(\d+)_\[(.+)\]$")


def _expand_sacct_id(job_id: str) -> list[str]:
    """``12_[3-5,7%2]`` (pending array tasks, as sacct shows them) -> ``12_3 12_4 12_5 12_7``."""
    m = _ARRAY_RANGE.match(job_id)
    if not m:
        return [job_id]
    base, spec = m.group(1), m.group(2).split("%")[0]
    ids: list[str] = []
    for part in spec.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            ids.extend(f"{base}_{i}" for i in range(int(lo), int(hi) + 1))
        elif part:
            ids.append(f"{base}_{part}")
    return ids


def sacct_states(job_ids: list[str], timeout_s: float = 30.0) -> dict[str, str]:
    """SLURM state of each job id (``123`` or ``123_4``) in one sacct call; ids sacct does not know are absent."""
    if not job_ids:
        return {}
    parents = sorted({j.split("_")[0] for j in job_ids})
    cmd = ["sacct", "-n", "-P", "-X", "--duplicates", "-o", "JobID,State", "-j", ",".join(parents)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"sacct failed ({result.returncode}): {result.stderr.strip()[:300]}")
    states: dict[str, str] = {}
    # With --duplicates a requeued job shows each run; the last line of an id is its latest run.
    for line in result.stdout.splitlines():
        parts = line.split("|")
        if len(parts) < 2:
            continue
        state = parts[1].split()[0] if parts[1] else ""
        for jid in _expand_sacct_id(parts[0]):
            states[jid] = state
    return states


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cell_states(paths: SweepPaths, query_scheduler: bool = True) -> list[CellState]:
    """The state of every cell in the sweep folder."""
    cell_ids = paths.cell_ids()
    attempts = {cid: read_attempts(paths, cid) for cid in cell_ids}
    slurm_ids = [a[-1]["job_id"] for a in attempts.values() if a and a[-1].get("backend") == "slurm"]
    sched = sacct_states(slurm_ids) if (query_scheduler and slurm_ids) else {}
    out = []
    for cid in cell_ids:
        tries = attempts[cid]
        latest = tries[-1] if tries else None
        attempt = int(latest["attempt"]) if latest else 0
        job_id = str(latest["job_id"]) if latest else None
        record, problem = read_record(paths.record(cid))
        if problem is not None:
            out.append(CellState(cid, "corrupt", attempt, job_id, problem))
            continue
        if record is not None and int(record.get("attempt", 0)) >= attempt:
            out.append(_from_record(cid, record, attempt, job_id))
            continue
        if latest is None:
            out.append(CellState(cid, "new", 0, None))
            continue
        if latest.get("backend") == "local":
            alive = job_id is not None and job_id.isdigit() and _pid_alive(int(job_id))
            state = "running" if alive else "lost"
            out.append(CellState(cid, state, attempt, job_id, None if alive else "no record and no process"))
            continue
        raw = sched.get(job_id or "")
        if raw is None:
            why = "no record and unknown to the scheduler" if query_scheduler else "scheduler not asked"
            out.append(CellState(cid, "lost" if query_scheduler else "pending", attempt, job_id, why))
            continue
        state = SACCT_STATE.get(raw.rstrip("+"), "failed")
        reason = f"SLURM state {raw}" if state not in ACTIVE else None
        if raw == "COMPLETED":
            reason = "the job completed but wrote no record"
        out.append(CellState(cid, state, attempt, job_id, reason, scheduler_state=raw))
    return out


def _from_record(cid: str, record: dict[str, Any], attempt: int, job_id: str | None) -> CellState:
    status = str(record.get("status"))
    if status in FINAL_GOOD or status == "oom":
        state = status
    elif status in STATES:
        state = status
    else:
        state = "failed"
    return CellState(cid, state, attempt, job_id, record.get("reason"), record=record)


def counts(states: list[CellState]) -> dict[str, int]:
    c = Counter(s.state for s in states)
    return {k: c[k] for k in STATES if c[k]}


def needs_rerun(state: str) -> bool:
    """Everything but a final good result and a cell still queued or running."""
    return state not in FINAL_GOOD and state not in ACTIVE


def is_done(states: list[CellState]) -> bool:
    return all(s.state not in ACTIVE for s in states)
