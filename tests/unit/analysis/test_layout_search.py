"""The layout search: the mesh3d engine's large-run settings among the candidates, none the engine refuses, and the
fastest picked by the predictor's own figures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from analysis.predict.layout_search import accepted, candidate_layouts, ranked_layouts, variants
from analysis.predict.layouts import sweep_overrides
from analysis.predict.network import Network
from analysis.predict.parallelism import Layout, estimate_layout, layout_cell
from analysis.predict.predictor import predict_cell
from orchestrator.config.schema import GpuConfig, ModelConfig
from orchestrator.engines.mesh3d.pipeline import INTERLEAVED
from orchestrator.engines.registry import check_batch, check_engine_options

A100 = GpuConfig(
    name="a100-80gb", architecture="ampere", memory_gib=80, peak_tflops_bf16=312.0, nvlink_gbytes_s=600.0,
    pcie_gbytes_s=64.0,
)  # fmt: skip
NET = Network(intra_node_gbytes_s=300.0, inter_node_gbytes_s_per_gpu=25.0, gpus_per_node=8, source="test")
EIGHT = ModelConfig(
    name="eight", family="llama", num_layers=8, hidden_size=1024, num_heads=8, num_kv_heads=8, intermediate_size=2816,
    vocab_size=1024, rotary_pct=1.0, seq_length=1024,
)  # fmt: skip
DEEP = ModelConfig(
    name="deep", family="llama", num_layers=32, hidden_size=8192, num_heads=64, num_kv_heads=8,
    intermediate_size=28672, vocab_size=32000, rotary_pct=1.0, seq_length=4096,
)  # fmt: skip
"""Llama 2 70B's layer on 32 layers: on 32 A100s at 16 sequences a step it needs a pipeline of few micro-batches."""


def test_describe_and_cell_carry_the_schedule_checkpointing_and_hsdp() -> None:
    layout = Layout(4, 2, 2, 1, True, stages_per_rank=2, schedule="interleaved_1f1b", checkpoint_policy="selective",
                    dp_replicate=2)  # fmt: skip
    assert layout.describe() == "dp4 tp2 pp2 v2 mb1 ckpt:sel hsdp2"
    assert replace(layout, schedule="interleaved_zb", checkpoint_policy="full").describe() == (
        "dp4 tp2 pp2 v2 zb mb1 ckpt hsdp2"
    )
    assert Layout(2, 8, 1, 2, sequence_parallel=True, loss_parallel=True).describe() == "dp2 tp8 pp1 mb2 sp"
    cell = layout_cell(EIGHT, A100, layout, 32, NET)
    m = cell.method
    assert (m.pp_schedule, m.pp_chunks, m.checkpoint_policy, m.dp_replicate) == ("interleaved_1f1b", 2, "selective", 2)
    assert not check_engine_options(cell) and not check_batch(cell)
    # The search predicts the cell as `gpudays plan` does: selective checkpointing keeps more than full does.
    est = estimate_layout(EIGHT, A100, layout, 32, NET)
    assert est.step_time_s == pytest.approx(predict_cell(cell).step_time_s)
    assert est.memory_gib == pytest.approx(predict_cell(cell).peak_memory_gib)
    full = estimate_layout(EIGHT, A100, replace(layout, checkpoint_policy="full"), 32, NET)
    assert full.activations_gib < est.activations_gib and full.compute_s > est.compute_s
    # The offered sweep line runs that cell.
    assert {
        "method.pp_schedule=interleaved_1f1b",
        "method.checkpoint_policy=selective",
        "method.dp_replicate=2",
    } <= set(sweep_overrides(est))


def test_candidates_hold_each_large_run_setting_where_the_engine_runs_it_and_nothing_it_refuses() -> None:
    layouts = candidate_layouts(EIGHT, 16, 32, 8)
    assert len(set(layouts)) == len(layouts)
    for layout in layouts:
        cell = layout_cell(EIGHT, A100, layout, 32, NET)
        assert not check_engine_options(cell) and not check_batch(cell), layout.describe()
    piped = [lay for lay in layouts if lay.pipeline > 1]
    assert {(lay.pp_schedule, lay.pp_chunks) for lay in piped} >= {
        ("1f1b", 2), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4), ("interleaved_zb", 2), ("interleaved_zb", 4)
    }  # fmt: skip
    assert all(lay.pipeline * lay.stages_per_rank <= EIGHT.num_layers for lay in piped)
    assert not [lay for lay in piped if lay.pp_schedule == "interleaved_zb" and lay.selective]
    assert any(lay.selective for lay in layouts)
    assert not [lay for lay in layouts if lay.selective and lay.cell_engine != "mesh3d"]
    # HSDP groups the replicas of one node: dp8 tp2 spans the 2 nodes, so 2 groups of 4 (and no HSDP within one).
    hsdp = {(lay.data, lay.tensor, lay.pipeline, lay.dp_replicate) for lay in layouts if lay.dp_replicate > 1}
    assert (8, 2, 1, 2) in hsdp and all(d * t == 16 and r == 2 for d, t, _, r in hsdp)
    # Sequence (with loss) parallelism with tensor parallelism and no pipeline only.
    sp = [lay for lay in layouts if lay.sequence_parallel]
    assert sp and all(lay.tensor > 1 and lay.pipeline == 1 and lay.loss_parallel for lay in sp)
    # What the engine refuses is among the variants tried, and left out: zero-bubble with selective checkpointing,
    # 4 stages a rank of 4 pipeline ranks (16 stages of 8 layers), sequence parallelism of a tied output layer.
    tried = variants(Layout(4, 1, 4, 1), 8)
    refused = [lay for lay in tried if not accepted(EIGHT, lay, 32, 8)]
    assert {(lay.pp_schedule, lay.pp_chunks, lay.checkpoint_policy) for lay in refused} >= {
        ("interleaved_zb", 2, "selective"), ("interleaved_1f1b", 4, "full")
    }  # fmt: skip
    tied = replace(EIGHT, tie_word_embeddings=True)
    assert not [lay for lay in candidate_layouts(tied, 16, 32, 8) if lay.sequence_parallel]


def test_the_search_picks_an_interleaved_schedule_where_the_predictor_finds_it_faster() -> None:
    # 16 sequences on 32 GPUs: the fastest pipeline (few micro-batches a schedule) takes an interleaved or
    # zero-bubble schedule, whose bubble is smaller than 1F1B's, by the predictor's own figures.
    ranked = ranked_layouts(DEEP, A100, 32, 16, NET)
    best = next(e for e in ranked if e.layout.pipeline > 1)
    assert best.layout.pp_schedule in INTERLEAVED, best.layout
    plain = estimate_layout(DEEP, A100, replace(best.layout, schedule="", stages_per_rank=1), 16, NET)
    assert plain.layout.pp_schedule == "1f1b"
    assert best.bubble_fraction < plain.bubble_fraction and best.step_time_s < plain.step_time_s
    first_1f1b = next(e for e in ranked if e.layout.pipeline > 1 and e.layout.pp_schedule == "1f1b")
    assert best.step_time_s < first_1f1b.step_time_s
