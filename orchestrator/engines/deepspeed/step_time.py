"""DeepSpeed's share of a step's time as the predictor models it (``analysis/predict/step_time.py``): nominal seconds of
communication and of offload for one optimizer step, element-wise over the predictor's arrays.

Communication: a ring all-reduce moves 2(N-1)/N of the gradients per GPU; ZeRO-1/2's reduce-scatter plus
all-gather the same; ZeRO-3 gathers parameters in forward and backward and reduce-scatters gradients: 3(N-1)/N,
in the 16-bit (or fp32) bytes of the precision, over the node's links or, for a multi-node cell, the network.

Offload: with optimizer offload the gradients go down, the updated 16-bit parameters come back and each node's
CPUs update its GPUs' shares with CPU-Adam; with parameter offload every micro-step fetches the partition for the
forward and for the backward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from orchestrator.engines.memory import precision_bytes

if TYPE_CHECKING:
    from orchestrator.engines.spec import CellArrays, Links, Terms


def step_time_terms(x: CellArrays, accum: np.ndarray, links: Links) -> Terms:
    """Nominal seconds of communication (``communication_s``) and offload (``offload_s``) of one step of
    ``accum`` micro-steps, for every cell of ``x`` (bandwidths in bytes/s), by its ZeRO fields."""
    n, nodes, psi = x.num_gpus, x.num_nodes, x.params
    m = x.method
    stage, offload_optimizer, offload_params = m["zero_stage"], m["offload_optimizer"], m["offload_params"]
    volume = np.where(stage >= 3, 3.0, 2.0) * (n - 1.0) / n * psi * precision_bytes(x.precision)
    busbw = np.where(nodes > 1, links.inter_node, links.intra_node)
    communication = np.where(n > 1, volume / busbw, 0.0)
    host = links.host
    offload = np.where(
        offload_optimizer & (stage >= 1),
        4.0 * psi / n / host + psi / nodes / links.cpu_adam_params_per_s_per_node,
        0.0,
    ) + np.where(offload_params & (stage >= 3), accum * 4.0 * psi / n / host, 0.0)
    return {"communication_s": communication, "offload_s": offload}
