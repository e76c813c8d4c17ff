"""mesh3d's selective activation checkpointing (``method.checkpoint_policy``) and HSDP over its data-parallel
replicas (``method.dp_replicate``): their domains and refusals before submission, the cell ids they leave alone,
and their memory and step-time terms (pure; the engine runs them in tests/integration/test_probe_mesh3d.py)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from orchestrator.cells import cell as cells
from orchestrator.config.schema import MethodConfig, to_config
from orchestrator.engines.memory import activation_bytes_per_sequence, recomputes_layers, selective_layer_bytes
from orchestrator.engines.mesh3d.config import data_mesh, layout_of
from orchestrator.engines.mesh3d.memory import memory_terms, shard_degree
from orchestrator.engines.registry import method_label

MESH = "method.engine=mesh3d"
TWO_NODES = ["cluster=slurm", "gpu=h100-80gb", "num_gpus=16", "num_nodes=2"]


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        ([MESH, "num_gpus=2", "method.tp=2", "method.checkpoint_policy=selective"], "method.checkpoint_policy",
         "activation_checkpointing=true"),
        (["method.engine=fsdp", "num_gpus=2", "method.activation_checkpointing=true",
          "method.checkpoint_policy=selective"], "method.checkpoint_policy", "mesh3d setting"),
        (["num_gpus=2", "method.zero_stage=1", "method.activation_checkpointing=true",
          "method.checkpoint_policy=selective"], "method.checkpoint_policy", "method.engine=mesh3d"),
        ([MESH, "num_gpus=8", "method.tp=2", "method.dp_replicate=3", "model.global_batch_size=24"],
         "method.dp_replicate", "do not divide the 4 data-parallel replicas"),
        (["method.engine=fsdp", "num_gpus=4", "method.dp_replicate=2"], "method.dp_replicate", "mesh3d setting"),
    ],
)  # fmt: skip
def test_settings_that_cannot_run_are_refused_naming_the_key(make_cell, overrides, key, fragment) -> None:
    config = to_config(make_cell(*overrides))
    refusals = cells.check_values(config) + cells.check_runnable(config)
    assert key in [r.key for r in refusals], refusals
    assert any(fragment in r.reason for r in refusals if r.key == key), refusals


@pytest.mark.parametrize(
    ("override", "message"),
    [("method.checkpoint_policy=some", "method.checkpoint_policy: 'some' is not accepted; use one of full, selective"),
     ("method.dp_replicate=0", "method.dp_replicate: ")],
)  # fmt: skip
def test_values_outside_the_domain_are_input_errors_naming_the_accepted_ones(make_cell, override, message) -> None:
    from orchestrator.planning.plan import SweepError

    with pytest.raises(SweepError, match=re.escape(message)):
        make_cell(MESH, "num_gpus=2", override)


@pytest.mark.parametrize(
    "overrides",
    [
        [MESH, "num_gpus=2", "method.tp=2", "method.activation_checkpointing=true", "method.checkpoint_policy=selective"],
        [MESH, *TWO_NODES, "method.tp=4", "method.dp_replicate=2"],
        [MESH, *TWO_NODES, "method.tp=2", "method.pp=2", "method.pp_microbatches=4", "method.dp_replicate=2",
         "method.activation_checkpointing=true",
         "method.checkpoint_policy=selective"],
    ],
)  # fmt: skip
def test_what_mesh3d_runs_is_accepted(make_cell, overrides) -> None:
    config = to_config(make_cell(*overrides))
    assert cells.check_values(config) == [] and cells.check_runnable(config) == []


def test_the_new_settings_leave_every_existing_id_alone_and_set_ones_move(make_cell) -> None:
    base = [
        MESH,
        "model=pythia-160m",
        "gpu=h100-80gb",
        "num_gpus=8",
        "method.tp=2",
        "method.activation_checkpointing=true",
    ]
    full = to_config(make_cell(*base))
    ident = cells.identity(full)
    assert "method.checkpoint_policy" not in ident and "method.dp_replicate" not in ident  # at their defaults
    explicit = to_config(make_cell(*base, "method.checkpoint_policy=full", "method.dp_replicate=1"))
    assert cells.cell_id(explicit) == cells.cell_id(full)
    selective = to_config(make_cell(*base, "method.checkpoint_policy=selective"))
    hsdp = to_config(make_cell(*base, "method.dp_replicate=2"))
    assert len({cells.cell_id(full), cells.cell_id(selective), cells.cell_id(hsdp)}) == 3
    assert cells.identity(selective)["method.checkpoint_policy"] == "selective"
    assert cells.identity(hsdp)["method.dp_replicate"] == 2
    deepspeed = to_config(make_cell("model=pythia-160m", "gpu=h100-80gb", "num_gpus=8"))
    assert cells.cell_id(deepspeed) == "3702d9be51bd"  # as in test_cells_identity: never moves
    assert method_label(
        {"engine": "mesh3d", "tp": 2, "pp": 1, "dp_replicate": 2, "checkpoint_policy": "selective"}
    ) == ("tp2 pp1 hsdp2 selective")


@pytest.mark.parametrize("model", ["pythia-160m", "llama-3.2-1b", "qwen3-0.6b"])
def test_selective_keeps_more_than_full_checkpointing_and_less_than_none(make_cell, model) -> None:
    cfg = to_config(make_cell(MESH, f"model={model}", "gpu=h100-80gb"))
    none = dataclasses.replace(cfg.method, activation_checkpointing=False)
    full = dataclasses.replace(cfg.method, activation_checkpointing=True)
    selective = dataclasses.replace(full, checkpoint_policy="selective")
    m = cfg.model
    bytes_of = {name: activation_bytes_per_sequence(m, meth) for name, meth in
                [("none", none), ("full", full), ("selective", selective)]}  # fmt: skip
    assert bytes_of["full"] < bytes_of["selective"] < bytes_of["none"], bytes_of
    # the layers' part is L x the kept bytes a token, the peak of the rest the larger of the loss and one layer
    assert bytes_of["selective"] >= m.num_layers * selective_layer_bytes(m) * m.seq_length
    # llama's SwiGLU layer of h=2048, 32 heads of 64 (8 key/value heads), f=8192: the input, q, k, v, attention's
    # output, the o projection, gate and up, down; 2 bytes each, and attention's fp32 log-sum-exp per head
    if model == "llama-3.2-1b":
        h, f = 2048, 8192
        assert selective_layer_bytes(m) == 2 * (h + (h + 2 * 512) + h + h + 2 * f + h) + 4 * 32
    # selective reruns no matrix product: its hardware FLOPs are the unchecked step's
    assert recomputes_layers(True, "full") and not recomputes_layers(True, "selective")
    assert not recomputes_layers(False, "full")


def test_hsdp_shards_the_states_over_one_replica_group_only() -> None:
    psi, e = 1.0e9, 1.0e8
    # 16 GPUs, tp=2: 8 replicas; two groups of 4 shard over 4, each group holding all the states
    assert shard_degree(16, 2, 1) == 8 and shard_degree(16, 2, 1, 2) == 4 and shard_degree(16, 2, 1, 8) == 1
    flat = memory_terms(psi, e, e, 16, 16, 2, 1, "bf16")
    hsdp = memory_terms(psi, e, e, 16, 16, 2, 1, "bf16", False, 2)
    for holder in ("params", "optimizer"):
        assert hsdp[holder] == pytest.approx(2 * flat[holder])
    assert hsdp["buffers"] == pytest.approx(flat["buffers"])  # the gathered layers are the same
    lay = layout_of(dataclasses.replace(MethodConfig(engine="mesh3d"), tp=2, dp_replicate=2), 16)
    assert data_mesh(lay, 2) == (2, 4) and data_mesh(lay, 1) == (8,)


def test_the_predictor_orders_the_checkpointing_policies_and_charges_hsdp_its_states() -> None:
    import synthetic

    from analysis.predict.predictor import predict_cell
    from analysis.sweeps.records import Catalog

    catalog = Catalog.load()

    def _mesh(gpus: int = 8, nodes: int = 1, **method: object) -> dict:
        return synthetic.cell_config("llama-3.2-1b", "h100-80gb", gpus, nodes, catalog, engine="mesh3d", **method)

    ckpt = {"none": {}, "full": {"activation_checkpointing": True},
            "selective": {"activation_checkpointing": True, "checkpoint_policy": "selective"}}  # fmt: skip
    cells = {name: predict_cell(_mesh(tp=2, **m), micro_batch_size=4) for name, m in ckpt.items()}
    peak = {name: c.peak_memory_gib for name, c in cells.items()}
    assert peak["full"] < peak["selective"] < peak["none"], peak
    # selective reruns no matrix product: the step costs what the unchecked one does, full checkpointing more
    step = {name: c.step_time_s for name, c in cells.items()}
    assert step["selective"] == pytest.approx(step["none"]) and step["full"] > step["none"], step
    flat = predict_cell(_mesh(16, 2, tp=2), micro_batch_size=4)
    hsdp = predict_cell(_mesh(16, 2, tp=2, dp_replicate=2), micro_batch_size=4)
    assert hsdp.peak_memory_gib > flat.peak_memory_gib  # the states over 4 replicas of a node, not all 8
    assert hsdp.step_time_s < flat.step_time_s  # the shards' traffic inside the node; only an all-reduce across
