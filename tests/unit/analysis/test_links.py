"""The step-time model's communication as collectives: a latency per collective and bytes over a bus bandwidth, on
links from one place (the cited defaults, or a measured profile), counted as each engine issues them, and the part
the compute hides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis.predict import network
from analysis.predict.calibration import calibrate
from analysis.predict.inputs import Inputs, inputs_from_columns
from analysis.predict.network import links_for, measured_links
from analysis.predict.predictor import predict_frame
from analysis.predict.step_time import exposed
from orchestrator.engines.deepspeed.step_time import step_time_terms as deepspeed_terms
from orchestrator.engines.fsdp.step_time import step_time_terms as fsdp_terms
from orchestrator.engines.mesh3d.step_time import step_time_terms as mesh3d_terms
from orchestrator.engines.spec import Links
from orchestrator.profile.identity import Identity
from orchestrator.profile.record import CollectiveFit, Profile, read_profile

ROOT = Path(__file__).resolve().parents[3]
LATENCY = 1e-3
ONLY_LATENCY = Links(1e30, 1e30, 1e30, 1e9, intra_node_latency_s=LATENCY, inter_node_latency_s=LATENCY)
"""Links whose bandwidth is all but infinite: what a step's communication takes is its collectives' latencies."""


def cells(size: int = 1, **columns: Any) -> Inputs:
    """``size`` pythia-like cells on 2 GPUs of an H100 node, with ``columns`` (a value each, or one for all)."""
    base: dict[str, Any] = {
        "model_family": "gpt_neox", "model_num_layers": 6, "model_hidden_size": 512, "model_num_heads": 8,
        "model_vocab_size": 50304, "model_seq_length": 2048, "model_global_batch_size": 64, "gpu": "h100-80gb",
        "gpu_architecture": "hopper", "gpu_memory_gib": 80, "gpu_peak_tflops_bf16": 989.0, "num_gpus": 2,
        "num_nodes": 1, "precision": "bf16",
    }  # fmt: skip
    merged = {**base, **columns}
    table = {k: v if isinstance(v, list) else [v] * size for k, v in merged.items()}
    return inputs_from_columns(table, size)


def test_fsdp_pays_a_latency_a_unit_so_twice_the_layers_pay_twice_the_layers_latencies() -> None:
    accum = np.array([3.0, 3.0])
    x = cells(2, engine="fsdp", fsdp_sharding="full", model_num_layers=[4, 8])
    terms = fsdp_terms(x, accum, ONLY_LATENCY)
    # Each micro-step: two gathers (forward, backward) and a reduce-scatter a unit; a unit a layer, and the root.
    per_unit = accum * (2.0 + 1.0) * LATENCY
    assert terms["overlappable_s"] == pytest.approx(per_unit * np.array([5.0, 9.0]))
    assert terms["overlappable_s"][1] - terms["overlappable_s"][0] == pytest.approx(4 * per_unit[0])
    # Reducing once at the boundary (unsharded accumulation) leaves the gathers only every micro-step.
    once = fsdp_terms(cells(1, engine="fsdp", fsdp_accumulation="unsharded"), accum[:1], ONLY_LATENCY)
    assert once["overlappable_s"] == pytest.approx(LATENCY * 7.0 * (2.0 * 3.0 + 1.0))


def test_zero_2_and_3_reduce_every_micro_step_zero_0_and_1_once_a_step() -> None:
    def communication(stage: int, accum: float) -> float:
        x = cells(engine="deepspeed", zero_stage=stage)
        links = links_for(x.gpu, x.arch, x.inter_node_bytes_s)
        terms = deepspeed_terms(x, np.array([accum]), links)
        return float(terms["communication_s"][0] + terms["overlappable_s"][0])

    for stage in (0, 1):
        assert communication(stage, 8.0) == communication(stage, 1.0) > 0
    for stage in (2, 3):
        assert communication(stage, 8.0) > communication(stage, 1.0) > 0
    # ZeRO-3 gathers and reduces everything every micro-step; ZeRO-2 gathers the parameters once a step.
    assert communication(3, 8.0) == pytest.approx(8 * communication(3, 1.0))
    assert communication(2, 8.0) == pytest.approx(4.5 * communication(2, 1.0))


def test_tensor_and_pipeline_collectives_count_every_micro_batch() -> None:
    x = cells(2, engine="mesh3d", tp=[2, 1], pp=[1, 2], pp_microbatches=4)
    one, two = (mesh3d_terms(x, np.array([a, a]), ONLY_LATENCY)["communication_s"] for a in (1.0, 2.0))
    wait = mesh3d_terms(x, np.array([1.0, 1.0]), Links(1e30, 1e30, 1e30, 1e9))["communication_s"]
    # tp2: four all-reduces a layer (two forward, two backward), 6 layers, one micro-batch a step.
    assert one[0] - wait[0] == pytest.approx(24 * LATENCY)
    # pp2 (1f1b): a send forward and one back per micro-batch, 4 micro-batches a schedule.
    assert one[1] - wait[1] == pytest.approx(8 * LATENCY)
    assert two - wait == pytest.approx(2 * (one - wait))


def profile(latency_s: float, gbytes_s: float, link: str = "intra") -> Profile:
    identity = Identity("cpu", 2, 1, "test", "2.13", "gloo")
    fits = tuple(
        CollectiveFit(op, link, 2, (4096,), (latency_s,), latency_s, gbytes_s, 1.0)
        for op in ("all_reduce", "send_recv")
    )
    return Profile(identity, "2026-01-01T00:00:00+00:00", 1.0, (), (), (), fits)


def test_a_profile_replaces_the_defaults_of_its_gpu_only() -> None:
    x = cells(2, gpu=["h100-80gb", "a100-80gb"], gpu_architecture=["hopper", "ampere"])
    default = links_for(x.gpu, x.arch, x.inter_node_bytes_s)
    assert list(default.intra_node_latency_s) == [network.NVLINK_LATENCY_S] * 2
    measured = links_for(x.gpu, x.arch, x.inter_node_bytes_s, {"h100-80gb": profile(2e-4, 5.0)})
    # all-reduce's bus bandwidth is 2(n-1)/n of its rate (1 on 2 ranks), send/recv's is its rate: 5 GB/s both.
    assert measured.intra_node[0] == pytest.approx(5e9) and measured.intra_node_latency_s[0] == pytest.approx(2e-4)
    assert measured.intra_node[1] == default.intra_node[1]
    assert measured.inter_node[0] == default.inter_node[0]  # not measured across nodes: the default stays
    assert measured.intra_node_latency_s[1] == default.intra_node_latency_s[1]


def test_the_predictor_and_calibration_take_the_profile() -> None:
    row = pd.DataFrame([{
        "model_family": "gpt_neox", "model_num_layers": 6, "model_hidden_size": 512, "model_num_heads": 8,
        "model_vocab_size": 50304, "model_seq_length": 2048, "model_global_batch_size": 64, "gpu": "h100-80gb",
        "gpu_architecture": "hopper", "gpu_memory_gib": 80, "gpu_peak_tflops_bf16": 989.0, "num_gpus": 2,
        "num_nodes": 1, "precision": "bf16", "zero_stage": 2,
    }])  # fmt: skip
    slow = {"h100-80gb": profile(0.5, 0.01)}
    default = predict_frame(row)["predicted_step_time_s"].iloc[0]
    measured = predict_frame(row, profiles=slow)["predicted_step_time_s"].iloc[0]
    assert measured > default
    # A calibration fitted with a profile predicts with it.
    assert calibrate(row.assign(status="ok", step_time_s=1.0), slow).profiles is slow


def test_overlap_hides_up_to_the_floor_and_never_below_zero() -> None:
    overlappable, floor = np.array([1.0, 1.0, 0.2, 0.0]), np.array([0.1, 0.1, 0.5, 0.0])
    compute = np.array([0.5, 100.0, 100.0, 100.0])
    gpu = np.full(4, "hopper", dtype=object)
    out = exposed(overlappable, floor, compute, gpu)
    assert out[0] == pytest.approx(1.0 - 0.8 * 0.5)  # the compute hides 80% of its time's worth
    assert out[1] == pytest.approx(0.1)  # no more than the floor stays
    assert out[2] == pytest.approx(0.2)  # never more than there is
    assert out[3] == 0.0 and np.all(out >= 0.0)
    # gloo on the CPU runs on the cores that compute: nothing hides.
    assert exposed(overlappable, floor, compute, np.full(4, "cpu", dtype=object)) == pytest.approx(overlappable)


def test_the_cpu_defaults_are_the_committed_profiles() -> None:
    links = measured_links(read_profile(ROOT / "tests" / "data" / "cpu-grid" / "profile.json"))["intra"]
    assert links.latency_s == pytest.approx(network.CPU_GLOO_LATENCY_S, rel=0.01)
    assert links.bus_bytes_s == pytest.approx(network.CPU_GLOO_BUSBW_GBPS * 1e9, rel=0.01)
