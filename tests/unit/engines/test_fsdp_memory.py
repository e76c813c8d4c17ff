"""FSDP2's memory model (hand-checked states per sharding, offload, gathered layers) and what the predictor makes of
it next to ZeRO's: FSDP's options order as the ZeRO stages they resemble."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import synthetic

from analysis.predict.inputs import inputs_from_columns
from analysis.predict.network import links_for
from analysis.predict.predictor import plan, predict_cell
from analysis.predict.step_time import step_terms
from analysis.sweeps.records import Catalog
from orchestrator.config.schema import MethodConfig, to_config
from orchestrator.engines import memory as shared_memory
from orchestrator.engines.deepspeed import memory as ds_memory
from orchestrator.engines.fsdp.memory import (
    buffer_bytes,
    estimate_micro_batch_size,
    fixed_bytes,
    memory_terms,
    model_state_bytes,
    shard_group_size,
)
from orchestrator.engines.fsdp.step_time import step_time_terms as fsdp_step_time_terms
from orchestrator.models import num_parameters

PSI = 1e9


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def test_shard_groups() -> None:
    assert shard_group_size(["full", "grad_op", "none", "hybrid"], 16, 2).tolist() == [16, 16, 1, 8]


def test_sharded_states_are_zero3s_sixteen_bytes_plus_the_accumulated_gradients() -> None:
    # Accumulating sharded (the default: a reduce-scatter every micro-batch), the states are ZeRO-3's 16 bytes.
    params, grads, optimizer = model_state_bytes(PSI, "full", 8)
    assert (params, grads, optimizer) == (4 * PSI / 8, 4 * PSI / 8, 8 * PSI / 8)
    zero3 = sum(ds_memory.model_state_bytes(PSI, 3, 8, "bf16"))
    assert params + grads + optimizer == zero3
    # Accumulating unsharded, each rank keeps the whole gradients between boundaries, in the reduce dtype.
    unsharded = model_state_bytes(PSI, "full", 8, accumulation="unsharded")
    assert unsharded[1] == 4 * PSI / 8 + 4 * PSI
    assert model_state_bytes(PSI, "full", 8, 1, "bf16", False, "unsharded")[1] == 4 * PSI / 8 + 2 * PSI
    assert sum(model_state_bytes(PSI, "none", 8, accumulation="unsharded")) == 16 * PSI + 4 * PSI
    assert sum(model_state_bytes(PSI, "none", 8)) == 16 * PSI  # every rank holds everything
    assert model_state_bytes(PSI, "hybrid", 16, 2)[0] == 4 * PSI / 8  # sharded inside a node of 8


def test_offload_keeps_the_states_on_the_host_but_not_the_accumulated_gradients() -> None:
    params, grads, optimizer = model_state_bytes(PSI, "full", 8, offload=True, accumulation="unsharded")
    assert (params, grads, optimizer) == (0.0, 4 * PSI, 0.0)
    assert model_state_bytes(PSI, "full", 8, offload=True) == (0.0, 0.0, 0.0)
    terms = memory_terms(PSI, 1e8, 20, "full", 8, 1, "bf16", "fp32", True)
    assert terms["offloaded"] == pytest.approx(16 * PSI / 8)


def test_grad_op_and_none_keep_every_layer_gathered_full_only_two() -> None:
    full = buffer_bytes(PSI, 1e8, 20, "full", "bf16", "fp32")
    grad_op = buffer_bytes(PSI, 1e8, 20, "grad_op", "bf16", "fp32")
    assert full == pytest.approx(2 * PSI / 20 * 2 + 1e8 * 2 + PSI / 20 * 4)
    assert grad_op == pytest.approx(PSI * 2 + PSI / 20 * 4)
    assert buffer_bytes(PSI, 1e8, 20, "none", "bf16", "fp32") == grad_op


def test_arrays_and_scalars_agree() -> None:
    kinds = np.array(["full", "grad_op", "none", "hybrid"], dtype=object)
    arrays = model_state_bytes(np.full(4, PSI), kinds, np.full(4, 16.0), np.full(4, 2.0))
    for i, kind in enumerate(kinds):
        assert [a[i] for a in arrays] == list(model_state_bytes(PSI, kind, 16, 2))


def test_the_probe_starts_its_search_where_the_model_says(make_cell) -> None:
    config = to_config(make_cell("model=pythia-1b", "gpu=a100-80gb", "num_gpus=8", "method=fsdp-full"))
    fixed = fixed_bytes(config.model, config.method, 8)
    per_sequence = shared_memory.activation_bytes_per_sequence(config.model, config.method)
    micro = estimate_micro_batch_size(config, 80.0)
    usable = 80.0 * shared_memory.GIB * (1 - shared_memory.DEFAULT_MARGIN)
    peak = shared_memory.peak_bytes  # allocated bytes times the caching allocator's overhead, as for DeepSpeed
    assert peak(fixed, per_sequence, micro) <= usable < peak(fixed, per_sequence, micro + 1)
    assert fixed > 16 * num_parameters(config.model) / 8  # the accumulated gradients and gathered layers too


def _fsdp(catalog: Catalog, gpus: int = 8, nodes: int = 1, **method: object) -> dict:
    return synthetic.cell_config("pythia-1b", "a100-80gb", gpus, nodes, catalog=catalog, engine="fsdp", **method)


def test_the_predictor_orders_fsdps_options_as_the_zero_stages_they_resemble(catalog: Catalog) -> None:
    peak = {s: predict_cell(_fsdp(catalog, fsdp_sharding=s), micro_batch_size=4).peak_memory_gib for s in
            ("full", "grad_op", "none")}  # fmt: skip
    offload = predict_cell(_fsdp(catalog, fsdp_offload=True), micro_batch_size=4)
    assert offload.peak_memory_gib < peak["full"] < peak["grad_op"] < peak["none"]
    assert offload.offloaded_gib == pytest.approx(16 * offload_params(catalog) / 8 / 2**30)
    zero3 = predict_cell(
        synthetic.cell_config("pythia-1b", "a100-80gb", 8, catalog=catalog, zero_stage=3), micro_batch_size=4
    )
    # Same sharded states as ZeRO-3; FSDP adds the unsharded gradients it accumulates between boundaries.
    assert peak["full"] > zero3.peak_memory_gib
    assert offload.offload_s is not None and offload.offload_s > 0


def offload_params(catalog: Catalog) -> float:
    config = to_config(_fsdp(catalog))
    return float(num_parameters(config.model))


def test_step_time_terms_follow_the_gathers_and_the_one_reduction(catalog: Catalog) -> None:
    cells = [_fsdp(catalog, fsdp_sharding=s) for s in ("full", "grad_op", "none")]
    cells.append(_fsdp(catalog, 16, 2, fsdp_sharding="hybrid"))
    cells.append(_fsdp(catalog, 16, 2, fsdp_sharding="full"))
    rows = [{k: v for k, v in synthetic_row(c).items()} for c in cells]
    x = inputs_from_columns({k: [r.get(k) for r in rows] for k in rows[0]}, len(rows))
    accum = np.full(len(rows), 4.0)
    links = links_for(x.gpu, x.arch, x.inter_node_bytes_s)
    terms = fsdp_step_time_terms(x, accum, links)
    full, grad_op, none, hybrid, full_2 = terms["communication_s"] + terms["overlappable_s"]
    assert full > grad_op > 0  # two gathers a micro-step, one
    # none gathers nothing but all-reduces every micro-step (2(n-1)/n of the fp32 gradients; grad_op's gather and
    # reduce-scatter send (n-1)/n of bf16 and fp32 each).
    assert none > grad_op
    assert hybrid < full_2  # hybrid gathers inside the node; full over two nodes gathers across them
    # What the step waits for: at least the floor (a unit's first gather and last reduction), at most all of it.
    exposed = step_terms(x, accum)[:, 1]
    assert np.all(exposed >= terms["overlap_floor_s"]) and np.all(exposed <= terms["overlappable_s"])


def synthetic_row(cell: dict) -> dict:
    from analysis.predict.inputs import flat_cell

    return flat_cell(cell)


def test_deepspeed_cells_predict_as_before(catalog: Catalog) -> None:
    cell = synthetic.cell_config("pythia-1b", "a100-80gb", 8, catalog=catalog, zero_stage=2)
    explicit = dict(cell, method={**cell["method"], "engine": "deepspeed"})
    assert predict_cell(cell) == predict_cell(explicit)
    legacy = dict(cell, method={k: v for k, v in cell["method"].items() if not k.startswith(("engine", "fsdp"))})
    assert predict_cell(legacy) == predict_cell(cell)  # a record from before the engine existed


def test_plan_names_the_engine(catalog: Catalog) -> None:
    rows = plan([_fsdp(catalog), synthetic.cell_config("pythia-1b", "a100-80gb", 8, catalog=catalog)])
    assert rows["engine"].tolist() == ["fsdp", "deepspeed"]
    assert rows["predicted_step_time_s"].notna().all()


def test_method_defaults_are_deepspeeds() -> None:
    m = MethodConfig()
    assert m.engine == "deepspeed" and dataclasses.asdict(m)["fsdp_sharding"] == "full"


def test_sharded_accumulation_reduces_every_micro_batch_and_joins_every_fsdp_id(catalog: Catalog) -> None:
    from orchestrator.cells.cell import cell_id, identity

    sharded, unsharded = _fsdp(catalog), _fsdp(catalog, fsdp_accumulation="unsharded")
    rows = [synthetic_row(c) for c in (sharded, unsharded)]
    x = inputs_from_columns({k: [r.get(k) for r in rows] for k in rows[0]}, len(rows))
    one, four = (step_terms(x, np.full(2, n))[:, 1] for n in (1.0, 4.0))
    assert one[0] == pytest.approx(one[1])  # one micro-batch: one reduction either way
    assert four[0] > four[1]  # four micro-batches: four reduce-scatters against one
    mem = [predict_cell(c, micro_batch_size=4).peak_memory_gib for c in (sharded, unsharded)]
    assert mem[0] < mem[1]  # whole gradients kept between boundaries
    # A cell measured before the setting existed ran unsharded under an id without it: no FSDP id is that id now.
    legacy = identity(to_config(sharded))
    assert legacy.pop("method.fsdp_accumulation") == "sharded"
    assert "method.fsdp_accumulation" not in identity(
        to_config(synthetic.cell_config("pythia-1b", "a100-80gb", 8, catalog=catalog))
    )
    assert cell_id(to_config(sharded)) != cell_id(to_config(unsharded))
    # ... and the report reads such a record's cell as what it ran.
    from analysis.sweeps.catalog import stored_cell

    old = dict(sharded, method={k: v for k, v in sharded["method"].items() if k != "fsdp_accumulation"})
    assert stored_cell(old).method.fsdp_accumulation == "unsharded"
