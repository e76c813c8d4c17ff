"""FSDP2's share of a step's time as the predictor models it (``analysis/predict/step_time.py``): nominal seconds of
communication and of offload for one optimizer step, element-wise over the predictor's arrays.

Every micro-step gathers the parameters (compute dtype) for the forward and, under ``full`` and ``hybrid``, again
for the backward; gradients are reduced in the reduce dtype every micro-step (``fsdp_accumulation: sharded``) or
once, at the boundary (``unsharded``: ``set_requires_gradient_sync``): a reduce-scatter over the shard group, plus an all-reduce of each shard across nodes under ``hybrid``, or
one all-reduce under ``none``. Offload copies the fp32 shards to the GPU for each gather and the gradients back,
and steps AdamW on the CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from orchestrator.engines.fsdp.memory import reduce_bytes, shard_group_size
from orchestrator.engines.memory import precision_bytes

if TYPE_CHECKING:
    from orchestrator.engines.spec import CellArrays, Links, Terms


def step_time_terms(x: CellArrays, accum: np.ndarray, links: Links) -> Terms:
    """Nominal seconds of communication (``communication_s``) and offload (``offload_s``) of one step of
    ``accum`` micro-steps, for every cell of ``x`` (bandwidths in bytes/s), by its ``fsdp_*`` fields."""
    n, nodes, psi = x.num_gpus, x.num_nodes, x.params
    m = x.method
    sharding, offload, reduce = m["fsdp_sharding"], m["fsdp_offload"], m["fsdp_reduce_precision"]
    intra, inter = links.intra_node, links.inter_node
    shards = shard_group_size(sharding, n, nodes)
    p, r = precision_bytes(x.precision), reduce_bytes(reduce)
    regather = (sharding == "full") | (sharding == "hybrid")
    gathers = np.where(sharding == "none", 0.0, np.where(regather, 2.0, 1.0))
    # Inside a node for the shards of hybrid; across nodes for everything else of a multi-node cell.
    shard_bw = np.where((nodes > 1) & (sharding != "hybrid"), inter, intra)
    gather_s = accum * gathers * (shards - 1.0) / shards * psi * p / shard_bw
    scatters = np.where(m["fsdp_accumulation"] == "unsharded", 1.0, accum)
    scatter_s = scatters * (shards - 1.0) / shards * psi * r / shard_bw
    replicas = n / shards
    replica_bw = np.where(nodes > 1, inter, intra)
    all_reduce_s = 2.0 * (replicas - 1.0) / replicas * psi / shards * r / replica_bw
    communication = np.where(n > 1, gather_s + scatter_s + all_reduce_s, 0.0)
    offload = np.where(
        offload,
        (accum * gathers + 1.0) * 4.0 * psi / shards / links.host + psi / nodes / links.cpu_adam_params_per_s_per_node,
        0.0,
    )
    return {"communication_s": communication, "offload_s": offload}
