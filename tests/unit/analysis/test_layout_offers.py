"""The layouts a plan offers (analysis/predict/layouts.py) and the predictor's view of mesh3d cells: a 70B Llama-2 on
1,024 A100-80GB gets a tensor × pipeline × data layout that data parallelism cannot match, the offered overrides
make a cell the sweep accepts and predicts to fit, and a small model is left to data parallelism."""

from __future__ import annotations

import math

import pytest

from analysis.predict.inputs import flat_cell, inputs_from_columns, layout_terms, memory_terms
from analysis.predict.layouts import near_offers, offer, offers
from analysis.predict.predictor import predict_cell
from orchestrator.cells import cell as cells
from orchestrator.config.schema import Config, to_config, to_container
from orchestrator.planning.plan import plan

LARGE = ["gpu=a100-80gb", "num_gpus=1024", "num_nodes=128", "cluster=slurm"]


def cell(*overrides: str) -> Config:
    p = plan(list(overrides), sweep_dir=None)
    (found,) = p.cells + p.skipped
    return to_config(found.config)


def prediction(cfg: Config) -> dict[str, object]:
    p = predict_cell(to_container(cfg))
    hours = p.step_time_s * cfg.model.train_steps * cfg.num_gpus / 3600 if p.step_time_s else None
    return {"predicted_fits": p.fits, "predicted_gpu_hours": hours}


def test_a_70b_model_on_1024_a100s_is_offered_a_3d_layout_cheaper_than_zero3() -> None:
    zero3 = cell("model=llama-2-70b", *LARGE, "method.zero_stage=3", "method.activation_checkpointing=true")
    dp = prediction(zero3)
    assert dp["predicted_fits"] is True
    found, *near = offers([(zero3, dp)])
    assert all(o.estimate.step_time_s >= found.estimate.step_time_s for o in near)
    lay = found.estimate.layout
    assert lay.tensor > 1 and lay.pipeline > 1 and lay.data > 1, found.layout  # a 3D layout
    assert lay.tensor <= 8 and found.estimate.fits
    # ZeRO-3 over 1,024 GPUs gathers every layer twice a micro-step across nodes; most of it hides behind the
    # compute (analysis/predict/step_time.py, OVERLAP), so it costs more, not many times more.
    assert isinstance(dp["predicted_gpu_hours"], float) and found.gpu_hours < dp["predicted_gpu_hours"] / 1.5
    # Within a factor of 1.5 of the 1,720,320 A100-80GB GPU-hours Llama 2 70B was trained with (Touvron et al.).
    assert 1_720_320 / 1.5 < found.gpu_hours < 1_720_320 * 1.5


def test_the_offered_overrides_make_a_cell_the_sweep_accepts_and_predicts_to_fit() -> None:
    zero3 = cell("model=llama-2-70b", *LARGE, "method.zero_stage=3", "method.activation_checkpointing=true")
    found, *_ = offers([(zero3, prediction(zero3))])
    assert found.sweep.startswith("gpudays sweep model=llama-2-70b gpu=a100-80gb num_gpus=1024 num_nodes=128 ")
    mesh = cell("model=llama-2-70b", *LARGE, *found.overrides)
    assert cells.check_runnable(mesh) == []
    p = predict_cell(to_container(mesh))
    assert p.fits and p.micro_batch_size == found.estimate.layout.micro_batch_size and p.grad_accum_steps == 1
    assert p.step_time_s == pytest.approx(found.estimate.step_time_s, rel=0.25)


def test_bloom_whose_batch_no_data_parallel_cell_splits_is_offered_its_published_uneven_pipeline() -> None:
    # BLOOM-176B's shape (benchmarks/published_runs.toml's stand-in): 2048 sequences do not split over 384 GPUs, so
    # every data-parallel cell is refused; its 70 layers in 12 stages are an uneven split.
    bloom = cell(
        "model=pythia-12b", "model.num_parameters=null", "model.num_layers=70", "model.hidden_size=14336",
        "model.num_heads=112", "model.vocab_size=250880", "model.global_batch_size=2048", "gpu=a100-80gb",
        "num_gpus=384", "num_nodes=48", "cluster=slurm",
    )  # fmt: skip
    assert [r.key for r in cells.check_runnable(bloom)] == ["num_gpus"]
    found = offers([(bloom, {})])  # refused: no prediction
    assert "tp4 pp12 dp8" in [o.layout for o in found] and len(found) <= 3
    assert all(o.estimate.fits and o.data_parallel_gpu_hours is None for o in found)


def test_nothing_is_offered_where_data_parallelism_is_cheaper_or_there_is_no_gpu() -> None:
    small = cell("model=pythia-160m", "gpu=a100-80gb", "num_gpus=8")
    assert offer(small, data_parallel_gpu_hours=1.0) is None  # already cheaper than any layout
    assert offer(cell("model=pythia-tiny", "gpu=cpu", "num_gpus=4"), None) is None  # no peak to predict from
    unfit = offer(cell("model=llama-2-70b", *LARGE), None, data_parallel_cells=1)
    assert unfit is not None and unfit.data_parallel_gpu_hours is None  # ZeRO-0 does not fit: offered anyway


def test_the_predictor_splits_a_mesh3d_batch_and_its_activations_as_the_engine_does() -> None:
    mesh = cell("model=pythia-tiny", "gpu=cpu", "num_gpus=4", "method.engine=mesh3d", "method.pp=2")
    dp = cell("model=pythia-tiny", "gpu=cpu", "num_gpus=4", "method.engine=fsdp")
    rows = [flat_cell(to_container(c)) for c in (mesh, dp)]
    x = inputs_from_columns({k: [r.get(k) for r in rows] for k in {*rows[0], *rows[1]}}, 2)
    split = layout_terms(x)
    # mesh3d: 2 replicas x 8 pipeline micro-batches; fsdp: one share per GPU
    assert list(split["batch_split"]) == [16.0, 4.0] and list(x.per_gpu_batch) == [1.0, 4.0]
    # one stage of two, 2 micro-batches in flight: as much as the whole model's one sequence; FSDP all of it
    assert list(split["activation_share"]) == [1.0, 1.0]
    tp = cell("model=pythia-tiny", "gpu=cpu", "num_gpus=4", "method.engine=mesh3d", "method.tp=2")
    x = inputs_from_columns({k: [v] for k, v in flat_cell(to_container(tp)).items()}, 1)
    assert memory_terms(x)["per_sequence"][0] == pytest.approx(x.per_sequence[0] * (10 + 12) / 34)
    assert math.isclose(float(layout_terms(x)["batch_split"][0]), 2.0)


def test_data_parallel_alone_on_mesh3d_is_offered_where_it_is_fastest() -> None:
    # Llama 2 7B on 1,024 A100s: FSDP2 sharded inside a node and replicated across the 128 (HSDP) beats every
    # tensor or pipeline split and the plan's own FSDP cell; it is offered, not left out with the rest.
    fsdp = cell("model=llama-2-7b", *LARGE, "method.engine=fsdp")
    dp = prediction(fsdp)
    offered = near_offers(fsdp, None)
    assert offered, "the fastest layout is data-parallel: it is offered"
    first = offered[0].estimate.layout
    assert (first.tensor, first.pipeline) == (1, 1) and first.dp_replicate > 1, first
    assert isinstance(dp["predicted_gpu_hours"], float) and offered[0].gpu_hours < dp["predicted_gpu_hours"]
