"""Data x tensor x pipeline layouts: each predicted as the cell that runs it."""

from __future__ import annotations

import pytest

from analysis.predict.layout_search import best_layout, candidate_layouts, min_gpus_to_fit
from analysis.predict.network import Network, network_for
from analysis.predict.parallelism import Layout, estimate_layout, layout_cell
from analysis.predict.predictor import predict_cell
from analysis.predict.reference_profile import widest_product_share
from analysis.predict.step_time import DEFAULT_EFFICIENCY
from orchestrator.config.schema import ClusterConfig, GpuConfig, ModelConfig
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


def test_a_layout_is_predicted_as_the_cell_that_runs_it() -> None:
    # d=2, t=2, p=2, micro-batch 1, global batch 8 -> m = 8/(2*1) = 4 micro-batches per pipeline: a mesh3d cell
    # running them in one schedule, predicted as `gpudays plan` predicts that cell.
    layout = Layout(2, 2, 2, 1, False)
    est = estimate_layout(SMALL, A100, layout, 8, NET)
    cell = layout_cell(SMALL, A100, layout, 8, NET)
    assert (cell.method.engine, cell.method.tp, cell.method.pp, cell.method.pp_microbatches) == ("mesh3d", 2, 2, 4)
    assert (cell.num_gpus, cell.num_nodes, cell.method.micro_batch_size) == (8, 1, 1)
    pred = predict_cell(cell)
    assert est.memory_gib == pytest.approx(pred.peak_memory_gib)
    assert est.step_time_s == pytest.approx(pred.step_time_s)
    assert est.compute_s + est.communication_s + est.overhead_s == pytest.approx(est.step_time_s)
    assert est.num_micro_batches == 4
    # 1F1B bubble (p-1)/(m+p-1) = 1/5.
    assert est.bubble_fraction == pytest.approx(0.2)


def test_data_parallel_layout_is_a_zero1_cell() -> None:
    layout = Layout(16, 1, 1, 2, True)
    cell = layout_cell(SMALL, A100, layout, 64, NET)
    assert (cell.method.engine, cell.method.zero_stage, cell.method.activation_checkpointing) == ("deepspeed", 1, True)
    assert (cell.num_gpus, cell.num_nodes) == (16, 2)
    # The network between the nodes is NET's: 25 GB/s a GPU, as the cluster config's Gb/s a node.
    assert cell.cluster.inter_node_gbits_s == pytest.approx(25.0 * 8 * 8)
    assert estimate_layout(SMALL, A100, layout, 64, NET).step_time_s == pytest.approx(predict_cell(cell).step_time_s)
    assert layout_cell(SMALL, A100, Layout(1, 1, 1, engine="mesh3d"), 8, NET).method.engine == "mesh3d"


def test_bubble_and_communication_follow_the_parallelism() -> None:
    est = estimate_layout(SMALL, A100, Layout(1, 1, 4, 1, False), 12, NET)
    assert est.bubble_fraction == pytest.approx(3 / 15)
    one = estimate_layout(SMALL, A100, Layout(1, 1, 1, 1, False), 12, NET)
    assert one.bubble_fraction == 0.0 and one.communication_s == 0.0
    dp = estimate_layout(SMALL, A100, Layout(4, 1, 1, 1, False), 12, NET)
    assert dp.bubble_fraction == 0.0 and dp.communication_s > 0.0


def test_a_higher_efficiency_shortens_the_compute() -> None:
    layout = Layout(4, 1, 1, 1, False)
    slow = estimate_layout(SMALL, A100, layout, 12, NET)
    fast = estimate_layout(SMALL, A100, layout, 12, NET, efficiency=2 * DEFAULT_EFFICIENCY)
    assert fast.compute_s == pytest.approx(slow.compute_s / 2)
    assert fast.communication_s == pytest.approx(slow.communication_s)


def test_tensor_parallelism_over_pcie_costs_more_than_over_nvlink() -> None:
    nvlink = estimate_layout(GPT3, A100, Layout(1, 8, 12, 1, False), 96, network_for(A100))
    pcie = estimate_layout(GPT3, H100_PCIE_ONLY, Layout(1, 8, 12, 1, False), 96, network_for(H100_PCIE_ONLY))
    assert pcie.communication_s > 4 * nvlink.communication_s


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
    # under the widest products' share of the peak (the reference profile's): communication and the bubble
    assert 0.2 < est.mfu <= widest_product_share()
