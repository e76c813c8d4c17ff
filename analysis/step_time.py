"""The step-time model: the raw terms of one optimizer step and their uncalibrated coefficients.

Step time = Σ coefficient × term over :data:`TERMS`: seconds of compute at the reference rate (the step's hardware
FLOPs, recomputation included, over the GPUs' dense peak), nominal seconds of communication and of offload, and the
micro-steps (the coefficient is a fixed cost per micro-step). Uncalibrated, the coefficients are
:data:`DEFAULT_COEFFICIENTS`; :func:`analysis.calibration.calibrate` fits them per GPU type to measured records.
"""

from __future__ import annotations

import numpy as np

from analysis.inputs import Inputs
from orchestrator.engines.deepspeed.memory import precision_bytes
from orchestrator.engines.fsdp.memory import reduce_bytes, shard_group_size

DEFAULT_EFFICIENCY = 0.54
"""Achieved share of the dense peak in the matrix products, before calibration. Set by the H100 records in
tests/data/gpu-records (pythia-160m, 410m and 1b, free-lunch settings, bf16): the step times of 410m and 1b, which
share a micro-step count (64), give 0.54 and :data:`DEFAULT_OVERHEAD_S_PER_MICRO_STEP` together; 160m then lands
within 4%."""
DEFAULT_OVERHEAD_S_PER_MICRO_STEP = 0.074
"""Seconds per micro-step that do not scale with FLOPs (kernel launches, the loss, DeepSpeed's hooks), set with
:data:`DEFAULT_EFFICIENCY` by the same H100 records: 4.76 s over 64 micro-steps."""

# Nominal bandwidths (GB/s). Orders of magnitude only, for the uncalibrated prediction: calibration rescales
# the communication and offload terms to what the records show.
INTRA_NODE_BUSBW_GBPS: dict[str, float] = {
    "v100-32gb": 130.0,  # NVLink 2 (SXM2), typical NCCL all-reduce bus bandwidth
    "a100-40gb": 230.0,  # NVLink 3 (SXM4)
    "a100-80gb": 230.0,
    "h100-80gb": 360.0,  # NVLink 4 (SXM5)
    "h200": 360.0,
    "rtx3090": 12.0,  # PCIe 4.0 through the host, no NVLink assumed
    "a6000": 12.0,
    "l40s": 12.0,
    "cpu": 2.0,  # gloo over shared memory between processes
}
DEFAULT_INTRA_NODE_BUSBW_GBPS = 12.0
INTER_NODE_BUSBW_GBPS = 12.0
"""About one 100 Gb/s InfiniBand or Ethernet link per node."""
HOST_LINK_GBPS: dict[str, float] = {"volta": 12.0, "ampere": 20.0, "ada": 20.0, "hopper": 40.0, "cpu": 10.0}
DEFAULT_HOST_LINK_GBPS = 12.0
CPU_ADAM_PARAMS_PER_S_PER_NODE = 1e9
"""Parameters a node's CPU-Adam updates per second (DeepSpeed CPU-Adam, order of magnitude)."""

TERMS = ("compute_s_at_reference", "communication_s", "offload_s", "micro_steps")
"""The raw step-time terms the coefficients multiply: seconds of compute at the reference rate (the dense peak,
or 1 TFLOP/s where none is known), nominal seconds of communication and of offload, and micro-steps."""
DEFAULT_COEFFICIENTS = np.array([1.0 / DEFAULT_EFFICIENCY, 1.0, 1.0, DEFAULT_OVERHEAD_S_PER_MICRO_STEP])
"""The uncalibrated multipliers of :data:`TERMS`."""


def step_terms(x: Inputs, accum: np.ndarray) -> np.ndarray:
    """The raw terms of one optimizer step, one row per cell, columns as in :data:`TERMS`."""
    n, nodes, psi = x.num_gpus, x.num_nodes, x.params
    flops = x.batch * x.seq * x.flops_per_token
    reference = np.where(np.isnan(x.reference_tflops), 1.0, x.reference_tflops)
    compute = flops / n / (reference * 1e12)
    # Ring all-reduce moves 2(N-1)/N of the gradients per GPU; ZeRO-1/2's reduce-scatter plus all-gather the
    # same; ZeRO-3 gathers parameters in forward and backward and reduce-scatters gradients: 3(N-1)/N.
    volume = np.where(x.stage >= 3, 3.0, 2.0) * (n - 1.0) / n * psi * precision_bytes(x.precision)
    intra = np.array([INTRA_NODE_BUSBW_GBPS.get(g, DEFAULT_INTRA_NODE_BUSBW_GBPS) for g in x.gpu], dtype=float)
    busbw = np.where(nodes > 1, INTER_NODE_BUSBW_GBPS, intra) * 1e9
    communication = np.where(n > 1, volume / busbw, 0.0)
    host = np.array([HOST_LINK_GBPS.get(a, DEFAULT_HOST_LINK_GBPS) for a in x.arch], dtype=float) * 1e9
    # Optimizer offload: gradients go down, updated 16-bit parameters come back, each node's CPUs update its
    # GPUs' shares. Parameter offload: every micro-step fetches the partition for forward and for backward.
    offload = np.where(
        x.offload_optimizer & (x.stage >= 1), 4.0 * psi / n / host + psi / nodes / CPU_ADAM_PARAMS_PER_S_PER_NODE, 0.0
    ) + np.where(x.offload_params & (x.stage >= 3), accum * 4.0 * psi / n / host, 0.0)
    fsdp = x.engine == "fsdp"
    if fsdp.any():
        fsdp_comm, fsdp_offload = fsdp_terms(x, accum, intra * 1e9, host)
        communication = np.where(fsdp, fsdp_comm, communication)
        offload = np.where(fsdp, fsdp_offload, offload)
    return np.column_stack([compute, communication, offload, accum.astype(float)])


def fsdp_terms(x: Inputs, accum: np.ndarray, intra: np.ndarray, host: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nominal seconds of communication and of offload of one FSDP2 step (bandwidths in bytes/s).

    Every micro-step gathers the parameters (compute dtype) for the forward and, under ``full`` and ``hybrid``,
    again for the backward; gradients are reduced once, at the boundary (``set_requires_gradient_sync``), in the
    reduce dtype: a reduce-scatter over the shard group, plus an all-reduce of each shard across nodes under
    ``hybrid``, or one all-reduce under ``none``. Offload copies the fp32 shards to the GPU for each gather and
    the gradients back, and steps AdamW on the CPU.
    """
    n, nodes, psi = x.num_gpus, x.num_nodes, x.params
    shards = shard_group_size(x.fsdp_sharding, n, nodes)
    p, r = precision_bytes(x.precision), reduce_bytes(x.fsdp_reduce_precision)
    regather = (x.fsdp_sharding == "full") | (x.fsdp_sharding == "hybrid")
    gathers = np.where(x.fsdp_sharding == "none", 0.0, np.where(regather, 2.0, 1.0))
    # Inside a node for the shards of hybrid; across nodes for everything else of a multi-node cell.
    shard_bw = np.where((nodes > 1) & (x.fsdp_sharding != "hybrid"), INTER_NODE_BUSBW_GBPS * 1e9, intra)
    gather_s = accum * gathers * (shards - 1.0) / shards * psi * p / shard_bw
    scatter_s = (shards - 1.0) / shards * psi * r / shard_bw
    replicas = n / shards
    replica_bw = np.where(nodes > 1, INTER_NODE_BUSBW_GBPS * 1e9, intra)
    all_reduce_s = 2.0 * (replicas - 1.0) / replicas * psi / shards * r / replica_bw
    communication = np.where(n > 1, gather_s + scatter_s + all_reduce_s, 0.0)
    offload = np.where(
        x.fsdp_offload,
        (accum * gathers + 1.0) * 4.0 * psi / shards / host + psi / nodes / CPU_ADAM_PARAMS_PER_S_PER_NODE,
        0.0,
    )
    return communication, offload
