"""Every config file composes against the schema; bad input is refused with a useful message."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.cli import main as cli
from orchestrator.planning.plan import CONF_DIR, SweepError, plan

GROUPS = ("model", "gpu", "method", "cluster", "probe")


def _choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize(("group", "choice"), [(g, c) for g in GROUPS for c in _choices(g)])
def test_every_config_file_composes(group: str, choice: str, make_cell) -> None:
    cell = make_cell(f"{group}={choice}")
    if group in ("model", "gpu"):
        assert cell[group]["name"] == choice, "a model or GPU file's name must match its file name"


def test_groups_hold_what_the_grid_needs() -> None:
    assert {
        "pythia-tiny",
        "pythia-70m",
        "pythia-160m",
        "pythia-410m",
        "pythia-1b",
        "pythia-1.4b",
        "pythia-2.8b",
        "pythia-6.9b",
        "pythia-12b",
    } <= set(_choices("model"))
    assert {"v100-32gb", "rtx3090", "a6000", "a100-40gb", "a100-80gb", "l40s", "h100-80gb", "h200", "cpu"} <= set(
        _choices("gpu")
    )
    assert {"local", "slurm", "example-university"} <= set(_choices("cluster"))


@pytest.mark.parametrize("choice", _choices("gpu"))
def test_every_gpu_figure_cites_a_source(choice: str) -> None:
    text = (CONF_DIR / "gpu" / f"{choice}.yaml").read_text()
    header = text.split("name:")[0]
    assert "#" in header and ("datasheet" in header or "whitepaper" in header or choice == "cpu")
    for line in text.splitlines():
        if line.startswith(("purchase_price_usd", "cloud_usd_per_gpu_hour")) and "null" not in line:
            assert "#" in line, f"{choice}: {line!r} has no source or 'unconfirmed' note"


def test_misspelt_key_names_the_file_and_the_accepted_keys() -> None:
    with pytest.raises(SweepError) as e:
        plan(["model=pythia-1b", "model.num_layer=3"])
    msg = str(e.value)
    assert "model.num_layer" in msg and "conf/model/pythia-1b.yaml" in msg and "num_layers" in msg


def test_misspelt_method_key_in_a_sweep() -> None:
    with pytest.raises(SweepError, match=r"method\.zero_stag.*zero_stage"):
        plan(["num_gpus=1,2", "method.zero_stag=1"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model=pythia-7b", "pythia-6.9b"),  # lists the models that exist
        ("gpu=h100", "h100-80gb"),
        ("cluster=slurmm", "example-university"),
        ("num_gpus=four", "num_gpus"),
        ("method.precision=fp8", "bf16, fp16, fp32"),
        ("method.micro_batch_size=big", "auto or an integer"),
        ("method.zero_stage=4", "0, 1, 2, 3"),
    ],
)
def test_unknown_choices_and_values_say_what_is_accepted(override: str, expected: str) -> None:
    with pytest.raises(SweepError) as e:
        plan([override])
    assert expected in str(e.value)


def test_bad_input_submits_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir = tmp_path / "sweep"
    code = cli.main(["sweep", "-m", "model=pythia-tiny,pythia-7b", "--dir", str(sweep_dir)])
    assert code == cli.EXIT_BAD_INPUT
    assert "pythia-7b" in capsys.readouterr().err
    assert not sweep_dir.exists()


def test_a_sweep_of_only_impossible_cells_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["sweep", "gpu=v100-32gb", "model=pythia-70m", "--dir", str(tmp_path / "s")])
    out = capsys.readouterr()
    assert code == cli.EXIT_BAD_INPUT
    assert "v100-32gb has neither bf16 nor TF32" in out.out and "nothing was submitted" in out.err
    assert not (tmp_path / "s").exists()


def test_cfg_job_prints_the_composed_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sweep", "model=pythia-1b", "gpu=h100-80gb", "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    assert "hidden_size: 2048" in out and "name: h100-80gb" in out and "hydra:" not in out


def test_plan_prints_every_cell_with_its_prediction_and_writes_nothing(tmp_path: Path, capsys) -> None:
    sweep_dir = tmp_path / "planned"
    code = cli.main(["plan", "gpu=a100-80gb", "model=pythia-1b,pythia-12b", "num_gpus=8", "--dir", str(sweep_dir)])
    out = capsys.readouterr().out
    assert code == 0
    assert "pythia-12b a100-80gb x8" in out and "predicted not to fit" in out
    rows = [line.split() for line in out.splitlines()]
    assert any(
        r[1:5] == ["pythia-1b", "a100-80gb", "8", "1"] and r[5:9] == ["zero0", "bf16", "mb=8", "yes"] for r in rows
    )
    assert "pythia-1b on 8 × A100-80GB: " in out and "pythia-12b on 8 × A100-80GB: no answer yet" in out
    assert "1 cell(s) would be submitted" in out
    assert not sweep_dir.exists()


def test_plan_on_a_sweep_folder_does_not_count_cells_already_in_it(tmp_path: Path, capsys) -> None:
    # `plan --dir` said "4 would be submitted" where 3 were: a cell already submitted is left to `resume`.
    from orchestrator.planning import plan as sweep
    from orchestrator.store.paths import SweepPaths

    argv = ["gpu=a100-80gb", "model=pythia-160m,pythia-410m", "num_gpus=8"]
    cells = sweep.plan(argv, sweep_dir=tmp_path / "s").cells
    assert len(cells) == 2
    attempts = SweepPaths(tmp_path / "s").attempts(cells[0].cell_id)
    attempts.parent.mkdir(parents=True)
    attempts.write_text('{"attempt": 1, "backend": "slurm", "job_id": "7_0"}\n')
    assert cli.main(["plan", *argv, "--dir", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "plan: 1 cell(s) would be submitted (1 already in" in out


def test_plan_costs_gpus_past_one_node_on_any_cluster_in_one_try(capsys) -> None:
    # `plan num_gpus=64` said "use num_nodes=8"; doing so said "cluster=local runs on this machine only".
    argv = ["model=pythia-1b", "gpu=a100-80gb", "num_gpus=64"]
    outs = []
    for extra in ([], ["num_nodes=8"]):
        assert cli.main(["plan", *argv, *extra]) == 0
        outs.append(capsys.readouterr().out)
        assert re.search(r"pythia-1b\s+a100-80gb\s+64\s+8\s", outs[-1]), outs[-1]  # gpus, then nodes
        assert "plan: 1 cell(s) would be submitted" in outs[-1]
    assert "costed on 8 nodes of 8 GPUs (cluster.gpus_per_node); a sweep needs num_nodes=8" in outs[0]
    # A sweep on this machine still refuses, and names in one message what would run.
    (skipped,) = plan(argv).skipped
    assert "use num_gpus=8 or fewer, or cluster=slurm num_nodes=8" in str(skipped.refusals[0])


def test_a_probe_memory_limit_is_judged_alike_for_auto_and_fixed_micro_batches() -> None:
    # mb=16 was refused as "about 0.0 GiB per GPU at micro-batch 1, 3.6 GiB usable (10% margin)": neither the
    # micro-batch nor the memory the probe is held to (probe.memory_limit_gib), which the auto cell was judged by.
    from orchestrator.cli.display import prediction

    # Then the auto cell was predicted to fit (0.0076 GiB at micro-batch 4), ran, and ended does_not_fit: on the
    # CPU the probe measures the process's resident growth, which holds 0.04 GiB of runtime at any micro-batch
    # (orchestrator.engines.memory.CPU_RUNTIME_GIB). Both cells are now refused, each naming its micro-batch.
    p = plan(["method.micro_batch_size=auto,16", "probe.memory_limit_gib=0.01"])
    prediction.predict(p)
    assert p.cells == []
    by_mb = {str(c.typed.method.micro_batch_size): c for c in p.skipped}
    said = str(by_mb["16"].refusals[0])
    assert "at micro-batch 16, 0.01 GiB usable (probe.memory_limit_gib)" in said, said
    assert "method.micro_batch_size=auto" not in said, "auto is refused too: not offered"
    said = str(by_mb["auto"].refusals[0])
    assert "predicted not to fit: about 0.0438 GiB per GPU at micro-batch 1, 0.01 GiB usable" in said, said
    # Under a limit the runtime leaves room in, both run, auto at the largest micro-batch predicted to fit.
    p = plan(["method.micro_batch_size=auto,16", "probe.memory_limit_gib=0.05"])
    prediction.predict(p)
    (auto,) = p.cells
    (fixed,) = p.skipped
    assert str(fixed.typed.method.micro_batch_size) == "16"
    assert auto.prediction["predicted_peak_memory_gib"] <= 0.05 < fixed.prediction["predicted_peak_memory_gib"]
    assert "method.micro_batch_size=auto (a smaller micro-batch)" in str(fixed.refusals[0]), "auto would fit here"


def test_plan_says_what_a_familys_predictions_leave_out_once(capsys) -> None:
    assert cli.main(["plan", "model=mamba-130m,mamba-370m,pythia-160m", "gpu=h100-80gb"]) == 0
    out = capsys.readouterr().out
    assert out.count("planned memory is that of transformers' reference scan") == 1, out
    assert cli.main(["plan", "model=pythia-160m", "gpu=h100-80gb"]) == 0
    assert "reference scan" not in capsys.readouterr().out
    # Said where it matters most: a Mamba cell predicted not to fit (skipped, not among the cells to run).
    cli.main(["plan", "model=mamba-1.4b", "gpu=a100-80gb", "num_gpus=8"])
    said = capsys.readouterr()
    assert "predicted not to fit" in said.out + said.err
    assert "planned memory is that of transformers' reference scan" in said.out, said.out
