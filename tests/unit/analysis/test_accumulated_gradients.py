"""Gradients kept whole between micro-steps (mesh3d without a pipeline, FSDP's ``unsharded`` accumulation) are
held only where a step accumulates: a step of one micro-step is its own boundary and reduces them as the backward
makes them (``set_requires_gradient_sync(True)``), so the predictor charges them only where it accumulates, and
its ``auto`` micro-batch tries the whole per-GPU batch without them first."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import synthetic

from analysis.predict.predictor import predict_cell
from analysis.sweeps.records import Catalog


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def _cell(catalog: Catalog, model: str, gpus: int, nodes: int, batch: int, **method: Any) -> dict[str, Any]:
    cfg = synthetic.cell_config(model, "h100-80gb", gpus, nodes, catalog, **method)
    cfg["model"]["global_batch_size"] = batch
    return cfg


def test_mesh3d_holds_the_whole_gradients_only_where_a_step_accumulates(catalog: Catalog) -> None:
    # llama-2-70b, tp8 over 128 GPUs: 16 replicas, 32 sequences a step, 2 a replica.
    cell = _cell(catalog, "llama-2-70b", 128, 16, 32, engine="mesh3d", tp=8, activation_checkpointing=True)
    one = predict_cell(cell, micro_batch_size=2)
    two = predict_cell(cell, micro_batch_size=1)
    assert (one.grad_accum_steps, two.grad_accum_steps) == (1, 2)
    # The whole fp32 gradients of a rank's share are the 16 replicas' fp32 parameter shards together.
    assert two.grads_gib - one.grads_gib == pytest.approx(16 * one.params_gib, rel=1e-9)
    assert one.grads_gib == pytest.approx(one.params_gib, rel=1e-9), "a step of one micro-step: the fp32 shards only"
    assert two.peak_memory_gib - one.peak_memory_gib == pytest.approx(
        two.grads_gib - one.grads_gib - one.activations_gib / 2, rel=1e-9
    )
    # Forcing accumulation at the same micro-batch holds them again.
    forced = predict_cell(cell, micro_batch_size=2, grad_accum_steps=2)
    assert forced.grads_gib == pytest.approx(two.grads_gib, rel=1e-9)
    # auto: the whole replica's batch in one micro-step, which fits here.
    auto = predict_cell(cell)
    assert (auto.micro_batch_size, auto.grad_accum_steps, auto.fits) == (2, 1, True)


def test_a_pipeline_accumulates_its_schedule_always(catalog: Catalog) -> None:
    # 8 replicas of tp8 pp2, 4 sequences each: one schedule of 4 micro-batches a step.
    cell = _cell(
        catalog, "llama-2-70b", 128, 16, 32, engine="mesh3d", tp=8, pp=2, pp_microbatches=4,
        activation_checkpointing=True,
    )  # fmt: skip
    one = predict_cell(cell, micro_batch_size=1)
    two = predict_cell(cell, micro_batch_size=1, grad_accum_steps=2)
    assert one.grad_accum_steps == 1 and one.grads_gib == pytest.approx(two.grads_gib, rel=1e-12)
    assert one.grads_gib > 8 * one.params_gib, "the stage's whole fp32 gradients, beside its shards"


def test_fsdp_unsharded_accumulation_holds_them_only_between_micro_steps(catalog: Catalog) -> None:
    cell = _cell(
        catalog, "pythia-1b", 8, 1, 64, engine="fsdp", fsdp_accumulation="unsharded", activation_checkpointing=True
    )
    one = predict_cell(cell, micro_batch_size=8)
    two = predict_cell(cell, micro_batch_size=4)
    assert (one.grad_accum_steps, two.grad_accum_steps) == (1, 2)
    assert two.grads_gib - one.grads_gib == pytest.approx(8 * one.params_gib, rel=1e-9)  # 4Ψ over 4Ψ/8
    sharded = _cell(catalog, "pythia-1b", 8, 1, 64, engine="fsdp", activation_checkpointing=True)
    assert predict_cell(sharded, micro_batch_size=4).grads_gib == pytest.approx(one.grads_gib, rel=1e-9)


def test_auto_takes_the_whole_batch_where_only_the_accumulated_gradients_stood_in_its_way(catalog: Catalog) -> None:
    # llama-2-70b tp8 over 64 GPUs (8 replicas): a rank's whole fp32 gradients are 35 GB. Find a batch whose
    # one micro-step fits only without them, from the predictor's own figures.
    def cell(per_replica: int) -> dict[str, Any]:
        return _cell(
            catalog, "llama-2-70b", 64, 8, 8 * per_replica, engine="mesh3d", tp=8, activation_checkpointing=True
        )

    probe = predict_cell(cell(64), micro_batch_size=1, grad_accum_steps=2)
    held = probe.peak_memory_gib - probe.activations_gib  # everything but the activations, accumulating
    saved = probe.grads_gib - probe.params_gib
    room = probe.usable_memory_gib - held
    per_sequence = probe.activations_gib
    wanted = int((room + saved) // per_sequence)  # the most sequences one micro-step holds without them
    assert room // per_sequence < wanted, "the case exists: they stand in the way"
    auto = predict_cell(cell(wanted))
    assert (auto.micro_batch_size, auto.grad_accum_steps, auto.fits) == (wanted, 1, True)
    # One more sequence a replica and the whole batch no longer fits: auto accumulates, holding them.
    more = predict_cell(cell(wanted + 1))
    assert more.grad_accum_steps > 1 and more.micro_batch_size <= room // per_sequence


@pytest.mark.parametrize("engine", ["fsdp", "mesh3d"])
def test_the_probes_search_starts_at_the_whole_batch_where_only_the_accumulated_gradients_stood_in_its_way(
    catalog: Catalog, engine: str
) -> None:
    """Each engine's estimate (where the probe's search starts) follows the predictor's rule."""
    from orchestrator.config.schema import to_config
    from orchestrator.engines.fsdp import memory as fsdp_memory
    from orchestrator.engines.mesh3d import memory as mesh_memory

    method: dict[str, Any] = {"activation_checkpointing": True}
    method.update({"fsdp_accumulation": "unsharded"} if engine == "fsdp" else {"tp": 2})
    per_gpu = 16
    split = 8 if engine == "fsdp" else 4  # mesh3d: 8 GPUs over tp2 are 4 replicas
    cfg = to_config(_cell(catalog, "pythia-1b", 8, 1, split * per_gpu, engine=engine, **method))
    estimate = fsdp_memory.estimate_micro_batch_size if engine == "fsdp" else mesh_memory.estimate_micro_batch_size

    def without_the_rule(memory_gib: float) -> int:
        """Every fixed byte counted, as before the rule: a global batch of one sequence leaves no whole batch."""
        one = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, global_batch_size=1))
        return estimate(one, memory_gib)

    answers = {gib: (estimate(cfg, gib), without_the_rule(gib)) for gib in range(8, 60)}
    whole = [gib for gib, (new, old) in answers.items() if new == per_gpu and old < per_gpu]
    assert whole, answers  # memory where one micro-step of the whole batch fits only without them
    assert all(new == old for gib, (new, old) in answers.items() if new < per_gpu), answers
    assert all(new >= min(old, per_gpu) for new, old in answers.values()), "never a smaller start"
