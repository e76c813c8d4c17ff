"""The job id in cells.csv is the one `gpudays status` and squeue show: ARRAY_TASK for an array task."""

from __future__ import annotations

from analysis.sweeps.records import scheduler_job_id


def test_an_array_task_is_named_by_its_array_and_task() -> None:
    env = {"slurm_job_id": "18", "slurm_array_job_id": "9", "slurm_array_task_id": "0", "job_id": "9_0"}
    assert scheduler_job_id(env) == "9_0"
    assert scheduler_job_id({"slurm_job_id": "18", "slurm_array_job_id": 9, "slurm_array_task_id": 0}) == "9_0"


def test_a_plain_job_and_a_local_run_keep_their_id() -> None:
    assert scheduler_job_id({"slurm_job_id": "42"}) == "42"
    assert scheduler_job_id({"job_id": "12345"}) == "12345"
    assert scheduler_job_id({}) is None
