"""A sweep's own profile: which hardware it needs, whether it measures, reuses, copies in or refuses a profile,
what its runs cost the budget, and which profiles its predictions get; on profiles made up here (no ranks run:
the local sweep's integration test measures one)."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.cells.cell import cell_id
from orchestrator.cli import autoprofile
from orchestrator.cli import main as cli
from orchestrator.cli.errors import CommandError
from orchestrator.config.schema import Config, to_config
from orchestrator.planning.plan import plan
from orchestrator.profile import sweep
from orchestrator.profile.identity import Identity
from orchestrator.profile.record import write_profile
from orchestrator.profile.runner import ProfileFailed
from orchestrator.store.paths import SweepPaths
from orchestrator.submission.launch import write_cell
from tests.unit.test_profile_record import made_up

HERE = Identity("cpu", 2, 1, "AMD EPYC", "2.13.0+cpu", "gloo")
H100 = Identity("NVIDIA H100 80GB HBM3", 4, 2, "Intel Xeon", "2.5.1+cu124", "nccl")


@functools.cache
def _composed(*overrides: str) -> Config:
    (cell,) = plan(list(overrides), sweep_dir=None).cells
    return to_config(cell.config)


def cpu(num_gpus: int = 2, auto: bool = True, kind: str = "deepspeed") -> Config:
    base = _composed("model=pythia-tiny")
    return replace(base, num_gpus=num_gpus, probe=replace(base.probe, kind=kind, profile=auto))


def h100(num_gpus: int = 8, num_nodes: int = 2) -> Config:
    base = _composed("model=pythia-70m", "gpu=h100-80gb", "cluster=slurm", "num_gpus=8", "num_nodes=2")
    return replace(base, num_gpus=num_gpus, num_nodes=num_nodes)


LOCAL = sweep.Need("cpu", 2, 1, "gloo", "local")
SLURM = sweep.Need("h100-80gb", 4, 2, "nccl", "slurm")


def test_a_sweep_needs_one_profile_per_gpu_type_at_its_widest_layout() -> None:
    found = sweep.needs([cpu(1), cpu(2), h100(4, 1), h100(8, 2)])
    assert set(found) == {LOCAL, SLURM}  # 4 GPUs a node at most, and two nodes for the inter-node link
    assert len(found[LOCAL]) == 2 and len(found[SLURM]) == 2
    assert set(sweep.needs([h100(4, 1)])) == {sweep.Need("h100-80gb", 4, 1, "nccl", "slurm")}


def test_an_empty_folder_measures_and_one_with_this_machines_profile_reuses_it(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    assert sweep.decide(paths, LOCAL, [cpu()], HERE).action == "measure"
    where = sweep.keep(paths, made_up(HERE), "cpu")
    decided = sweep.decide(paths, LOCAL, [cpu()], HERE)
    assert (decided.action, decided.found) == ("reuse", where)
    # Another torch build is other hardware on this machine: measured anew.
    assert sweep.decide(paths, LOCAL, [cpu()], replace(HERE, torch_version="2.14.0+cpu")).action == "measure"


def test_profile_auto_false_measures_nothing_but_a_profile_there_is_still_used(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    assert sweep.decide(paths, LOCAL, [cpu(auto=False)], HERE).action == "off"
    assert sweep.decide(paths, LOCAL, [cpu(auto=False), cpu(auto=True)], HERE).action == "measure"
    assert sweep.decide(paths, LOCAL, [cpu(kind="sleep"), cpu(kind="fail")], HERE).action == "off"
    sweep.keep(paths, made_up(HERE), "cpu")
    assert sweep.decide(paths, LOCAL, [cpu(auto=False)], HERE).action == "reuse"


def test_a_profile_started_before_is_never_started_again(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    sweep.log_run(paths, SLURM, "started", where="slurm", job_id="41")
    assert sweep.decide(paths, SLURM, [h100()], None).action == "started"
    sweep.log_run(paths, SLURM, "ended", outcome="failed", reason="NCCL error", wall_s=5.0)
    assert sweep.decide(paths, SLURM, [h100()], None).action == "started"  # failed: the defaults stand in
    assert sweep.decide(paths, replace(SLURM, nodes=1), [h100(4, 1)], None).action == "measure"


def test_a_slurm_profile_is_found_by_the_gpu_config_name_it_was_measured_for(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    write_profile(paths, made_up(H100))  # by `gpudays profile`: known only as torch names the GPU
    assert sweep.decide(paths, SLURM, [h100()], None).action == "measure"
    where = sweep.keep(paths, made_up(H100), "h100-80gb")
    assert sweep.decide(paths, SLURM, [h100()], None) == sweep.Decision(SLURM, "reuse", where)
    assert sweep.decide(paths, replace(SLURM, gpus_per_node=8), [h100()], None).action == "measure"


def test_profile_from_copies_a_fitting_profile_in_and_refuses_other_hardware(tmp_path: Path) -> None:
    old, new = SweepPaths(tmp_path / "old"), SweepPaths(tmp_path / "new")
    sweep.keep(old, made_up(H100), "h100-80gb")
    decided = sweep.decide(new, SLURM, [h100()], None, [old])
    assert decided.action == "reuse" and decided.found is not None and decided.found.parent == new.profiles_dir
    assert sweep.profiles_for(new.root)["h100-80gb"].identity == H100
    # Of several folders, the one that holds this hardware's profile is used.
    other = SweepPaths(tmp_path / "other")
    sweep.keep(other, made_up(replace(H100, gpus_per_node=8)), "h100-80gb")
    assert sweep.decide(SweepPaths(tmp_path / "fourth"), SLURM, [h100()], None, [other, old]).action == "reuse"
    with pytest.raises(sweep.RefusedProfile, match=r"gpus_per_node: 4 != 8") as refused:
        sweep.decide(SweepPaths(tmp_path / "third"), replace(SLURM, gpus_per_node=8), [h100()], None, [old])
    assert str(old.root) in str(refused.value) and "nodes" not in str(refused.value).split("(", 1)[1].replace(
        "gpus_per_node", ""
    )
    with pytest.raises(CommandError, match="--profile-from .*: no such sweep folder"):
        autoprofile.older_folders([str(tmp_path / "nowhere")])


def test_the_predictions_get_each_gpus_profile_over_the_most_nodes(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    assert sweep.profiles_for(tmp_path) == {}
    sweep.keep(paths, made_up(replace(H100, nodes=1), when="2026-11-27T09:00:00+00:00"), "h100-80gb")
    sweep.keep(paths, made_up(H100, when="2026-11-27T08:00:00+00:00"), "h100-80gb")
    write_profile(paths, made_up(HERE))
    found = sweep.profiles_for(tmp_path)
    assert set(found) == {"h100-80gb", "cpu"}
    assert found["h100-80gb"].identity.nodes == 2 and found["cpu"].identity == HERE


def test_the_budget_counts_each_profile_run_once_at_its_time_or_its_whole_budget(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    assert sweep.spent_gpu_s(paths) == 0.0
    sweep.log_run(paths, SLURM, "started", job_id="41")
    assert sweep.spent_gpu_s(paths) == (sweep.BUDGET_S + sweep.START_S) * 8  # under way: all it may take
    sweep.log_run(paths, SLURM, "ended", outcome="ok", wall_s=30.0)
    local = replace(LOCAL, gpus_per_node=1)
    sweep.log_run(paths, local, "started")
    sweep.log_run(paths, local, "ended", outcome="failed", wall_s=0.0)  # never submitted
    assert sweep.spent_gpu_s(paths) == 30.0 * 8
    (paths.profiles_dir / "runs.jsonl").open("a").write('{"cut sh')
    assert sweep.spent_gpu_s(paths) == 30.0 * 8


def test_a_failed_local_profile_leaves_the_cells_to_run_and_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    def fails(*_args: object) -> None:
        raise ProfileFailed("a rank of the profile failed: RuntimeError: gloo")

    monkeypatch.setattr("orchestrator.profile.runner.profile_here", fails)
    monkeypatch.setattr("orchestrator.profile.identity.this_machine", lambda *_: HERE)
    paths = SweepPaths(tmp_path)
    autoprofile.ensure(paths, {"a": cpu()})
    assert "the profile of 2 x cpu failed" in capsys.readouterr().err
    assert [r["event"] for r in sweep.runs(paths)] == ["started", "ended"]
    assert autoprofile.status_lines(paths) == [
        f"profile of 2 x cpu (this machine): failed: a rank of the profile failed: RuntimeError: gloo; "
        f"{autoprofile.FALLBACK}"
    ]
    autoprofile.ensure(paths, {"a": cpu()})  # a second sweep does not try again
    assert len(sweep.runs(paths)) == 2


def test_a_refused_profile_job_leaves_the_cells_to_go_on(tmp_path: Path, monkeypatch, capsys) -> None:
    def refused(*_args: object) -> str:
        raise OSError("sbatch: error: QOSMaxSubmitJobPerUserLimit")

    monkeypatch.setattr("orchestrator.submission.profile_job.submit_profile", refused)
    paths = SweepPaths(tmp_path)
    autoprofile.ensure(paths, {"a": h100()})
    assert "could not be submitted (sbatch: error: QOSMaxSubmitJobPerUserLimit)" in capsys.readouterr().err
    assert sweep.spent_gpu_s(paths) == 0.0
    (line,) = autoprofile.status_lines(paths)
    assert line.startswith("profile of 4 x h100-80gb on 2 nodes (its SLURM job): failed: not submitted")


def test_a_damaged_gpu_index_is_named(tmp_path: Path) -> None:
    paths = SweepPaths(tmp_path)
    paths.profiles_dir.mkdir()
    (paths.profiles_dir / "gpus.jsonl").write_text(json.dumps(["h100"]) + "\n")
    with pytest.raises(CommandError, match=r"gpus.jsonl: line 1: expected"):
        autoprofile.decisions(paths, {"a": h100()}, [])


def test_show_profile_lists_each_run_and_a_failed_jobs_log(tmp_path: Path, capsys) -> None:
    paths = SweepPaths(tmp_path)
    write_cell(paths, cell_id(cpu()), cpu())
    assert cli.main(["show", str(tmp_path), "profile"]) == 0
    assert "has started no profile run" in capsys.readouterr().out
    sweep.log_run(paths, SLURM, "started", where="slurm", job_id="41")
    sweep.log_run(paths, SLURM, "ended", outcome="failed", reason="RuntimeError: NCCL timeout", wall_s=9.0)
    paths.job_dir("41").mkdir(parents=True)
    (paths.job_dir("41") / "41_0_log.err").write_text("Traceback ...\nRuntimeError: NCCL timeout\n")
    assert cli.main(["show", str(tmp_path), "profile"]) == 0
    out = capsys.readouterr().out
    assert "profile of 4 x h100-80gb on 2 nodes (job 41): failed: RuntimeError: NCCL timeout" in out
    assert "41_0_log.err" in out and "    RuntimeError: NCCL timeout" in out


def test_report_hands_each_gpus_profile_to_the_predictions_and_says_which_folder_it_could_not_read(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import analysis.report.writer as writer

    good, damaged = SweepPaths(tmp_path / "good"), SweepPaths(tmp_path / "damaged")
    sweep.keep(good, made_up(H100), "h100-80gb")
    write_profile(damaged, made_up(HERE))
    (damaged.root / "profiles" / "gpus.jsonl").write_text(json.dumps(["cpu"]) + "\n")
    for paths in (good, damaged):
        write_cell(paths, cell_id(cpu()), cpu())
    found, unread = sweep.profiles_of([good.root, damaged.root])
    assert set(found) == {"h100-80gb"} and found["h100-80gb"].identity == H100
    assert len(unread) == 1 and "gpus.jsonl" in unread[0] and "cited links" in unread[0]

    seen: dict[str, object] = {}
    real = writer.write_report

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(writer, "write_report", spy)
    assert cli.main(["report", str(good.root), str(damaged.root), "--no-plots"]) == 0
    assert set(seen["profiles"]) == {"h100-80gb"}  # type: ignore[arg-type]
    assert "gpus.jsonl" in capsys.readouterr().out
