"""benchmarks/published_runs.py: its table parses, every row says where its figure comes from and what kind it is,
and its scoring is right on a small row made up here (no planning: fast)."""

from __future__ import annotations

import math
from types import ModuleType

import pytest
from benchmark_loader import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("published_runs")


def test_the_table_parses_and_every_row_has_a_source_and_its_kind(bench: ModuleType) -> None:
    runs = bench.load()
    assert len(runs) >= 12
    for run in runs:
        assert run.source.strip() and run.verified.strip(), run.id
        assert run.kind in ("wall-clock", "steady-state"), run.id
        assert run.figure in bench.FIGURES and run.value > 0, run.id
        assert run.train_steps >= 1 and run.num_gpus >= 1, run.id
    kinds = {run.kind for run in runs}
    assert kinds == {"wall-clock", "steady-state"}
    assert {run.gpu for run in runs} >= {"a100-80gb", "h100-80gb"}
    assert any(run.layout.get("pp", 1) > 1 for run in runs), "a 3-D layout"


def test_a_row_without_a_source_or_with_an_unknown_kind_is_refused_naming_it(bench: ModuleType) -> None:
    row = """
[[run]]
id = "tiny"
name = "a made-up run"
source = ""
verified = "no"
kind = "wall-clock"
figure = "gpu_hours"
value = 10
gpu = "a100-80gb"
num_gpus = 8
model = "pythia-70m"
seq_length = 2048
global_batch = 1024
tokens = 1e9
"""
    with pytest.raises(ValueError, match="tiny.*source"):
        bench.parse(row)
    with pytest.raises(ValueError, match="kind 'measured'"):
        bench.parse(row.replace('source = ""', 'source = "here"').replace("wall-clock", "measured"))


def test_scoring_computes_the_ratio_the_interval_and_its_width(bench: ModuleType) -> None:
    s = bench.score(predicted=130.0, low=50.0, high=200.0, published=100.0)
    assert s.ratio == pytest.approx(1.3)
    assert s.inside and s.spread == pytest.approx(4.0)
    assert s.abs_error == pytest.approx(0.3)
    outside = bench.score(predicted=60.0, low=55.0, high=80.0, published=100.0)
    assert outside.ratio == pytest.approx(0.6) and not outside.inside
    line = bench.summary([s, outside])
    assert "2 rows" in line and "within ±30% 50%" in line and "coverage 50%" in line, "30% itself is within"


def test_steady_state_figures_become_gpu_hours_of_the_same_tokens(bench: ModuleType) -> None:
    base = {
        "id": "x", "name": "x", "source": "s", "verified": "v", "kind": "steady-state", "gpu": "a100-80gb",
        "num_gpus": 10, "model": "pythia-70m", "seq_length": 1000, "global_batch": 100, "tokens": 3.6e9,
    }  # fmt: skip
    run = bench.Run(**base, figure="tokens_per_s_per_gpu", value=1000.0)
    assert bench.published_gpu_hours(run, flops_per_token=1.0) == pytest.approx(1000.0)
    run = bench.Run(**base, figure="tflops_per_gpu", value=1.0)
    assert bench.published_gpu_hours(run, flops_per_token=1e9) == pytest.approx(1000.0)
    run = bench.Run(**base, figure="step_s", value=0.01)  # 36,000 steps x 0.01 s x 10 GPUs
    assert run.train_steps == 36_000
    assert bench.published_gpu_hours(run, flops_per_token=1.0) == pytest.approx(1.0)
    assert math.isclose(bench.published_gpu_hours(bench.Run(**base, figure="gpu_hours", value=7.0), 1.0), 7.0)


def test_a_published_zero_layout_is_planned_as_published(bench: ModuleType) -> None:
    """DeepSpeed ZeRO data parallelism, its checkpointing and micro-batch, as the run's config gave them."""
    run = bench.Run(
        id="x", name="x", source="s", verified="v", kind="wall-clock", figure="gpu_hours", value=1.0,
        gpu="a100-80gb", num_gpus=8, model="pythia-70m", seq_length=2048, global_batch=64, tokens=1e9,
        layout={"tp": 1, "pp": 1, "zero_stage": 1, "micro_batch": 4, "checkpointing": True},
    )  # fmt: skip
    answer = bench.published_layout(run)
    assert answer is not None and answer.answered, answer
    assert answer.setting == "zero1 ckpt bf16 mb=4"
    assert bench._layout_text(run) == "DeepSpeed ZeRO-1 dp8"
    unchecked = bench.published_layout(bench.Run(**{**run.__dict__, "layout": {"zero_stage": 2, "micro_batch": 4}}))
    assert unchecked is not None and unchecked.setting in ("zero2 bf16 mb=4", "zero2 ckpt bf16 mb=4")


def test_the_mfu_a_figure_implies_is_its_model_flops_over_the_gpus_dense_peak(bench: ModuleType) -> None:
    base = {
        "id": "x", "name": "x", "source": "s", "verified": "v", "gpu": "a100-80gb", "num_gpus": 10,
        "model": "pythia-70m", "seq_length": 1000, "global_batch": 100, "tokens": 3.6e9,
    }  # fmt: skip
    # A throughput in TFLOP/s a GPU comes back as itself over the peak, whatever the FLOPs per token.
    run = bench.Run(**base, kind="steady-state", figure="tflops_per_gpu", value=156.0)
    published = bench.published_gpu_hours(run, flops_per_token=7e8)
    peak = 312.0  # conf/gpu/a100-80gb.yaml, the datasheet's bf16 dense
    row = bench.Row(run, published, bench.Answer(gpu_hours=published / 2), None, flops_per_token=7e8, peak_tflops=peak)
    assert row.mfus() == pytest.approx((0.5, 1.0))
    # A wall-clock prediction is scored at its goodput: the steps' GPU-hours over it, so a lower MFU.
    run = bench.Run(**base, kind="wall-clock", figure="gpu_hours", value=100.0)
    row = bench.Row(run, 100.0, bench.Answer(gpu_hours=80.0, goodput=0.8), None, flops_per_token=1e9, peak_tflops=peak)
    by_hand = 3.6e9 * 1e9 / (100.0 * 3600.0 * 312e12)
    assert row.mfus() == pytest.approx((by_hand, by_hand))
    assert (
        bench.Row(run, 100.0, bench.Answer(reason="none"), None, 1e9, peak).mfus()[1] != row.mfus()[1]
    )  # NaN: no answer


def test_a_row_as_run_is_scored_on_its_published_layout_where_the_planner_expresses_it(bench: ModuleType) -> None:
    """The published layout's prediction where there is one (even one predicted not to fit: the run's hours are of
    that layout), else the fastest setting's; the fastest setting's score stays what it was."""
    base = {
        "id": "x", "name": "x", "source": "s", "verified": "v", "gpu": "a100-80gb", "num_gpus": 8,
        "model": "pythia-70m", "seq_length": 2048, "global_batch": 64, "tokens": 1e9, "kind": "steady-state",
        "figure": "gpu_hours", "value": 100.0,
    }  # fmt: skip
    run = bench.Run(**base)
    fastest = bench.Answer(setting="tp2", gpu_hours=50.0, low=40.0, high=60.0)
    laid = bench.Answer(setting="zero1", gpu_hours=90.0, low=70.0, high=120.0, fits=False)
    row = bench.Row(run, 100.0, fastest, laid)
    assert row.score.ratio == pytest.approx(0.5) and not row.score.inside
    assert row.as_run_score.ratio == pytest.approx(0.9) and row.as_run_score.inside
    cannot = bench.Row(run, 100.0, fastest, bench.Answer(reason="cannot express"))
    assert cannot.as_run_score == cannot.score and bench.Row(run, 100.0, fastest, None).as_run_score == cannot.score
    lines = bench.summaries([row, cannot])
    (as_run,) = [line for line in lines if line.startswith("as run")]
    assert "2 rows: within ±30% 50%" in as_run and "coverage 50%" in as_run, as_run
