"""Per-user job limits: read from sacctmgr, counted against squeue, and cells past them held back, then submitted
in waves as the queue empties."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import folder
from orchestrator.slurm import site as slurm_site
from orchestrator.store.attempts import Attempt
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import launch, quota


def _cells(make_typed: Any, n: int, qos: str | None = None) -> dict[str, Any]:
    out = {}
    for i in range(n):
        cell = make_typed("cluster=slurm", "gpu=cpu", "probe.kind=sleep", f"probe.seed={i}")
        cell.cluster.qos = qos
        out[f"cell{i}"] = cell
    return out


def test_limits_are_read_from_the_qos_and_the_association(monkeypatch: pytest.MonkeyPatch) -> None:
    listings = {
        "qos": [["normal", ""], ["short", "3"], ["long", "200"]],
        "assoc": [["", "short"], ["50", ""]],
    }
    monkeypatch.setattr(slurm_site, "sacctmgr_rows", lambda args: listings[args[1]])
    limits = quota.read_limits("ada")
    assert limits == quota.Limits({"short": 3, "long": 200}, association=50, default_qos="short")
    monkeypatch.setattr(slurm_site, "sacctmgr_rows", lambda args: None)
    assert quota.read_limits("ada") is None, "no accounting: nothing to hold back"


def test_cells_past_a_qos_limit_are_held_back_with_the_limit_named(make_typed) -> None:
    configs = _cells(make_typed, 5, qos="short")
    limits = quota.Limits({"short": 3})
    now, later, why = quota.split(configs, limits, {"short": 1, "normal": 7})
    assert list(now) == ["cell0", "cell1"] and list(later) == ["cell2", "cell3", "cell4"]
    assert "QOS 'short' allows 3 queued jobs per user (MaxSubmitJobsPerUser" in why and "1 queued" in why
    now, later, _ = quota.split(configs, None, {"short": 1})
    assert len(now) == 5 and not later


def test_a_cell_naming_no_qos_counts_against_the_default_and_the_association_caps_all(make_typed) -> None:
    configs = _cells(make_typed, 4)
    now, later, _ = quota.split(configs, quota.Limits({"normal": 10}, default_qos="normal"), {"normal": 9})
    assert len(now) == 1 and len(later) == 3
    now, later, why = quota.split(configs, quota.Limits({}, association=5), {"other": 3})
    assert len(now) == 2 and "association allows 5 queued jobs (MaxSubmitJobs" in why
    now, later, _ = quota.split(configs, quota.Limits({"short": 1}), {})
    assert len(now) == 4, "a limit on another QOS holds nothing back"


def test_waves_submit_what_fits_then_the_rest_as_the_queue_empties(
    make_typed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs = _cells(make_typed, 5, qos="short")
    queue = {"short": 0}
    submitted: list[list[str]] = []

    def fake_submit(paths: SweepPaths, now: dict[str, Any], max_array: Any, before: Any) -> list[Attempt]:
        submitted.append(list(now))
        queue["short"] += len(now)
        return [Attempt(cid, 1, f"7_{i}", "slurm", "x") for i, cid in enumerate(now)]

    monkeypatch.setattr(quota, "read_limits", lambda user: quota.Limits({"short": 2}))
    monkeypatch.setattr(slurm_site, "user_jobs_by_qos", lambda user: dict(queue))
    monkeypatch.setattr(launch, "submit_slurm", fake_submit)
    monkeypatch.setattr(quota.admission, "scheduler_max_array_size", lambda: None)
    waves = quota.Waves(SweepPaths(tmp_path))
    subs = waves.submit(configs)
    assert [s.cell_id for s in subs] == ["cell0", "cell1"] and list(waves.held) == ["cell2", "cell3", "cell4"]
    assert "3 cell(s) held back" in waves.summary(subs) and "MaxSubmitJobsPerUser" in waves.summary(subs)
    assert waves.refill() == [] and submitted == [["cell0", "cell1"]], "no room yet: nothing submitted"
    queue["short"] = 1  # one job left the queue
    assert [s.cell_id for s in waves.refill()] == ["cell2"]
    queue["short"] = 0
    assert [s.cell_id for s in waves.refill()] == ["cell3", "cell4"] and not waves.held
    assert waves.refill() == []


def test_wait_goes_on_while_cells_are_held_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeWaves(quota.Waves):
        def refill(self) -> list[Attempt]:
            self.held = {}
            return [Attempt("cell9", 1, "8", "slurm", "x")]

    waves = FakeWaves(SweepPaths(tmp_path), held={"cell9": None})  # type: ignore[dict-item]
    monkeypatch.setattr(folder, "states_or_records", lambda paths: [])
    said: list[str] = []
    monkeypatch.setattr(folder.console, "out", said.append)
    folder.wait_for(SweepPaths(tmp_path), interval_s=0, waves=waves)
    assert said == ["submitted 1 cell(s) to SLURM as 1 array job(s): 8"], "nothing active, yet a held cell waited"
