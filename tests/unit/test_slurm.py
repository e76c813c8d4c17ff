"""Parsing what SLURM's commands print (text as SLURM 22.05 prints it on the local cluster); no cluster needed."""

from __future__ import annotations

import pytest

from orchestrator.slurm import commands as slurm
from orchestrator.slurm import errors as slurm_errors
from orchestrator.slurm import site as slurm_site
from orchestrator.slurm.commands import JobId


def test_job_ids_parse_once_into_a_job_and_an_optional_task() -> None:
    assert JobId.parse("12") == JobId(12) and str(JobId.parse("12")) == "12"
    assert JobId.parse("12_3") == JobId(12, 3) and str(JobId(12, 3)) == "12_3"
    assert JobId.parse(" 12_3 ").array == "12"
    for bad in ("", "12_", "abc", "12_[4-7]", "12.batch", "12_3_4"):
        with pytest.raises(ValueError, match="not a SLURM job id"):
            JobId.parse(bad)


def test_array_ranges_expand_to_every_task() -> None:
    assert slurm.expand_job_ids("12_[4-7%2]") == [JobId(12, t) for t in (4, 5, 6, 7)]
    assert slurm.expand_job_ids("12_[3-5,7]") == [JobId(12, t) for t in (3, 4, 5, 7)]
    assert slurm.expand_job_ids("12_[9]") == [JobId(12, 9)]
    assert slurm.expand_job_ids("12_3") == [JobId(12, 3)]
    assert slurm.expand_job_ids("12") == [JobId(12)]


def test_sacct_gives_each_task_its_newest_run_the_runs_before_and_each_arrays_own_record() -> None:
    text = "\n".join(
        [
            "40_0|41|COMPLETED|0:0|None",
            "40_1|42|CANCELLED by 0|0:15|None",
            "40_2|43|REQUEUED|0:0|None",
            "40_2|43|NODE_FAIL|0:0|None",
            "40_2|43|RUNNING|0:0|None",
            "40_[5-7,9%2]|40|PENDING|0:0|JobArrayTaskLimit",
            "41|41|TIMEOUT|0:0|None",
            "50|50|CANCELLED by 1000|0:0|None",
            "garbage line",
            "",
        ]
    )
    acct = slurm.parse_sacct(text)
    jobs = acct.jobs
    assert jobs[JobId(40, 0)].state == "COMPLETED" and jobs[JobId(40, 0)].history == ()
    assert jobs[JobId(40, 1)].state == "CANCELLED" and jobs[JobId(40, 1)].raw_state == "CANCELLED by 0"
    assert jobs[JobId(40, 1)].exit_code == "0:15"
    assert jobs[JobId(40, 2)].state == "RUNNING" and jobs[JobId(40, 2)].history == ("REQUEUED", "NODE_FAIL")
    assert {j.task for j in jobs if j.job == 40} == {0, 1, 2, 5, 6, 7, 9}
    assert jobs[JobId(40, 9)].reason == "JobArrayTaskLimit"
    assert jobs[JobId(41)].state == "TIMEOUT"
    assert acct.arrays["40"].state == "PENDING"
    assert acct.arrays["50"].state == "CANCELLED"  # an array cancelled before any task started
    assert acct.seen == {"40", "41", "50"}


def test_the_last_task_to_start_reuses_the_arrays_raw_id_and_is_still_a_task() -> None:
    acct = slurm.parse_sacct("24_6|34|COMPLETED|0:0|None\n24_7|24|COMPLETED|0:0|JobArrayTaskLimit\n")
    assert JobId(24, 7) in acct.jobs and "24" not in acct.arrays


def test_sacct_in_the_three_column_form_is_read_too() -> None:
    acct = slurm.parse_sacct("40_1|CANCELLED by 0|0:15\n40_[2-3]|PENDING|0:0\n")
    assert acct.jobs[JobId(40, 1)].state == "CANCELLED" and acct.jobs[JobId(40, 3)].state == "PENDING"


def test_squeue_expands_pending_ranges_and_keeps_why_a_job_waits() -> None:
    acct = slurm.parse_squeue("36_[1-3%1]|PENDING|JobArrayTaskLimit\n36_4|PENDING|JobHeldUser\n36_0|RUNNING|None\n\n")
    assert {str(j): v.state for j, v in acct.jobs.items()} == {
        "36_1": "PENDING",
        "36_2": "PENDING",
        "36_3": "PENDING",
        "36_4": "PENDING",
        "36_0": "RUNNING",
    }
    assert acct.jobs[JobId(36, 4)].reason == "JobHeldUser"
    assert acct.jobs[JobId(36, 0)].reason is None


def test_squeue_overrides_sacct_where_asked() -> None:
    acct = slurm.parse_sacct("36_2|37|PENDING|0:0|None\n")
    acct.merge(slurm.parse_squeue("36_2|PENDING|JobHeldAdmin\n"), prefer_other=True)
    assert acct.jobs[JobId(36, 2)].reason == "JobHeldAdmin"
    kept = slurm.parse_sacct("36_2|37|RUNNING|0:0|None\n")
    kept.merge(slurm.parse_squeue("36_2|PENDING|None\n"))
    assert kept.jobs[JobId(36, 2)].state == "RUNNING"


def test_sinfo_lines_describe_each_partition() -> None:
    (debug, gpu) = slurm_site.parse_sinfo(
        "debug|2|4|7900|gpu:a100:4|(null)|1:00:00\ngpu|1|8|64000|(null)|a100|infinite\n"
    )
    assert debug.name == "debug" and debug.gres == "gpu:a100:4" and gpu.time_limit == "infinite"
    assert debug.describe() == (
        "partition debug: 2 node(s) of 4 CPUs, 7900 MB, gres gpu:a100:4, features (null), time limit 1:00:00"
    )


def test_a_missing_command_is_unavailable_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(slurm.SlurmUnavailable, match="`sacct` is not on PATH"):
        slurm.sacct([JobId(1, 2)])
    assert slurm_site.max_array_size() is None
    assert slurm_site.sacctmgr_names(["show", "qos"]) is None


NO_CONFIG = """sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host
sinfo: error: fetch_config: DNS SRV lookup failed
sinfo: error: _establish_config_source: failed to fetch config
sinfo: fatal: Could not establish a configuration source
"""


def test_slurm_without_a_configuration_is_one_line_naming_cluster_env() -> None:
    # Forgetting `eval $(gpudays cluster env)` gave seven lines of resolve_ctls_from_dns_srv errors and no hint.
    said = slurm_errors.explain_failure("sinfo", 1, NO_CONFIG)
    assert "eval $(gpudays cluster env)" in said and "resolve_ctls" not in said and "\n" not in said
    assert slurm_errors.controller_down(said)
    down = slurm_errors.explain_failure(
        "sinfo", 1, "slurm_load_partitions: Unable to contact slurm controller (connect failure)\n"
    )
    assert slurm_errors.controller_down(down) and "Unable to contact slurm controller" in down
    assert not slurm_errors.controller_down(
        slurm_errors.explain_failure("sbatch", 1, "sbatch: error: invalid partition specified")
    )


def test_a_sweep_the_scheduler_cannot_be_asked_about_exits_as_the_readme_says(monkeypatch, make_typed) -> None:
    # A sweep while the controller is down exited 2 (bad input); the README gives it 3 (the scheduler).
    from orchestrator.cli import errors
    from orchestrator.cli import flow as lifecycle

    def down() -> list[str]:
        raise slurm.SlurmUnavailable(slurm_errors.explain_failure("sinfo", 1, "Unable to contact slurm controller\n"))

    monkeypatch.setattr(slurm_site, "partitions", down)
    with pytest.raises(errors.CommandError) as info:
        lifecycle.check({"c1": make_typed("cluster=slurm", "gpu=cpu", "model=pythia-tiny")})
    assert info.value.code == errors.Exit.SCHEDULER and "could not be asked" in str(info.value)


@pytest.mark.parametrize(
    ("shown", "accounted", "cancelled"),
    [
        ("JobState=CANCELLED Reason=None", [], True),
        ("JobState=RUNNING Reason=None", [], False),
        # A job being killed shows COMPLETING in scontrol, whatever ended it: accounting names the state under it.
        ("JobState=COMPLETING Reason=None", ["RUNNING", "CANCELLED by 0"], True),
        ("JobState=COMPLETING Reason=None", ["TIMEOUT"], False),
    ],
)
def test_a_cancel_is_told_by_the_scheduler_even_while_the_job_is_completing(
    monkeypatch: pytest.MonkeyPatch, shown: str, accounted: list[str], cancelled: bool
) -> None:
    import subprocess

    answers = iter(accounted)

    def run(cmd, stdin=None, timeout_s=0.0):  # noqa: ANN001, ANN202 - stands in for slurm.run
        out = f"JobId=7 {shown}\n" if cmd[0] == "scontrol" else f"{next(answers)}\n"
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(slurm, "run", run)
    assert slurm.was_cancelled("7_0", pause_s=0.0) is cancelled
