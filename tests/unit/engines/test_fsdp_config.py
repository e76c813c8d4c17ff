"""FSDP2 as a method: the refusals before submission, the cell ids it leaves alone, and how each option maps onto
``fully_shard``'s arguments (pure; the real FSDP2 runs in tests/integration/test_probe_fsdp.py)."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.cells import cell as cells
from orchestrator.config.schema import MethodConfig, to_config
from orchestrator.engines.base import engine_module_name, engine_name
from orchestrator.engines.fsdp.config import fsdp_options
from orchestrator.planning.plan import SweepError, plan


def method(**overrides: object) -> MethodConfig:
    return dataclasses.replace(MethodConfig(), **overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (["method.engine=fsdp", "num_gpus=2", "method.zero_stage=2"], "method.zero_stage", "method.fsdp_sharding"),
        (["method.engine=fsdp", "method.offload_params=true"], "method.offload_params", "fsdp_offload=true"),
        (["method.engine=fsdp", "method.offload_optimizer=true"], "method.offload_optimizer", "leave it at False"),
        (["method.fsdp_sharding=grad_op"], "method.fsdp_sharding", "method.engine=fsdp"),
        (["method.fsdp_offload=true"], "method.fsdp_offload", "method.engine=fsdp"),
        (["method.fsdp_reduce_precision=bf16"], "method.fsdp_reduce_precision", "method.engine=fsdp"),
        (["method.engine=fsdp", "num_gpus=2", "method.fsdp_sharding=hybrid"], "method.fsdp_sharding", "num_nodes"),
        (["method.engine=fsdp", "method.fsdp_offload=true"], "method.fsdp_offload", "gpu=cpu"),
        (
            [
                "method.engine=fsdp",
                "gpu=a100-80gb",
                "num_gpus=2",
                "method.fsdp_sharding=none",
                "method.fsdp_offload=true",
            ],
            "method.fsdp_offload",
            "needs sharding",
        ),
        (["method.engine=fsdp", "gpu=a100-80gb", "method.precision=fp16"], "method.precision", "bf16 or fp32"),
    ],
)
def test_combinations_fsdp_does_not_have_are_refused_naming_the_key(make_cell, overrides, key, fragment) -> None:
    refusals = cells.check_runnable(to_config(make_cell(*overrides)))
    assert key in [r.key for r in refusals], refusals
    assert any(fragment in r.reason for r in refusals if r.key == key), refusals


@pytest.mark.parametrize(
    "overrides",
    [
        ["method.engine=fsdp"],
        ["method.engine=fsdp", "num_gpus=2", "method.fsdp_sharding=grad_op"],
        ["method.engine=fsdp", "num_gpus=2", "method.fsdp_sharding=none", "method.activation_checkpointing=true"],
        ["method=fsdp-offload", "gpu=a100-80gb", "num_gpus=8"],
        ["method=fsdp-grad-op", "gpu=h100-80gb", "num_gpus=8"],
        [
            "method.engine=fsdp",
            "gpu=h100-80gb",
            "num_gpus=16",
            "num_nodes=2",
            "cluster=slurm",
            "method.fsdp_sharding=hybrid",
        ],
    ],
)
def test_what_fsdp_has_is_accepted(make_cell, overrides) -> None:
    config = to_config(make_cell(*overrides))
    assert cells.check_values(config) == [] and cells.check_runnable(config) == []


def test_unknown_engine_and_sharding_are_input_errors_before_anything_is_submitted() -> None:
    with pytest.raises(SweepError) as err:
        plan(["method.engine=megatron", "method.fsdp_sharding=zero"], sweep_dir=None)
    assert "method.engine: 'megatron' is not accepted; use one of deepspeed, fsdp" in str(err.value)
    assert "method.fsdp_sharding: 'zero' is not accepted; use one of full, grad_op, none, hybrid" in str(err.value)


def test_deepspeed_cells_keep_their_ids_and_fsdp_cells_get_their_own(make_cell) -> None:
    deepspeed = to_config(make_cell("model=pythia-160m", "gpu=h100-80gb", "num_gpus=8"))
    assert cells.cell_id(deepspeed) == "3702d9be51bd"  # as in test_cells_identity: never moves
    explicit = to_config(make_cell("model=pythia-160m", "gpu=h100-80gb", "num_gpus=8", "method.engine=deepspeed"))
    assert cells.cell_id(explicit) == "3702d9be51bd"
    full = to_config(make_cell("model=pythia-160m", "gpu=h100-80gb", "num_gpus=8", "method.engine=fsdp"))
    grad_op = to_config(make_cell("model=pythia-160m", "gpu=h100-80gb", "num_gpus=8", "method=fsdp-grad-op"))
    ids = {cells.cell_id(deepspeed), cells.cell_id(full), cells.cell_id(grad_op)}
    assert len(ids) == 3
    assert cells.identity(full)["method.engine"] == "fsdp" and "method.fsdp_sharding" not in cells.identity(full)
    assert cells.settings(grad_op)["engine"] == "fsdp" and cells.settings(grad_op)["fsdp_sharding"] == "grad_op"
    assert "fsdp-grad_op" in cells.label(grad_op) and "zero" not in cells.label(grad_op)


def test_the_training_probe_creates_the_engine_the_method_names(make_cell) -> None:
    config = to_config(make_cell("method.engine=fsdp"))
    assert engine_module_name(engine_name(config)) == "orchestrator.engines.fsdp.engine"
    sleep = to_config(make_cell("probe.kind=sleep", "method.engine=fsdp"))
    with pytest.raises(ValueError, match="trains nothing"):
        engine_name(sleep)


@pytest.mark.parametrize(
    ("sharding", "gpus", "nodes", "mesh", "reshard"),
    [
        ("full", 8, 1, (8,), True),
        ("grad_op", 8, 1, (8,), False),
        ("none", 8, 1, (8, 1), False),
        ("hybrid", 16, 2, (2, 8), True),
        ("full", 16, 2, (16,), True),
        ("full", 1, 1, (1,), True),
    ],
)
def test_sharding_maps_to_a_mesh_and_resharding(sharding, gpus, nodes, mesh, reshard) -> None:
    opts = fsdp_options(method(engine="fsdp", fsdp_sharding=sharding), gpus, nodes)
    assert opts.mesh_shape == mesh and opts.reshard_after_forward is reshard
    assert opts.as_record()["mesh_dim_names"] == (["replicate", "shard"] if len(mesh) == 2 else [])


@pytest.mark.parametrize(
    ("precision", "reduce", "param_dtype", "reduce_dtype"),
    [
        ("bf16", "fp32", "bfloat16", "float32"),  # the default: bf16 compute, fp32 reduction and accumulation
        ("bf16", "bf16", "bfloat16", None),  # reduce in the compute dtype
        ("fp32", "fp32", None, None),  # no mixed precision at all
        ("fp32", "bf16", None, "bfloat16"),
    ],
)
def test_precision_maps_to_the_mixed_precision_policy(precision, reduce, param_dtype, reduce_dtype) -> None:
    opts = fsdp_options(method(engine="fsdp", precision=precision, fsdp_reduce_precision=reduce), 2, 1)
    assert (opts.param_dtype, opts.reduce_dtype) == (param_dtype, reduce_dtype)


def test_the_engine_refuses_what_cells_refuse() -> None:
    with pytest.raises(ValueError, match="method.precision"):
        fsdp_options(method(engine="fsdp", precision="fp16"), 2, 1)
    with pytest.raises(ValueError, match="num_nodes >= 2"):
        fsdp_options(method(engine="fsdp", fsdp_sharding="hybrid"), 2, 1)
    with pytest.raises(ValueError, match="accepted are full"):
        fsdp_options(method(engine="fsdp", fsdp_sharding="zero3"), 2, 1)
    assert fsdp_options(method(engine="fsdp", fsdp_offload=True), 2, 1).offload
