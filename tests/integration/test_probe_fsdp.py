"""The probe with real FSDP2 (``fully_shard``) on the CPU over gloo: every sharding option on one and two ranks,
hybrid sharding over a 2 × 2 mesh, mixed precision, CPU offload, activation checkpointing, compile, accumulation
and the micro-batch search. Mirrors tests/integration/test_probe.py (its helpers run each rank as the job would).

What the CPU cannot show: ``fsdp_offload`` moves nothing here (the device is the host), so sweeps refuse it on
``gpu=cpu``; the engine's offload path still runs below. ``hybrid`` across real nodes runs in
tests/integration/test_slurm_fsdp.py; here its two "nodes" are processes of this machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_probe import assert_measured, compose_cell, run_probe_ranks

pytestmark = pytest.mark.fsdp


def fsdp_cell(*overrides: str) -> dict[str, Any]:
    return compose_cell("method.engine=fsdp", *overrides)


def assert_same_on_every_rank(results: list[dict[str, Any]]) -> None:
    first = results[0]["metrics"]
    for other in results[1:]:
        for key in ("micro_batch_size", "step_times_s", "steps_timed", "stop_reason"):
            assert other["metrics"][key] == first[key], key


def test_full_bf16_accumulating_one_rank(tmp_path: Path) -> None:
    cell = fsdp_cell("method.fsdp_sharding=full", "method.micro_batch_size=1")
    (result,) = run_probe_ranks(cell, tmp_path)
    m = assert_measured(result, cell)
    # 16 micro-steps: composed from 4 inside the cycle (no gradient sync) and the boundary one.
    assert (m["micro_batch_size"], m["grad_accum_steps"]) == (1, 16)
    # The boundary's figure is its extra time over a micro-step: noise can make it a little negative (a real H200
    # record has -0.0025 s), so the parts are checked by what they compose, as for DeepSpeed (test_probe.py).
    assert m["step_time_method"] == "composed" and m["micro_step_time_s"] > 0 and m["boundary_time_s"] is not None
    composed = 16 * m["micro_step_time_s"] + m["boundary_time_s"]
    assert m["step_time_s"] == pytest.approx(composed, rel=0.25), "medians of the parts compose the median step"
    fsdp = result["environment"]["fsdp"]
    assert fsdp["sharding"] == "full" and fsdp["mesh_shape"] == [1] and fsdp["reshard_after_forward"] is True
    assert (fsdp["param_dtype"], fsdp["reduce_dtype"]) == ("bfloat16", "float32")
    assert result["environment"]["compiled"] is False and "ds_config" not in result["environment"]


def test_grad_op_fp32_checkpointing_compiled_one_rank(tmp_path: Path) -> None:
    # fp32, as in the DeepSpeed compile test: Inductor's CPU backend fails on this model in bf16 (torch 2.13).
    cell = fsdp_cell(
        "method.fsdp_sharding=grad_op", "method.precision=fp32", "method.activation_checkpointing=true",
        "method.compile=true", "method.micro_batch_size=8",
    )  # fmt: skip
    (result,) = run_probe_ranks(cell, tmp_path)
    m = assert_measured(result, cell)
    fsdp = result["environment"]["fsdp"]
    assert fsdp["reshard_after_forward"] is False and fsdp["param_dtype"] is None and fsdp["reduce_dtype"] is None
    assert result["environment"]["compiled"] is True and result["environment"]["compile_scope"] == "regional"
    assert m["hardware_tflops_per_gpu"] > m["model_tflops_per_gpu"], "checkpointing reruns the layers"


def test_none_auto_micro_batch_one_rank(tmp_path: Path) -> None:
    cell = fsdp_cell("method.fsdp_sharding=none", "method.micro_batch_size=auto")
    (result,) = run_probe_ranks(cell, tmp_path)
    m = assert_measured(result, cell)
    assert m["search_tried"] and m["micro_batch_size"] == max(t["micro_batch_size"] for t in m["search_tried"])
    assert result["environment"]["fsdp"]["mesh_shape"] == [1, 1]


def test_full_offload_checkpointing_bf16_reduction_whole_steps_two_ranks(tmp_path: Path) -> None:
    cell = fsdp_cell(
        "num_gpus=2", "method.fsdp_sharding=full", "method.fsdp_offload=true", "method.fsdp_reduce_precision=bf16",
        "method.activation_checkpointing=true", "method.micro_batch_size=2", "probe.step_timing=whole",
    )  # fmt: skip
    results = run_probe_ranks(cell, tmp_path, world_size=2)
    metrics = [assert_measured(r, cell) for r in results]
    assert (metrics[0]["micro_batch_size"], metrics[0]["grad_accum_steps"]) == (2, 4)
    assert metrics[0]["step_time_method"] == "whole"
    assert_same_on_every_rank(results)
    fsdp = results[0]["environment"]["fsdp"]
    assert fsdp["offload"] is True and fsdp["mesh_shape"] == [2] and fsdp["reduce_dtype"] is None


def test_grad_op_accumulating_two_ranks(tmp_path: Path) -> None:
    cell = fsdp_cell("num_gpus=2", "method.fsdp_sharding=grad_op", "method.micro_batch_size=2")
    results = run_probe_ranks(cell, tmp_path, world_size=2)
    for result in results:
        assert_measured(result, cell)
    assert_same_on_every_rank(results)
    assert results[0]["environment"]["fsdp"]["reshard_after_forward"] is False


def test_none_is_plain_data_parallel_two_ranks(tmp_path: Path) -> None:
    cell = fsdp_cell("num_gpus=2", "method.fsdp_sharding=none", "method.micro_batch_size=4")
    results = run_probe_ranks(cell, tmp_path, world_size=2)
    for result in results:
        assert_measured(result, cell)
    fsdp = results[0]["environment"]["fsdp"]
    assert fsdp["mesh_shape"] == [2, 1] and fsdp["mesh_dim_names"] == ["replicate", "shard"]


def test_hybrid_shards_inside_a_node_and_replicates_across_two(tmp_path: Path) -> None:
    # Four processes on this machine standing for two nodes of two GPUs: a 2 × 2 mesh.
    cell = fsdp_cell("num_gpus=4", "num_nodes=2", "method.fsdp_sharding=hybrid", "method.micro_batch_size=2")
    results = run_probe_ranks(cell, tmp_path, world_size=4, env={"LOCAL_WORLD_SIZE": "4"})
    for result in results:
        assert_measured(result, cell)
    assert_same_on_every_rank(results)
    fsdp = results[0]["environment"]["fsdp"]
    assert fsdp["mesh_shape"] == [2, 2] and fsdp["reshard_after_forward"] is True


def test_a_build_over_the_memory_limit_is_an_oom_of_its_own(tmp_path: Path) -> None:
    # The limit judges the build as it judges every step: here the build alone is over it, before any micro-batch.
    cell = fsdp_cell("method.micro_batch_size=16", "probe.memory_limit_gib=0.001")
    (result,) = run_probe_ranks(cell, tmp_path)
    assert result["status"] == "oom", (result["reason"], result["traceback"])
    assert result["reason"].startswith("building the model: peak") and "memory_limit_gib=0.001" in result["reason"]
    assert result["traceback"] is None, "an imposed limit raises nothing"
    m = result["metrics"]
    assert m["build_peak_memory_gib"] > 0.001 and "search_tried" not in m and "step_time_s" not in m
