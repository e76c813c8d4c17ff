"""``gpudays cancel``: a sweep's queued and running jobs (or the named cells'), cancelled and recorded so.

Under the sweep folder's lock, so that no ``resume`` submits meanwhile, every cell's state is read as ``status``
reads it (a submission cut short is adopted first, so its job is cancelled too). Each chosen cell that SLURM has
pending, held or running has its job cancelled, all in one ``scancel``; then each gets a record of its attempt
saying ``cancelled``, unless its job has written one of its own by then (a running job writes ``cancelled``
itself when the cancel's SIGTERM reaches it, or had just ended). So ``status`` says ``cancelled`` at once,
whether or not accounting ever lists the job (a pending array task cancelled alone leaves no line in ``sacct``),
and ``resume`` reruns the cell. A record already there is kept aside under its attempt's name, never written
over: the new one is linked into place only where no record is (the job's own, written meanwhile, wins).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config.values import Container
from orchestrator.slurm import commands as slurm
from orchestrator.store.durable import fsync_dir
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import BadCellConfig, Record, aside_path, read_cell_config, read_record, write_record
from orchestrator.store.states import ACTIVE, RecordStatus, State, is_answer
from orchestrator.submission import intents, status

CANCELLABLE = frozenset({*ACTIVE, State.HELD})
"""States whose job SLURM still holds: queued, held, or running."""


class UnknownCells(ValueError):
    """Cells named on the command line that the sweep does not have (or that name several of its cells)."""


@dataclass
class Cancelled:
    """What ``cancel`` did: the cells whose jobs it cancelled, and why each other cell named was left."""

    cancelled: list[status.CellState] = field(default_factory=list)
    recorded_by_job: list[str] = field(default_factory=list)
    """Cancelled cells whose job wrote its own record before this command could (kept as the job wrote it)."""
    answered: dict[str, str] = field(default_factory=dict)
    """Cancelled cells whose job had ended with an answer before the cancel reached it: cell id -> the answer."""
    left: list[tuple[str, str]] = field(default_factory=list)
    """(cell id, why it was not cancelled)."""


def pick(cell_ids: Sequence[str], wanted: Sequence[str]) -> list[str]:
    """The cells ``wanted`` names (each an id or the start of exactly one); raises UnknownCells naming the others."""
    out: list[str] = []
    bad: list[str] = []
    for name in wanted:
        matches = SweepPaths.named(list(cell_ids), name)
        if len(matches) == 1:
            out.extend(m for m in matches if m not in out)
        else:
            bad.append(f"{name!r} matches {'no cell' if not matches else f'{len(matches)} cells'}")
    if bad:
        shown = ", ".join(cell_ids[:20]) + (" ..." if len(cell_ids) > 20 else "")
        raise UnknownCells(f"{'; '.join(bad)}; nothing was cancelled; the sweep's cells: {shown}")
    return out


def _why_not(paths: SweepPaths, s: status.CellState) -> str | None:
    """Why a cell is not cancelled; None where it is."""
    if s.state not in CANCELLABLE:
        return f"{s.state}: no job of it is queued or running, nothing to cancel"
    if s.job_id is None:
        return f"{s.state}: {s.reason or 'its job is not known yet'}"
    attempts = status.read_attempts(paths, s.cell_id)
    if attempts and attempts[-1].backend == "local":
        return f"runs on this machine (process {s.job_id}), not under SLURM: Ctrl-C in its sweep's terminal stops it"
    try:
        slurm.JobId.parse(s.job_id)
    except ValueError:
        return f"{s.state}: attempts.jsonl names job {s.job_id!r}, not a SLURM id"
    return None


def cancel(paths: SweepPaths, wanted: Sequence[str] = ()) -> Cancelled:
    """Cancel the jobs of the named cells (``wanted``: ids or their starts), or of every cell queued, held or
    running; record each as ``cancelled``. Raises UnknownCells for a name the sweep lacks, SchedulerUnavailable
    where the states cannot be read or ``scancel`` fails (then nothing is recorded)."""
    chosen = pick(paths.cell_ids(), wanted) if wanted else None
    out = Cancelled()
    with intents.sweep_lock(paths):
        states = status.cell_states(paths, holding_lock=True)
        for s in states:
            if chosen is not None and s.cell_id not in chosen:
                continue
            why = _why_not(paths, s)
            if why is None:
                out.cancelled.append(s)
            elif chosen is not None or s.state in CANCELLABLE:
                out.left.append((s.cell_id, why))
        if not out.cancelled:
            return out
        slurm.cancel([slurm.JobId.parse(s.job_id or "") for s in out.cancelled])
        when = dt.datetime.now(dt.timezone.utc).isoformat()
        for s in out.cancelled:
            found = _record_cancel(paths, s, when)
            if found is not None and is_answer(found.state):
                out.answered[s.cell_id] = found.status.value
            elif found is not None:
                out.recorded_by_job.append(s.cell_id)
    return out


def _record_cancel(paths: SweepPaths, s: status.CellState, when: str) -> Record | None:
    """Write a ``cancelled`` record of the cell's attempt, unless its job has written one (returned then)."""
    target = paths.record(s.cell_id)
    found = read_record(target, s.cell_id)
    if isinstance(found, Record) and found.attempt >= s.attempt:
        return found
    if found is not None:  # an older attempt's record (a resume killed before it moved it), or a damaged one
        try:
            target.rename(aside_path(paths, s.cell_id, found, s.attempt))
        except FileNotFoundError:
            pass
    config: Container = {}
    try:
        config = read_cell_config(paths.cell_config(s.cell_id))
    except BadCellConfig:
        pass
    record = Record(
        cell_id=s.cell_id,
        sweep=str(config.get("name", "")),
        attempt=s.attempt,
        status=RecordStatus.CANCELLED,
        reason=f"cancelled by `gpudays cancel` (scancel {s.job_id}) while {s.state}",
        config=config,
        environment={"job_id": s.job_id},
        finished_at=when,
    )
    # Written aside, then linked into place only where no record is: the job's own, written meanwhile, wins.
    aside = target.with_name(f".{target.name}.cancel-{os.getpid()}")
    write_record(aside, record)
    try:
        os.link(aside, target)
    except FileExistsError:
        again = read_record(target, s.cell_id)
        return again if isinstance(again, Record) else None
    finally:
        Path(aside).unlink(missing_ok=True)
    fsync_dir(target.parent)
    return None
