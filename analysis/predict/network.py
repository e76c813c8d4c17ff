"""The links a cell's communication crosses: one place every prediction reads them from.

``plan`` (the step-time model, :mod:`analysis.predict.step_time`), ``budget``, ``shortest`` and the offered
layouts (:mod:`analysis.predict.parallelism`) all take the network between nodes from the cell's cluster config
(``inter_node_gbits_s``, shared by the node's ``gpus_per_node`` GPUs), so the same cell crosses the same network
whichever command costs it. Where the cluster config says nothing, the default is the network NVIDIA's reference
design gives a node of that GPU generation (:data:`DEFAULT_INTER_NODE_GBITS_S`).

Inside a node: the GPU's NVLink, else its PCIe link (conf/gpu); datasheets quote both directions together, one
direction is half.

The step-time model's links (:func:`links_for`, an :class:`orchestrator.engines.spec.Links` per table of cells):
for each link kind, inside a node, across nodes and to the host, a collective's fixed time and its bus bandwidth,
from the cited defaults below, or from a measured profile of the machine (``gpudays profile``;
:func:`measured_links`) where one is given for the cell's GPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from orchestrator.config.schema import ClusterConfig, GpuConfig
from orchestrator.engines.spec import Links

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
CPU_ADAM_PARAMS_PER_S_PER_NODE = 1e9
"""Parameters a node's CPU-Adam updates per second (DeepSpeed CPU-Adam, order of magnitude; FSDP's offloaded
AdamW is taken to run as fast)."""
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


# --------------------------------------------------------------------------------------------------------------
# The step-time model's links: a latency and a bus bandwidth per link kind
# --------------------------------------------------------------------------------------------------------------

INTRA_NODE_BUSBW_GBPS: dict[str, float] = {
    "v100-32gb": 130.0,  # NVLink 2 (DGX-1/SXM2): nccl-tests all_reduce_perf bus bandwidth, 8 GPUs, large messages
    "a100-40gb": 230.0,  # NVLink 3 (DGX A100): about 230 GB/s in nccl-tests (see LINK_EFFICIENCY)
    "a100-80gb": 230.0,
    "h100-80gb": 360.0,  # NVLink 4 (DGX H100): about 360 GB/s in nccl-tests, 8 GPUs
    "h200": 360.0,
    "rtx3090": 12.0,  # PCIe 4.0 through the host, no NVLink assumed
    "a6000": 12.0,
    "l40s": 12.0,
    "a40": 12.0,
    "l40": 12.0,
}
"""All-reduce bus bandwidth inside a node (GB/s), by GPU name, as nccl-tests report it (``busbw``; NVIDIA's
nccl-tests README defines it as the algorithm bandwidth times ``2(n-1)/n``)."""
DEFAULT_INTRA_NODE_BUSBW_GBPS = 12.0
"""A GPU not named above: PCIe through the host."""
NVLINK_LATENCY_S = 15e-6
"""A small collective inside an NVLink node: nccl-tests' all_reduce_perf times of a few-KiB message on 8 GPUs of
a DGX A100 or H100 are 10-20 us (the LL protocol); NCCL's documentation puts the latency-bound regime there."""
PCIE_LATENCY_S = 25e-6
"""A small collective between PCIe GPUs of one node (through the host bridge): nccl-tests' small-message times
on PCIe 4 machines, 20-30 us."""
INTER_NODE_LATENCY_S = 30e-6
"""A small collective across nodes over InfiniBand: nccl-tests' all_reduce_perf on two or more HDR/NDR nodes,
ring, a few KiB, 20-40 us (the network's few microseconds plus NCCL's proxy and the intra-node steps)."""
HOST_LINK_GBPS: dict[str, float] = {"volta": 12.0, "ampere": 20.0, "ada": 20.0, "hopper": 40.0, "cpu": 10.0}
"""One GPU's copies to and from pinned host memory (GB/s, one direction), by generation: PCIe 3 / 4 / 5 x16 as
``bandwidthTest`` measures them."""
DEFAULT_HOST_LINK_GBPS = 12.0
HOST_LATENCY_S = 10e-6
"""A copy to or from the host: a ``cudaMemcpyAsync`` of a small pinned buffer, about 10 us."""
CPU_GLOO_BUSBW_GBPS = 0.345
CPU_GLOO_LATENCY_S = 1.356e-3
"""gloo between the processes of the CPU "nodes" (they share one machine): the median over the collectives of
``gpudays profile --device cpu --ranks 2`` on the 2-core machine of tests/data/cpu-grid
(``tests/data/cpu-grid/profile.json``), timed with the cores busy as a step keeps them
(:func:`orchestrator.profile.collectives.cores_busy`)."""


class CollectiveFigure(Protocol):
    """One collective's fitted line in a profile (``orchestrator.profile.record.CollectiveFit``)."""

    @property
    def op(self) -> str: ...
    @property
    def link(self) -> str: ...
    @property
    def latency_s(self) -> float: ...
    @property
    def bus_gbytes_s(self) -> float | None: ...


class MatmulFigure(Protocol):
    """One timed matrix product ``(m x k) @ (k x n)`` of a profile (``orchestrator.profile.record.MatmulTime``)."""

    @property
    def step(self) -> str: ...
    @property
    def m(self) -> int: ...
    @property
    def k(self) -> int: ...
    @property
    def n(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def seconds(self) -> float: ...


class AttentionFigure(Protocol):
    """One timed causal attention of a profile (``orchestrator.profile.record.AttentionTime``)."""

    @property
    def seq_len(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def batch(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def forward_s(self) -> float: ...
    @property
    def backward_s(self) -> float: ...


class MemoryFigure(Protocol):
    """One timed device-memory stream of a profile (``orchestrator.profile.record.MemoryTime``)."""

    @property
    def bytes_moved(self) -> int: ...
    @property
    def seconds(self) -> float: ...


class MeasuredProfile(Protocol):
    """What the predictor reads of a profile (``orchestrator.profile.record.Profile``): its collectives, its
    matrix products and attention (:mod:`analysis.predict.measured_compute`), and its memory streams
    (:mod:`analysis.predict.memory_bound`)."""

    @property
    def collectives(self) -> Sequence[CollectiveFigure]: ...
    @property
    def matmuls(self) -> Sequence[MatmulFigure]: ...
    @property
    def attention(self) -> Sequence[AttentionFigure]: ...
    @property
    def memory(self) -> Sequence[MemoryFigure]: ...
    def __hash__(self) -> int: ...  # a frozen record: the predictor reads each profile once


@dataclass(frozen=True)
class LinkFigures:
    """One link kind: a collective's fixed time (s) and bus bandwidth (bytes/s)."""

    latency_s: float
    bus_bytes_s: float
    source: str


def measured_links(profile: MeasuredProfile) -> dict[str, LinkFigures]:
    """The links of a profile by kind (``intra``, ``inter``): the median latency and median bus bandwidth over its
    collectives on that link (all-reduce, all-gather, reduce-scatter, send/recv, all-to-all; the median, as one
    noisy fit on a loaded machine should not set the figure). A link the profile did not measure, or whose rates
    it could not read, is absent (the defaults stay)."""
    out = {}
    for kind in ("intra", "inter"):
        fits = [c for c in profile.collectives if c.link == kind]
        rates = [c.bus_gbytes_s for c in fits if c.bus_gbytes_s]
        if rates:
            latency = statistics.median(c.latency_s for c in fits)
            out[kind] = LinkFigures(latency, statistics.median(rates) * 1e9, f"profile: {len(fits)} collectives")
    return out


def links_for(
    gpu: np.ndarray,
    arch: np.ndarray,
    inter_node_bytes_s: np.ndarray,
    profiles: Mapping[str, MeasuredProfile] | None = None,
) -> Links:
    """The links of every cell: the cited defaults by GPU name and generation (the network between nodes as
    :func:`inter_node_bytes_s` gives it), replaced, for a GPU that ``profiles`` names, by what its profile measured
    (:func:`measured_links`)."""
    cpu = np.asarray(arch == "cpu", dtype=bool)
    names = [str(g) for g in gpu]
    intra_bw = np.array([INTRA_NODE_BUSBW_GBPS.get(g, DEFAULT_INTRA_NODE_BUSBW_GBPS) * 1e9 for g in names])
    nvlink = np.array([INTRA_NODE_BUSBW_GBPS.get(g, 0.0) >= 100.0 for g in names], dtype=bool)
    intra_bw = np.where(cpu, CPU_GLOO_BUSBW_GBPS * 1e9, intra_bw)
    intra_lat = np.where(cpu, CPU_GLOO_LATENCY_S, np.where(nvlink, NVLINK_LATENCY_S, PCIE_LATENCY_S))
    inter_bw = np.asarray(inter_node_bytes_s, dtype=float).copy()
    inter_lat = np.where(cpu, CPU_GLOO_LATENCY_S, INTER_NODE_LATENCY_S)
    host = np.array([HOST_LINK_GBPS.get(str(a), DEFAULT_HOST_LINK_GBPS) * 1e9 for a in arch])
    for name, profile in (profiles or {}).items():
        rows = np.array([g == name for g in names], dtype=bool)
        measured = measured_links(profile)
        if "intra" in measured:
            intra_bw = np.where(rows, measured["intra"].bus_bytes_s, intra_bw)
            intra_lat = np.where(rows, measured["intra"].latency_s, intra_lat)
        if "inter" in measured:
            inter_bw = np.where(rows, measured["inter"].bus_bytes_s, inter_bw)
            inter_lat = np.where(rows, measured["inter"].latency_s, inter_lat)
    return Links(
        intra_node=intra_bw,
        inter_node=inter_bw,
        host=host,
        cpu_adam_params_per_s_per_node=CPU_ADAM_PARAMS_PER_S_PER_NODE,
        intra_node_latency_s=intra_lat,
        inter_node_latency_s=inter_lat,
        host_latency_s=np.full(len(names), HOST_LATENCY_S),
    )
