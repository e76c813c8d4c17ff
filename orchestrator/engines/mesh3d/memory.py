"""Device memory of a mesh3d training step per GPU: the model states of one rank's share after tensor and pipeline
parallelism, sharded by FSDP2 over the data-parallel replicas, and the micro-batch that fits. Pure arithmetic.

Ψ parameters, E = V·h one vocabulary matrix, t tensor ranks, p pipeline ranks, d data-parallel replicas, p_b
bytes of the compute dtype, r of the reduce dtype (fp32):

- a rank's share: the decoder layers' (Ψ − 2E)/(p·t), plus the vocabulary matrices of its end of the pipeline
  (the input embedding on the first stage, the output layer on the last, both when p = 1), which stay whole on
  every tensor rank unless ``tp_loss_parallel`` splits the vocabulary (then E/t): Ψ_gpu = (Ψ − 2E)/(p·t) +
  E·(2 if p = 1 else 1) where the stages split the layers evenly; otherwise the largest rank's, the layers of its
  stages (one, or ``pp_chunks`` under an interleaved schedule) as ``config.stage_sizes`` splits them or as
  ``method.pp_layers`` gives them;
- FSDP2 keeps fp32 shards over the d replicas: 4Ψ_gpu/d parameters, 4Ψ_gpu/d gradients, 8Ψ_gpu/d AdamW moments;
  the gradients of a schedule's micro-batches accumulate unsharded, rΨ_gpu (held only where a step accumulates:
  without a pipeline a step of one micro-step reduces them as the backward makes them, :func:`accumulated_bytes_of`
  and the predictor's micro-batch rule); with HSDP (``dp_replicate``) d is
  the shard degree, the replicas of one group (:func:`shard_degree`), each group holding all the states;
- gathered parameters: with a pipeline the stage stays gathered for all its micro-batches (resharding between
  them would gather it again for each), p_bΨ_gpu; without, as FSDP's ``full``: two layers and the largest weight;
- activations (:func:`activation_factor`): a layer's activations split over the t ranks (they hold a share of
  the heads and of the MLP; the residual stream and norms are whole on each, which this leaves out), over the
  layers of the stages the first rank holds in flight as its schedule orders them (``pipeline.in_flight_share``:
  1F1B's first stage min(p, m) micro-batches, Narayanan et al. 2021; interleaving more). With
  ``tp_loss_parallel`` the logits and the loss's share of them (:func:`logit_fraction`) are split over the t ranks;
  with ``tp_sequence_parallel`` all of a layer's activations are (and the vocabulary matrices, E/t). Selective
  checkpointing (``checkpoint_policy``) keeps the outputs of each layer's matrix products and attention, between
  full checkpointing's input and no checkpointing's everything (``engines.memory.selective_layer_bytes``).

Building (:func:`build_bytes`): on the meta device, split, then each rank allocates its fp32 shards, 4Ψ_gpu/d, and
initialises one unit at a time (a decoder layer, or a module outside them) on a full-size fp32 copy, not split
over the tensor ranks: 4 bytes of the largest unit beside the shards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.engines.memory import (
    activation_bytes_per_sequence,
    largest_unit,
    micro_batch_that_fits,
    precision_bytes,
)
from orchestrator.engines.memory import scalar_or_array as _out
from orchestrator.engines.mesh3d.config import Mesh3dLayout, end_weight, layout_of, peak_rank_layers, stage_sizes
from orchestrator.engines.mesh3d.pipeline import in_flight_share, rank_totals, stages_per_rank, user_split
from orchestrator.models import family_module, num_parameters

if TYPE_CHECKING:
    from orchestrator.config.schema import Config
    from orchestrator.engines.spec import CellArrays, Terms

REDUCE_BYTES = 4.0
"""Gradients are reduced and accumulated in fp32."""


def rank_parameters(
    num_parameters: ArrayLike, vocab_matrix: ArrayLike, tp: ArrayLike, pp: ArrayLike,
    num_layers: ArrayLike | None = None, vocab_split: ArrayLike = False, chunks: ArrayLike = 2,
    schedule: ArrayLike = "1f1b", split: ArrayLike | None = None,
) -> np.ndarray | float:  # fmt: skip
    """Parameters one rank holds before FSDP shards them: the largest rank's share, of the layers as
    ``config.stage_sizes`` splits ``num_layers`` over the stages of ``schedule`` (with ``chunks``, ``pp_chunks``)
    or as ``split`` (``pp_layers``) gives them (unevenly where the stages do not divide them; None: L/p each);
    ``vocab_split`` (``tp_loss_parallel``): the vocabulary matrices split over the tensor ranks too."""
    psi = np.asarray(num_parameters, dtype=float)
    e = np.minimum(np.asarray(vocab_matrix, dtype=float), psi / 2.0)
    t, p = np.asarray(tp, dtype=float), np.asarray(pp, dtype=float)
    held = e / np.where(np.asarray(vocab_split, dtype=bool), t, 1.0)
    if num_layers is not None:
        largest = np.vectorize(_largest_stage, otypes=[float])
        v = np.vectorize(stages_per_rank, otypes=[int])(np.asarray(schedule, dtype=object), np.asarray(chunks))
        layers = np.asarray(num_layers, dtype=float)
        return _out(largest(psi, e, t, p, layers, held, v, np.asarray(split, dtype=object)))
    return _out((psi - 2.0 * e) / (p * t) + held * np.where(p > 1, 1.0, 2.0))


def _largest_stage(
    psi: float, e: float, t: float, p: float, layers: float, held: float, v: int = 1, split: object = None
) -> float:
    per_layer = (psi - 2.0 * e) / max(layers, 1.0)
    stages = int(p) * max(int(v), 1)
    if p <= 1 or stages > layers or per_layer <= 0:
        return (psi - 2.0 * e) / (p * t) + held * (1.0 if p > 1 else 2.0)
    # the engine's split, whatever the vocabulary's
    sizes = list(user_split(split, int(layers), stages)) or stage_sizes(int(layers), stages, e / per_layer)
    last = len(sizes) - 1
    return max(
        rank_totals([n * per_layer / t + (held if i in (0, last) else 0.0) for i, n in enumerate(sizes)], int(p))
    )


def memory_terms(
    num_parameters: ArrayLike,
    vocab_matrix: ArrayLike,
    largest_weight: ArrayLike,
    num_layers: ArrayLike,
    num_gpus: ArrayLike,
    tp: ArrayLike,
    pp: ArrayLike,
    precision: ArrayLike,
    vocab_split: ArrayLike = False,
    dp_replicate: ArrayLike = 1.0,
    pipeline: tuple[ArrayLike, ArrayLike, ArrayLike | None] = (2, "1f1b", None),
) -> dict[str, np.ndarray | float]:
    """Bytes per GPU by holder (``params``, ``grads``, ``optimizer``, ``buffers``, and ``offloaded``: none); the
    states sharded over :func:`shard_degree` ranks; ``pipeline``: ``pp_chunks``, ``pp_schedule`` and
    ``pp_layers``, for the largest rank's layers."""
    t, p = np.asarray(tp, dtype=float), np.asarray(pp, dtype=float)
    d = np.asarray(shard_degree(num_gpus, t, p, dp_replicate), dtype=float)
    share = np.asarray(
        rank_parameters(num_parameters, vocab_matrix, t, p, num_layers, vocab_split, *pipeline), dtype=float
    )
    pb = np.asarray(precision_bytes(precision), dtype=float)
    per_layer = share / np.maximum(np.asarray(num_layers, dtype=float) / p, 1.0)
    gathered = np.where(p > 1, pb * share, pb * (2.0 * per_layer + np.asarray(largest_weight, dtype=float) / t))
    return {
        "params": _out(4.0 * share / d),
        "grads": _out(4.0 * share / d + REDUCE_BYTES * share),
        "optimizer": _out(8.0 * share / d),
        "buffers": _out(gathered),
        "offloaded": _out(np.zeros_like(share)),
    }


def shard_degree(
    num_gpus: ArrayLike, tp: ArrayLike, pp: ArrayLike, dp_replicate: ArrayLike = 1.0
) -> np.ndarray | float:
    """Ranks FSDP2 shards a parameter over: the ``d = n/(t·p)`` replicas, or with HSDP the ``d / dp_replicate`` of
    one replica group (the groups each hold all the states)."""
    t, p = np.asarray(tp, dtype=float), np.asarray(pp, dtype=float)
    d = np.maximum(np.asarray(num_gpus, dtype=float) / (t * p), 1.0)
    return _out(np.maximum(d / np.maximum(np.asarray(dp_replicate, dtype=float), 1.0), 1.0))


def build_bytes(
    num_parameters: ArrayLike, vocab_matrix: ArrayLike, largest_weight: ArrayLike, num_layers: ArrayLike,
    num_gpus: ArrayLike, tp: ArrayLike, pp: ArrayLike, vocab_split: ArrayLike = False, dp_replicate: ArrayLike = 1.0,
) -> np.ndarray | float:  # fmt: skip
    """Allocated bytes per GPU at the build's peak: the rank's fp32 shards and one unit's full fp32 copy."""
    t, p = np.asarray(tp, dtype=float), np.asarray(pp, dtype=float)
    d = np.asarray(shard_degree(num_gpus, t, p, dp_replicate), dtype=float)
    share = np.asarray(rank_parameters(num_parameters, vocab_matrix, t, p, vocab_split=vocab_split), dtype=float)
    unit = np.asarray(largest_unit(num_parameters, vocab_matrix, largest_weight, num_layers), dtype=float)
    return _out(4.0 * share / d + 4.0 * unit)


def build_bytes_of(x: CellArrays) -> np.ndarray | float:
    """:func:`build_bytes` for every cell of the predictor's arrays ``x``."""
    m = x.method
    return build_bytes(
        x.params, x.vocab * x.hidden, x.largest_weight, x.layers, x.num_gpus, m["tp"], m["pp"], vocab_split_of(m),
        m["dp_replicate"],
    )  # fmt: skip


def accumulated_gradient_bytes(share: ArrayLike, pp: ArrayLike) -> np.ndarray:
    """The unsharded gradients (``REDUCE_BYTES`` × a rank's ``share``) that :func:`memory_terms` counts, which a
    rank holds only between micro-steps: without a pipeline a step of one micro-step runs it as an accumulation
    boundary (``set_requires_gradient_sync(True)``), so FSDP2 reduce-scatters each layer's gradients as the
    backward makes them; a pipeline's schedule accumulates its micro-batches always (then 0 here)."""
    out: np.ndarray = np.where(np.asarray(pp, dtype=float) > 1, 0.0, REDUCE_BYTES * np.asarray(share, dtype=float))
    return out


def accumulated_bytes_of(x: CellArrays) -> np.ndarray:
    """:func:`accumulated_gradient_bytes` of every cell of the predictor's arrays ``x``."""
    m = x.method
    share = rank_parameters(
        x.params, x.vocab * x.hidden, m["tp"], m["pp"], x.layers, vocab_split_of(m),
        m["pp_chunks"], m["pp_schedule"], m["pp_layers"],
    )  # fmt: skip
    return accumulated_gradient_bytes(share, m["pp"])


def memory_terms_of(x: CellArrays) -> Terms:
    """:func:`memory_terms` for every cell of the predictor's arrays ``x``, by its ``tp``, ``pp``,
    ``tp_loss_parallel`` and ``dp_replicate`` fields."""
    m = x.method
    terms = memory_terms(
        x.params, x.vocab * x.hidden, x.largest_weight, x.layers, x.num_gpus, m["tp"], m["pp"], x.precision,
        vocab_split_of(m), m["dp_replicate"], (m["pp_chunks"], m["pp_schedule"], m["pp_layers"]),
    )  # fmt: skip
    return {k: np.asarray(v) for k, v in terms.items()}


def tensor_activation_share(tp: ArrayLike) -> np.ndarray | float:
    """A tensor rank's share of one layer's activations without sequence parallelism: the norms' and the
    residual's (10 of a layer's 34·s·b·h bytes, Korthikanti et al. 2022, eq. 1 with fused attention) stay whole on
    each rank, attention's and the MLP's 24 split."""
    return _out((10.0 + 24.0 / np.asarray(tp, dtype=float)) / 34.0)


def vocab_split_of(method: Mapping[str, ArrayLike]) -> np.ndarray:
    """Where the vocabulary matrices are split over the tensor ranks: with ``tp_loss_parallel`` or
    ``tp_sequence_parallel`` (whose embedding and output layer are row- and column-parallel)."""
    split: np.ndarray = np.asarray(method["tp_loss_parallel"], dtype=bool) | np.asarray(
        method["tp_sequence_parallel"], dtype=bool
    )
    return split


def activation_share(
    tp: ArrayLike, pp: ArrayLike, microbatches: ArrayLike, chunks: ArrayLike = 2, logits: ArrayLike = 0.0,
    vocab_split: ArrayLike = False, sequence_split: ArrayLike = False, schedule: ArrayLike = "1f1b",
    first_rank: ArrayLike = 1.0,
) -> np.ndarray | float:  # fmt: skip
    """A rank's activations over one whole-model sequence's, element-wise: the layers of the stages its
    ``schedule`` (of ``chunks`` stages a rank where interleaved) keeps in flight on the first rank
    (``pipeline.in_flight_share``; 1F1B's min(p, m) micro-batches of a stage's layers), times the
    tensor share (1/t with ``sequence_split``, ``tp_sequence_parallel``: the norms' and the residual's split too);
    where ``vocab_split`` (``tp_loss_parallel``), the ``logits`` fraction of them (:func:`logit_fraction`) takes
    1/t instead of the tensor share; ``first_rank``: the rank whose activations peak over that first rank with
    the mean stage's layers (``config.peak_rank_layers``: an uneven split moves the peak)."""
    t, p = np.asarray(tp, dtype=float), np.asarray(pp, dtype=float)
    m = np.asarray(microbatches, dtype=float)
    in_flight = np.vectorize(in_flight_share, otypes=[float])(p, m, chunks, np.asarray(schedule, dtype=object))
    in_flight = in_flight * np.asarray(first_rank, dtype=float)
    plain = np.asarray(tensor_activation_share(t), dtype=float)
    tensor = np.where(np.asarray(sequence_split, dtype=bool), 1.0 / t, plain)
    f = np.asarray(logits, dtype=float)
    logit_share = np.where(np.asarray(vocab_split, dtype=bool), 1.0 / t, plain)
    return _out(in_flight * (tensor * (1.0 - f) + f * logit_share))


def logit_fraction(vocab: ArrayLike, seq: ArrayLike, per_sequence: ArrayLike) -> float | np.ndarray:
    """The share of a sequence's activation bytes ``per_sequence`` that are its logits and the eager loss's
    buffers (``gpt_neox.LOGIT_BYTES_PER_ENTRY`` a token and vocabulary entry), at most all of them."""
    from orchestrator.models.gpt_neox import LOGIT_BYTES_PER_ENTRY

    logits = LOGIT_BYTES_PER_ENTRY * np.asarray(vocab, dtype=float) * np.asarray(seq, dtype=float)
    total = np.asarray(per_sequence, dtype=float)
    share: np.ndarray = np.clip(np.divide(logits, total, out=np.zeros_like(logits * total), where=total > 0), 0.0, 1.0)
    return float(share) if share.ndim == 0 else share


def activation_factor(
    layout: Mesh3dLayout, num_layers: int, logits: float = 0.0, vocab_split: bool = False, sequence: bool = False,
    end: float = 0.0,
) -> float:  # fmt: skip
    """:func:`activation_share` of one cell's layout (``end``: ``config.end_weight`` of its model)."""
    first = peak_rank_layers(
        num_layers, layout.pp, end, layout.stages_per_rank, layout.layers, layout.microbatches, layout.schedule
    )
    return float(
        activation_share(
            layout.tp, layout.pp, layout.microbatches, layout.stages_per_rank, logits, vocab_split, sequence,
            layout.schedule, first,
        )
    )  # fmt: skip


def fixed_bytes(cfg: Config) -> float:
    """Allocated bytes per GPU that do not grow with the micro-batch."""
    model = cfg.model
    layout = layout_of(cfg.method, cfg.num_gpus)
    terms = memory_terms(
        num_parameters(model), model.vocab_size * model.hidden_size,
        family_module(model.family).largest_weight_elements(model), model.num_layers, cfg.num_gpus,
        layout.tp, layout.pp, cfg.method.precision, cfg.method.tp_loss_parallel or cfg.method.tp_sequence_parallel,
        cfg.method.dp_replicate, (cfg.method.pp_chunks, cfg.method.pp_schedule, cfg.method.pp_layers),
    )  # fmt: skip
    return float(sum(v for k, v in terms.items() if k != "offloaded"))


def estimate_micro_batch_size(cfg: Config, memory_gib: float) -> int:
    """The pipeline micro-batch the memory model says fits in ``memory_gib`` per GPU: where the search starts."""
    layout = layout_of(cfg.method, cfg.num_gpus)
    per_sequence = activation_bytes_per_sequence(cfg.model, cfg.method)
    logits = float(logit_fraction(cfg.model.vocab_size, cfg.model.seq_length, per_sequence))
    m = cfg.method
    scale = activation_factor(
        layout, cfg.model.num_layers, logits, m.tp_loss_parallel, m.tp_sequence_parallel, end_weight(cfg.model)
    )
    # Without a pipeline a step of one micro-step reduces the gradients as the backward makes them
    # (accumulated_bytes_of): the whole replica's batch is tried without them.
    share = rank_parameters(
        num_parameters(cfg.model), cfg.model.vocab_size * cfg.model.hidden_size, layout.tp, layout.pp,
        cfg.model.num_layers, m.tp_loss_parallel or m.tp_sequence_parallel, m.pp_chunks, m.pp_schedule, m.pp_layers,
    )  # fmt: skip
    accumulated = float(accumulated_gradient_bytes(share, layout.pp))
    per_gpu = cfg.model.global_batch_size // layout.batch_split
    # micro_batch_that_fits divides by the whole model's bytes per sequence: scale the fixed bytes instead.
    fixed = fixed_bytes(cfg)
    return (
        micro_batch_that_fits(cfg, memory_gib / scale, fixed / scale, accumulated / scale, per_gpu)
        if per_sequence
        else 1
    )
