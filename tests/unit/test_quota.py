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
from orchestrator.submission import launch, limits, quota


def _cells(make_typed: Any, n: int, qos: str | None = None) -> dict[str, Any]:
    out = {}
    for i in range(n):
        cell = make_typed("cluster=slurm", "gpu=cpu", "probe.kind=sleep", f"probe.seed={i}")
        cell.cluster.qos = qos
        out[f"cell{i}"] = cell
    return out


def _site(**kw: Any) -> limits.Site:
    return limits.Site("ada", **kw)


def _queued(n: int, qos: str = "normal", user: str = "ada", account: str = "lab", partition: str = "gpu") -> list:
    return [limits.Queued(user, account, qos, partition)] * n


def test_limits_are_read_from_the_qos_the_associations_and_the_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    listings = {
        "qos": [
            ["normal", "", "", "", ""],
            ["short", "3", "", "40", "DenyOnLimit,OverPartQOS"],
            ["part", "", "", "", ""],
        ],
        "assoc": [
            ["root", "", "", "", "", "", ""],
            ["lab", "", "", "root", "", "100", ""],
            ["lab", "ada", "", "", "50", "", "short"],
        ],
    }
    monkeypatch.setattr(slurm_site, "sacctmgr_rows", lambda args: listings[args[1]])
    monkeypatch.setattr(slurm_site, "partition_qos", lambda: ({"gpu": "part"}, "gpu"))
    site = quota.read_limits("ada")
    assert site is not None and site.qos["short"] == limits.QosLimits(3, None, 40, over_partition_qos=True)
    assert site.partition_qos == {"gpu": "part"} and site.default_partition == "gpu"
    assert site.default_qos() == "short" and site.account_of(None) == "lab"
    names = [lim.name for lim in site.limits(None, None, None)]
    assert any("QOS 'short' allows 3 queued jobs per user (MaxSubmitJobsPerUser" in n for n in names), names
    assert any("QOS 'short' allows 40 queued jobs of all users (GrpSubmitJobs" in n for n in names), names
    assert any("association in account 'lab' allows 50 queued jobs (MaxSubmitJobs" in n for n in names), names
    assert any("account 'lab' allows 100 queued jobs of all its users (GrpSubmitJobs" in n for n in names), names
    listings["qos"] = [["normal", "", "", "", ""]]
    monkeypatch.setattr(slurm_site, "partition_qos", lambda: pytest.fail("no QOS limits: partitions not asked"))
    assert quota.read_limits("ada") is not None
    monkeypatch.setattr(slurm_site, "sacctmgr_rows", lambda args: None)
    assert quota.read_limits("ada") is None, "no accounting: nothing to hold back"


def test_scontrol_show_partition_gives_each_partition_its_qos_and_the_default() -> None:
    text = (
        "PartitionName=debug AllowGroups=ALL Default=YES QoS=N/A Nodes=n[1-2]\n"
        "PartitionName=gpu AllowGroups=ALL Default=NO QoS=gpu-part Nodes=n3\n"
    )
    assert slurm_site.parse_partitions(text) == ({"gpu": "gpu-part"}, "debug")


def test_cells_past_a_qos_limit_are_held_back_with_the_limit_named(make_typed) -> None:
    configs = _cells(make_typed, 5, qos="short")
    site = _site(qos={"short": limits.QosLimits(per_user=3)})
    now, later, why = quota.split(configs, site, _queued(1, "short") + _queued(7))
    assert list(now) == ["cell0", "cell1"] and list(later) == ["cell2", "cell3", "cell4"]
    assert "QOS 'short' allows 3 queued jobs per user (MaxSubmitJobsPerUser" in why and "3 are queued" in why
    now, later, _ = quota.split(configs, None, _queued(1, "short"))
    assert len(now) == 5 and not later


def test_a_partition_qos_limit_holds_cells_back_whatever_qos_they_name(make_typed) -> None:
    configs = _cells(make_typed, 4, qos="short")
    for cfg in configs.values():
        cfg.cluster.partition = "gpu"
    qos = {"short": limits.QosLimits(per_user=10), "gpu-part": limits.QosLimits(per_user=2)}
    site = _site(qos=qos, partition_qos={"gpu": "gpu-part"})
    # A job of another QOS in the partition counts against the partition's QOS; one elsewhere does not.
    queued = _queued(1, "normal", partition="gpu") + _queued(5, "normal", partition="cpu")
    now, later, why = quota.split(configs, site, queued)
    assert len(now) == 1 and len(later) == 3, "the partition's limit wins over the job QOS's larger one"
    assert "partition's QOS 'gpu-part' allows 2 queued jobs per user" in why
    over = dict(qos, short=limits.QosLimits(per_user=10, over_partition_qos=True))
    now, _, _ = quota.split(configs, _site(qos=over, partition_qos={"gpu": "gpu-part"}), queued)
    assert len(now) == 4, "a job QOS flagged OverPartQOS sets the limit itself"


def test_group_and_account_limits_count_other_users_jobs(make_typed) -> None:
    configs = _cells(make_typed, 4)
    assoc = [
        limits.Association("root"),
        limits.Association("lab", parent="root", group_submit=6),
        limits.Association("lab-sub", parent="lab"),
        limits.Association("lab", user="ada"),
    ]
    queued = _queued(3, user="bob", account="lab-sub") + _queued(1)
    now, later, why = quota.split(configs, _site(qos={}, associations=assoc), queued)
    assert len(now) == 2, "jobs of another user in a sub-account count against the account's GrpSubmitJobs"
    assert "account 'lab' allows 6 queued jobs of all its users (GrpSubmitJobs" in why
    site = _site(qos={"normal": limits.QosLimits(group=3)}, associations=assoc)
    now, _, why = quota.split(configs, site, queued)
    assert len(now) == 0 and "QOS 'normal' allows 3 queued jobs of all users (GrpSubmitJobs" in why
    site = _site(qos={"normal": limits.QosLimits(per_account=5)}, associations=assoc[2:])
    now, _, why = quota.split(configs, site, queued)
    assert len(now) == 4, "bob's jobs are another account's"
    now, _, why = quota.split(configs, site, queued + _queued(3, user="cy"))
    assert len(now) == 1 and "allows 5 queued jobs per account (MaxSubmitJobsPerAccount" in why


def test_a_cell_naming_no_qos_counts_against_the_default_and_the_association_caps_all(make_typed) -> None:
    configs = _cells(make_typed, 4)
    now, later, _ = quota.split(configs, _site(qos={"normal": limits.QosLimits(per_user=10)}), _queued(9))
    assert len(now) == 1 and len(later) == 3
    assoc = [limits.Association("lab", user="ada", max_submit=5)]
    now, later, why = quota.split(configs, _site(qos={}, associations=assoc), _queued(3, "other"))
    assert len(now) == 2 and "association in account 'lab' allows 5 queued jobs (MaxSubmitJobs" in why
    now, later, _ = quota.split(configs, _site(qos={"short": limits.QosLimits(per_user=1)}), [])
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

    monkeypatch.setattr(quota, "read_limits", lambda user: _site(qos={"short": limits.QosLimits(per_user=2)}))
    monkeypatch.setattr(slurm_site, "queued_jobs", lambda user: [("ada", "lab", "short", "gpu")] * queue["short"])
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
