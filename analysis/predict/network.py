"""The links a cell's communication crosses: one place every prediction reads them from.

``plan`` (the step-time model, :mod:`analysis.predict.step_time`), ``budget``, ``shortest`` and the offered
layouts (:mod:`analysis.predict.parallelism`) all take the network between nodes from the cell's cluster config
(``inter_node_gbits_s``, shared by the node's ``gpus_per_node`` GPUs), so the same cell crosses the same network
whichever command costs it. Where the cluster config says nothing, the default is the network NVIDIA's reference
design gives a node of that GPU generation (:data:`DEFAULT_INTER_NODE_GBITS_S`).

Inside a node: the GPU's NVLink, else its PCIe link (conf/gpu); datasheets quote both directions together, one
direction is half.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.config.schema import ClusterConfig, GpuConfig

LINK_EFFICIENCY = 0.75
"""Achieved share of a link's one-way rate in large collectives: nccl-tests reach about 230 GB/s bus bandwidth on
DGX A100's 300 GB/s one-way NVLink, and 75-90% of line rate over InfiniBand."""
DEFAULT_GPUS_PER_NODE = 8
DEFAULT_INTER_NODE_GBITS_S: dict[str, float] = {
    "volta": 4 * 100.0,  # NVIDIA DGX-1 with V100: four InfiniBand EDR ports of 100 Gb/s (DGX-1 datasheet)
    "ampere": 8 * 200.0,  # NVIDIA DGX A100: eight HDR ports of 200 Gb/s, one per GPU (DGX A100 datasheet)
    "hopper": 8 * 400.0,  # NVIDIA DGX H100: eight NDR ports of 400 Gb/s, one per GPU (DGX H100 datasheet)
}
"""A node's network, all ports, one direction (Gb/s), by GPU generation, for a GPU with NVLink (a DGX-class node)
where the cluster config gives no ``inter_node_gbits_s``."""
PCIE_NODE_INTER_NODE_GBITS_S = 200.0
"""A node of PCIe cards (no NVLink in conf/gpu: A6000, A40, L40S, RTX 3090), which no reference design fixes: one
InfiniBand HDR port of 200 Gb/s assumed."""
CPU_INTER_NODE_GBYTES_S_PER_RANK = 12.0
"""gloo between the processes of CPU "nodes" (the local cluster's nodes share one machine): a nominal 12 GB/s a
rank, which calibration rescales."""
FALLBACK_INTRA_NODE_GBYTES_S = 32.0
"""Both directions of PCIe gen 3 x16, for a GPU config that gives neither NVLink nor PCIe figures."""


@dataclass(frozen=True)
class Network:
    """The links a layout's communication runs over, one-way GB/s per GPU, and where each figure came from."""

    intra_node_gbytes_s: float
    inter_node_gbytes_s_per_gpu: float
    gpus_per_node: int
    source: str


def default_inter_node_gbits_s(architecture: str, has_nvlink: bool) -> float:
    """A node's network where the cluster config says nothing (see :data:`DEFAULT_INTER_NODE_GBITS_S`)."""
    if has_nvlink and architecture in DEFAULT_INTER_NODE_GBITS_S:
        return DEFAULT_INTER_NODE_GBITS_S[architecture]
    return PCIE_NODE_INTER_NODE_GBITS_S


def inter_node_gbytes_s_per_gpu(
    architecture: str, has_nvlink: bool, gbits_s: float | None, gpus_per_node: int | None
) -> tuple[float, str]:
    """One GPU's share of its node's network (one-way GB/s, line rate) and where the figure came from."""
    if architecture == "cpu":
        return CPU_INTER_NODE_GBYTES_S_PER_RANK, f"{CPU_INTER_NODE_GBYTES_S_PER_RANK:g} GB/s a rank (gloo, nominal)"
    per_node = gpus_per_node or DEFAULT_GPUS_PER_NODE
    if gbits_s:
        return gbits_s / 8.0 / per_node, f"{gbits_s:g} Gb/s a node (conf/cluster)"
    gbits = default_inter_node_gbits_s(architecture, has_nvlink)
    return gbits / 8.0 / per_node, f"{gbits:g} Gb/s a node ({architecture or 'unknown'} default)"


def inter_node_bytes_s(
    architecture: np.ndarray, has_nvlink: np.ndarray, gbits_s: np.ndarray, gpus_per_node: np.ndarray
) -> np.ndarray:
    """:func:`inter_node_gbytes_s_per_gpu` for every cell of the predictor's arrays, in achieved bytes/s (NaN where
    a column is unknown: the defaults)."""
    out = []
    for arch, nvlink, gbits, per_node in zip(architecture, has_nvlink, gbits_s, gpus_per_node, strict=True):
        known = gbits if gbits == gbits and gbits else None  # NaN or 0: unknown
        node = int(per_node) if per_node == per_node and per_node else None
        gbytes, _ = inter_node_gbytes_s_per_gpu(str(arch or ""), bool(nvlink), known, node)
        out.append(gbytes * 1e9 * (1.0 if arch == "cpu" else LINK_EFFICIENCY))
    return np.asarray(out, dtype=float)


def network_for(gpu: GpuConfig, cluster: ClusterConfig | None = None) -> Network:
    """The intra-node link (NVLink, else PCIe) of ``gpu`` and its share of the inter-node network of ``cluster``."""
    if gpu.nvlink_gbytes_s:
        intra, intra_src = gpu.nvlink_gbytes_s / 2, f"NVLink {gpu.nvlink_gbytes_s:g} GB/s (conf/gpu/{gpu.name})"
    elif gpu.pcie_gbytes_s:
        intra, intra_src = gpu.pcie_gbytes_s / 2, f"PCIe {gpu.pcie_gbytes_s:g} GB/s (conf/gpu/{gpu.name})"
    else:
        intra, intra_src = (
            FALLBACK_INTRA_NODE_GBYTES_S / 2,
            f"PCIe gen 3 assumed ({FALLBACK_INTRA_NODE_GBYTES_S:g} GB/s)",
        )
    per_node = cluster.gpus_per_node if cluster is not None else DEFAULT_GPUS_PER_NODE
    gbits = cluster.inter_node_gbits_s if cluster is not None else None
    inter, inter_src = inter_node_gbytes_s_per_gpu(gpu.architecture, bool(gpu.nvlink_gbytes_s), gbits, per_node)
    return Network(intra, inter, per_node, f"{intra_src}; {inter_src}")
