"""Cell identity and the rules that refuse cells before submission."""

from __future__ import annotations

import pytest

from orchestrator.cells import cell as cells
from orchestrator.config.schema import to_config


def test_cell_id_is_stable_and_ignores_where_and_how_long(make_cell) -> None:
    a = make_cell("model=pythia-70m", "num_gpus=2")
    b = make_cell("model=pythia-70m", "num_gpus=2", "cluster=slurm", "cluster.partition=gpu", "probe=quick")
    assert cells.cell_id(to_config(a)) == cells.cell_id(to_config(b))
    assert len(cells.cell_id(to_config(a))) == 12
    assert cells.cell_id(to_config(a)) == cells.cell_id(to_config(make_cell("num_gpus=2", "model=pythia-70m")))


@pytest.mark.parametrize(
    "change",
    [
        "num_gpus=4",
        "method.zero_stage=1",
        "method.activation_checkpointing=true",
        "gpu=a100-80gb",
        "model=pythia-160m",
        "method.micro_batch_size=4",
        "num_nodes=2",
    ],
)
def test_cell_id_changes_with_what_is_measured(make_cell, change: str) -> None:
    base = make_cell("model=pythia-70m", "num_gpus=2", "cluster=slurm")
    other = make_cell("model=pythia-70m", "num_gpus=2", "cluster=slurm", change)
    assert cells.cell_id(to_config(base)) != cells.cell_id(to_config(other))


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        # The defaults (bf16, TF32) on a V100: both changes in one message, so one try runs it.
        (["gpu=v100-32gb"], "method.precision", "use method.precision=fp16 method.tf32=false"),
        (["gpu=v100-32gb", "method.tf32=false"], "method.precision", "no bf16"),
        (["gpu=v100-32gb", "method.precision=fp16"], "method.tf32", "no TF32"),
        (["gpu=cpu", "method.precision=fp16"], "method.precision", "CUDA GPUs only"),
        (["method.zero_stage=2"], "method.zero_stage", "one GPU"),
        (["method.offload_optimizer=true"], "method.offload_optimizer", "needs sharding"),
        (["num_gpus=2", "method.zero_stage=2", "method.offload_params=true"], "method.offload_params", "stage=3"),
        (["num_gpus=3", "model=pythia-70m", "cluster=slurm", "num_nodes=2"], "num_gpus", "split evenly"),
        (["num_gpus=16", "gpu=a100-80gb", "cluster=slurm"], "num_gpus", "num_nodes=2"),
        (["num_gpus=3"], "num_gpus", "does not split"),
        (["num_gpus=2", "method.micro_batch_size=3"], "method.micro_batch_size", "[1, 2, 4, 8]"),
        (["num_gpus=2", "num_nodes=2"], "num_nodes", "cluster=slurm"),
        (["method.attention=flash_attention_2"], "method.attention", "CUDA GPU"),
        (["cluster.time_limit_min=5"], "cluster.time_limit_min", "cluster.time_limit_min=9"),
        (["cluster.time_limit_min=5", "probe=quick"], None, None),
    ],
)
def test_impossible_cells_are_refused_with_the_key_and_a_way_out(make_cell, overrides, key, fragment) -> None:
    refusals = cells.check_runnable(to_config(make_cell(*overrides)))
    if key is None:
        assert refusals == [], refusals
    else:
        assert any(r.key == key and fragment in r.reason for r in refusals), refusals
        assert len({r.key for r in refusals if r.key.startswith("method.")}) <= 1, refusals


@pytest.mark.parametrize(
    "overrides",
    [
        ["method.zero_stage=1", "method.offload_optimizer=true"],
        ["num_gpus=2", "method.zero_stage=3", "method.offload_optimizer=true", "method.offload_params=true"],
        ["num_gpus=2", "method.micro_batch_size=4"],
        ["gpu=v100-32gb", "method.precision=fp16", "method.tf32=false", "model=pythia-70m"],
        ["num_gpus=8", "num_nodes=2", "cluster=slurm", "gpu=h100-80gb", "model=pythia-1b"],
    ],
)
def test_valid_cells_pass(make_cell, overrides) -> None:
    assert cells.check_runnable(to_config(make_cell(*overrides))) == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cluster.partition", "gpu; rm -rf ~"),
        ("cluster.account", "$(whoami)"),
        ("cluster.qos", "normal\n#SBATCH --uid=0"),
        ("cluster.constraint", "a100'"),
        ("name", "../../etc"),
        ("name", "x`id`"),
    ],
)
def test_hostile_scheduler_strings_are_refused(make_cell, key: str, value: str) -> None:
    cell = make_cell("cluster=slurm")
    target = cell
    *parents, leaf = key.split(".")
    for p in parents:
        target = target[p]
    target[leaf] = value
    errors = cells.check_values(to_config(cell))
    assert any(r.key == key for r in errors), errors


def test_hostile_setup_and_env_are_refused(make_cell) -> None:
    cell = make_cell("cluster=slurm")
    cell["cluster"]["setup"] = ["module load cuda", "echo ok\nrm -rf /"]
    cell["cluster"]["env"] = {"GOOD": "x y $z", "BAD NAME": "1", "NL": "a\nb"}
    keys = {r.key for r in cells.check_values(to_config(cell))}
    assert keys == {"cluster.setup[1]", "cluster.env.BAD NAME", "cluster.env.NL"}


def test_labels_read_well(make_cell) -> None:
    cell = make_cell(
        "model=pythia-1b",
        "gpu=a100-80gb",
        "num_gpus=8",
        "num_nodes=2",
        "cluster=slurm",
        "method.zero_stage=3",
        "method.activation_checkpointing=true",
    )
    assert cells.label(to_config(cell)) == "pythia-1b a100-80gb x8 on 2 nodes zero3 ckpt bf16 mb=auto"


def test_a_probe_budget_the_time_limit_cannot_hold_names_both_ways_out(make_cell) -> None:
    # The default probe times for up to 300 s; with 120 s of start-up and the 90 s warning it needs 510 s.
    (refusal,) = cells.check_runnable(to_config(make_cell("cluster=slurm", "cluster.time_limit_min=7")))
    assert "510 s" in refusal.reason and "cluster.time_limit_min=9" in refusal.reason
    assert "probe.time_budget_s to 210" in refusal.reason
    # A sleep probe may outlive its limit on purpose: that is how timeouts are tested.
    sleeper = make_cell("cluster=slurm", "cluster.time_limit_min=1", "probe.kind=sleep", "probe.sleep_s=600")
    assert cells.check_runnable(to_config(sleeper)) == []


@pytest.mark.parametrize(
    ("overrides", "minutes"),
    [
        ((), 17),  # 2 x (300 s budget + 120 s start-up + 90 s warning) = 1,020 s
        (("probe.time_budget_s=1200",), 47),  # 2 x 1,410 s = 2,820 s
        (("probe=quick",), 10),  # 2 x 230 s = 460 s: the 10-minute floor
        (("probe.kind=sleep", "probe.sleep_s=600"), 27),  # a sleep probe needs its sleep, not the budget
        (("cluster.time_limit_min=45",), 45),  # a number overrides the derivation
    ],
)
def test_the_time_limit_is_derived_from_the_probe_with_its_margin_unless_set(
    make_cell, overrides: tuple[str, ...], minutes: int
) -> None:
    from orchestrator.submission import launch

    cell = to_config(make_cell("cluster=slurm", *overrides))
    assert cells.time_limit_min(cell) == minutes
    assert launch.resources(cell).time_limit_min == minutes, "what sbatch gets as --time"
    assert cells.check_runnable(cell) == [], "a derived limit always holds the probe"


def test_a_cell_yaml_with_an_unknown_key_is_named(make_cell) -> None:
    cell = make_cell()
    cell["method"]["zero_stag"] = 1
    with pytest.raises(ValueError, match="zero_stag.*accepted: .*zero_stage"):
        to_config(cell)


def test_a_mig_instance_is_a_gpu_type_of_one_rank_cells(make_cell) -> None:
    one = to_config(make_cell("cluster=slurm", "gpu=a100-80gb-mig-3g.40gb", "model=pythia-70m", "num_gpus=1"))
    assert one.gpu.mig_profile == "3g.40gb" and one.gpu.memory_gib == 40
    assert cells.check_values(one) == [] and cells.check_runnable(one) == []
    two = to_config(make_cell("cluster=slurm", "gpu=a100-80gb-mig-3g.40gb", "model=pythia-70m", "num_gpus=2"))
    (refusal,) = cells.check_runnable(two)
    assert refusal.key == "num_gpus" and "MIG instance (3g.40gb)" in refusal.reason and "num_gpus=1" in refusal.reason
