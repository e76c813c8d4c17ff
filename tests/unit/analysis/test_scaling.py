"""The scaling table by hand: speed-up, the knee where returns diminish, energy and cost per token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import synthetic

from analysis.report import scaling
from analysis.report.writer import write_report
from analysis.sweeps.records import Catalog

# pythia-160m trains 1024 sequences x 2048 tokens = 2,097,152 tokens per optimizer step.
TOKENS_PER_STEP = 1024 * 2048


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def _measure(sweep: Path, cell_id: str, config: dict, tokens_per_s: float) -> None:
    metrics = synthetic.metrics(config, TOKENS_PER_STEP / tokens_per_s, 4, 20.0)
    synthetic.write_cell(sweep, cell_id, config, synthetic.record(cell_id, config, "ok", metrics))


@pytest.fixture(scope="module")
def knee_sweep(tmp_path_factory: pytest.TempPathFactory, catalog: Catalog) -> Path:
    """pythia-160m on A100s (ZeRO-0): 1, 2, 4, 8 GPUs at 1000, 1900, 3400, 4000 tokens/s."""
    sweep = tmp_path_factory.mktemp("knee") / "sweep"
    for gpus, tokens_per_s in ((1, 1000.0), (2, 1900.0), (4, 3400.0), (8, 4000.0)):
        _measure(
            sweep, f"a{gpus}", synthetic.cell_config("pythia-160m", "a100-80gb", gpus, catalog=catalog), tokens_per_s
        )
    return sweep


def test_the_knee_is_the_last_count_before_an_added_gpu_buys_less_than_half_of_one(knee_sweep: Path) -> None:
    table = write_report([knee_sweep], plots=False).scaling.set_index("num_gpus")
    # Marginal speed-up per added GPU, in units of the first GPU's 1000 tokens/s:
    #   1 -> 2: (1900 - 1000) / 1 / 1000 = 0.90
    #   2 -> 4: (3400 - 1900) / 2 / 1000 = 0.75
    #   4 -> 8: (4000 - 3400) / 4 / 1000 = 0.15  < 0.5: each of these four GPUs buys 15% of the first one.
    # So the knee is at 4 GPUs and 8 GPUs are beyond it.
    assert table["marginal_speedup_per_added_gpu"].tolist()[1:] == pytest.approx([0.90, 0.75, 0.15])
    assert np.isnan(table.loc[1, "marginal_speedup_per_added_gpu"])
    assert table["speedup"].tolist() == pytest.approx([1.0, 1.9, 3.4, 4.0])
    assert table["scaling_efficiency"].tolist() == pytest.approx([1.0, 0.95, 0.85, 0.5])
    assert table["knee_num_gpus"].tolist() == [4, 4, 4, 4]
    assert table["beyond_knee"].tolist() == [False, False, False, True]
    assert scaling.KNEE_MARGINAL_SPEEDUP == 0.5


def test_a_stricter_or_looser_knee_threshold_moves_the_knee(knee_sweep: Path) -> None:
    cells = write_report([knee_sweep], plots=False).cells
    strict = scaling.scaling(cells, knee=0.8).set_index("num_gpus")  # 0.75 from 2 to 4 GPUs is already below
    assert strict["knee_num_gpus"].tolist() == [2, 2, 2, 2]
    assert strict["beyond_knee"].tolist() == [False, False, True, True]
    loose = scaling.scaling(cells, knee=0.1)  # every step buys more than 0.1 of a GPU: no knee measured
    assert loose["knee_num_gpus"].isna().all() and not loose["beyond_knee"].any()
    for bad in (0, -1, "half", float("nan")):
        with pytest.raises(ValueError, match="knee threshold .* positive number such as 0.5"):
            scaling.scaling(cells, knee=bad)


def test_tokens_per_kwh_and_dollars_per_billion_tokens_by_hand(knee_sweep: Path) -> None:
    table = write_report([knee_sweep], plots=False).scaling.set_index("num_gpus")
    # A100 80GB in conf/gpu: 400 W board power, $2.736 per GPU-hour, $19,000 per GPU; a 1-GPU machine $1,000.
    # 1 GPU at 1000 tokens/s: an hour trains 3.6e6 tokens on 0.4 kWh, 9.0e6 tokens/kWh; a billion tokens take
    # 1e6 s = 277.78 GPU-hours = $760.00 rented, and 11.574 days of a $20,000 machine written off over 1825 days
    # = $126.84.
    assert table.loc[1, "tokens_per_kwh"] == pytest.approx(9.0e6)
    assert table.loc[1, "usd_per_billion_tokens_cloud"] == pytest.approx(760.0, rel=1e-6)
    assert table.loc[1, "usd_per_billion_tokens_amortised"] == pytest.approx(126.8391, rel=1e-6)
    # 8 GPUs at 4000 tokens/s: 14.4e6 tokens an hour on 3.2 kWh = 4.5e6 tokens/kWh; 8 x $2.736 / 14.4e6 tokens
    # = $1,520.00 per billion; machine $10,500 + 8 x $19,000 = $162,500, 1e9 / 4000 s = 2.8935 days: $257.64.
    assert table.loc[8, "tokens_per_kwh"] == pytest.approx(4.5e6)
    assert table.loc[8, "usd_per_billion_tokens_cloud"] == pytest.approx(1520.0, rel=1e-6)
    assert table.loc[8, "usd_per_billion_tokens_amortised"] == pytest.approx(257.6408, rel=1e-5)
    assert table.loc[4, "tokens_per_s_per_gpu"] == pytest.approx(850.0)


def test_each_sharding_option_is_a_line_of_its_own(tmp_path: Path, catalog: Catalog) -> None:
    sweep = tmp_path / "sharding"
    for cell_id, gpus, method, tokens_per_s in (
        ("z0-1", 1, {}, 1000.0),
        ("z0-2", 2, {}, 1800.0),
        ("z2-2", 2, {"zero_stage": 2}, 1950.0),
        ("z2-4", 4, {"zero_stage": 2}, 3000.0),
        ("z2off-2", 2, {"zero_stage": 2, "offload_optimizer": True}, 600.0),
        ("z0-2-ckpt", 2, {"activation_checkpointing": True}, 1500.0),  # same line as z0-2, slower: not taken
    ):
        config = synthetic.cell_config("pythia-160m", "a100-80gb", gpus, catalog=catalog, **method)
        _measure(sweep, cell_id, config, tokens_per_s)
    table = write_report([sweep], plots=False).scaling
    assert table["sharding"].tolist() == ["zero0", "zero0", "zero2", "zero2", "zero2 offload-opt"]
    assert table["cell_id"].tolist() == ["z0-1", "z0-2", "z2-2", "z2-4", "z2off-2"]
    zero2 = table[table["sharding"] == "zero2"].set_index("num_gpus")
    # Its base is its own smallest count, 2 GPUs at 1950 tokens/s (975 per GPU): 4 GPUs add 1050 / 2 / 975.
    assert zero2.loc[4, "speedup"] == pytest.approx(3000 / 1950)
    assert zero2.loc[4, "marginal_speedup_per_added_gpu"] == pytest.approx(1050 / 2 / 975)
    # Every cell names its engine (DeepSpeed for these); the label names only an engine other than DeepSpeed.
    assert table["engine"].eq("deepspeed").all()


def test_an_engine_column_splits_the_lines_when_the_cells_have_one(knee_sweep: Path) -> None:
    cells = write_report([knee_sweep], plots=False).cells
    other = cells.assign(engine="other", cell_id=cells["cell_id"] + "-other", tokens_per_s=cells["tokens_per_s"] / 2)
    both = pd.concat([cells.assign(engine="deepspeed"), other], ignore_index=True)
    table = scaling.scaling(both)
    assert list(table.columns) == list(scaling.SCALING_COLUMNS)
    assert sorted(set(table["sharding"])) == ["other zero0", "zero0"]
    # Half the throughput at every count: the same speed-ups and knee, half the tokens per kWh.
    for _, line in table.groupby("engine"):
        assert line["knee_num_gpus"].tolist() == [4, 4, 4, 4]
    ratio = (
        table[table["engine"] == "other"]["tokens_per_kwh"].to_numpy()
        / table[table["engine"] == "deepspeed"]["tokens_per_kwh"].to_numpy()
    )
    assert ratio == pytest.approx([0.5] * 4)


def test_knees_lists_one_row_per_line(knee_sweep: Path) -> None:
    table = write_report([knee_sweep], plots=False).scaling
    summary = scaling.knees(table)
    assert summary[["sharding", "num_gpus_measured"]].values.tolist() == [["zero0", "1 2 4 8"]]
    assert summary.loc[0, "knee_num_gpus"] == 4
    assert summary.loc[0, "marginal_speedup_past_knee"] == pytest.approx(0.15)


def test_no_measured_cell_gives_an_empty_table_with_the_columns() -> None:
    empty = scaling.scaling(pd.DataFrame({"status": ["oom"], "model": ["m"], "gpu": ["g"]}))
    assert empty.empty and "knee_num_gpus" in empty.columns and "engine" not in empty.columns
    assert scaling.knees(empty).empty


def test_report_md_names_the_knee_and_its_threshold(knee_sweep: Path, tmp_path: Path) -> None:
    write_report([knee_sweep], out_dir=tmp_path / "default", plots=False)
    text = (tmp_path / "default" / "report.md").read_text()
    section = text[text.index("## Scaling") : text.index("## Predicted")]
    assert "marginal speed-up per added GPU below 0.5" in section
    assert "Returns diminish within the measured counts in 1 of 1 line(s)" in section
    assert "| pythia-160m | a100-80gb | zero0 | 1 2 4 8 | 4 | 0.15 |" in section
    write_report([knee_sweep], out_dir=tmp_path / "strict", plots=False, knee=0.8)
    assert "per added GPU below 0.8" in (tmp_path / "strict" / "report.md").read_text()
    with pytest.raises(ValueError, match="knee threshold"):
        write_report([knee_sweep], out_dir=tmp_path / "bad", knee=-1)
    assert not (tmp_path / "bad").exists()  # refused before anything is read or written


def test_no_knee_from_cpu_processes_that_share_cores_and_report_md_warns(tmp_path: Path, catalog: Catalog) -> None:
    """Two CPU processes slower than one (they share the host's cores) give no knee; the same numbers on GPUs do.
    The CPU probes ran at the same time on one host, so report.md warns that they shared cores."""
    sweep = tmp_path / "cpu"
    for gpus, tokens_per_s in ((1, 1000.0), (2, 700.0)):
        _measure(sweep, f"cpu{gpus}", synthetic.cell_config("pythia-160m", "cpu", gpus, catalog=catalog), tokens_per_s)
        _measure(
            sweep, f"gpu{gpus}", synthetic.cell_config("pythia-160m", "a100-80gb", gpus, catalog=catalog), tokens_per_s
        )
    report = write_report([sweep], plots=False)
    table = report.scaling.set_index(["gpu", "num_gpus"])
    assert table.loc[("cpu", 2), "marginal_speedup_per_added_gpu"] == pytest.approx(-0.3)
    assert table.loc[("cpu", 2), "knee_num_gpus"] is pd.NA and not table.loc[("cpu", 2), "beyond_knee"]
    assert table.loc[("a100-80gb", 2), "knee_num_gpus"] == 1, "on GPUs a slower step is a knee"
    text = (sweep / "report.md").read_text()
    assert "A line on the CPU gets no knee" in text
    assert "shared cores with other probes" in text and "`cpu1` ran on node1 while cpu2 did" in text
    assert "gpu1" not in text.split("**Warning:**")[1].split("|")[0], "GPU cells are not CPU probes"


def test_report_md_rounds_large_numbers_for_reading(knee_sweep: Path) -> None:
    per_kwh = write_report([knee_sweep], plots=False).scaling["tokens_per_kwh"].iloc[0]
    text = (knee_sweep / "report.md").read_text()
    assert per_kwh > 1e6 and f"{per_kwh:,.0f}" not in text
    assert f"{per_kwh / 1e6:.3g} million" in text or f"{per_kwh / 1e9:.3g} billion" in text
