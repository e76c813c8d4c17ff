"""What goes to the scheduler: resources, grouping into arrays, and the sbatch text itself."""

from __future__ import annotations

from pathlib import Path

import submitit

from orchestrator import launch

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


def _sbatch_text(cell: dict) -> str:
    res = launch.resources(cell)
    executor = submitit.SlurmExecutor(folder="/sweeps/demo/jobs/%j")
    executor.update_parameters(**launch.slurm_parameters(res))
    return executor._make_submission_file_text("python -u -m submitit.core._submit /sweeps/demo/jobs/%j", "0")


def test_two_node_sbatch_matches_the_reviewed_golden_file(make_cell) -> None:
    cell = make_cell(
        "cluster=example-university",
        "model=pythia-1b",
        "gpu=a100-80gb",
        "num_gpus=8",
        "num_nodes=2",
        "method.zero_stage=1",
    )
    assert _sbatch_text(cell) == (GOLDEN / "sbatch_a100-80gb_2x4.sh").read_text()


def test_cpu_cells_request_no_gpus_and_select_deepspeeds_cpu_accelerator(make_cell) -> None:
    text = _sbatch_text(make_cell("cluster=slurm", "num_gpus=2", "num_nodes=2"))
    assert "--gres" not in text
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    assert "export DS_ACCELERATOR=cpu" in text


def test_gres_type_comes_from_the_cluster_map_or_is_left_out(make_cell) -> None:
    mapped = launch.resources(
        make_cell("cluster=example-university", "gpu=h100-80gb", "num_gpus=4", "model=pythia-70m")
    )
    plain = launch.resources(make_cell("cluster=slurm", "gpu=h100-80gb", "num_gpus=4", "model=pythia-70m"))
    assert mapped.gres == "gpu:h100:4"
    assert plain.gres == "gpu:4"


def test_env_values_are_shell_quoted(make_cell) -> None:
    cell = make_cell("cluster=slurm", "+cluster.env.WEIRD='a b $(touch /tmp/pwned) `id`'")
    lines = launch.render_setup(launch.resources(cell))
    assert "export WEIRD='a b $(touch /tmp/pwned) `id`'" in lines


def test_cells_with_equal_resources_share_one_array(make_cell) -> None:
    cfgs = {
        "a": make_cell("cluster=slurm", "gpu=a100-80gb", "model=pythia-70m", "num_gpus=2"),
        "b": make_cell(
            "cluster=slurm", "gpu=a100-80gb", "model=pythia-160m", "num_gpus=2", "method.activation_checkpointing=true"
        ),
        "c": make_cell("cluster=slurm", "gpu=a100-80gb", "model=pythia-70m", "num_gpus=4"),
        "d": make_cell("cluster=slurm", "gpu=h100-80gb", "model=pythia-70m", "num_gpus=2"),
    }
    groups = sorted(sorted(ids) for ids in launch.group_by_resources(cfgs).values())
    # a and b differ only in what is measured; c asks for more GPUs; d's gres type is the same (untyped) gpu:2
    assert groups == [["a", "b", "d"], ["c"]]
    cfgs["d"] = make_cell("cluster=example-university", "gpu=h100-80gb", "model=pythia-70m", "num_gpus=2")
    groups = sorted(sorted(ids) for ids in launch.group_by_resources(cfgs).values())
    assert groups == [["a", "b"], ["c"], ["d"]]


def test_large_groups_split_at_max_array_size() -> None:
    chunks = list(launch._chunks([str(i) for i in range(2500)], 1000))
    assert [len(c) for c in chunks] == [1000, 1000, 500]
