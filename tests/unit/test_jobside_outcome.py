"""What the job side writes for each way a job ends: the probe gets the typed cell, and every outcome (the probe's,
a sleep's, an exception no probe caught) has its status decided once, with the time-limit signal the job got."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from orchestrator.config.schema import Config
from orchestrator.job import entry as jobside
from orchestrator.job.failures import Ending, Happened, ProbeOutcome, TimeSignal, outcome_of
from orchestrator.store.paths import CELL_CONFIG_NAME, SweepPaths
from orchestrator.store.record import Metrics, Record, read_record
from orchestrator.store.states import RecordStatus


@pytest.fixture
def job(tmp_path: Path, make_cell: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Write a cell and make this process its job's only rank; returns a function that runs it and reads back."""
    fake = SimpleNamespace(global_rank=0, num_tasks=1, local_rank=0, num_nodes=1, job_id="7", hostnames=["here"])
    monkeypatch.setattr(jobside.submitit, "JobEnvironment", lambda: fake)
    monkeypatch.setattr(jobside, "set_distributed_env", lambda *args: None)
    monkeypatch.setattr(jobside, "_time_limit_signal", None)
    for name in ("DS_ACCELERATOR", "OMP_NUM_THREADS"):  # run_cell sets them for a CPU cell; put back after
        monkeypatch.delenv(name, raising=False)
    paths = SweepPaths(tmp_path)

    def run(*overrides: str, submitted_by: str | None = None) -> tuple[str, Record, dict[str, Any]]:
        cell = make_cell("model=pythia-tiny", "gpu=cpu", *overrides)
        paths.cell_dir("abc").mkdir(parents=True, exist_ok=True)
        (paths.cell_dir("abc") / CELL_CONFIG_NAME).write_text(yaml.safe_dump(cell))
        for claim in paths.cell_dir("abc").glob("ranks/*-recorded"):
            claim.unlink()  # each call stands for a new job, whose first failing rank claims the record anew
        status = jobside.run_cell(str(tmp_path), "abc", 1, submitted_by=submitted_by)
        record = read_record(paths.record("abc"), "abc")
        assert isinstance(record, Record)
        return status, record, json.loads(paths.record("abc").read_text())

    return run


def test_a_sleep_is_ok_with_no_metrics(job: Any) -> None:
    status, record, raw = job("probe.kind=sleep", "probe.sleep_s=0")
    assert status == "ok" and record.status is RecordStatus.OK
    assert record.reason == "probe.kind=sleep: nothing measured" and raw["metrics"] == {}
    typed = record.typed_config()
    assert isinstance(typed, Config) and typed.probe.kind == "sleep"


def test_the_probe_gets_the_typed_cell_and_its_outcome_is_the_record(job: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def probe(cell: Any, rank: int, world_size: int, local_rank: int, time_signal: Any) -> ProbeOutcome:
        seen.append(cell)
        metrics = Metrics(num_parameters=123, per_gpu_batch_size=16, micro_batch_size=1, startup_s=1.0)
        return outcome_of(Happened(Ending.NOTHING_FITS, "nothing fits"), metrics, {"torch": "x"}, time_signal())

    monkeypatch.setattr("orchestrator.job.probe.run_probe", probe)
    status, record, raw = job()
    assert isinstance(seen[0], Config) and seen[0].model.name == "pythia-tiny"
    assert status == "does_not_fit" and record.reason == "nothing fits"
    assert raw["metrics"] == {
        "num_parameters": 123, "per_gpu_batch_size": 16, "memory_limit_gib": None, "micro_batch_size": 1,
        "startup_s": 1.0,
    }  # fmt: skip
    assert raw["environment"]["torch"] == "x" and raw["environment"]["job_id"] == "7"


def test_an_exception_no_probe_caught_is_failed_or_after_sigterm_a_timeout(
    job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def probe(*args: Any, **kwargs: Any) -> ProbeOutcome:
        raise RuntimeError("the probe itself broke")

    monkeypatch.setattr("orchestrator.job.probe.run_probe", probe)
    status, record, _ = job()
    assert status == "failed" and record.reason == "RuntimeError: the probe itself broke"
    assert record.traceback is not None and "the probe itself broke" in record.traceback
    monkeypatch.setattr(jobside, "_time_limit_signal", TimeSignal("SIGTERM", time.time()))
    status, record, _ = job()
    assert status == "timeout" and record.reason is not None and "SLURM's time limit: SIGTERM" in record.reason


def test_the_first_rank_to_fail_writes_the_record_and_a_peer_failing_after_it_does_not(
    tmp_path: Path, make_cell: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = SimpleNamespace(global_rank=1, num_tasks=2, local_rank=1, num_nodes=1, job_id="7", hostnames=["here"])
    monkeypatch.setattr(jobside.submitit, "JobEnvironment", lambda: fake)
    monkeypatch.setattr(jobside, "set_distributed_env", lambda *args: None)
    monkeypatch.setattr(jobside, "_time_limit_signal", None)
    monkeypatch.setattr(jobside, "PEER_RECORD_DELAY_S", 0.0)
    monkeypatch.setenv("GPUDAYS_DIST_TIMEOUT_S", "0")
    for name in ("DS_ACCELERATOR", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    paths = SweepPaths(tmp_path)
    paths.cell_dir("abc").mkdir(parents=True)
    cell = make_cell("model=pythia-tiny", "gpu=cpu", "probe.kind=fail", "probe.fail_rank=1", "num_gpus=2")
    (paths.cell_dir("abc") / CELL_CONFIG_NAME).write_text(yaml.safe_dump(cell))
    assert jobside.run_cell(str(tmp_path), "abc", 1) == "failed"  # rank 1: the one that fails
    record = read_record(paths.record("abc"), "abc")
    assert isinstance(record, Record) and record.reason is not None
    assert record.reason.startswith("rank 1: InjectedFailure: probe.kind=fail")
    assert record.environment["recorded_by_rank"] == 1 and record.traceback and "fail_probe" in record.traceback
    fake.global_rank, fake.local_rank = 0, 0  # rank 0 then fails too, as a peer left in a collective would
    assert jobside.run_cell(str(tmp_path), "abc", 1) == "failed"
    again = read_record(paths.record("abc"), "abc")
    assert isinstance(again, Record) and again.reason == record.reason, "the first failure is the record"


def test_a_rank_that_ended_its_cell_badly_exits_non_zero_on_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    statuses = iter(["failed", "ok", "does_not_fit", "comm_error"])
    monkeypatch.setattr(jobside, "run_cell", lambda *args: next(statuses))
    monkeypatch.setattr(jobside, "superseded", lambda *args: False)
    monkeypatch.setattr(jobside.CellJob, "_guard_time_limit", lambda self: None)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    job = jobside.CellJob("/sweep", "abc", 1)
    with pytest.raises(jobside.RankEnded, match="ended failed on this rank"):
        job()
    assert job() == "ok" and job() == "does_not_fit", "ranks that end together exit 0"
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    assert job() == "comm_error", "no srun to end the peers: the status is returned"


def test_the_record_lists_the_nodes_other_jobs_and_says_whether_it_was_shared(
    job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.job import env as job_env
    from orchestrator.slurm import commands as slurm
    from orchestrator.slurm import site as slurm_site

    queue = [[("7", "7", "me"), ("41", "40_1", "alice")], [("7", "7", "me")]]
    monkeypatch.setattr(slurm, "jobs_on_nodes", lambda nodes: queue.pop(0))
    monkeypatch.setattr(slurm_site, "private_data", lambda: frozenset())
    monkeypatch.setattr(job_env, "_HIDDEN", [])
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    _, _, raw = job("probe.kind=sleep")
    env = raw["environment"]
    assert env["node_jobs_at_start"] == ["40_1 alice"] and env["node_jobs_at_end"] == []
    assert env["shared_node"] is True, "a job beside it at the start is enough"

    def broken(nodes: str) -> Any:
        raise slurm.SlurmUnavailable("squeue did not answer")

    monkeypatch.setattr(slurm, "jobs_on_nodes", broken)
    status, _, raw = job("probe.kind=sleep")
    assert status == "ok" and raw["environment"]["shared_node"] is None, "unknown, and the cell is not failed for it"
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    assert job("probe.kind=sleep")[2]["environment"]["node_jobs_at_start"] is None, "not a SLURM job"


def test_where_other_users_jobs_are_hidden_a_node_with_none_listed_is_not_called_unshared(
    job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.job import env as job_env
    from orchestrator.slurm import commands as slurm
    from orchestrator.slurm import site as slurm_site

    monkeypatch.setattr(slurm, "jobs_on_nodes", lambda nodes: [("7", "7", "me")])
    monkeypatch.setattr(slurm, "run", lambda *a, **k: SimpleNamespace(stdout="PrivateData             = jobs,usage\n"))
    assert slurm_site.private_data() == frozenset({"jobs", "usage"})
    monkeypatch.setattr(job_env, "_HIDDEN", [])
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node1")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    _, _, raw = job("probe.kind=sleep")
    env = raw["environment"]
    assert env["shared_node"] is None, "only the user's own jobs could be seen: unknown, not unshared"
    assert env["other_users_jobs_hidden"] is True and env["node_jobs_at_start"] is None


@pytest.mark.parametrize("answer", ["ok", "does_not_fit", "oom"])
def test_a_run_that_finds_its_own_attempt_answered_measures_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    # A node failed after the record was written, before the job ended: SLURM requeued the job (same id, same
    # attempt), and the second run measured the cell again and wrote over the first answer.
    from orchestrator.store.attempts import Attempt, append_attempt
    from orchestrator.store.record import write_record

    paths = SweepPaths(tmp_path)
    append_attempt(paths, Attempt("abc", 2, "7", "slurm"))
    write_record(paths.record("abc"), Record("abc", RecordStatus(answer), 2, reason="measured"))
    before = paths.record("abc").read_bytes()

    def measures(*args: Any) -> str:
        raise AssertionError("the cell was measured twice under one attempt")

    monkeypatch.setattr(jobside, "run_cell", measures)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    assert jobside.CellJob(str(tmp_path), "abc", 2)() == "answered"
    assert paths.record("abc").read_bytes() == before
    # An answer of an earlier attempt, or a failure of this one, is no answer to this attempt: it runs.
    ran: list[int] = []
    monkeypatch.setattr(
        jobside, "run_cell", lambda root, cid, attempt, requeues, submitted_by=None: ran.append(attempt) or "ok"
    )
    for record in (Record("abc", RecordStatus(answer), 1), Record("abc", RecordStatus.FAILED, 2, reason="boom")):
        write_record(paths.record("abc"), record)
        assert jobside.CellJob(str(tmp_path), "abc", 2)() == "ok"
    assert ran == [2, 2]


def test_a_record_is_never_written_over_another_without_the_first_kept(
    job: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run of attempt 1 failed and wrote its record; SLURM ran the job again (a node failure), and it ended ok:
    # the failure was written over, and with it what the first run said.
    paths = SweepPaths(tmp_path)
    assert job("probe.kind=fail", "probe.sleep_s=0")[0] == "failed"
    assert job("probe.kind=sleep", "probe.sleep_s=0")[0] == "ok"
    kept = read_record(paths.cell_dir("abc") / "record.attempt1.json", "abc")
    assert isinstance(kept, Record) and kept.status is RecordStatus.FAILED and kept.attempt == 1
    # Where the record there cannot be moved aside, the new one goes beside it, never over it.
    before = paths.record("abc").read_bytes()

    def refused(self: Path, target: Any) -> Path:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "rename", refused)
    jobside.run_cell(str(tmp_path), "abc", 1)
    assert paths.record("abc").read_bytes() == before
    beside = read_record(paths.cell_dir("abc") / "record.attempt1.2.json", "abc")
    assert isinstance(beside, Record) and beside.status is RecordStatus.OK


def test_every_record_names_its_gpudays_and_a_job_of_another_version_refuses(
    job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.store.version import gpudays_version

    mine = gpudays_version()
    status, record, raw = job("probe.kind=sleep", "probe.sleep_s=0", submitted_by=mine)
    assert status == "ok" and raw["gpudays_version"] == mine and record.gpudays_version == mine
    assert raw["schema_version"] == 2 and raw["environment"]["gpudays_submitted_by"] == mine

    def probe(*args: Any, **kwargs: Any) -> ProbeOutcome:
        raise AssertionError("nothing is measured under another version")

    monkeypatch.setattr("orchestrator.job.probe.run_probe", probe)
    status, record, raw = job(submitted_by="0.0.1+git.000000000000")
    assert status == "failed" and record.status is RecordStatus.FAILED
    assert record.reason is not None and "0.0.1+git.000000000000" in record.reason and mine in record.reason
    assert "reinstall" in record.reason and "gpudays resume" in record.reason
    assert record.gpudays_version == mine


def test_a_job_that_cannot_read_its_commit_compares_package_versions_only(
    job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A compute node without git (or a checkout git will not read there): the job knows only "0.1.0".
    from orchestrator.store.version import same_gpudays

    monkeypatch.setattr(jobside, "gpudays_version", lambda: "0.1.0")
    status, record, raw = job("probe.kind=sleep", "probe.sleep_s=0", submitted_by="0.1.0+git.1b9c968a2f3e")
    assert status == "ok" and record.gpudays_version == "0.1.0"
    assert raw["environment"]["gpudays_submitted_by"] == "0.1.0+git.1b9c968a2f3e"
    status, record, _ = job("probe.kind=sleep", "probe.sleep_s=0", submitted_by="0.2.0+git.1b9c968a2f3e")
    assert status == "failed" and record.reason is not None and "0.2.0+git.1b9c968a2f3e" in record.reason
    assert same_gpudays("0.1.0", "0.1.0+git.abc") and same_gpudays("0.1.0+git.abc", "0.1.0+git.abc")
    assert not same_gpudays("0.1.0+git.abc", "0.1.0+git.def") and not same_gpudays("0.1.0", "0.2.0")


def test_a_cpu_rank_runs_the_threads_it_was_given_at_most_the_cores_it_has(
    job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    # The sbatch script exported 4 CPUs a task (cluster.cpus_per_gpu) on a node whose host has 2 cores.
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    job("probe.kind=sleep", "probe.sleep_s=0")
    assert os.environ["OMP_NUM_THREADS"] == "2"
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # an honest node: what was given
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    job("probe.kind=sleep", "probe.sleep_s=0")
    assert os.environ["OMP_NUM_THREADS"] == "4"
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")  # nested levels: the site's own
    job("probe.kind=sleep", "probe.sleep_s=0")
    assert os.environ["OMP_NUM_THREADS"] == "4,2"
    monkeypatch.delenv("OMP_NUM_THREADS")  # nothing exported: the cell's cpus_per_gpu (local: 1)
    job("probe.kind=sleep", "probe.sleep_s=0")
    assert os.environ["OMP_NUM_THREADS"] == "1"


def test_a_cell_job_pickled_without_a_version_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(jobside, "run_cell", lambda *args: seen.append(args) or "ok")
    monkeypatch.setattr(jobside, "superseded", lambda *args: False)
    monkeypatch.setattr(jobside, "answered", lambda *args: False)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    old = jobside.CellJob("/sweep", "abc", 1)
    del old.__dict__["submitted_by"]  # as an older gpudays pickled it
    assert old() == "ok" and seen[-1][-1] is None
    assert jobside.CellJob("/sweep", "abc", 1, "1.0")() == "ok" and seen[-1][-1] == "1.0"


def test_a_rank_cancelled_while_it_sets_up_ends_quietly_as_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cancel's SIGTERM reaches a slow rank before its probe began (its peer already measuring): the handler's
    # JobCancelled ends it as its peers end, with no traceback for submitit to print.
    def cancelled_in_setup(*args: object, **kwargs: object) -> str:
        raise jobside.JobCancelled("the scheduler cancelled job 7 (scancel)")

    monkeypatch.setattr(jobside, "run_cell", cancelled_in_setup)
    monkeypatch.setattr(jobside, "answered", lambda *args: False)
    monkeypatch.setattr(jobside, "superseded", lambda *args: False)
    monkeypatch.setattr(jobside.CellJob, "_guard_time_limit", lambda self: None)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    assert jobside.CellJob("/sweep", "abc", 1)() == RecordStatus.CANCELLED.value
