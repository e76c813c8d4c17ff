"""sbatch refusing the real submission (after ``--test-only`` accepted it: a QOS limit reached in between, a
controller that went away): exit 3 and one line naming the cells and SLURM's words, every cell where it stood.

sbatch is a shell script on PATH that says what SLURM says and exits 1 (or, with a count, accepts the first
submissions); nothing else of SLURM is asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import main as cli
from orchestrator.cli.errors import Exit
from orchestrator.slurm import commands as slurm
from orchestrator.store.attempts import read_attempts
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import admission, quota

COMMON = ["cluster=slurm", "model=pythia-tiny", "gpu=cpu", "cluster.cpus_per_gpu=1", "probe.kind=sleep"]
QOS_LIMIT = (
    "sbatch: error: QOSMaxSubmitJobPerUserLimit\n"
    "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's "
    "size and/or time limits)"
)


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An sbatch that accepts as many submissions as ``accept`` holds (none unless written), then refuses as the
    QOS limit does; the scheduler has no job of any name; releases are noted. Returns the ``accept`` file."""
    shims = tmp_path / "shims"
    shims.mkdir()
    accept = tmp_path / "accept"
    accept.write_text("0")
    sbatch = shims / "sbatch"
    sbatch.write_text(
        "#!/bin/sh\n"
        f'n=$(/bin/cat {accept})\nif [ "$n" -gt 0 ]; then echo $((n - 1)) > {accept}; '
        f'echo "Submitted batch job $((4242 + n))"; exit 0; fi\n'
        f"/bin/cat >&2 <<'EOF'\n{QOS_LIMIT}\nEOF\nexit 1\n"
    )
    sbatch.chmod(0o755)
    (shims / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit looks for it; nothing runs it here
    (shims / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", str(shims))  # sbatch alone: no other SLURM command is there to be asked
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(admission, "check_slurm", lambda configs: None)  # --test-only accepted it
    monkeypatch.setattr(quota, "read_limits", lambda user: None)
    monkeypatch.setattr(quota.admission, "scheduler_max_array_size", lambda: None)
    monkeypatch.setattr(slurm, "jobs_named", lambda names, since: slurm.Named({}, complete=True))
    monkeypatch.setattr(slurm, "release", lambda ids: None)
    monkeypatch.setattr(slurm, "sacct", lambda ids: slurm.Accounting())
    monkeypatch.setattr(slurm, "squeue", lambda ids: slurm.Accounting())
    return accept


def test_a_refused_submission_exits_3_naming_the_cells_and_slurms_reason(
    tmp_path: Path, fake_sbatch: Path, capsys
) -> None:
    sweep_dir = tmp_path / "refused"
    code = cli.main(["sweep", "--dir", str(sweep_dir), "--no-report", *COMMON, "model.seq_length=64,65"])
    err = capsys.readouterr().err
    assert code == Exit.SCHEDULER, err  # it was 70, "a bug in gpudays"
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    paths = SweepPaths(sweep_dir)
    ids = paths.cell_ids()
    assert len(ids) == 2 and all(cid in lines[0] for cid in ids)
    assert "sbatch refused 2 cell(s)" in lines[0] and "QOSMaxSubmitJobPerUserLimit" in lines[0]
    assert "Job violates accounting/QOS policy" in lines[0] and "internal error" not in lines[0]
    assert "the limit on queued jobs refused: a QOS's MaxSubmitJobsPerUser" in lines[0], "the limit in words"
    assert "gpudays resume" in lines[0]
    # The scheduler has no job of the array's name: the intents are taken back, and the cells are new again.
    assert all(not paths.attempts(cid).exists() for cid in ids)


def test_a_refusal_after_an_earlier_array_went_out_keeps_what_was_submitted(
    tmp_path: Path, fake_sbatch: Path, tiny_sweep: Path, capsys
) -> None:
    # Two cells that failed, resumed as two arrays of one: the first goes out, the second is refused.
    paths = SweepPaths(tiny_sweep)
    first, second = paths.cell_ids()
    records = {cid: paths.record(cid).read_bytes() for cid in (first, second)}
    fake_sbatch.write_text("1")
    code = cli.main(["resume", str(tiny_sweep)])
    err = capsys.readouterr().err
    assert code == Exit.SCHEDULER and len(err.strip().splitlines()) == 1, err
    assert f"sbatch refused 1 cell(s) {second}" in err and "1 cell(s) submitted before it run as job(s) 4243" in err
    assert [(a.attempt, a.job_id) for a in read_attempts(paths, first)] == [(1, "1"), (2, "4243")]
    assert (read_attempts(paths, first)[-1].token or "").startswith("gpudays-failed-"), "the sweep's name"
    assert [p.name for p in paths.cell_dir(first).glob("record*")] == ["record.attempt1.json"]
    assert paths.cell_dir(first).joinpath("record.attempt1.json").read_bytes() == records[first]
    # The refused cell is as it was: its attempt taken back, its record in place for the next resume.
    assert [(a.attempt, a.job_id) for a in read_attempts(paths, second)] == [(1, "2")]
    assert paths.record(second).read_bytes() == records[second]


@pytest.fixture
def tiny_sweep(tmp_path: Path, make_cell) -> Path:
    """Two SLURM cells whose first attempts failed (jobs 1 and 2), each in an array of its own when resubmitted."""
    from orchestrator.config.schema import to_config
    from orchestrator.store.attempts import Attempt, append_attempt
    from orchestrator.store.record import Record, write_record
    from orchestrator.store.states import RecordStatus
    from orchestrator.submission import launch

    paths = SweepPaths(tmp_path / "failed")
    for n, length in enumerate((64, 65), start=1):
        config = make_cell(*COMMON, f"model.seq_length={length}", "cluster.max_array_size=1")
        cid = f"cell{n}"
        launch.write_cell(paths, cid, to_config(config))
        append_attempt(paths, Attempt(cid, 1, str(n), "slurm"))
        write_record(paths.record(cid), Record(cid, RecordStatus.FAILED, 1, reason="boom", config=config))
    return paths.root
