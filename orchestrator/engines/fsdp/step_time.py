"""FSDP2's share of a step's time as the predictor models it (``analysis/predict/step_time.py``): nominal seconds of
communication and of offload for one optimizer step, element-wise over the predictor's arrays.

``fully_shard`` wraps every layer and then the root (the embedding and output layer): L + 1 units, each gathered
and reduced by collectives of its own, so a collective's latency counts once a unit (``Links.collectives``: count
× latency + bytes / bus bandwidth). Every micro-step gathers each unit's parameters (compute dtype) for the
forward and, under ``full`` and ``hybrid`` (``reshard_after_forward``), again for the backward; gradients are
reduced in the reduce dtype every micro-step (``fsdp_accumulation: sharded``, FSDP2's default) or once, at the
boundary (``unsharded``: ``set_requires_gradient_sync``): a reduce-scatter a unit over the shard group, plus an
all-reduce of each shard across nodes under ``hybrid``, or one all-reduce a unit under ``none``.

FSDP2 prefetches the next unit's gather and reduces a unit's gradients while the backward goes on, so all of it is
``overlappable_s``; a micro-step's first gather and last reduction (one unit's) have nothing to hide behind
(``overlap_floor_s``). Offload copies the fp32 shards to the GPU for each gather and the gradients back, and steps
AdamW on the CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from orchestrator.engines.fsdp.memory import reduce_bytes, shard_group_size
from orchestrator.engines.memory import precision_bytes

if TYPE_CHECKING:
    from orchestrator.engines.spec import CellArrays, Links, Terms


def step_time_terms(x: CellArrays, accum: np.ndarray, links: Links) -> Terms:
    """Nominal seconds of communication (``communication_s``, ``overlappable_s``, ``overlap_floor_s``) and offload
    (``offload_s``) of one step of ``accum`` micro-steps, for every cell of ``x``, by its ``fsdp_*`` fields."""
    n, nodes, psi = x.num_gpus, x.num_nodes, x.params
    m = x.method
    sharding, offload, reduce = m["fsdp_sharding"], m["fsdp_offload"], m["fsdp_reduce_precision"]
    accum = np.asarray(accum, dtype=float)
    units = np.maximum(np.asarray(x.layers, dtype=float), 1.0) + 1.0
    shards = shard_group_size(sharding, n, nodes)
    p, r = precision_bytes(x.precision), reduce_bytes(reduce)
    regather = (sharding == "full") | (sharding == "hybrid")
    gathers = np.where(sharding == "none", 0.0, np.where(regather, 2.0, 1.0))
    # Inside a node for the shards of hybrid; across nodes for everything else of a multi-node cell.
    shard_across = (nodes > 1) & (sharding != "hybrid")
    replicas = n / shards
    sharded = np.where(shards > 1, 1.0, 0.0)  # no gather or reduce-scatter over a group of one
    replicated = np.where(replicas > 1, 1.0, 0.0)

    def per_unit(share: np.ndarray | float, bytes_each: np.ndarray | float, across: np.ndarray) -> np.ndarray:
        """One unit's collective: its latency and its share of the model's bytes."""
        return np.asarray(links.collectives(1.0, share * psi / units * bytes_each, across), dtype=float)

    gather_one = sharded * per_unit((shards - 1.0) / shards, p, shard_across)
    scatter_one = sharded * per_unit((shards - 1.0) / shards, r, shard_across)
    reduce_one = replicated * per_unit(2.0 * (replicas - 1.0) / replicas / shards, r, nodes > 1)
    reductions = np.where(m["fsdp_accumulation"] == "unsharded", 1.0, accum)
    total = accum * gathers * units * gather_one + reductions * units * (scatter_one + reduce_one)
    floor = accum * np.minimum(gathers, 1.0) * gather_one + reductions * (scatter_one + reduce_one)
    many = n > 1
    offload_s = np.where(
        offload,
        (accum * gathers + 1.0) * 4.0 * psi / shards / links.host + psi / nodes / links.cpu_adam_params_per_s_per_node,
        0.0,
    )
    zero = np.zeros_like(total)
    return {
        "communication_s": zero,
        "overlappable_s": np.where(many, total, 0.0),
        "overlap_floor_s": np.where(many, floor, 0.0),
        "offload_s": offload_s,
    }
