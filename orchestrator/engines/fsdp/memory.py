"""Device memory of an FSDP2 training step per GPU: sharded model states, gathered parameters, the accumulated
gradients, and the micro-batch that fits. Pure arithmetic; activations, the allocator's overhead and the peak are
what every engine shares (:mod:`orchestrator.engines.memory`).

Ψ parameters, S ranks a parameter is sharded over (``full``, ``grad_op``: every GPU; ``hybrid``: the GPUs of a
node; ``none``: 1), p bytes of the compute dtype (2 in bf16, 4 in fp32), r of the reduce dtype:

- sharded states: FSDP2 keeps the sharded parameters in fp32 (the module is built in fp32; ``MixedPrecisionPolicy``
  casts a copy for compute), so parameters 4Ψ/S, gradients 4Ψ/S, AdamW's two moments 8Ψ/S: 16Ψ/S, ZeRO-3's
  total. ``CPUOffloadPolicy`` keeps all three on the host.
- accumulated gradients: with ``fsdp_accumulation: unsharded``, inside an accumulation cycle
  (``set_requires_gradient_sync(False)``) each rank keeps the *unsharded* gradients of every layer, in the reduce
  dtype: rΨ, held only where a step accumulates (:func:`accumulated_bytes_of`: a step of one micro-step is its
  own boundary, and the predictor's micro-batch rule leaves it out there). ``sharded`` (the default) reduce-scatters every micro-batch
  into the sharded gradients already counted: nothing more.
- gathered parameters: ``full``/``hybrid`` gather a layer for its forward and again for its backward, with the
  next one prefetched: two layers (Ψ/L each) in the compute dtype, plus the root's (embeddings and output layer,
  not resharded: the backward starts there). ``grad_op`` and ``none`` keep every layer gathered from its forward
  to its backward: pΨ. One layer's gradients wait in the reduce-scatter buffer: rΨ/L.

Building (:func:`build_bytes`): the model is built on the meta device and sharded there; each rank then allocates
its fp32 shards (4Ψ/S, on the host with offload) and initialises one unit at a time (a block, or a module outside
the blocks) on a full-size fp32 copy: 4 bytes of the largest unit beside the shards.

Every function works element-wise on numpy arrays as on scalars, as the DeepSpeed model does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.engines.memory import largest_unit, micro_batch_that_fits, precision_bytes
from orchestrator.engines.memory import scalar_or_array as _out
from orchestrator.models import family_module, num_parameters

if TYPE_CHECKING:
    from orchestrator.config.schema import Config, MethodConfig, ModelConfig
    from orchestrator.engines.spec import CellArrays, Terms

__all__ = [
    "buffer_bytes", "build_bytes", "build_bytes_of", "estimate_micro_batch_size", "fixed_bytes", "memory_terms", "memory_terms_of",
    "model_state_bytes", "reduce_bytes", "shard_group_size",
]  # fmt: skip


def shard_group_size(sharding: ArrayLike, num_gpus: ArrayLike, num_nodes: ArrayLike) -> np.ndarray | float:
    """Ranks one parameter is split over: every GPU (full, grad_op), a node's GPUs (hybrid), or 1 (none)."""
    kind = np.asarray(sharding, dtype=object)
    n = np.maximum(np.asarray(num_gpus, dtype=float), 1.0)
    nodes = np.maximum(np.asarray(num_nodes, dtype=float), 1.0)
    return _out(np.where(kind == "none", 1.0, np.where(kind == "hybrid", np.maximum(n / nodes, 1.0), n)))


def reduce_bytes(reduce_precision: ArrayLike) -> np.ndarray | float:
    """Bytes of one gradient element in the reduce dtype."""
    return _out(np.where(np.asarray(reduce_precision, dtype=object) == "bf16", 2.0, 4.0))


def model_state_bytes(
    num_parameters: ArrayLike,
    sharding: ArrayLike,
    num_gpus: ArrayLike,
    num_nodes: ArrayLike = 1,
    reduce_precision: ArrayLike = "fp32",
    offload: ArrayLike = False,
    accumulation: ArrayLike = "sharded",
) -> tuple[np.ndarray | float, np.ndarray | float, np.ndarray | float]:
    """Bytes per GPU of (parameters, gradients, optimizer states) under FSDP2, after offload; gradients include
    the unsharded ones accumulated between boundaries where ``accumulation`` is ``unsharded``."""
    psi = np.asarray(num_parameters, dtype=float)
    shards = np.asarray(shard_group_size(sharding, num_gpus, num_nodes), dtype=float)
    on_host = np.asarray(offload, dtype=bool)
    params = np.where(on_host, 0.0, 4.0 * psi / shards)
    grads = np.where(on_host, 0.0, 4.0 * psi / shards) + unsharded_gradient_bytes(psi, reduce_precision, accumulation)
    optimizer = np.where(on_host, 0.0, 8.0 * psi / shards)
    return _out(params), _out(grads), _out(optimizer)


def unsharded_gradient_bytes(
    num_parameters: ArrayLike, reduce_precision: ArrayLike, accumulation: ArrayLike
) -> np.ndarray:
    """The whole gradients, rΨ, that ``unsharded`` accumulation keeps on each rank between boundaries (on the
    device even with offload); none under ``sharded``."""
    whole = np.asarray(accumulation, dtype=object) == "unsharded"
    out: np.ndarray = np.where(
        whole, np.asarray(num_parameters, dtype=float) * np.asarray(reduce_bytes(reduce_precision)), 0.0
    )
    return out


def buffer_bytes(
    num_parameters: ArrayLike,
    largest_weight: ArrayLike,
    num_layers: ArrayLike,
    sharding: ArrayLike,
    precision: ArrayLike,
    reduce_precision: ArrayLike,
) -> np.ndarray | float:
    """Bytes of gathered (unsharded) parameters and of the reduce-scatter buffer."""
    psi = np.asarray(num_parameters, dtype=float)
    per_layer = psi / np.maximum(np.asarray(num_layers, dtype=float), 1.0)
    p = np.asarray(precision_bytes(precision), dtype=float)
    kind = np.asarray(sharding, dtype=object)
    regathered = 2.0 * per_layer * p + np.asarray(largest_weight, dtype=float) * p
    kept = psi * p
    gathered = np.where((kind == "full") | (kind == "hybrid"), regathered, kept)
    return _out(gathered + per_layer * np.asarray(reduce_bytes(reduce_precision)))


def memory_terms(
    num_parameters: ArrayLike,
    largest_weight: ArrayLike,
    num_layers: ArrayLike,
    sharding: ArrayLike,
    num_gpus: ArrayLike,
    num_nodes: ArrayLike,
    precision: ArrayLike,
    reduce_precision: ArrayLike,
    offload: ArrayLike,
    accumulation: ArrayLike = "sharded",
) -> dict[str, np.ndarray | float]:
    """Bytes per GPU by holder (``params``, ``grads``, ``optimizer``, ``buffers``) and ``offloaded`` (on the host
    instead), as the predictor adds them up (analysis/predict/inputs.py)."""
    params, grads, optimizer = model_state_bytes(
        num_parameters, sharding, num_gpus, num_nodes, reduce_precision, offload, accumulation
    )
    on_device = model_state_bytes(num_parameters, sharding, num_gpus, num_nodes, reduce_precision, False, accumulation)
    buffers = buffer_bytes(num_parameters, largest_weight, num_layers, sharding, precision, reduce_precision)
    offloaded = _out(np.asarray(sum(on_device)) - params - grads - optimizer)
    return {"params": params, "grads": grads, "optimizer": optimizer, "buffers": buffers, "offloaded": offloaded}


def build_bytes(
    num_parameters: ArrayLike, vocab_matrix: ArrayLike, largest_weight: ArrayLike, num_layers: ArrayLike,
    sharding: ArrayLike, num_gpus: ArrayLike, num_nodes: ArrayLike = 1, offload: ArrayLike = False,
) -> np.ndarray | float:  # fmt: skip
    """Allocated bytes per GPU at the build's peak: the fp32 shards (none on the device with offload) and one
    unit's full fp32 copy."""
    psi = np.asarray(num_parameters, dtype=float)
    shards = np.asarray(shard_group_size(sharding, num_gpus, num_nodes), dtype=float)
    on_device = np.where(np.asarray(offload, dtype=bool), 0.0, 4.0 * psi / shards)
    unit = np.asarray(largest_unit(psi, vocab_matrix, largest_weight, num_layers), dtype=float)
    return _out(on_device + 4.0 * unit)


def build_bytes_of(x: CellArrays) -> np.ndarray | float:
    """:func:`build_bytes` for every cell of the predictor's arrays ``x``."""
    m = x.method
    return build_bytes(
        x.params, x.vocab * x.hidden, x.largest_weight, x.layers, m["fsdp_sharding"], x.num_gpus, x.num_nodes,
        m["fsdp_offload"],
    )  # fmt: skip


def accumulated_bytes_of(x: CellArrays) -> np.ndarray:
    """:func:`unsharded_gradient_bytes` of every cell of ``x``: held only inside an accumulation cycle, none in a
    step of one micro-step (its one micro-step is the boundary)."""
    m = x.method
    return unsharded_gradient_bytes(x.params, m["fsdp_reduce_precision"], m["fsdp_accumulation"])


def memory_terms_of(x: CellArrays) -> Terms:
    """:func:`memory_terms` for every cell of the predictor's arrays ``x``, by its ``fsdp_*`` fields."""
    m = x.method
    terms = memory_terms(
        x.params, x.largest_weight, x.layers, m["fsdp_sharding"], x.num_gpus, x.num_nodes, x.precision,
        m["fsdp_reduce_precision"], m["fsdp_offload"], m["fsdp_accumulation"],
    )  # fmt: skip
    return {k: np.asarray(v) for k, v in terms.items()}


def fixed_bytes(model: ModelConfig, method: MethodConfig, num_gpus: int, num_nodes: int = 1) -> float:
    """Allocated bytes per GPU that do not grow with the micro-batch: model states after sharding and buffers."""
    psi = num_parameters(model)
    states = model_state_bytes(
        psi, method.fsdp_sharding, num_gpus, num_nodes, method.fsdp_reduce_precision, method.fsdp_offload,
        method.fsdp_accumulation,
    )  # fmt: skip
    largest = family_module(model.family).largest_weight_elements(model)
    buffers = buffer_bytes(
        psi, largest, model.num_layers, method.fsdp_sharding, method.precision, method.fsdp_reduce_precision
    )
    return float(sum(states) + buffers)


def estimate_micro_batch_size(cfg: Config, memory_gib: float) -> int:
    """The most sequences per micro-batch the memory model says fit in ``memory_gib`` per GPU (at least 1),
    leaving :data:`~orchestrator.engines.memory.DEFAULT_MARGIN` free: where the probe's search starts."""
    m = cfg.method
    accumulated = float(
        unsharded_gradient_bytes(num_parameters(cfg.model), m.fsdp_reduce_precision, m.fsdp_accumulation)
    )
    fixed = fixed_bytes(cfg.model, m, cfg.num_gpus, cfg.num_nodes)
    return micro_batch_that_fits(cfg, memory_gib, fixed, accumulated, cfg.model.global_batch_size // cfg.num_gpus)
