"""A cluster's own sbatch and srun options and its Python command reach the job script, and only where they work."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.cells import cell as cells
from orchestrator.submission import launch


def _script(cell) -> str:
    res = launch.resources(cell)
    return launch.slurm_executor(res, "/sweeps/demo/jobs/%j")._make_submission_file_text("true", "0")


def _first_command(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))


def test_sbatch_extra_lands_among_the_directives_before_the_first_command(make_typed) -> None:
    cell = make_typed("cluster=example-university", "gpu=a100-80gb", "num_gpus=4")
    cell.cluster.sbatch_extra = {
        "reservation": "lab-week",
        "spread-job": "",
        "container-image": "nvcr.io#nvidia/pytorch:24.05-py3",
    }
    assert cell.cluster.env, "example-university exports env values, which used to end directive parsing"
    assert cells.check_values(cell) == []
    lines = _script(cell).splitlines()
    first = _first_command(lines)
    for directive in ("#SBATCH --reservation=lab-week", "#SBATCH --spread-job", "#SBATCH --requeue"):
        assert directive in lines[:first], directive
    assert "#SBATCH --container-image='nvcr.io#nvidia/pytorch:24.05-py3'" in lines[:first]


@pytest.mark.parametrize(
    ("sbatch_extra", "srun_args", "key", "names"),
    [
        ({"time": "10"}, [], "cluster.sbatch_extra.time", "cluster.time_limit_min"),
        ({"partition": "other"}, [], "cluster.sbatch_extra.partition", "cluster.partition"),
        ({"--job_name": "x"}, [], "cluster.sbatch_extra.--job_name", "name"),
        ({}, ["-c4"], "cluster.srun_args[0]", "cluster.cpus_per_gpu"),
        ({}, ["--output=x"], "cluster.srun_args[0]", "jobs/"),
        ({}, ["-K0"], "cluster.srun_args[0]", "one rank that fails ends its cell"),
        ({}, ["--kill-on-bad-exit=0"], "cluster.srun_args[0]", "one rank that fails ends its cell"),
    ],
)
def test_a_flag_gpudays_sets_cannot_be_passed_again(
    make_typed, sbatch_extra: dict[str, str], srun_args: list[str], key: str, names: str
) -> None:
    cell = make_typed("cluster=example-university", "gpu=a100-80gb")
    cell.cluster.sbatch_extra, cell.cluster.srun_args = sbatch_extra, srun_args
    refusals = [r for r in cells.check_values(cell) if r.key == key]
    assert len(refusals) == 1, cells.check_values(cell)
    assert names in refusals[0].reason


def test_an_sbatch_line_in_setup_is_refused_with_where_it_belongs(make_typed) -> None:
    cell = make_typed("cluster=example-university", "gpu=a100-80gb")
    cell.cluster.setup = [*cell.cluster.setup, "#SBATCH --exclusive"]
    key = f"cluster.setup[{len(cell.cluster.setup) - 1}]"
    (refusal,) = [r for r in cells.check_values(cell) if r.key == key]
    assert "cluster.sbatch_extra" in refusal.reason


def test_srun_args_follow_the_cpus_and_python_is_the_wrapper(make_typed) -> None:
    wrapper = "apptainer exec --nv /shared/gpudays.sif python3"
    cell = make_typed("cluster=example-university", "gpu=a100-80gb", "num_gpus=4")
    cell.cluster.srun_args, cell.cluster.python = ["--cpu-bind=cores"], wrapper
    assert cells.check_values(cell) == []
    res = launch.resources(cell)
    executor = launch.slurm_executor(res, "/sweeps/demo/jobs/%j")
    command = executor._submitit_command_str
    assert command.startswith(wrapper + " -u -m orchestrator.job.start -u -m submitit.core._submit")
    srun = next(
        line for line in executor._make_submission_file_text(command, "0").splitlines() if line.startswith("srun")
    )
    assert "--cpus-per-task=8 --kill-on-bad-exit=1 --export=ALL --cpu-bind=cores " + wrapper in srun


def test_planning_refuses_a_repeated_flag_before_submission(make_cell) -> None:
    from orchestrator.planning.plan import SweepError

    with pytest.raises(SweepError, match=r"cluster.sbatch_extra.time: gpudays sets --time itself"):
        make_cell("cluster=example-university", "gpu=a100-80gb", "+cluster.sbatch_extra.time=10")


def test_submission_hides_an_allocations_variables_but_keeps_the_cluster(monkeypatch) -> None:
    monkeypatch.setenv("SLURM_CONF", "/etc/site/slurm.conf")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_MEM_PER_CPU", "2000")
    with launch.submission_environment():
        assert os.environ.get("SLURM_CONF") == "/etc/site/slurm.conf"
        assert "SLURM_JOB_ID" not in os.environ and "SLURM_MEM_PER_CPU" not in os.environ
    assert os.environ["SLURM_JOB_ID"] == "77" and os.environ["SLURM_CONF"] == "/etc/site/slurm.conf"


def test_each_gpu_type_goes_to_its_own_partition_qos_and_account(make_typed) -> None:
    by_gpu = {}
    for gpu in ("a100-80gb", "h100-80gb", "v100-32gb"):
        cell = make_typed("cluster=example-university", f"gpu={gpu}")
        cell.cluster.partition_by_gpu = {"a100-80gb": "gpu-a100", "h100-80gb": "gpu-h100,gpu-h100-long"}
        cell.cluster.qos_by_gpu = {"h100-80gb": "h100"}
        cell.cluster.account_by_gpu = {"a100-80gb": "lab-a100"}
        assert cells.check_values(cell) == []
        res = launch.resources(cell)
        by_gpu[gpu] = (res.partition, res.qos, res.account)
    assert by_gpu == {
        "a100-80gb": ("gpu-a100", "normal", "lab-a100"),
        "h100-80gb": ("gpu-h100,gpu-h100-long", "h100", "mylab"),
        "v100-32gb": ("gpu", "normal", "mylab"),
    }
    assert len({launch.resources(make_typed("cluster=example-university", f"gpu={g}")) for g in by_gpu}) == 3


@pytest.mark.parametrize(
    ("overrides", "exclusive"),
    [
        (("gpu=a100-80gb", "num_gpus=1"), False),  # 1 of a node's 4 GPUs: exactly those, the rest is shared
        (("gpu=a100-80gb", "num_gpus=4"), False),  # the whole node already
        (("gpu=a100-80gb", "num_gpus=8", "num_nodes=2"), False),
        (("gpu=a100-80gb", "num_gpus=4", "cluster.exclusive=true"), True),
        (("gpu=a100-80gb", "num_gpus=1", "cluster.exclusive=false"), False),
        (("gpu=cpu", "num_gpus=1"), False),  # CPU cells (tests, the demo) share nodes
    ],
)
def test_exclusive_only_where_the_cluster_asks_for_it(make_typed, overrides, exclusive: bool) -> None:
    cell = make_typed("cluster=example-university", *overrides)
    assert launch.exclusive(cell) is exclusive
    lines = _script(cell).splitlines()
    assert ("#SBATCH --exclusive" in lines[: _first_command(lines)]) is exclusive


def test_exclusive_is_not_passed_a_second_time(make_typed) -> None:
    cell = make_typed("cluster=example-university", "gpu=a100-80gb")
    cell.cluster.sbatch_extra = {"exclusive": ""}
    (refusal,) = [r for r in cells.check_values(cell) if r.key == "cluster.sbatch_extra.exclusive"]
    assert "cluster.exclusive" in refusal.reason


def test_a_template_in_a_cd_folder_is_found_and_kept_as_its_path(tmp_path: Path) -> None:
    from orchestrator.planning.plan import plan

    (tmp_path / "cluster").mkdir()
    (tmp_path / "sbatch_templates").mkdir()
    (tmp_path / "cluster" / "my-site.yaml").write_text("backend: slurm\ntemplate: my-site.sh.j2\ncpus_per_gpu: 2\n")
    (tmp_path / "sbatch_templates" / "my-site.sh.j2").write_text(
        "module load site-cuda\nexport OMP_NUM_THREADS={{ cpus_per_task }}\n"
    )
    p = plan(["model=pythia-tiny", "gpu=cpu", "cluster=my-site"], search_dirs=[tmp_path])
    (cell,) = p.cells
    assert cell.typed.cluster.template == str(tmp_path.resolve() / "sbatch_templates" / "my-site.sh.j2")
    # Rendered from that path, with no -cd folder needed any more (resume reads it from cell.yaml).
    assert launch.render_setup(launch.resources(cell.typed)) == ["module load site-cuda", "export OMP_NUM_THREADS=2"]
    missing = plan(["model=pythia-tiny", "gpu=cpu", "cluster=slurm", "cluster.template=nowhere.sh.j2"])
    with pytest.raises(launch.SubmissionRefused, match="nor in a -cd folder's sbatch_templates/"):
        launch.render_setup(launch.resources(missing.cells[0].typed))


def test_export_none_still_gives_the_ranks_the_jobs_environment(make_typed) -> None:
    import subprocess

    cell = make_typed("cluster=example-university", "gpu=a100-80gb", "num_gpus=4")
    cell.cluster.sbatch_extra = {"export": "NONE"}
    assert cells.check_values(cell) == []
    res = launch.resources(cell)
    executor = launch.slurm_executor(res, "/sweeps/demo/jobs/%j")
    script = executor._make_submission_file_text(executor._submitit_command_str, "0").splitlines()
    assert "#SBATCH --export=NONE" in script
    srun = next(i for i, line in enumerate(script) if line.startswith("srun"))
    # srun inherits SLURM_EXPORT_ENV=NONE from such a job: told to pass the script's environment, the ranks keep
    # SUBMITIT_EXECUTOR, cluster.env and the setup's exports.
    assert "--export=ALL" in script[srun].split()
    assert script.index("export SUBMITIT_EXECUTOR=slurm") < srun
    said = script.index(launch.EXPORT_LOG_LINE)
    assert said < srun
    for value, heard in (("NONE", True), ("ALL", False), ("", False)):
        run = subprocess.run(["bash", "-c", launch.EXPORT_LOG_LINE], env={"SLURM_EXPORT_ENV": value},
                             capture_output=True, text=True, check=True)  # fmt: skip
        assert ("srun --export=ALL" in run.stderr) is heard, (value, run.stderr)
    note = launch.export_none(res, environ={})
    assert note is not None and "cluster.sbatch_extra.export=NONE" in note and "--export=ALL" in note


def test_a_site_wide_sbatch_export_none_is_noticed_and_an_own_srun_export_kept(make_typed) -> None:
    cell = make_typed("cluster=example-university", "gpu=a100-80gb", "num_gpus=4")
    res = launch.resources(cell)
    assert launch.export_none(res, environ={}) is None
    note = launch.export_none(res, environ={"SBATCH_EXPORT": "NONE"})
    assert note is not None and "SBATCH_EXPORT=NONE" in note
    cell.cluster.srun_args = ["--export=ALL,FOO=1"]
    own = launch.resources(cell)
    assert launch.srun_export(own) == []
    assert launch.slurm_parameters(own)["srun_args"].count("--export=ALL,FOO=1") == 1
    assert "--export=ALL" not in launch.slurm_parameters(own)["srun_args"]
