"""Analytic data x tensor x pipeline layouts against figures worked out by hand."""

from __future__ import annotations

import pytest

from analysis.predict.network import Network, network_for
from analysis.predict.parallelism import (
    Layout,
    best_layout,
    candidate_layouts,
    estimate_layout,
    min_gpus_to_fit,
    stage_parameters,
)
from analysis.predict.step_time import DEFAULT_EFFICIENCY
from orchestrator.config.schema import ClusterConfig, GpuConfig, ModelConfig
from orchestrator.engines.memory import GIB
from orchestrator.models import num_parameters

A100 = GpuConfig(
    name="a100-80gb", architecture="ampere", memory_gib=80, peak_tflops_bf16=312.0, nvlink_gbytes_s=600.0,
    pcie_gbytes_s=64.0,
)  # fmt: skip
H100_PCIE_ONLY = GpuConfig(
    name="pcie", architecture="hopper", memory_gib=80, peak_tflops_bf16=756.0, pcie_gbytes_s=128.0
)
NET = Network(intra_node_gbytes_s=300.0, inter_node_gbytes_s_per_gpu=25.0, gpus_per_node=8, source="test")
# L=4, h=1024, V=1024, s=1024, f=4h: N = 4*(12h^2 + 13h) + 2h + 2Vh = 50,384,896 + 2,048 + 2,097,152.
SMALL = ModelConfig(name="small", num_layers=4, hidden_size=1024, num_heads=8, vocab_size=1024, seq_length=1024)
GPT3 = ModelConfig(
    name="gpt3", num_layers=96, hidden_size=12288, num_heads=96, vocab_size=50304, global_batch_size=1536
)


def test_small_model_has_the_hand_counted_parameters() -> None:
    assert num_parameters(SMALL) == 52_484_096


def test_stage_holds_its_layers_and_one_embedding() -> None:
    # (N - 2Vh)/L = (52,484,096 - 2,097,152)/4 = 12,596,736 a layer; two layers and one 1024x1024 embedding.
    assert stage_parameters(SMALL, 2) == 2 * 12_596_736 + 1_048_576
    assert stage_parameters(SMALL, 1) == 52_484_096


def test_memory_per_gpu_of_a_tensor_and_pipeline_layout_by_hand() -> None:
    # d=2, t=2, p=2, micro-batch 1, global batch 8 -> m = 8/(2*1) = 4 micro-batches per pipeline.
    est = estimate_layout(SMALL, A100, Layout(2, 2, 2, 1, False), 8, NET)
    # Per GPU: (2 layers + embedding)/t = 26,242,048/2 = 13,121,024 parameters.
    # 2 bytes parameters, 2 bytes gradients, 12 bytes optimizer split over d=2 (ZeRO-1).
    assert est.params_gib * GIB == pytest.approx(26_242_048)
    assert est.grads_gib * GIB == pytest.approx(26_242_048)
    assert est.optimizer_gib * GIB == pytest.approx(78_726_144)
    # Activations with sequence parallel: a GPT-NeoX layer keeps 36h + 6a bytes a token with SDPA (measured on the
    # real module, orchestrator/models/gpt_neox.py) = 36*1024 + 6*8 = 36,912; x s*b = 1024 tokens / t=2 =
    # 18,898,944 a layer. First stage, min(p, m) = 2 micro-batches in flight x 2 layers = 75,595,776; the last
    # stage holds one micro-batch (37,797,888) plus logits 1024*1024*12/2 = 6,291,456 -> 44,089,344. The larger counts.
    assert est.activations_gib * GIB == pytest.approx(75_595_776)
    assert est.memory_gib * GIB == pytest.approx(26_242_048 * 2 + 78_726_144 + 75_595_776)
    assert est.num_micro_batches == 4
    # 1F1B bubble (p-1)/(m+p-1) = 1/5.
    assert est.bubble_fraction == pytest.approx(0.2)


def test_checkpointing_keeps_only_layer_inputs() -> None:
    # p=1, t=1, b=1: 4 layers x 2*s*b*h + one layer rerun (36h + 6a)*s*b + logits 12*s*b*V, all by hand.
    est = estimate_layout(SMALL, A100, Layout(1, 1, 1, 1, True), 1, NET)
    s_b_h = 1024 * 1024
    rerun = (36 * 1024 + 6 * 8) * 1024
    assert est.activations_gib * GIB == pytest.approx(4 * 2 * s_b_h + rerun + 12 * 1024 * 1024)


def test_bubble_and_communication_vanish_without_their_kind_of_parallelism() -> None:
    est = estimate_layout(SMALL, A100, Layout(1, 1, 4, 1, False), 12, NET)
    assert est.bubble_fraction == pytest.approx(3 / 15)
    assert est.tensor_comm_s == 0.0 and est.data_comm_s == 0.0 and est.pipeline_comm_s > 0.0
    dp = estimate_layout(SMALL, A100, Layout(4, 1, 1, 1, False), 12, NET)
    assert dp.bubble_fraction == 0.0 and dp.tensor_comm_s == 0.0 and dp.data_comm_s > 0.0
    tp = estimate_layout(SMALL, A100, Layout(1, 4, 1, 1, False), 12, NET)
    assert tp.tensor_comm_s > 0.0 and tp.data_comm_s == 0.0


def test_tensor_parallelism_over_pcie_costs_more_than_over_nvlink() -> None:
    nvlink = estimate_layout(GPT3, A100, Layout(1, 8, 12, 1, False), 96, network_for(A100))
    pcie = estimate_layout(GPT3, H100_PCIE_ONLY, Layout(1, 8, 12, 1, False), 96, network_for(H100_PCIE_ONLY))
    # 600 GB/s NVLink against 128 GB/s PCIe (both directions): about 4.7x the time for the same bytes.
    assert pcie.tensor_comm_s > 4 * nvlink.tensor_comm_s


def test_network_from_datasheet_and_cluster_figures() -> None:
    cluster = ClusterConfig(gpus_per_node=4, inter_node_gbits_s=200.0)
    net = network_for(A100, cluster)
    assert net.intra_node_gbytes_s == 300.0  # 600 GB/s both ways -> 300 one way
    assert net.inter_node_gbytes_s_per_gpu == pytest.approx(200 / 8 / 4)  # one HDR port shared by 4 GPUs
    assert "NVLink 600" in net.source and "200 Gb/s" in net.source
    assert network_for(H100_PCIE_ONLY).intra_node_gbytes_s == 64.0
    # Without a cluster figure, a node of the GPU's generation: DGX A100's 8 x 200 Gb/s; a PCIe card's node one port.
    assert network_for(A100).inter_node_gbytes_s_per_gpu == pytest.approx(1600 / 8 / 8)
    assert network_for(H100_PCIE_ONLY).inter_node_gbytes_s_per_gpu == pytest.approx(200 / 8 / 8)


def test_layouts_respect_heads_layers_and_batch() -> None:
    layouts = candidate_layouts(SMALL, 16, 8, 8)
    assert layouts, "16 GPUs can run 8 sequences with tensor or pipeline parallelism"
    for layout in layouts:
        assert layout.num_gpus == 16
        assert SMALL.num_heads % layout.tensor == 0 and SMALL.num_layers % layout.pipeline == 0
        assert 8 % (layout.data * layout.micro_batch_size) == 0
    with pytest.raises(ValueError, match="do not split"):
        estimate_layout(SMALL, A100, Layout(3, 1, 1, 1, False), 8, NET)


def test_175b_needs_model_parallelism_and_fits_on_enough_a100s() -> None:
    # 175e9 parameters x 16 bytes of model states = 2.8 TB: 8 GPUs of 72 usable GiB cannot hold it.
    assert best_layout(GPT3, A100, 8, 1536, NET) is None
    smallest = min_gpus_to_fit(GPT3, A100, 1536, NET)
    assert smallest is not None and 32 <= smallest <= 128
    est = best_layout(GPT3, A100, 1024, 1536, NET)
    assert est is not None and est.fits and est.memory_gib <= 72.0
    assert est.layout.tensor * est.layout.pipeline > 1
    assert 0.2 < est.mfu <= DEFAULT_EFFICIENCY  # the analytic figure stays under the uncalibrated efficiency
