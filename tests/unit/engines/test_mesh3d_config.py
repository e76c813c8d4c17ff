"""mesh3d as a method: its refusals before submission (each naming the key and why), the layout a cell maps to,
its label and cell ids, and its memory and step-time terms (pure; the real engine runs in
tests/integration/test_probe_mesh3d.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from orchestrator.cells import cell as cells
from orchestrator.config.schema import MethodConfig, to_config
from orchestrator.engines.mesh3d.config import layout_of, stage_sizes
from orchestrator.engines.mesh3d.memory import activation_share, memory_terms, rank_parameters
from orchestrator.engines.mesh3d.step_time import bubble
from orchestrator.engines.registry import method_label


def method(**overrides: object) -> MethodConfig:
    return dataclasses.replace(MethodConfig(engine="mesh3d"), **overrides)  # type: ignore[arg-type]


MESH = "method.engine=mesh3d"


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        # heads not divisible: pythia-tiny has 4 heads
        ([MESH, "num_gpus=8", "method.tp=8", "model.global_batch_size=16"], "method.tp", "4 attention heads"),
        # grouped-query attention: smollm2-tiny's 2 key/value heads
        (
            [MESH, "model=smollm2-tiny", "num_gpus=6", "method.tp=3", "model.global_batch_size=18"],
            "method.tp",
            "2 key/value heads",
        ),
        # the sizes must divide the GPUs
        ([MESH, "num_gpus=4", "method.tp=3"], "method.tp", "must divide num_gpus=4"),
        # tensor parallelism across nodes
        (
            [MESH, "cluster=slurm", "gpu=h100-80gb", "num_gpus=8", "num_nodes=4", "method.tp=4"],
            "method.tp",
            "inside a node",
        ),
        # a pipeline longer than the layers (pythia-tiny has 2)
        ([MESH, "num_gpus=4", "method.pp=4"], "method.pp", "has 2 layers"),
        ([MESH, "num_gpus=2", "method.pp=2", "method.pp_schedule=interleaved_1f1b"], "method.pp", "has 2 layers"),
        ([MESH, "num_gpus=2", "method.pp=2", "method.pp_microbatches=1"], "method.pp_microbatches", "at least 2"),
        (
            [
                MESH,
                "model=pythia-1b",
                "num_gpus=4",
                "method.pp=4",
                "method.pp_schedule=interleaved_1f1b",
                "method.pp_microbatches=9",
            ],
            "method.pp_microbatches",
            "multiple of 4",
        ),
        ([MESH, "num_gpus=2", "method.pp_schedule=interleaved_1f1b"], "method.pp_schedule", "no pipeline"),
        ([MESH, "num_gpus=2", "method.pp_microbatches=4"], "method.pp_microbatches", "no pipeline"),
        # a family the engine cannot split
        ([MESH, "model=olmo2-1b", "gpu=h100-80gb", "num_gpus=2", "method.tp=2"], "method.tp", "OLMo 2"),
        # the batch must split into replicas x micro-batches
        ([MESH, "num_gpus=4", "method.pp=2", "method.pp_microbatches=16"], "model.global_batch_size", "do not split"),
        ([MESH, "gpu=a100-80gb", "method.precision=fp16"], "method.precision", "bf16 or fp32"),
        # the vocabulary split needs tensor ranks, an untied output layer and (for now) no pipeline
        ([MESH, "num_gpus=2", "method.tp_loss_parallel=true"], "method.tp_loss_parallel", "method.tp > 1"),
        (
            [MESH, "model=smollm2-tiny", "num_gpus=2", "method.tp=2", "method.tp_loss_parallel=true"],
            "method.tp_loss_parallel",
            "ties its output layer",
        ),
        (
            [MESH, "num_gpus=4", "method.tp=2", "method.pp=2", "method.tp_loss_parallel=true"],
            "method.tp_loss_parallel",
            "method.pp=1",
        ),
        ([MESH, "num_gpus=2", "method.tp_sequence_parallel=true"], "method.tp_sequence_parallel", "method.tp > 1"),
        # another engine's fields, and mesh3d's under another engine
        ([MESH, "num_gpus=2", "method.zero_stage=2"], "method.zero_stage", "method.tp"),
        (["num_gpus=2", "method.tp=2"], "method.tp", "method.engine=mesh3d"),
        (["method.engine=fsdp", "num_gpus=2", "method.pp=2"], "method.pp", "method.engine=fsdp"),
    ],
)
def test_layouts_mesh3d_cannot_run_are_refused_naming_the_key(make_cell, overrides, key, fragment) -> None:
    refusals = cells.check_runnable(to_config(make_cell(*overrides)))
    assert key in [r.key for r in refusals], refusals
    assert any(fragment in r.reason for r in refusals if r.key == key), refusals


@pytest.mark.parametrize(
    "overrides",
    [
        [MESH, "num_gpus=4", "method.tp=2", "method.pp=2"],
        [MESH, "num_gpus=4", "method.tp=1", "method.pp=2"],
        [MESH, "num_gpus=4"],
        [MESH, "model=smollm2-tiny", "num_gpus=4", "method.tp=2", "method.pp=2"],
        [MESH, "num_gpus=4", "method.tp=2", "method.tp_loss_parallel=true", "method.tp_sequence_parallel=true"],
        [MESH, "model=pythia-160m", "num_gpus=2", "method.pp=2", "method.pp_schedule=interleaved_1f1b"],
        # stages need not divide the layers: pythia-70m's 6 in 4 stages
        [MESH, "model=pythia-70m", "num_gpus=2", "method.pp=2", "method.pp_schedule=interleaved_1f1b"],
        # BLOOM-176B as it was trained: 70 layers in 12 stages, 2048 sequences over 8 replicas x 128 micro-batches
        [
            MESH,
            "model=pythia-12b",
            "model.num_parameters=null",
            "model.num_layers=70",
            "model.hidden_size=14336",
            "model.num_heads=112",
            "model.vocab_size=250880",
            "model.global_batch_size=2048",
            "gpu=a100-80gb",
            "cluster=slurm",
            "num_gpus=384",
            "num_nodes=48",
            "method.tp=4",
            "method.pp=12",
            "method.pp_microbatches=128",
            "method.micro_batch_size=2",
        ],  # fmt: skip
        # the batch splits over the replicas x micro-batches (64 x 8 of 1024), not over the 2,048 GPUs
        [
            MESH,
            "model=llama-2-70b",
            "cluster=slurm",
            "gpu=h100-80gb",
            "num_gpus=2048",
            "num_nodes=256",
            "method.tp=8",
            "method.pp=4",
        ],
        [
            MESH,
            "model=pythia-1b",
            "cluster=slurm",
            "gpu=h100-80gb",
            "num_gpus=16",
            "num_nodes=2",
            "method.tp=8",
            "method.pp=2",
        ],
    ],
)
def test_what_mesh3d_can_run_is_accepted(make_cell, overrides) -> None:
    config = to_config(make_cell(*overrides))
    assert cells.check_values(config) == [] and cells.check_runnable(config) == []


def test_a_layout_is_a_mesh_stages_and_a_batch_split() -> None:
    lay = layout_of(method(tp=2, pp=4, pp_schedule="interleaved_1f1b", pp_microbatches=8), 64)
    assert lay.mesh_shape == (4, 8, 2) and lay.num_stages == 8 and lay.batch_split == 8 * 8
    assert lay.stages_of(1) == [1, 5]
    assert [list(r) for r in lay.stage_layers(16)][:2] == [[0, 1], [2, 3]]
    # Uneven splits balanced by cost, the vocabulary matrices weighing on the end stages, as the published runs
    # laid them out: BLOOM's 70 layers in 12 stages (its embedding about 1.46 layers), Llama 3 405B's 126 in 16.
    assert stage_sizes(70, 12, 1.46) == [5, *[6] * 10, 5]
    assert stage_sizes(126, 16, 0.65) == [7, *[8] * 14, 7]
    assert [list(r) for r in layout_of(method(pp=3), 3).stage_layers(8, end_weight=2.0)] == [
        [0, 1],
        [2, 3, 4, 5],
        [6, 7],
    ]
    assert lay.bubble == pytest.approx(3 / (2 * 8 + 3))
    flat = layout_of(method(tp=2, pp_microbatches=8), 8)  # no pipeline: its micro-batch settings do nothing
    assert flat.microbatches == 1 and flat.batch_split == 4 and flat.bubble == 0.0 and flat.schedule == "none"
    with pytest.raises(ValueError, match="must divide num_gpus"):
        layout_of(method(tp=3), 8)


def test_the_label_and_ids_say_the_layout_and_leave_other_engines_ids_alone(make_cell) -> None:
    assert method_label({"engine": "mesh3d", "tp": 2, "pp": 2, "pp_schedule": "1f1b", "pp_microbatches": 8}) == (
        "tp2 pp2 1f1b-m8"
    )
    assert method_label({"engine": "mesh3d", "tp": 4, "pp": 1}) == "tp4 pp1"
    deepspeed = to_config(make_cell("model=pythia-160m", "gpu=h100-80gb", "num_gpus=8"))
    assert cells.cell_id(deepspeed) == "3702d9be51bd"  # as in test_cells_identity: never moves
    a = to_config(make_cell("model=pythia-160m", "gpu=h100-80gb", "num_gpus=8", MESH, "method.tp=2"))
    b = to_config(make_cell("model=pythia-160m", "gpu=h100-80gb", "num_gpus=8", MESH, "method.pp=2"))
    assert len({cells.cell_id(deepspeed), cells.cell_id(a), cells.cell_id(b)}) == 3
    assert cells.identity(a)["method.tp"] == 2 and "method.pp" not in cells.identity(a)


def test_memory_terms_split_the_layers_over_tensor_and_pipeline_ranks_and_shard_over_replicas() -> None:
    psi, e = 1.0e9, 1.0e8
    # one GPU: everything; tp=2: the layers halve, the vocabulary matrices stay whole; pp=2 holds one of them
    assert rank_parameters(psi, e, 1, 1) == pytest.approx(psi)
    assert rank_parameters(psi, e, 2, 1) == pytest.approx((psi - 2 * e) / 2 + 2 * e)
    assert rank_parameters(psi, e, 1, 2) == pytest.approx((psi - 2 * e) / 2 + e)
    # an uneven split holds its largest stage: 5 layers in 3 stages of 1, 3, 1 where the ends weigh 2.3 layers
    big_e = 2.4e8
    per_layer = (psi - 2 * big_e) / 5
    assert stage_sizes(5, 3, big_e / per_layer) == [1, 3, 1]
    assert rank_parameters(psi, big_e, 1, 3, num_layers=5) == pytest.approx(per_layer + big_e)
    one = memory_terms(psi, e, e, 16, 1, 1, 1, "bf16")
    four_dp = memory_terms(psi, e, e, 16, 4, 1, 1, "bf16")
    assert four_dp["optimizer"] == pytest.approx(one["optimizer"] / 4) and one["optimizer"] == pytest.approx(8 * psi)
    piped = memory_terms(np.array([psi]), e, e, 16, 4, 1, 2, "bf16")
    assert piped["buffers"][0] == pytest.approx(2.0 * rank_parameters(psi, e, 1, 2))  # the stage stays gathered
    # tp_loss_parallel splits the vocabulary matrices too, and the logits' share of the activations
    assert rank_parameters(psi, e, 2, 1, vocab_split=True) == pytest.approx(psi / 2)
    assert rank_parameters(psi, e, 2, 2, 4, True) == pytest.approx((psi - 2 * e) / 4 + e / 2)
    plain = activation_share(2, 1, 1)
    assert activation_share(2, 1, 1, 1.0, 0.0, True) == pytest.approx(plain)
    assert activation_share(2, 1, 1, 1.0, 0.5, True) == pytest.approx(0.5 * plain + 0.5 / 2)
    # tp_sequence_parallel splits the norms' and the residual's share as well: all of a layer's over t
    assert activation_share(2, 1, 1, 1.0, 0.0, True, True) == pytest.approx(1 / 2) and plain > 1 / 2


def test_the_bubble_shrinks_with_micro_batches_and_interleaving() -> None:
    assert bubble(1, 8, "1f1b") == 0.0
    assert bubble(4, 8, "1f1b") == pytest.approx(3 / 11)
    assert bubble(4, 8, "interleaved_1f1b") == pytest.approx(3 / 19)
    assert list(bubble(np.array([2.0, 2.0]), np.array([4.0, 16.0]), np.array(["1f1b", "1f1b"], dtype=object))) == (
        pytest.approx([1 / 5, 1 / 17])
    )
