"""What a job's run leaves of its cell, and when it leaves nothing: the claim on the record of a failure (the first
failing rank's), a newer attempt that replaced this one, an attempt already answered, and the record already there
kept aside under its attempt's name, so that no record is ever written over another."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.job.env import say
from orchestrator.store.attempts import current_attempt
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import Record, aside_path, read_record
from orchestrator.store.states import ANSWERS


def claim_record(ranks_dir: Path, attempt: int) -> bool:
    """Whether this rank is the first of its run to claim the failure record (a requeued run claims anew)."""
    claim = ranks_dir / f"attempt{attempt}-run{os.environ.get('SLURM_RESTART_COUNT', '0')}-recorded"
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError as e:
        say(f"the record could not be claimed ({e}); this rank writes it")
    return True


def superseded(paths: SweepPaths, cell_id: str, attempt: int) -> bool:
    """Whether a newer attempt of the cell was submitted after this job's (a submission cut short and made
    again, whose first job ran after all): such a job leaves the cell alone, its record included."""
    newest = current_attempt(paths, cell_id)
    if newest > attempt:
        say(f"cell {cell_id}: this job runs attempt {attempt}, but attempt {newest} has replaced it; it stops here")
        return True
    return False


def answered(paths: SweepPaths, cell_id: str, attempt: int) -> bool:
    """Whether this job's own attempt already has an answer (ok, does_not_fit, oom): a run SLURM started again
    after the first had written it (a node that failed after the record, before the job ended) must not measure
    the cell a second time under the same attempt; it stops here, the record as it is."""
    found = read_record(paths.record(cell_id), cell_id)
    if isinstance(found, Record) and found.attempt == attempt and found.state in ANSWERS:
        say(f"cell {cell_id}: attempt {attempt} is already answered ({found.status}); this run measures nothing")
        return True
    return False


def keep_earlier_record(paths: SweepPaths, cell_id: str, attempt: int) -> Path:
    """Keep the record already there beside the new one, under its attempt's name: an earlier attempt's (``resume``
    moves it aside once the new attempt is submitted; this is for a resume killed before it could), or an earlier
    run's of this attempt (SLURM requeued the job after it wrote one). Returns where the new record goes: its own
    place, or, should the old one not move, beside it, so that no record is ever written over another."""
    target = paths.record(cell_id)
    found = read_record(target, cell_id)
    if found is None:
        return target
    aside = aside_path(paths, cell_id, found, attempt - 1)
    try:
        target.rename(aside)
    except FileNotFoundError:
        pass  # moved aside meanwhile (a resume)
    except OSError as e:
        instead = paths.archived_record(cell_id, attempt)
        say(f"the record already there could not be kept aside ({e}); this one is written to {instead}")
        return instead
    return target
