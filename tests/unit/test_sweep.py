"""Hydra's sweep syntax expands into the cells a Hydra user expects, composed exactly as Hydra would."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from orchestrator.cli.display.prediction import predict
from orchestrator.planning.compose_cache import register_configs
from orchestrator.planning.plan import CONF_DIR, plan


def test_bare_sweep_is_the_demo_grid() -> None:
    p = plan([])
    assert p.name == "demo"
    assert len(p.cells) == 4 and not p.skipped
    combos = {(c.config["num_gpus"], c.config["method"]["activation_checkpointing"]) for c in p.cells}
    assert combos == {(1, False), (1, True), (2, False), (2, True)}
    assert all(c.config["gpu"]["name"] == "cpu" and c.config["cluster"]["backend"] == "local" for c in p.cells)
    assert "sweeps/demo/" in str(p.sweep_dir)


def test_comma_lists_make_the_cartesian_product_and_refusals_are_kept_apart() -> None:
    p = plan(["model=pythia-70m,pythia-160m", "gpu=a100-80gb", "num_gpus=1,2", "method.zero_stage=0,1"])
    assert len(p.cells) + len(p.skipped) == 8
    # ZeRO-1 on one GPU without offload is refused, for both models
    assert len(p.skipped) == 2
    assert all(c.config["num_gpus"] == 1 and c.config["method"]["zero_stage"] == 1 for c in p.skipped)


def test_command_line_overrides_win_over_experiment_sweep_params() -> None:
    p = plan(["+experiment=demo", "num_gpus=2"])
    assert {c.config["num_gpus"] for c in p.cells} == {2}
    assert len(p.cells) == 2


def test_range_and_glob_work_as_in_hydra() -> None:
    p = plan(["gpu=a100-80gb", "model=glob(pythia-1*)", "num_gpus=range(1,3)"])
    models = {c.config["model"]["name"] for c in p.cells}
    assert models == {"pythia-160m", "pythia-1b", "pythia-1.4b", "pythia-12b"}
    assert {c.config["num_gpus"] for c in p.cells + p.skipped} == {1, 2}


def test_the_same_cell_twice_is_measured_once() -> None:
    p = plan(["num_gpus=1,1,2"])
    assert len(p.cells) == 2 and p.duplicates == 1


def test_sweep_dir_override_is_honoured(tmp_path) -> None:
    p = plan([f"hydra.sweep.dir={tmp_path}/mine"])
    assert p.sweep_dir == tmp_path / "mine"


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=pythia-1b", "gpu=h100-80gb", "num_gpus=8", "method.zero_stage=2", "cluster=slurm"],
        ["+experiment=demo", "num_gpus=2", "method.activation_checkpointing=true", "probe.max_steps=7"],
        ["cluster=example-university", "cluster.partition=big", "model.seq_length=1024", "method.micro_batch_size=4"],
        ["method=zero3-offload", "num_gpus=2", "+cluster.env.EXTRA=1"],
    ],
)
def test_fast_composition_equals_hydra_composition(overrides: list[str]) -> None:
    p = plan(overrides)
    fast = p.cells + p.skipped
    assert len(fast) == 1
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        slow = OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)
    GlobalHydra.instance().clear()
    assert fast[0].config == slow


def test_cells_predicted_not_to_fit_are_refused_unless_asked_to_run() -> None:
    overrides = ["gpu=a100-80gb", "model=pythia-12b,pythia-70m", "num_gpus=1"]
    p = plan(overrides)
    predict(p)
    assert [c.config["model"]["name"] for c in p.cells] == ["pythia-70m"]
    (refused,) = p.skipped
    assert refused.refusals[0].key == "prediction" and "--run-unfit" in refused.refusals[0].reason
    assert p.cells[0].prediction["predicted_fits"] is True
    assert p.cells[0].prediction["predicted_peak_memory_gib"] > 0

    anyway = plan(overrides)
    predict(anyway, run_anyway=True)
    assert len(anyway.cells) == 2 and not anyway.skipped
