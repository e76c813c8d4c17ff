"""A cell's submissions (``attempts.jsonl``): typed lines, one writer and one reader.

A submission is a transaction of two lines. Before ``sbatch`` (or before a local job starts), the **intent** is
appended and flushed to disk: the attempt's number, and the token the scheduler will carry (the job's name, and
the cell's task in the array). Once the scheduler has taken it, a second line adds the job id. A command killed
between the two leaves an intent without a job id: a cell whose job may exist is never ``new``, and any later
command finds the job by its token (``orchestrator.submission.intents``) and adopts it, or, where the scheduler has no job
of that name, says the attempt never reached it. Both lines of an attempt share its number, and the reader
merges them into one :class:`Attempt`.

A line cut short by a crash mid-write is skipped by the reader, and the next append starts on a line of its own,
so one damaged line never hides the submission after it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace

from orchestrator.store.durable import append_line, truncate_to
from orchestrator.store.paths import SweepPaths


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


@dataclass(frozen=True)
class Attempt:
    """One attempt of one cell: which job runs it (one or two lines of the cell's attempts.jsonl)."""

    cell_id: str
    attempt: int
    """1 for the first submission of the cell, one more for each resubmission."""
    job_id: str | None
    """The scheduler's id as ``squeue`` shows it (``12_3`` for an array task), or the local job's process id; None
    while only the intent is written (the job may or may not exist: see :attr:`token`)."""
    backend: str
    """``slurm`` or ``local``."""
    label: str | None = None
    submitted_at: str = field(default_factory=_now)
    """ISO 8601, UTC."""
    token: str | None = None
    """The name the job carries (SLURM's job name), by which a submission cut short is found again."""
    index: int | None = None
    """The cell's task in its array job (``job_id`` is then ``<array>_<index>``); None for a job of one cell."""
    started: float | None = None
    """A local job: when its process started (seconds since the epoch, as psutil reports it), so that a process
    id the system has since given to another process is not taken for the job."""
    gpudays: str | None = None
    """The gpudays version that submitted the attempt (``orchestrator.store.version``); its job refuses to measure
    under another."""

    @property
    def intent_only(self) -> bool:
        """Written before submission, with no job id yet."""
        return self.job_id is None

    @classmethod
    def from_json(cls, entry: object) -> Attempt | None:
        """The attempt a parsed line holds; None where it is not one (a damaged or foreign line)."""
        if not isinstance(entry, dict):
            return None
        attempt, job_id, token = entry.get("attempt"), entry.get("job_id"), entry.get("token")
        if not isinstance(attempt, int) or isinstance(attempt, bool):
            return None
        if job_id is None and not isinstance(token, str):
            return None
        label, submitted, index, started = (entry.get(k) for k in ("label", "submitted_at", "index", "started"))
        return cls(
            cell_id=str(entry.get("cell_id", "")),
            attempt=attempt,
            job_id=None if job_id is None else str(job_id),
            backend=str(entry.get("backend", "")),
            label=label if isinstance(label, str) else None,
            submitted_at=submitted if isinstance(submitted, str) else "",
            token=token if isinstance(token, str) else None,
            index=index if isinstance(index, int) and not isinstance(index, bool) else None,
            started=float(started) if isinstance(started, (int, float)) and not isinstance(started, bool) else None,
            gpudays=entry["gpudays"] if isinstance(entry.get("gpudays"), str) else None,
        )

    def to_line(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, sort_keys=True)


def _merge(earlier: Attempt, later: Attempt) -> Attempt:
    """The two lines of one attempt as one: what the later line adds (the job id) over the intent."""
    filled = {k: v for k, v in asdict(later).items() if v is not None and k != "submitted_at"}
    return replace(earlier, **filled)


def _read_lines(paths: SweepPaths, cell_id: str) -> tuple[list[Attempt], int]:
    """The parsed lines of a cell's attempts.jsonl, and how many lines could not be read."""
    try:
        text = paths.attempts(cell_id).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return [], 0
    out, damaged = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            found = Attempt.from_json(json.loads(line))
        except ValueError:
            found = None
        if found is None:
            damaged += 1
        else:
            out.append(found)
    return out, damaged


def merge_lines(lines: Iterable[Attempt]) -> list[Attempt]:
    """One Attempt per attempt number, in the order first written, each line's job id added to its intent."""
    by_number: dict[int, Attempt] = {}
    for a in lines:
        by_number[a.attempt] = _merge(by_number[a.attempt], a) if a.attempt in by_number else a
    return list(by_number.values())


def read_attempts(paths: SweepPaths, cell_id: str) -> list[Attempt]:
    """The submissions of a cell, oldest first (an intent without a job id included); a line cut short by a crash
    mid-write is skipped."""
    return merge_lines(_read_lines(paths, cell_id)[0])


def damaged_lines(paths: SweepPaths) -> list[str]:
    """Each cell whose attempts.jsonl holds lines that cannot be read (cut short by a crash mid-write, or not an
    attempt), one line each: every reader skips them the same way, and ``status``, ``show``, ``resume`` and
    ``report`` say so."""
    out = []
    for cell_id in paths.cell_ids():
        try:
            data = paths.attempts(cell_id).read_bytes()
        except OSError:
            continue
        # Whole lines end in "}" and a newline: only a file with another line is parsed (10,000 cells: 0.3 s less).
        if all(line.rstrip().endswith(b"}") for line in data.splitlines() if line.strip()) and data.endswith(b"\n"):
            continue
        damaged = _read_lines(paths, cell_id)[1]
        if damaged:
            out.append(
                f"cells/{cell_id}/{paths.attempts(cell_id).name}: {damaged} line(s) cut short or unreadable, "
                "skipped (their attempt numbers are not given again)"
            )
    return out


def next_attempt(paths: SweepPaths, cell_id: str) -> int:
    """1 for a cell never submitted, else one more than its submissions so far (a damaged line counts: its job
    may have run, and its number is not given to another)."""
    lines, damaged = _read_lines(paths, cell_id)
    merged = merge_lines(lines)
    return max([len(merged) + damaged, *(a.attempt for a in merged)]) + 1


def current_attempt(paths: SweepPaths, cell_id: str) -> int:
    """The newest attempt number written for the cell (intents included); 0 if none. A job running an older one
    has been replaced, and leaves the cell alone."""
    lines, _ = _read_lines(paths, cell_id)
    return max((a.attempt for a in lines), default=0)


def append_attempt(paths: SweepPaths, attempt: Attempt, durable: bool = True) -> int:
    """Append one line of the attempt, on a line of its own even after a line a crash cut short, flushed to disk;
    returns the file's size before (for :func:`durable.truncate_to`). Raises WriteFailed naming the file."""
    return append_line(paths.attempts(attempt.cell_id), attempt.to_line(), durable)


Written = list[tuple[str, int]]
"""What :func:`write_intents` appended: each cell id with its attempts.jsonl's size before."""


def write_intents(paths: SweepPaths, intents: Iterable[Attempt]) -> Written:
    """Append the intent of each attempt, all or none: when one cannot be written (a full disk), those already
    written are taken back, every cell stays as it was, and WriteFailed names the file. Returns what
    :func:`take_back` needs to undo them, should the scheduler never get the job."""
    written: Written = []
    try:
        for intent in intents:
            written.append((intent.cell_id, append_attempt(paths, intent)))
    except BaseException:
        take_back(paths, written)
        raise
    return written


def take_back(paths: SweepPaths, written: Written) -> None:
    """Remove intents that surely never reached the scheduler (under the sweep's lock, so nothing was appended
    after them): their cells are as they were before, not ``lost``."""
    for cell_id, size in written:
        truncate_to(paths.attempts(cell_id), size)
