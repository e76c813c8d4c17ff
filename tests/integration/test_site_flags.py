"""A cluster's own flags on the real local SLURM cluster: a Python wrapper (as a container would be) starts every
rank, a site's sbatch option is accepted, and a sweep submitted from inside an allocation (``salloc``) runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main as cli
from orchestrator.store.paths import SweepPaths

pytestmark = [pytest.mark.slurm]


def _job(record: dict[str, object]) -> str:
    """The job sacct knows the record's attempt by: ``ARRAY_TASK`` for an array task, else the job id."""
    env = record["environment"]
    assert isinstance(env, dict)
    if env.get("slurm_array_job_id") is not None:
        return f"{env['slurm_array_job_id']}_{env['slurm_array_task_id']}"
    return str(env["slurm_job_id"])


def test_python_wrapper_runs_every_rank_and_an_allocation_does_not_leak(
    slurm_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "wrapper.log"
    wrapper = tmp_path / "python-wrapper.sh"
    # What `apptainer exec --nv image.sif python3` stands for: a command that starts Python with the arguments given.
    wrapper.write_text(f'#!/bin/sh\necho "rank $SLURM_PROCID of $SLURM_NTASKS" >> {log}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    # What a shell inside `salloc -N3 -n7 --mem-per-cpu=100` carries; sbatch would take it for the new job's own.
    for name, value in {
        "SLURM_JOB_ID": "999999",
        "SLURM_JOBID": "999999",
        "SLURM_NNODES": "3",
        "SLURM_NTASKS": "7",
        "SLURM_MEM_PER_CPU": "100",
        "SLURM_CPUS_PER_TASK": "5",
    }.items():
        monkeypatch.setenv(name, value)
    sweep_dir = tmp_path / "site"
    code = cli.main(
        [
            "sweep", "--dir", str(sweep_dir), "--no-report", "cluster=slurm", "model=pythia-tiny", "gpu=cpu",
            "probe.kind=sleep", "probe.sleep_s=1", "num_gpus=2", "cluster.cpus_per_gpu=1",
            "cluster.time_limit_min=5", "cluster.mem_gb_per_gpu=1", f"cluster.python={wrapper}", "+cluster.sbatch_extra.comment=site-flag",
            "+cluster.sbatch_extra.export=NONE", "--wait",
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, out
    # A site that submits with --export=NONE: said at submission, and the ranks still get the job's environment.
    assert "--export=NONE (cluster.sbatch_extra.export=NONE)" in err, err
    paths = SweepPaths(sweep_dir)
    (cell_id,) = paths.cell_ids()
    record = json.loads(paths.record(cell_id).read_text())
    assert record["status"] == "ok", record["reason"]
    assert record["environment"]["world_size"] == 2
    # The submitting gpudays is in the sweep (the attempt's line) and went with the job, which ran the same one.
    from orchestrator.store.attempts import read_attempts
    from orchestrator.store.version import gpudays_version

    assert read_attempts(paths, cell_id)[-1].gpudays == gpudays_version() == record["gpudays_version"]
    assert record["schema_version"] == 2 and record["environment"]["gpudays_submitted_by"] == gpudays_version()
    logs = "".join(p.read_text() for p in paths.submitit_folder().parent.rglob("*_log.err"))
    assert "submitted with --export=NONE; its ranks are started with srun --export=ALL" in logs, logs[-2000:]
    rank_cpus = record["environment"]["rank_cpus"]
    assert len(rank_cpus) == 2 and all(cpus and all(isinstance(c, int) for c in cpus) for cpus in rank_cpus)
    assert sorted(log.read_text().splitlines()) == ["rank 0 of 2", "rank 1 of 2"], "every rank through the wrapper"
    scripts = list(paths.submitit_folder().parent.rglob("*_submission.sh"))
    assert scripts and all("#SBATCH --comment=site-flag" in s.read_text() for s in scripts)


def test_dry_run_accepts_a_comma_list_of_partitions_and_shows_the_job_script(
    slurm_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["sweep", "--dry-run", "--dir", str(tmp_path / "dry"), "cluster=slurm", "model=pythia-tiny", "gpu=cpu"]
    site = ["probe.kind=sleep", "cluster.cpus_per_gpu=1", "cluster.srun_args=['--cpu-bind=none']"]
    code = cli.main([*common, *site, "cluster.partition='debug,urgent'", "+cluster.sbatch_extra.comment=dry"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "#SBATCH --partition=debug,urgent" in out and "#SBATCH --comment=dry" in out
    srun = next(line for line in out.splitlines() if line.startswith("srun "))
    words = srun.split()
    for flag in ("--cpus-per-task=1", "--kill-on-bad-exit=1", "--cpu-bind=none", "--export=ALL"):
        assert flag in words, (flag, srun)  # the site's srun_args beside gpudays' own, --export=ALL among them
    assert "-m submitit.core._submit" in srun
    assert not (tmp_path / "dry" / "cells").exists() or not any((tmp_path / "dry" / "cells").iterdir())

    code = cli.main([*common, *site, "cluster.partition='debug,nosuch'"])
    captured = capsys.readouterr()
    assert code != 0
    assert "'nosuch' is not a partition here" in captured.out + captured.err


def test_a_mixed_grid_goes_to_a_partition_per_gpu_type(
    slurm_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The local cluster's nodes have one fake GPU type (gres a100); both GPU configs request it, each from a
    # partition of its own, as a site holding A100s and H100s in different partitions has them.
    sweep_dir = tmp_path / "mixed"
    code = cli.main(
        [
            "sweep", "-m", "--dir", str(sweep_dir), "--no-report", "cluster=slurm", "model=pythia-tiny",
            "gpu=a100-80gb,h100-80gb", "probe.kind=sleep", "probe.sleep_s=1", "cluster.cpus_per_gpu=1",
            "cluster.time_limit_min=5", "+cluster.partition_by_gpu={a100-80gb: debug, h100-80gb: urgent}",
            "+cluster.gres_by_gpu={a100-80gb: a100, h100-80gb: a100}", "--wait",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    paths = SweepPaths(sweep_dir)
    jobs = {}
    for cell_id in paths.cell_ids():
        record = json.loads(paths.record(cell_id).read_text())
        assert record["status"] == "ok", record["reason"]
        jobs[record["settings"]["gpu"]] = _job(record)
    partitions = {
        gpu: slurm_cluster.run_client(["sacct", "-n", "-X", "-P", "-j", job, "-o", "Partition"]).split()[0]
        for gpu, job in jobs.items()
    }
    assert partitions == {"a100-80gb": "debug", "h100-80gb": "urgent"}


def test_exclusive_cells_never_share_a_node(slurm_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir = tmp_path / "exclusive"
    code = cli.main(
        [
            "sweep", "-m", "--dir", str(sweep_dir), "--no-report", "cluster=slurm", "model=pythia-tiny",
            "gpu=a100-80gb", "probe.kind=sleep", "probe.sleep_s=3", "cluster.cpus_per_gpu=1",
            "cluster.gpus_per_node=4", "cluster.exclusive=true", "cluster.time_limit_min=5", "model.seq_length=32,33,34", "--wait",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    paths = SweepPaths(sweep_dir)
    spans = []
    for cell_id in paths.cell_ids():
        record = json.loads(paths.record(cell_id).read_text())
        assert record["status"] == "ok", record["reason"]
        fields = slurm_cluster.run_client(["sacct", "-n", "-X", "-P", "-j", _job(record), "-o", "NodeList,Start,End"])
        node, start, end = fields.split()[0].split("|")
        spans.append((node, start, end))
    assert len(spans) == 3
    for i, (node, start, end) in enumerate(spans):
        for other, other_start, other_end in spans[i + 1 :]:
            assert node != other or end <= other_start or other_end <= start, spans


def test_a_sweep_larger_than_a_qos_per_user_job_limit_ends_with_every_cell_ok(
    slurm_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = slurm_cluster.run_client
    enforce = next(
        line for line in run(["scontrol", "show", "config"]).splitlines() if "AccountingStorageEnforce" in line
    )
    assert "limits" in enforce, f"a cluster started by an older gpudays enforces no limits ({enforce}): restart it"
    qos = "gpudays-limited"
    run(["sacctmgr", "-i", "add", "qos", qos, "MaxSubmitJobsPerUser=2"], check=False)
    run(["sacctmgr", "-i", "modify", "qos", qos, "set", "MaxSubmitJobsPerUser=2"])
    run(["sacctmgr", "-i", "modify", "user", "root", "set", f"qos+={qos}"])
    try:
        # The limit is real, and counts array tasks: a 3-task array is refused outright.
        refused = run(["sbatch", f"--qos={qos}", "--array=0-2", "--wrap=true", "--output=/dev/null"], check=False)
        assert "Submitted" not in refused
        sweep_dir = tmp_path / "limited"
        code = cli.main(
            [
                "sweep", "-m", "--dir", str(sweep_dir), "--no-report", "cluster=slurm", "model=pythia-tiny",
                "gpu=cpu", "probe.kind=sleep", "probe.sleep_s=1", "model.seq_length=32,33,34,35,36", "cluster.cpus_per_gpu=1",
                "cluster.time_limit_min=5", f"cluster.qos={qos}", "--wait",
            ]
        )  # fmt: skip
        out = capsys.readouterr().out
        assert code == 0, out
        assert "3 cell(s) held back" in out and f"QOS {qos!r} allows 2 queued jobs per user" in out, out
        paths = SweepPaths(sweep_dir)
        records = [json.loads(paths.record(cid).read_text()) for cid in paths.cell_ids()]
        assert len(records) == 5 and all(r["status"] == "ok" for r in records), [r["reason"] for r in records]
    finally:
        run(["sacctmgr", "-i", "modify", "user", "root", "set", f"qos-={qos}"], check=False)
        run(["sacctmgr", "-i", "delete", "qos", qos], check=False)


def test_a_sweep_larger_than_its_partitions_qos_limit_ends_with_every_cell_ok(
    slurm_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = slurm_cluster.run_client
    qos = "gpudays-partition"
    run(["sacctmgr", "-i", "add", "qos", qos, "MaxSubmitJobsPerUser=2"], check=False)
    run(["sacctmgr", "-i", "modify", "qos", qos, "set", "MaxSubmitJobsPerUser=2"])
    # The partition's QOS (Partition QOS= in slurm.conf) limits every job in it, whatever QOS the job names.
    run(["scontrol", "update", "PartitionName=urgent", f"QOS={qos}"])
    try:
        sweep_dir = tmp_path / "partition-limited"
        code = cli.main(
            [
                "sweep", "-m", "--dir", str(sweep_dir), "--no-report", "cluster=slurm", "model=pythia-tiny",
                "gpu=cpu", "probe.kind=sleep", "probe.sleep_s=1", "model.seq_length=32,33,34", "cluster.cpus_per_gpu=1",
                "cluster.time_limit_min=5", "cluster.partition=urgent", "--wait", "--interval", "1",
            ]
        )  # fmt: skip
        out = capsys.readouterr().out
        assert code == 0, out
        assert "1 cell(s) held back" in out and f"partition's QOS {qos!r} allows 2 queued jobs per user" in out, out
        paths = SweepPaths(sweep_dir)
        records = [json.loads(paths.record(cid).read_text()) for cid in paths.cell_ids()]
        assert len(records) == 3 and all(r["status"] == "ok" for r in records), [r["reason"] for r in records]
    finally:
        run(["scontrol", "update", "PartitionName=urgent", "QOS="], check=False)
        run(["sacctmgr", "-i", "delete", "qos", qos], check=False)


def test_one_crashed_rank_ends_its_cell_at_once_with_a_classified_record(
    slurm_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    sweep_dir = tmp_path / "crash"
    started = time.monotonic()
    code = cli.main(
        [
            "sweep", "--dir", str(sweep_dir), "--no-report", "cluster=slurm", "model=pythia-tiny", "gpu=cpu",
            "num_gpus=2", "probe.kind=fail", "probe.fail_rank=1", "probe.sleep_s=1", "cluster.cpus_per_gpu=1",
            "cluster.time_limit_min=3", "--wait", "--interval", "1",
        ]
    )  # fmt: skip
    took_s = time.monotonic() - started
    out = capsys.readouterr().out
    assert code == 1, out
    paths = SweepPaths(sweep_dir)
    (cell_id,) = paths.cell_ids()
    record = json.loads(paths.record(cell_id).read_text())
    assert record["status"] == "failed" and record["reason"].startswith("rank 1: InjectedFailure"), record["reason"]
    assert record["environment"]["recorded_by_rank"] == 1
    # Rank 0 waits 600 s for rank 1, as a collective would: srun --kill-on-bad-exit ends it when rank 1 exits.
    assert took_s < 90, f"the cell took {took_s:.0f} s: rank 0 was left waiting"


def test_cells_sharing_a_node_are_recorded_and_flagged_by_the_report(
    slurm_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_dir = tmp_path / "shared"
    # Each cell sleeps 15 s, so that the two overlap even when one job's start-up is slow on a busy machine.
    code = cli.main(
        [
            "sweep", "-m", "--dir", str(sweep_dir), "cluster=slurm", "model=pythia-tiny", "gpu=cpu",
            "probe.kind=sleep", "probe.sleep_s=15", "model.seq_length=32,33", "cluster.cpus_per_gpu=1",
            "cluster.time_limit_min=5", "cluster.exclusive=false", "+cluster.sbatch_extra.nodelist=node1", "--wait",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    paths = SweepPaths(sweep_dir)
    records = [json.loads(paths.record(cid).read_text()) for cid in paths.cell_ids()]
    assert all(r["environment"]["shared_node"] is True for r in records), [r["environment"] for r in records]
    jobs = {_job(r): r for r in records}
    for job, record in jobs.items():
        (other,) = set(jobs) - {job}
        seen = {entry.split()[0] for entry in record["environment"]["node_jobs_at_start"]}
        seen |= {entry.split()[0] for entry in record["environment"]["node_jobs_at_end"]}
        assert other in seen, (job, record["environment"])
    assert "measured on a node shared with other jobs" in (sweep_dir / "report.md").read_text()


def test_bound_ranks_each_hold_their_cpus_per_gpu(slurm_cluster, tmp_path: Path, capsys) -> None:
    # The local cluster binds tasks (task/affinity); a site's own binding comes through cluster.srun_args.
    sweep_dir = tmp_path / "bound"
    code = cli.main(
        [
            "sweep", "--dir", str(sweep_dir), "--no-report", "cluster=slurm", "model=pythia-tiny", "gpu=cpu",
            "num_gpus=2", "probe.kind=sleep", "probe.sleep_s=1", "cluster.cpus_per_gpu=1", "cluster.exclusive=true",
            "cluster.time_limit_min=5", "cluster.srun_args=['--cpu-bind=cores']", "--wait",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    paths = SweepPaths(sweep_dir)
    (cell_id,) = paths.cell_ids()
    rank_cpus = json.loads(paths.record(cell_id).read_text())["environment"]["rank_cpus"]
    assert [len(cpus) for cpus in rank_cpus] == [1, 1], rank_cpus
    assert rank_cpus[0] != rank_cpus[1], f"each rank on a CPU of its own: {rank_cpus}"
