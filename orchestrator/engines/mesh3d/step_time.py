"""mesh3d's share of a step's time as the predictor models it (``analysis/predict/step_time.py``): nominal seconds of
communication for one optimizer step, element-wise over the predictor's arrays, with the pipeline's idle time.

Per optimizer step each replica runs B/d sequences (B the global batch), whatever the micro-batch, in ``accum``
schedules of k micro-batches (k = ``pp_microbatches`` with a pipeline, else 1); each collective costs its count ×
the link's latency + its bytes / the link's bus bandwidth (``Links.collectives``):

- tensor parallelism all-reduces a layer's ``s·h`` activations per sequence twice forward and twice backward
  (Shoeybi et al. 2019), 2(t − 1)/t of the bytes per rank, inside a node, for the L/p layers of the rank; with
  ``tp_loss_parallel``, one more forward (the row-parallel embedding's) and one more backward (the
  column-parallel output layer's input gradient), the loss's all-reduces of one number a token left out; with
  ``tp_sequence_parallel`` each all-reduce is an all-gather and a reduce-scatter, the same bytes, and the
  embedding and output layer split as with ``tp_loss_parallel``; each of them for every micro-batch (the count,
  whose latency dominates a small model's);
- the pipeline sends each sequence's activations forward and its gradients back across each stage boundary, v
  times a rank where it holds v stages (interleaved, Narayanan et al. 2021 §2.2),
  across nodes where the stages are on different nodes: a send/recv each way per micro-batch and boundary;
- FSDP2 gathers the rank's share for each schedule and reduce-scatters its gradients after each schedule (the
  pipeline reduces at the end of every schedule), over the d replicas; with HSDP (``dp_replicate``) over the
  d/r of a replica group, inside a node where they fit, and all-reduces each shard's gradients across the r
  groups (``fsdp_sharding=hybrid``'s terms); one collective of each a unit (a layer of the rank, and its root).
  Those are issued beside the compute (FSDP2's prefetch and asynchronous reductions): ``overlappable_s``, one
  unit's gather and reduction of each schedule left exposed (``overlap_floor_s``); the tensor-parallel and
  pipeline collectives sit on the path of the compute (``communication_s``);
- selective checkpointing reruns no matrix product, so its hardware FLOPs are the unchecked step's (the
  predictor's ``flops_per_sample``), where full checkpointing reruns each layer's forward;
- the bubble: a schedule leaves each rank idle (p − 1)/(v·m + p − 1) of its time (Narayanan et al. 2021), a
  zero-bubble one a third of that bubble (Qi et al. 2023; ``pipeline.bubble_share``), so the compute of the
  step, C, is stretched by C·bubble/(1 − bubble); that wait is the compute's own, not a link's: the predictor
  multiplies its compute term by :func:`compute_stretch` (``layout_terms``), so the wait is costed at the rate the
  compute is achieved, not at the dense peak nor with the communication's coefficient;
- the slowest rank sets the pace: where the ranks are not balanced (``config.pipeline_imbalance``: its
  costliest rank over the mean one, the layers split unevenly, by ``pp_layers`` or the ends' vocabulary
  matrices), every stage
  waits for it, C·(imbalance − 1) more, also stretched by the bubble (in :func:`compute_stretch` too);
- the output layer is whole on every tensor rank unless ``tp_loss_parallel`` or ``tp_sequence_parallel`` splits the
  vocabulary (``parallelize.apply_tensor_parallel``; the memory model holds its matrix whole there too): its
  logits' FLOPs (3 × 2hV a token, forward and both gradients), a share s of the step's, run t times, so the
  compute is C·(1 − s + t·s) (:func:`replicated_logits`, also in :func:`compute_stretch`). On pythia-tiny's two
  tensor ranks, s = 0.20 and the step's compute 1.2 times the even split's (pythia-160m: s = 0.24; Llama 2 70B: 0.004).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.engines.memory import precision_bytes
from orchestrator.engines.mesh3d.config import peak_rank_layers, pipeline_imbalance
from orchestrator.engines.mesh3d.memory import REDUCE_BYTES, rank_parameters, vocab_split_of
from orchestrator.engines.mesh3d.pipeline import bubble_share, stages_per_rank

if TYPE_CHECKING:
    from orchestrator.engines.spec import CellArrays, Links, Terms


def bubble(pp: ArrayLike, microbatches: ArrayLike, schedule: ArrayLike, chunks: ArrayLike = 2) -> np.ndarray:
    """``pipeline.bubble_share`` of each cell: ``(p − 1)/(v·m + p − 1)``, less for a zero-bubble schedule, 0
    without a pipeline."""
    one = np.vectorize(bubble_share, otypes=[float])
    return np.asarray(
        one(np.asarray(pp, dtype=float), microbatches, chunks, np.asarray(schedule, dtype=object)), dtype=float
    )


def end_weights(
    num_parameters: ArrayLike, vocab_matrix: ArrayLike, num_layers: ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """Each cell's decoder layers (at least 1) and ``config.end_weight``: the vocabulary matrix an end stage holds,
    in decoder layers, which the cost-balanced split weighs on the end stages."""
    psi = np.asarray(num_parameters, dtype=float)
    e = np.minimum(np.asarray(vocab_matrix, dtype=float), psi / 2.0)
    layers = np.maximum(np.asarray(num_layers, dtype=float), 1.0)
    return layers, np.where(psi > 2.0 * e, e * layers / np.maximum(psi - 2.0 * e, 1.0), 0.0)


def imbalance(
    num_parameters: np.ndarray, vocab_matrix: np.ndarray, num_layers: np.ndarray, pp: np.ndarray,
    pipeline: tuple[ArrayLike, ArrayLike, ArrayLike | None] = (2, "1f1b", None),
) -> np.ndarray:  # fmt: skip
    """``config.pipeline_imbalance`` of each cell: its slowest rank over the mean one (1 without a pipeline);
    ``pipeline``: ``pp_chunks``, ``pp_schedule`` and ``pp_layers``."""
    layers, weight = end_weights(num_parameters, vocab_matrix, num_layers)
    chunks, schedule, split = pipeline

    def one_cell(n: float, p: float, w: float, c: float, name: object, given: object) -> float:
        return pipeline_imbalance(int(n), int(p), float(w), stages_per_rank(str(name), int(c)), given)

    one = np.vectorize(one_cell, otypes=[float])
    names, given = np.asarray(schedule, dtype=object), np.asarray(split, dtype=object)
    return np.asarray(one(layers, np.asarray(pp, dtype=float), weight, chunks, names, given), dtype=float)


def step_time_terms(x: CellArrays, accum: np.ndarray, links: Links) -> Terms:
    """Nominal seconds of communication (``communication_s``, the bubble's wait included; ``overlappable_s`` and
    ``overlap_floor_s``, the data-parallel part) and offload (``offload_s``: none) of one step of ``accum``
    schedules, for every cell of ``x``."""
    m = x.method
    t, p = np.asarray(m["tp"], dtype=float), np.asarray(m["pp"], dtype=float)
    n, nodes = np.asarray(x.num_gpus, dtype=float), np.asarray(x.num_nodes, dtype=float)
    accum = np.asarray(accum, dtype=float)
    d = np.maximum(n / (t * p), 1.0)
    pb = np.asarray(precision_bytes(x.precision), dtype=float)
    tokens = np.asarray(x.batch, dtype=float) / d * np.asarray(x.seq, dtype=float)
    activation = tokens * np.asarray(x.hidden, dtype=float) * pb
    micro_batches = accum * np.where(p > 1, np.asarray(m["pp_microbatches"], dtype=float), 1.0)
    rank_layers = np.asarray(x.layers, dtype=float) / p
    vocab_split = vocab_split_of(m)
    reduces = rank_layers * 4.0 + np.where(vocab_split, 2.0, 0.0)
    inside = np.zeros_like(n, dtype=bool)
    tensor_s = np.where(
        t > 1, links.collectives(micro_batches * reduces, reduces * 2.0 * (t - 1.0) / t * activation, inside), 0.0
    )
    v = np.vectorize(stages_per_rank, otypes=[float])(np.asarray(m["pp_schedule"], dtype=object), m["pp_chunks"])
    sends = 2.0 * v * micro_batches
    pipeline_s = np.where(p > 1, links.collectives(sends, 2.0 * v * activation / t, nodes > 1), 0.0)
    share = np.asarray(rank_parameters(x.params, x.vocab * x.hidden, t, p, x.layers, vocab_split), dtype=float)
    r = np.maximum(np.asarray(m["dp_replicate"], dtype=float), 1.0)
    shards = np.maximum(d / r, 1.0)
    units = np.maximum(rank_layers, 1.0) + 1.0
    # A shard group of HSDP spans shards·t ranks: inside a node where they fit; one replica group's shards are
    # all-reduced across the groups, across nodes on several.
    across = np.where(r > 1, shards * t > n / np.maximum(nodes, 1.0), nodes > 1)
    gather_one = links.collectives(1.0, (shards - 1.0) / shards * share / units * pb, across)
    scatter_one = links.collectives(1.0, (shards - 1.0) / shards * share / units * REDUCE_BYTES, across)
    replicate_one = links.collectives(1.0, 2.0 * (r - 1.0) / r * share / shards / units * REDUCE_BYTES, nodes > 1)
    per_schedule = np.where(shards > 1, gather_one + scatter_one, 0.0) + np.where(r > 1, replicate_one, 0.0)
    data_s = accum * units * per_schedule
    return {
        "communication_s": np.asarray(tensor_s + pipeline_s, dtype=float),
        "overlappable_s": np.asarray(data_s, dtype=float),
        "overlap_floor_s": np.asarray(accum * per_schedule, dtype=float),
        "offload_s": np.zeros_like(n, dtype=float),
    }


def replicated_logits(x: CellArrays) -> np.ndarray:
    """Each cell's compute over the even split's where every tensor rank runs the whole output layer (see the
    module's docstring): ``1 − s + t·s``, s the logits' share of the step's FLOPs; 1 where the vocabulary is split
    or t = 1. With a pipeline the logits are the last stage's, and the factor spreads them over the step (a
    small-model figure: for large models s is under 1%)."""
    t = np.asarray(x.method["tp"], dtype=float)
    logits = 6.0 * np.asarray(x.hidden, dtype=float) * np.asarray(x.vocab, dtype=float) * np.asarray(x.seq, float)
    flops = np.asarray(x.flops_per_sample, dtype=float)
    share = np.where(flops > 0, np.minimum(logits / np.where(flops > 0, flops, 1.0), 1.0), 0.0)
    whole = (t > 1) & ~vocab_split_of(x.method)
    return np.asarray(np.where(whole, 1.0 + (t - 1.0) * np.nan_to_num(share), 1.0), dtype=float)


def compute_stretch(x: CellArrays) -> np.ndarray:
    """What the pipeline and the tensor ranks make of a step's compute, element-wise: ``imbalance / (1 − bubble)``,
    the slowest rank's share over the mean one's, stretched by the schedule's idle time (1 without a pipeline),
    times the output layer that every tensor rank runs whole (:func:`replicated_logits`). The predictor multiplies
    the compute term by it, so the wait is costed at the rate the compute is achieved (the calibrated
    efficiency), not at the dense peak."""
    m = x.method
    p = np.asarray(m["pp"], dtype=float)
    idle = bubble(p, m["pp_microbatches"], m["pp_schedule"], m["pp_chunks"])
    pace = imbalance(x.params, x.vocab * x.hidden, x.layers, p, (m["pp_chunks"], m["pp_schedule"], m["pp_layers"]))
    return np.asarray(pace / (1.0 - idle) * replicated_logits(x), dtype=float)


def peak_rank_share(x: CellArrays) -> np.ndarray:
    """``config.peak_rank_layers`` of each cell: the activations of the rank that peaks highest over the first
    rank's with the mean stage's layers, of the split :func:`imbalance` weighs (the ends' vocabulary matrices, or
    ``pp_layers``)."""
    m = x.method
    layers, weight = end_weights(x.params, x.vocab * x.hidden, x.layers)

    def one_cell(n: float, p: float, w: float, c: float, name: object, given: object, k: float) -> float:
        v = stages_per_rank(str(name), int(c))
        return peak_rank_layers(int(n), int(p), float(w), v, given, max(int(k), 1), str(name))

    one = np.vectorize(one_cell, otypes=[float])
    names, given = np.asarray(m["pp_schedule"], dtype=object), np.asarray(m["pp_layers"], dtype=object)
    p = np.asarray(m["pp"], dtype=float)
    return np.asarray(one(layers, p, weight, m["pp_chunks"], names, given, m["pp_microbatches"]), dtype=float)
