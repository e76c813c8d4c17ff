"""What goes to the scheduler: resources, grouping into arrays, and the sbatch text itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import submitit

from orchestrator.config.schema import Config
from orchestrator.store.paths import SweepPaths
from orchestrator.submission import launch, local

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


def _sbatch_text(cell: Config) -> str:
    res = launch.resources(cell)
    executor = submitit.SlurmExecutor(folder="/sweeps/demo/jobs/%j")
    executor.update_parameters(**launch.slurm_parameters(res))
    return executor._make_submission_file_text("python -u -m submitit.core._submit /sweeps/demo/jobs/%j", "0")


def test_two_node_sbatch_matches_the_reviewed_golden_file(make_typed) -> None:
    cell = make_typed(
        "cluster=example-university",
        "model=pythia-1b",
        "gpu=a100-80gb",
        "num_gpus=8",
        "num_nodes=2",
        "method.zero_stage=1",
    )
    assert _sbatch_text(cell) == (GOLDEN / "sbatch_a100-80gb_2x4.sh").read_text()


def test_cpu_cells_request_no_gpus_and_select_deepspeeds_cpu_accelerator(make_typed) -> None:
    text = _sbatch_text(make_typed("cluster=slurm", "num_gpus=2", "num_nodes=2"))
    assert "--gres" not in text
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    assert "export DS_ACCELERATOR=cpu" in text


def test_gres_type_comes_from_the_cluster_map_or_is_left_out(make_typed) -> None:
    mapped = launch.resources(
        make_typed("cluster=example-university", "gpu=h100-80gb", "num_gpus=4", "model=pythia-70m")
    )
    plain = launch.resources(make_typed("cluster=slurm", "gpu=h100-80gb", "num_gpus=4", "model=pythia-70m"))
    assert mapped.gres == "gpu:h100:4"
    assert plain.gres == "gpu:4"


def test_env_values_are_shell_quoted(make_typed) -> None:
    cell = make_typed("cluster=slurm", "+cluster.env.WEIRD='a b $(touch /tmp/pwned) `id`'")
    lines = launch.render_setup(launch.resources(cell))
    assert "export WEIRD='a b $(touch /tmp/pwned) `id`'" in lines


def test_cells_with_equal_resources_share_one_array(make_typed) -> None:
    cfgs = {
        "a": make_typed("cluster=slurm", "gpu=a100-80gb", "model=pythia-70m", "num_gpus=2"),
        "b": make_typed(
            "cluster=slurm", "gpu=a100-80gb", "model=pythia-160m", "num_gpus=2", "method.activation_checkpointing=true"
        ),
        "c": make_typed("cluster=slurm", "gpu=a100-80gb", "model=pythia-70m", "num_gpus=4"),
        "d": make_typed("cluster=slurm", "gpu=h100-80gb", "model=pythia-70m", "num_gpus=2"),
    }
    groups = sorted(sorted(ids) for ids in launch.group_by_resources(cfgs).values())
    # a and b differ only in what is measured; c asks for more GPUs; d's gres type is the same (untyped) gpu:2
    assert groups == [["a", "b", "d"], ["c"]]
    cfgs["d"] = make_typed("cluster=example-university", "gpu=h100-80gb", "model=pythia-70m", "num_gpus=2")
    groups = sorted(sorted(ids) for ids in launch.group_by_resources(cfgs).values())
    assert groups == [["a", "b"], ["c"], ["d"]]


def test_large_groups_split_at_max_array_size() -> None:
    chunks = list(launch._chunks([str(i) for i in range(2500)], 1000))
    assert [len(c) for c in chunks] == [1000, 1000, 500]


def test_single_node_gpu_sbatch_matches_the_reviewed_golden_file(make_typed) -> None:
    cell = make_typed(
        "cluster=example-university", "model=pythia-410m", "gpu=h100-80gb", "num_gpus=4", "method.zero_stage=1"
    )
    assert _sbatch_text(cell) == (GOLDEN / "sbatch_h100-80gb_1x4.sh").read_text()


def test_a_gpu_type_the_cluster_does_not_map_is_refused_not_untyped(make_typed) -> None:
    cell = make_typed("cluster=example-university", "gpu=h200", "num_gpus=4", "model=pythia-70m")
    with pytest.raises(launch.SubmissionRefused) as info:
        launch.check_gpu_types({"x": cell})
    message = str(info.value)
    assert "gpu=h200" in message and "gres_by_gpu" in message and "constraint_by_gpu" in message
    assert "a100-80gb" in message and "h100-80gb" in message, "the types the cluster maps are listed"
    assert "pythia-70m h200 x4" in message, "the cell is named"
    with pytest.raises(launch.SubmissionRefused):
        launch.resources(cell)  # never an untyped --gres=gpu:4 on the way to sbatch


def test_a_gpu_type_mapped_by_constraint_alone_is_accepted(make_typed) -> None:
    cell = make_typed(
        "cluster=example-university",
        "gpu=h200",
        "num_gpus=4",
        "model=pythia-70m",
        "+cluster.constraint_by_gpu.h200=h200",
    )
    launch.check_gpu_types({"x": cell})
    res = launch.resources(cell)
    assert res.constraint == "h200" and res.gres == "gpu:4"


class _Started(Exception):
    """Raised by the stand-in for submitit's job controller, with what it would have started the job with."""


def _what_submitit_hands_the_job(monkeypatch, tmp_path: Path, cell: Config, environ: dict[str, str]) -> dict:
    """Run submit_local up to the point where submitit starts the job's controller; return its arguments."""
    import submitit.local.local as submitit_local

    def start_controller(**kwargs):
        raise _Started(kwargs)

    monkeypatch.setattr(submitit_local, "start_controller", start_controller)
    for key in ("CUDA_VISIBLE_DEVICES",):
        monkeypatch.delenv(key, raising=False)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(_Started) as started:
        local.submit_local(SweepPaths(tmp_path), {"c": cell})
    return started.value.args[0]


@pytest.mark.parametrize("num_gpus", [1, 2, 4, 8])
def test_a_local_gpu_cell_runs_one_rank_per_gpu_and_sees_its_gpus(monkeypatch, tmp_path, make_typed, num_gpus) -> None:
    cell = make_typed("cluster=local", "gpu=h100-80gb", f"num_gpus={num_gpus}", "model=pythia-70m")
    started = _what_submitit_hands_the_job(monkeypatch, tmp_path, cell, {})
    assert started["tasks_per_node"] == num_gpus
    # submitit exports this as the job's CUDA_VISIBLE_DEVICES; rank r uses device r of it.
    assert started["cuda_devices"] == ",".join(str(i) for i in range(num_gpus))


def test_a_local_gpu_cell_uses_the_gpus_this_shell_was_given(monkeypatch, tmp_path, make_typed) -> None:
    cell = make_typed("cluster=local", "gpu=a100-80gb", "num_gpus=2", "model=pythia-70m")
    started = _what_submitit_hands_the_job(monkeypatch, tmp_path, cell, {"CUDA_VISIBLE_DEVICES": "5,7,3"})
    assert started["cuda_devices"] == "5,7"
    uuids = "GPU-aaaa,GPU-bbbb"
    started = _what_submitit_hands_the_job(monkeypatch, tmp_path, cell, {"CUDA_VISIBLE_DEVICES": uuids})
    assert f"export CUDA_VISIBLE_DEVICES={uuids}" in started["setup"], "UUIDs reach the job through the setup line"
    with pytest.raises(launch.SubmissionRefused, match="makes only 1 visible"):
        local.local_parameters(launch.resources(cell), {"CUDA_VISIBLE_DEVICES": "0"})


def test_a_local_cpu_cell_sees_no_gpu(monkeypatch, tmp_path, make_typed) -> None:
    cell = make_typed("cluster=local", "gpu=cpu", "num_gpus=2")
    started = _what_submitit_hands_the_job(monkeypatch, tmp_path, cell, {})
    assert started["tasks_per_node"] == 2 and started["cuda_devices"] == ""


def test_local_gpu_cells_asking_for_more_gpus_than_the_machine_shows_are_refused(make_typed) -> None:
    cells = {"four": make_typed("cluster=local", "gpu=h100-80gb", "num_gpus=4", "model=pythia-70m")}
    local.check_local_gpus(cells, device_count=lambda: 8)
    with pytest.raises(launch.SubmissionRefused, match="2 visible to CUDA") as info:
        local.check_local_gpus(cells, device_count=lambda: 2)
    assert "four (pythia-70m h100-80gb x4" in str(info.value)
    cpu_only = {"cpu": make_typed("cluster=local", "gpu=cpu", "num_gpus=2")}
    local.check_local_gpus(cpu_only, device_count=lambda: 0)  # CPU cells need no GPU


def test_each_rank_gets_its_cpus_and_a_wckey_only_when_the_site_has_one(make_typed) -> None:
    text = _sbatch_text(make_typed("cluster=slurm", "cluster.cpus_per_gpu=6", "num_gpus=2"))
    assert "--wckey" not in text
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert "--cpus-per-task=6" in srun, "srun from SLURM 22.05 does not inherit sbatch's --cpus-per-task"
    assert "export SRUN_CPUS_PER_TASK=6" in text and "export OMP_NUM_THREADS=6" in text
    keyed = _sbatch_text(make_typed("cluster=slurm", "num_gpus=2", "cluster.wckey=lab42"))
    assert "#SBATCH --wckey=lab42" in keyed


def test_with_no_gpu_the_advice_names_only_accepted_values_and_comes_without_torch(make_typed, tmp_path) -> None:
    # It said "use gpu=cpu or num_gpus=0 or less" (num_gpus=0 is refused) after 7.9 s of importing torch.
    cells = {"one": make_typed("cluster=local", "gpu=h100-80gb", "model=pythia-70m")}
    with pytest.raises(launch.SubmissionRefused) as info:
        local.check_local_gpus(cells, device_count=lambda: 0)
    assert "use gpu=cpu, or submit them with cluster=slurm" in str(info.value)
    assert "num_gpus=0" not in str(info.value)
    # No NVIDIA device file, or every device hidden: 0 without asking torch (which would take seconds).
    assert local.cuda_device_count({}, str(tmp_path / "nvidia[0-9]*")) == 0
    (tmp_path / "nvidia0").touch()
    assert local.cuda_device_count({"CUDA_VISIBLE_DEVICES": ""}, str(tmp_path / "nvidia[0-9]*")) == 0


def test_each_gpu_type_gets_its_nodes_gpus_cpus_and_memory() -> None:
    from orchestrator.planning.plan import plan

    p = plan(
        [
            "model=pythia-70m", "gpu=a100-80gb,h100-80gb", "num_gpus=8", "cluster=example-university",
            "+cluster.gpus_per_node_by_gpu={h100-80gb: 8}", "+cluster.cpus_per_gpu_by_gpu={h100-80gb: 12}",
            "+cluster.mem_gb_per_gpu_by_gpu={h100-80gb: 120}",
        ]
    )  # fmt: skip
    (h100,) = [c.typed for c in p.cells]
    (a100,) = [c for c in p.skipped]
    assert h100.gpu.name == "h100-80gb" and h100.cluster.gpus_per_node == 8
    res = launch.resources(h100)
    assert (res.tasks_per_node, res.cpus_per_task, res.mem_gb, res.gres) == (8, 12, 960, "gpu:h100:8")
    assert not res.exclusive, "8 of a node's 8 GPUs: the node is the cell's anyway"
    assert any("4 (cluster.gpus_per_node)" in str(r) for r in a100.refusals), "A100 nodes keep 4 GPUs"


def test_a_node_setting_per_gpu_type_must_be_a_positive_integer(make_typed) -> None:
    from orchestrator.cells import cell as cells

    cell = make_typed("cluster=example-university", "gpu=a100-80gb")
    cell.cluster.cpus_per_gpu_by_gpu = {"a100-80gb": 0}
    assert [r.key for r in cells.check_values(cell)] == ["cluster.cpus_per_gpu_by_gpu.a100-80gb"]


def test_a_sweeps_jobs_carry_its_name_so_squeue_shows_whose_they_are(make_typed, tmp_path: Path) -> None:
    # Every sweep's jobs were `gpudays-<hex>` unless `name` was set: in squeue, no sweep could be told apart.
    default = launch.resources(make_typed("cluster=slurm"))
    assert launch.job_name(default, SweepPaths(tmp_path / "llama-h100")) == "gpudays-llama-h100"
    assert launch.job_name(default, SweepPaths(tmp_path / "2026-01-02_03-04-05")) == "gpudays-2026-01-02_03-04-05"
    named = launch.resources(make_typed("cluster=slurm", "name=scaling"))
    assert launch.job_name(named, SweepPaths(tmp_path / "2026-01-02_03-04-05")) == "gpudays-scaling"
    # squeue --name takes a comma list, and sbatch a line: neither a comma, a space nor a newline gets through.
    odd = launch.job_name(default, SweepPaths(tmp_path / "a,b c\nd$"))
    assert odd == "gpudays-a_b_c_d" and len(launch.job_name(default, SweepPaths(tmp_path / ("x" * 300)))) == 60
