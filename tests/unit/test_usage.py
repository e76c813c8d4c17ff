"""An adaptive sweep's budget counts the GPU-seconds SLURM allocated (sacct's AllocTRES × elapsed), not the probe's
wall time × the cell's GPUs, where sacct says; else the probe's figure, with a note."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

from analysis.planners.selection import ProbeSteps
from orchestrator.cli import adaptive
from orchestrator.cli.display import console
from orchestrator.slurm import commands as slurm
from orchestrator.slurm.commands import JobId
from orchestrator.store.attempts import Attempt
from orchestrator.store.durable import append_jsonl
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import usage

SACCT = """\
40_0|billing=8,cpu=8,gres/gpu=4,mem=256G,node=1|600
40_1|billing=2,cpu=2,gres/gpu:a100=1,mem=64G,node=1|100
40_1|billing=2,cpu=2,gres/gpu:a100=1,mem=64G,node=1|50
40_[2-3]||0
41|cpu=4,mem=4G,node=1|30
not a job|gres/gpu=1|5
"""


def test_allocated_gpus_times_elapsed_every_run_counted() -> None:
    assert slurm.parse_usage(SACCT) == {
        JobId(40, 0): 2400.0,  # a 1-GPU cell given a whole node is charged the node's 4 GPUs
        JobId(40, 1): 150.0,  # typed gres counted; both runs of a requeued task
        JobId(41): 0.0,  # no GPU allocated
    }


def _sweep(tmp_path: Path) -> SweepPaths:
    paths = SweepPaths(tmp_path / "sweep")
    for cid, job in (("a", "40_0"), ("b", "40_1"), ("c", "40_9"), ("d", None)):
        paths.cell_config(cid).parent.mkdir(parents=True)
        if job:
            append_jsonl(paths.attempts(cid), asdict(Attempt(cell_id=cid, attempt=1, job_id=job, backend="slurm")))
    return paths


def test_the_budget_counts_what_slurm_allocated_and_the_probe_where_sacct_does_not_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _sweep(tmp_path)
    asked: list[list[JobId]] = []

    def fake_usage(ids: list[JobId]) -> dict[JobId, float]:
        asked.append(list(ids))
        return slurm.parse_usage(SACCT)

    monkeypatch.setattr(slurm, "sacct_usage", fake_usage)
    notes: list[str] = []
    monkeypatch.setattr(console, "note", notes.append)
    measured = pd.DataFrame(
        {"cell_id": ["a", "b", "c", "d"], "num_gpus": [1, 1, 2, 1], "probe_wall_s": [300.0, 100.0, 100.0, None]}
    )
    probe = ProbeSteps(5, 50, 900.0)
    assert adaptive._spent_gpu_s(measured, probe) == 300 + 100 + 200 + 900  # without the folder: the probes' figure
    # a: 4 GPUs x 600 s allocated; b: both runs; c: sacct lists no run (probe's 2 x 100); d: its whole budget
    assert adaptive._spent_gpu_s(measured, probe, paths) == 2400 + 150 + 200 + 900
    assert len(asked) == 1, "one sacct call for the sweep"
    assert notes and "1 cell(s)" in notes[0]


def test_without_sacct_the_probe_figure_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def down(ids: object) -> dict[JobId, float]:
        raise slurm.SlurmUnavailable("sacct: slurmdbd is down")

    monkeypatch.setattr(slurm, "sacct_usage", down)
    allocated, note = usage.allocated_gpu_s(_sweep(tmp_path), ["a", "b"])
    assert allocated == {} and note is not None and "slurmdbd is down" in note
