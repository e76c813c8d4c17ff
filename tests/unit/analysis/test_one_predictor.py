"""`plan`, `budget`, `shortest` and the offered layouts cost the same cell with the same model: the GPU-hours of a
cell (model, GPU type and count, nodes, layout, micro-batch, network) agree whichever command gives them."""

from __future__ import annotations

import pytest

from analysis.planners.budget import parse_budget, tokens_for_budget
from analysis.planners.shortest import shortest_training
from analysis.predict.layout_search import best_layout
from analysis.predict.layouts import near_offers, sweep_overrides
from analysis.predict.network import network_for
from analysis.predict.parallelism import Layout, LayoutEstimate, estimate_layout
from analysis.predict.predictor import plan as predict_plan
from orchestrator.config.schema import Config
from orchestrator.planning.plan import plan

LLAMA2_7B = ("model=llama-2-7b", "model.train_steps=1000")


def planned(*overrides: str) -> Config:
    p = plan(["cluster=slurm", *overrides], sweep_dir=None)
    (found,) = p.cells
    assert found.typed is not None
    return found.typed


def plan_gpu_hours(cfg: Config) -> float:
    return float(predict_plan([cfg])["predicted_gpu_hours"].iloc[0])


def layout_overrides(est: LayoutEstimate) -> list[str]:
    lay = est.layout
    if lay.cell_engine == "mesh3d":  # the offered sweep line: the schedule, checkpointing policy and HSDP with it
        return list(sweep_overrides(est))
    return [
        f"method.micro_batch_size={lay.micro_batch_size}",
        f"method.activation_checkpointing={lay.activation_checkpointing}",
        "method.zero_stage=1",
    ]


def test_pythia_1b_data_parallel_on_64_h100_costs_the_same_in_plan_budget_and_shortest() -> None:
    base = planned("model=pythia-1b", "gpu=h100-80gb", "num_gpus=64", "num_nodes=8", "model.global_batch_size=1024")
    model, gpu, network = base.model, base.gpu, network_for(base.gpu, base.cluster)
    steps, tokens = model.train_steps, model.train_steps * 1024 * model.seq_length
    # shortest: its data-parallel search capped at 64 GPUs ends on all 64 (each doubling still pays)
    (run,) = [r for r in shortest_training(model, gpu, network, tokens, global_batch_size=1024, max_gpus=64)
              if r.parallelism == "data" and r.point == "fastest"]  # fmt: skip
    assert run.estimate is not None and run.num_gpus == 64 and run.train_steps == steps
    cfg = planned("model=pythia-1b", "gpu=h100-80gb", "num_gpus=64", "num_nodes=8", "model.global_batch_size=1024",
                  *layout_overrides(run.estimate))  # fmt: skip
    hours = plan_gpu_hours(cfg)
    assert run.gpu_hours == pytest.approx(hours, rel=1e-6)
    # the same 64 GPUs, data parallelism alone, through the layout search budget and shortest share
    dp = best_layout(model, gpu, 64, 1024, network, data_parallel_only=True)
    assert dp is not None and dp.step_time_s * steps * 64 / 3600.0 == pytest.approx(hours, rel=1e-6)
    # budget: 64 GPUs for a day at the fastest layout of 64 (any parallelism); its tokens a second a GPU give the
    # model's tokens the GPU-hours `plan` gives that layout's cell
    (row,) = tokens_for_budget(model, gpu, parse_budget(num_gpus=64, days=1), network)
    best = best_layout(model, gpu, 64, 1024, network)
    assert best is not None and row["num_gpus"] == 64 and row["layout"] == best.layout.describe()
    cell = planned("model=pythia-1b", "gpu=h100-80gb", "num_gpus=64", "num_nodes=8", "model.global_batch_size=1024",
                   *layout_overrides(best))  # fmt: skip
    assert tokens / float(row["tokens_per_s_per_gpu"]) / 3600.0 == pytest.approx(plan_gpu_hours(cell), rel=1e-6)


def test_llama2_7b_tensor_parallel_on_256_a100_costs_the_same_offered_and_planned() -> None:
    tp2 = planned(*LLAMA2_7B, "gpu=a100-80gb", "num_gpus=256", "num_nodes=32", "method.engine=mesh3d", "method.tp=2",
                  "method.micro_batch_size=2")  # fmt: skip
    model, network = tp2.model, network_for(tp2.gpu, tp2.cluster)
    est = estimate_layout(model, tp2.gpu, Layout(128, 2, 1, 2), model.global_batch_size, network)
    hours = plan_gpu_hours(tp2)
    assert est.step_time_s * model.train_steps * 256 / 3600.0 == pytest.approx(hours, rel=1e-6)
    # the layouts a plan offers beside its cells: each at the GPU-hours `plan` gives its sweep line's cell
    offered = near_offers(tp2, None)
    assert offered
    for offer in offered:
        cell = planned(*LLAMA2_7B, "gpu=a100-80gb", "num_gpus=256", "num_nodes=32", *offer.overrides)
        assert offer.gpu_hours == pytest.approx(plan_gpu_hours(cell), rel=1e-6)


def test_a_pipeline_rank_pays_each_micro_batchs_fixed_cost_for_its_stages_only() -> None:
    """A micro-step's fixed cost (kernel launches, memory-bound work) grows with the layers a micro-batch passes:
    a pipeline of p stages running k micro-batches a schedule pays k/p of a whole-model micro-step per schedule,
    not one, so that deep pipelines of one-sequence micro-batches are not cheap by construction."""
    import pandas as pd

    from analysis.predict.inputs import flat_cell, inputs_from_columns
    from analysis.predict.memory_bound import FIXED_S_PER_MICRO_STEP
    from analysis.predict.step_time import DEFAULT_OVERHEAD_S_PER_MICRO_STEP, TERMS, step_terms

    common = ("model=pythia-1b", "gpu=h100-80gb", "num_gpus=8", "model.global_batch_size=64", "method.engine=mesh3d")
    flat = planned(*common, "method.micro_batch_size=1")
    piped = planned(*common, "method.micro_batch_size=1", "method.pp=4", "method.pp_microbatches=32")
    rows = pd.DataFrame([flat_cell(flat), flat_cell(piped)])
    x = inputs_from_columns({c: rows[c] for c in rows.columns}, len(rows))
    column = TERMS.index("micro_steps")
    accum = x.per_gpu_batch / 1.0
    # without a pipeline, 8 sequences a GPU in micro-batches of 1: 8 micro-steps; with 4 stages and 2 replicas,
    # one schedule of 32 micro-batches, each through a quarter of the layers: 8 whole micro-steps' worth
    assert list(accum) == [8.0, 1.0]
    # (on a GPU type with a profile, measured or cited, the fixed cost is what the memory-bound work leaves)
    fixed = FIXED_S_PER_MICRO_STEP / DEFAULT_OVERHEAD_S_PER_MICRO_STEP
    assert list(step_terms(x, accum)[:, column]) == pytest.approx([8.0 * fixed, 8.0 * fixed])
