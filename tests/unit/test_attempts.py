"""A cell's attempts.jsonl: typed lines, one reader, and an append that survives a line a crash cut short."""

from __future__ import annotations

from pathlib import Path

from orchestrator.store.attempts import Attempt, append_attempt, next_attempt, read_attempts
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import status


def test_attempts_round_trip_typed(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    assert read_attempts(paths, "c1") == [] and next_attempt(paths, "c1") == 1
    first = Attempt("c1", 1, "40_3", "slurm", "pythia-70m cpu x1")
    append_attempt(paths, first)
    assert read_attempts(paths, "c1") == [first]
    assert next_attempt(paths, "c1") == 2


def test_a_line_cut_short_does_not_swallow_the_next_submission(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    append_attempt(paths, Attempt("c1", 1, "40_3", "slurm"))
    with open(paths.attempts("c1"), "a") as f:
        f.write('{"attempt": 2, "backend": "slurm", "cell_id": "c1", "job_i')  # a crash mid-write
    # The damaged line's job may have run: its number is not given to another submission.
    assert next_attempt(paths, "c1") == 3
    append_attempt(paths, Attempt("c1", 3, "41_0", "slurm"))
    assert [(a.attempt, a.job_id) for a in read_attempts(paths, "c1")] == [(1, "40_3"), (3, "41_0")]
    # status reads the same attempts: the latest is the one just appended, not a cell `new` to submit again.
    (paths.cell_dir("c1") / "cell.yaml").write_text("name: x\n")
    (state,) = status.cell_states(paths, query_scheduler=False)
    assert state.attempt == 3 and state.job_id == "41_0"


def test_foreign_lines_are_skipped(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    paths.attempts("c1").parent.mkdir(parents=True)
    paths.attempts("c1").write_text('[1, 2]\n{"attempt": true, "job_id": "1"}\n{"attempt": 1}\nnot json\n')
    assert read_attempts(paths, "c1") == []


def test_intents_the_scheduler_never_got_are_taken_back_and_a_full_disk_is_a_write_failure(
    tmp_path: Path, monkeypatch
) -> None:
    import errno

    from orchestrator.slurm import commands as slurm
    from orchestrator.store.durable import WriteFailed
    from orchestrator.submission import launch
    from orchestrator.submission.refused import unsubmitted

    paths = SweepPaths(tmp_path)
    append_attempt(paths, Attempt("c1", 1, "40_3", "slurm"))
    before = paths.attempts("c1").read_bytes()
    intents = [Attempt("c1", 2, None, "slurm", token="gpudays-t"), Attempt("c2", 1, None, "slurm", token="gpudays-t")]
    written = launch.write_intents(paths, intents)
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "jobs" / "x.pkl"))

    # The scheduler has a job of that name (sbatch ran after all): the intents stay, for the next command to adopt.
    monkeypatch.setattr(slurm, "jobs_named", lambda names, since: slurm.Named({"gpudays-t": "41"}, complete=True))
    raised = unsubmitted(paths, written, "gpudays-t", full)
    assert isinstance(raised, WriteFailed) and "x.pkl" in str(raised) and "nothing of it was submitted" in str(raised)
    assert [a.attempt for a in read_attempts(paths, "c1")] == [1, 2]

    # It has none: every cell is as it was (an `ok` cell stays ok, not `lost`), its log as it was byte for byte.
    monkeypatch.setattr(slurm, "jobs_named", lambda names, since: slurm.Named({}, complete=True))
    refused = RuntimeError("sbatch: error: invalid partition")
    assert unsubmitted(paths, written, "gpudays-t", refused) is refused
    assert paths.attempts("c1").read_bytes() == before
    assert not paths.attempts("c2").exists(), "a cell never submitted has no attempts.jsonl, not an empty one"


def test_an_append_a_full_disk_refused_leaves_no_empty_file(tmp_path: Path, monkeypatch) -> None:
    import errno
    import os

    import pytest

    from orchestrator.store import durable

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(durable.WriteFailed, match="attempts.jsonl: No space left"):
        append_attempt(SweepPaths(tmp_path), Attempt("c1", 1, None, "slurm", token="t"))
    monkeypatch.undo()
    assert not SweepPaths(tmp_path).attempts("c1").exists()


def test_an_attempt_names_the_gpudays_that_submitted_it(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    submitted = Attempt("c1", 1, None, "slurm", token="gpudays-x-1", gpudays="0.1.0+git.abc")
    append_attempt(paths, submitted)
    assert read_attempts(paths, "c1")[0].gpudays == "0.1.0+git.abc"
    append_attempt(paths, Attempt("c1", 2, "41", "slurm"))
    assert read_attempts(paths, "c1")[1].gpudays is None, "a line of an older gpudays has none"
