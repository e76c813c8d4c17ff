"""What a training engine declares about itself, so that the cells' checks, the cell id, the labels and the
predictor find it through :mod:`orchestrator.engines.registry` instead of naming it.

Each engine folder ``orchestrator/engines/<name>/`` has a ``spec.py`` whose ``SPEC`` is an :class:`EngineSpec`:
the ``MethodConfig`` fields it owns, the values they accept, its option refusals, its share of a cell's label, its
memory and step-time terms, and what to try when a cell is predicted not to fit. A spec is cheap to import (the
checks of every sweep read all of them): nothing in it imports numpy, torch or a training library at module level;
its memory and step-time terms import their arithmetic when first called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:
    import numpy as np

    from orchestrator.config.refusal import Refusal
    from orchestrator.config.schema import Config
    from orchestrator.config.values import Scalar

MEMORY_HOLDERS = ("params", "grads", "optimizer", "buffers", "offloaded")
"""The keys of an engine's memory terms: bytes per GPU of the parameters, gradients, optimizer states and
buffers, and of what offload keeps on the host instead (not part of the peak)."""
STEP_TIME_TERMS = ("communication_s", "overlappable_s", "overlap_floor_s", "offload_s")
"""The keys of an engine's step-time terms, nominal seconds of one optimizer step: ``communication_s``, what the
step waits for whatever it computes (a blocking reduction, tensor parallelism, the pipeline's sends and bubble);
``overlappable_s``, communication the engine issues beside its compute (prefetched gathers, asynchronous
reductions), of which at least ``overlap_floor_s`` stays exposed (the first gather, the last bucket); and
``offload_s``, the copies to and from the host and the optimizer step on the CPU. ``analysis/predict/step_time.py``
decides how much of ``overlappable_s`` the compute hides."""


Terms: TypeAlias = "dict[str, np.ndarray]"
"""An engine's memory or step-time terms: one array per key of :data:`MEMORY_HOLDERS` or :data:`STEP_TIME_TERMS`,
one element per cell."""


class CellArrays(Protocol):
    """The predictor's arrays every engine may read, one element per cell (``analysis.predict.inputs.Inputs``): the
    figures every engine shares by name, and every method field by its name in :attr:`method`."""

    params: np.ndarray
    """Parameters of the model (the family's formula)."""
    largest_weight: np.ndarray
    """Elements of the model's largest weight."""
    layers: np.ndarray
    hidden: np.ndarray
    vocab: np.ndarray
    seq: np.ndarray
    """Tokens per sequence."""
    batch: np.ndarray
    """Sequences per optimizer step over all GPUs (the global batch)."""
    flops_per_sample: np.ndarray
    """Hardware FLOPs per sample (a sequence, an image) of a training step (recomputation included where the cell
    checkpoints)."""
    per_sequence: np.ndarray
    """Activation bytes of one sequence through the whole model, its logits and loss included."""
    reference_tflops: np.ndarray
    """The dense peak for the cell's precision; NaN where the device has none."""
    num_gpus: np.ndarray
    num_nodes: np.ndarray
    precision: np.ndarray
    method: Mapping[str, np.ndarray]
    """Every method field's array by the field's name (an engine reads its own fields here): numbers as floats,
    text as objects, flags as bools, the field's default where a cell has no value."""


@dataclass(frozen=True)
class Links:
    """The links the step-time model assumes for each cell (``analysis/predict/network.py`` builds them): for each
    link kind, a collective's fixed time (seconds) and its bus bandwidth (bytes/s, as nccl-tests count it: the
    bytes a rank sends of an all-reduce are ``2(n-1)/n`` of the buffer, of an all-gather or reduce-scatter
    ``(n-1)/n``). A collective of ``b`` such bytes takes ``latency + b / bandwidth``."""

    intra_node: np.ndarray | float
    """Bus bandwidth between the GPUs of one node, per cell."""
    inter_node: np.ndarray | float
    """Bus bandwidth across nodes (one GPU's share of its node's network)."""
    host: np.ndarray | float
    """One GPU's link to host memory, per cell."""
    cpu_adam_params_per_s_per_node: float
    """Parameters a node's CPUs update per second with Adam (offloaded optimizer steps)."""
    intra_node_latency_s: np.ndarray | float = 0.0
    """Seconds a collective inside a node takes whatever its size (0: bytes over bandwidth only)."""
    inter_node_latency_s: np.ndarray | float = 0.0
    """Seconds a collective across nodes takes whatever its size."""
    host_latency_s: np.ndarray | float = 0.0
    """Seconds a copy to or from the host takes whatever its size."""

    def collectives(
        self, count: np.ndarray | float, bus_bytes: np.ndarray | float, across: np.ndarray | bool
    ) -> np.ndarray:
        """Seconds of ``count`` collectives that send ``bus_bytes`` per rank in all, across nodes where ``across``
        is true and inside a node elsewhere (element-wise)."""
        import numpy as np

        latency = np.where(across, self.inter_node_latency_s, self.intra_node_latency_s)
        bandwidth = np.where(across, self.inter_node, self.intra_node)
        out: np.ndarray = count * latency + bus_bytes / bandwidth
        return out


def per_gpu_batch(cell: Config) -> list[Refusal]:
    """A data-parallel engine's batch check: every GPU runs its own sequences, so the global batch must split over
    the GPUs, and a fixed micro-batch must divide each GPU's share."""
    from orchestrator.config.refusal import Refusal

    batch, num_gpus, micro = cell.model.global_batch_size, cell.num_gpus, cell.method.micro_batch_size
    if batch % num_gpus:
        return [Refusal("num_gpus", f"the global batch of {batch} sequences does not split over {num_gpus} GPUs")]
    per_gpu = batch // num_gpus
    if isinstance(micro, int) and not isinstance(micro, bool) and micro > 0 and per_gpu % micro:
        divisors = [d for d in range(1, per_gpu + 1) if per_gpu % d == 0]
        return [
            Refusal(
                "method.micro_batch_size",
                f"{micro} does not divide the per-GPU batch of {per_gpu} sequences "
                f"({batch} / {num_gpus} GPUs); use auto or one of {divisors}",
            )
        ]
    return []


@dataclass(frozen=True)
class EngineSpec:
    """One training engine as the rest of gpudays sees it; ``orchestrator/engines/<name>/spec.py`` defines one."""

    name: str
    """``method.engine``'s value, and the engine folder's name."""
    setting: str
    """How a refusal names one of its settings when another engine is chosen: ``a DeepSpeed setting``."""
    fields: tuple[str, ...]
    """The ``MethodConfig`` fields only this engine reads: refused under any other engine when off their defaults.
    What each accepts is its domain, declared beside the field (orchestrator/config/schema.py)."""
    check: Callable[[Config], list[Refusal]]
    """Refusals of a cell that names this engine, for its own options (the registry refuses the other engines'
    fields)."""
    foreign: Callable[[EngineSpec, object, object], str]
    """``foreign(owner, value, default)``: why ``owner``'s field, set to ``value`` under this engine, is refused
    (it belongs at ``default``), and what this engine uses instead."""
    label: Callable[[Mapping[str, Scalar]], str]
    """How a cell shards under this engine, in a few words, from its method settings (a ``MethodConfig``'s fields
    or a row of the cells table): ``zero2 offload-opt``, ``fsdp-grad_op offload reduce-bf16``."""
    memory_terms: Callable[[CellArrays], Terms]
    """``memory_terms(x)``: bytes per GPU by :data:`MEMORY_HOLDERS` for every cell of the predictor's arrays ``x``
    (a :class:`CellArrays`: this engine's settings are in its ``method``), element-wise."""
    step_time_terms: Callable[[CellArrays, np.ndarray, Links], Terms]
    """``step_time_terms(x, accum, links)``: :data:`STEP_TIME_TERMS` of one optimizer step of ``accum``
    micro-steps for every cell of ``x``, element-wise."""
    not_fit_advice: str
    """What to try, besides more GPUs and activation checkpointing, for a cell predicted not to fit: ``a higher
    ZeRO stage, offload``."""
    identity_always: tuple[str, ...] = ()
    """Those of its fields that join every cell's id even at their defaults: DeepSpeed's, as before there was a
    second engine. A new engine leaves it empty: its fields join an id only where set, so no existing id moves."""
    identity_own: tuple[str, ...] = ()
    """Those of its fields that join the id of every cell naming this engine, even at their defaults (and other
    cells' ids only where set, as any field): a field whose default changed what the engine's cells run, so that
    a record of the old behaviour, under an id without the field, is never read as the new one."""
    sharding_fields: tuple[str, ...] | None = None
    """Those of its fields that say how it shards and offloads: each of their values is a line of its own in the
    scaling table and they are the plan's columns; its other fields are tuned per GPU count, as the method's own
    settings are. None: all of :attr:`fields`."""
    compile_scopes: tuple[str, ...] = ("regional",)
    """The values of ``method.compile_scope`` its engine compiles (``whole`` only where it wraps the whole model
    as one graph without splitting its own hooks out of it)."""
    batch_check: Callable[[Config], list[Refusal]] = per_gpu_batch
    """Refusals of a cell whose global batch does not split as this engine splits it: over the GPUs
    (:func:`per_gpu_batch`, a data-parallel engine's), or over what shares a micro-step (mesh3d: its replicas ×
    pipeline micro-batches)."""
    build_bytes: Callable[[CellArrays], np.ndarray | float] | None = None
    """``build_bytes(x)``: bytes per GPU allocated at the peak of building the model and its engine, before the
    first step (the model's states only come later), for every cell of ``x``, element-wise. A cell fits only where
    both this and the step's peak do. None: the build never peaks above the step."""
    accumulated_bytes: Callable[[CellArrays], np.ndarray] | None = None
    """``accumulated_bytes(x)``: the part of ``memory_terms``' ``grads`` a rank holds only while a step accumulates
    more than one micro-step (gradients kept whole between micro-steps, reduced at the boundary), for every cell of
    ``x``, element-wise; a step of one micro-step reduces them as the backward makes them and holds none of it.
    None: the engine's gradients do not depend on accumulating."""
    layout_terms: Callable[[CellArrays], Terms] | None = None
    """``layout_terms(x)``, for an engine whose ranks share their sequences (tensor and pipeline parallelism):
    ``batch_split``, the ways a micro-step splits the global batch (``num_gpus`` for a data-parallel engine, what
    the probe's ``orchestrator.engines.base.batch_split`` says), ``activation_share``, a rank's activations
    over those of one whole-model sequence, and optionally ``micro_step_share``, what one of its micro-steps costs
    of a whole-model micro-step's fixed cost, and ``compute_stretch``, what its schedule makes of the step's
    compute (a pipeline's bubble and slowest stage). None: ``num_gpus`` ways, all of them, a whole micro-step, no
    stretch."""

    @property
    def identity_if_set(self) -> tuple[str, ...]:
        """Its fields that join a cell's id only where they differ from their defaults."""
        return tuple(f for f in self.fields if f not in self.identity_always)

    @property
    def sharding(self) -> tuple[str, ...]:
        """:attr:`sharding_fields`, or all of its fields where it names none."""
        return self.fields if self.sharding_fields is None else self.sharding_fields
