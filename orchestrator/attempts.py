"""A cell's submissions (``attempts.jsonl``): one typed line per attempt, one writer and one reader.

Every submission of a cell appends an :class:`Attempt` (which job runs which attempt); ``status`` reads them back
to ask the scheduler about the latest, ``resume`` to number the next, ``show`` to find the logs. A line cut short
by a crash mid-write is skipped by the reader, and the next append starts on a line of its own, so one damaged
line never hides the submission after it.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field

from orchestrator.paths import SweepPaths


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


@dataclass(frozen=True)
class Attempt:
    """One attempt of one cell: which job runs it (one line of the cell's attempts.jsonl)."""

    cell_id: str
    attempt: int
    """1 for the first submission of the cell, one more for each resubmission."""
    job_id: str
    """The scheduler's id as ``squeue`` shows it (``12_3`` for an array task), or the local job's."""
    backend: str
    """``slurm`` or ``local``."""
    label: str | None = None
    submitted_at: str = field(default_factory=_now)
    """ISO 8601, UTC."""

    @classmethod
    def from_json(cls, entry: object) -> Attempt | None:
        """The attempt a parsed line holds; None where it is not one (a damaged or foreign line)."""
        if not isinstance(entry, dict):
            return None
        attempt, job_id = entry.get("attempt"), entry.get("job_id")
        if not isinstance(attempt, int) or isinstance(attempt, bool) or job_id is None:
            return None
        label, submitted = entry.get("label"), entry.get("submitted_at")
        return cls(
            cell_id=str(entry.get("cell_id", "")),
            attempt=attempt,
            job_id=str(job_id),
            backend=str(entry.get("backend", "")),
            label=label if isinstance(label, str) else None,
            submitted_at=submitted if isinstance(submitted, str) else "",
        )


def read_attempts(paths: SweepPaths, cell_id: str) -> list[Attempt]:
    """The submissions of a cell, oldest first; a line cut short by a crash mid-write is skipped."""
    try:
        text = paths.attempts(cell_id).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            found = Attempt.from_json(json.loads(line))
        except ValueError:
            continue
        if found is not None:
            out.append(found)
    return out


def next_attempt(paths: SweepPaths, cell_id: str) -> int:
    """1 for a cell never submitted, else one more than its submissions so far (a damaged line counts: its job
    may have run, and its number is not given to another)."""
    path = paths.attempts(cell_id)
    try:
        lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except FileNotFoundError:
        return 1
    return max([len(lines), *(a.attempt for a in read_attempts(paths, cell_id))]) + 1


def append_attempt(paths: SweepPaths, attempt: Attempt) -> None:
    """Append the attempt as one JSON line, on a line of its own even after a line a crash cut short."""
    path = paths.attempts(attempt.cell_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(asdict(attempt), sort_keys=True) + "\n"
    with open(path, "ab+") as f:
        if f.tell() > 0:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                line = "\n" + line
        f.write(line.encode())

