"""DeepSpeed's share of a step's time as the predictor models it (``analysis/predict/step_time.py``): nominal seconds of
communication and of offload for one optimizer step, element-wise over the predictor's arrays.

Communication, each collective as its count × the link's latency + its bytes / the link's bus bandwidth
(``Links.collectives``), in the 16-bit (or fp32) bytes of the precision, over the node's links or, for a
multi-node cell, the network, as DeepSpeed issues them (deepspeed 0.19's ``runtime/engine.py`` and
``runtime/zero/``):

- ZeRO-0 all-reduces the gradients once a step, at the accumulation boundary (``engine.allreduce_gradients``), in
  buffers of ``MEMORY_OPT_ALLREDUCE_SIZE`` = 5e8 elements: ``2(N-1)/N`` of the gradients a rank;
- ZeRO-1 reduces them once a step too, at the boundary (``stage_1_and_2.py``,
  ``reduce_ready_partitions_and_remove_grads``: ``if self.partition_gradients or
  self.is_gradient_accumulation_boundary()``), in buckets of ``reduce_bucket_size`` (5e8 elements), and
  all-gathers the updated parameters after the step in buckets of ``allgather_bucket_size`` (5e8): ``(N-1)/N``
  each;
- ZeRO-2 (``partition_gradients``) reduces every micro-step's gradients (the same line: the condition holds
  whatever the boundary), then all-gathers the parameters once a step;
- ZeRO-3 all-gathers each layer's parameters for the forward and again for the backward and reduce-scatters the
  gradients, every micro-step (``stage3.py``, ``reduce_ready_partitions_and_remove_grads`` has no boundary
  check): a gather per layer and per pass (a layer's parameters come in one coalesced all-gather), two more for
  the embedding and the output layer, and a reduce-scatter per 5e8-element bucket. One gather a layer is what
  the CPU grid's ZeRO-3 cells show (tests/data/cpu-grid: their mean leave-one-out errors are +1% and +7% with
  it); one a parameterised module (six a GPT-NeoX layer) overshoots them, +21% and +20%.

ZeRO-0, 1 and 2 block the step on their reductions: DeepSpeed's ``overlap_comm`` defaults to true for stage 3
only (``runtime/zero/config.py``, ``overlap_comm_valid``) and the probe's config leaves it unset, so their
communication is all ``communication_s``. ZeRO-3's prefetched gathers and overlapped reductions are
``overlappable_s``, less the first gather and the last bucket of each micro-step, which nothing hides.

Offload: with optimizer offload the gradients go down, the updated 16-bit parameters come back and each node's
CPUs update its GPUs' shares with CPU-Adam; with parameter offload every micro-step fetches the partition for the
forward and for the backward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from orchestrator.engines.deepspeed.memory import BUCKET_ELEMENTS
from orchestrator.engines.memory import precision_bytes

if TYPE_CHECKING:
    from orchestrator.engines.spec import CellArrays, Links, Terms

EXTRA_GATHERS = 2.0
"""ZeRO-3's gathers a pass besides one a layer: the embedding's and the output layer's."""


def step_time_terms(x: CellArrays, accum: np.ndarray, links: Links) -> Terms:
    """Nominal seconds of communication (``communication_s``, ``overlappable_s``, ``overlap_floor_s``) and offload
    (``offload_s``) of one step of ``accum`` micro-steps, for every cell of ``x``, by its ZeRO fields."""
    n, nodes, psi = x.num_gpus, x.num_nodes, x.params
    m = x.method
    stage, offload_optimizer, offload_params = m["zero_stage"], m["offload_optimizer"], m["offload_params"]
    accum = np.asarray(accum, dtype=float)
    grads = psi * precision_bytes(x.precision)
    share = (n - 1.0) / n  # of a buffer, a rank sends in an all-gather or a reduce-scatter
    buckets = np.ceil(psi / BUCKET_ELEMENTS)
    across = nodes > 1

    def run(count: np.ndarray, bus_bytes: np.ndarray) -> np.ndarray:
        return np.asarray(links.collectives(count, bus_bytes, across), dtype=float)

    all_reduce = run(buckets, 2.0 * share * grads)  # ZeRO-0, once a step
    reduce_once = run(buckets, share * grads)  # ZeRO-1/2's reduction, or the parameters' all-gather
    reductions = np.where(stage >= 2, accum, 1.0)  # ZeRO-2 reduces every micro-step, ZeRO-1 at the boundary
    sharded = reductions * reduce_once + reduce_once
    gathers = 2.0 * (x.layers + EXTRA_GATHERS)  # a micro-step's, forward and backward
    gather_one = run(np.ones_like(psi), share * grads / (x.layers + EXTRA_GATHERS))
    zero3 = accum * (gathers * gather_one + reduce_once)
    floor3 = accum * (gather_one + run(np.ones_like(psi), share * grads / buckets))
    many = n > 1
    blocking = np.where(many & (stage < 3), np.where(stage == 0, all_reduce, sharded), 0.0)
    overlappable = np.where(many & (stage >= 3), zero3, 0.0)
    host = links.host
    offload = np.where(
        offload_optimizer & (stage >= 1),
        4.0 * psi / n / host + psi / nodes / links.cpu_adam_params_per_s_per_node,
        0.0,
    ) + np.where(offload_params & (stage >= 3), accum * 4.0 * psi / n / host, 0.0)
    return {
        "communication_s": blocking,
        "overlappable_s": overlappable,
        "overlap_floor_s": np.where(many & (stage >= 3), floor3, 0.0),
        "offload_s": offload,
    }
