"""The layouts a plan offers beside its cells: tensor × pipeline × data parallel (the mesh3d engine) where data
parallelism alone does not fit or is slower, as practitioners lay out large models.

For each model × GPU type × GPU count of a plan, the fastest mesh3d layout that fits (``analysis.predict.parallelism``
with ``engine="mesh3d"``: each layout predicted as the mesh3d cell its sweep line runs, as the plan predicts a
cell) is offered when no
data-parallel cell of the plan fits (every one predicted not to, or refused before any prediction: a global batch
that does not split over the GPUs, as BLOOM's 2048 sequences over 384), or when its GPU-hours are fewer than the
cheapest fitting one's; with the
overrides that sweep it (one schedule runs all of a replica's micro-batches, as Megatron-LM does, so
``method.pp_microbatches`` is the step's micro-batch count). Pure: configs and predictions in, offers out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from analysis.predict.layout_search import ranked_layouts
from analysis.predict.network import network_for
from analysis.predict.parallelism import LayoutEstimate
from analysis.predict.step_time import DEFAULT_EFFICIENCY
from orchestrator.config.schema import Config, MethodConfig
from orchestrator.config.values import Row
from orchestrator.engines.mesh3d.config import SPLIT_FAMILIES

DATA_PARALLEL_ENGINES = ("deepspeed", "fsdp")
NEAR = 1.10
"""Layouts predicted within this factor of the fastest one's step time are offered beside it: the prediction is
uncalibrated, so a near tie is no reason to hide one (BLOOM's published tp4 pp12 is within 1% of tp8 pp6)."""
MOST_OFFERED = 3
"""The most layouts offered for one model × GPU type × count: the fastest, then the next tensor × pipeline splits."""


@dataclass(frozen=True)
class Offer:
    """One layout offered for a model on ``num_gpus`` GPUs of one type."""

    model: str
    gpu: str
    num_gpus: int
    num_nodes: int
    estimate: LayoutEstimate
    gpu_hours: float
    """The model's whole training run at the layout's predicted step time."""
    data_parallel_gpu_hours: float | None
    """The cheapest fitting data-parallel cell of the plan for the same model, GPUs and count; None when none
    of them fits, none can run (refused), or the plan has none (:attr:`data_parallel_cells`)."""
    data_parallel_cells: int
    """The plan's data-parallel cells (deepspeed, fsdp) for the same model, GPUs and count."""
    overrides: tuple[str, ...]
    """What to add to ``gpudays sweep`` to measure it."""

    @property
    def sweep(self) -> str:
        """The ``gpudays sweep`` line that measures it."""
        cell = [f"model={self.model}", f"gpu={self.gpu}", f"num_gpus={self.num_gpus}", f"num_nodes={self.num_nodes}"]
        return " ".join(["gpudays sweep", *cell, *self.overrides])

    @property
    def layout(self) -> str:
        lay = self.estimate.layout
        return f"tp{lay.tensor} pp{lay.pipeline} dp{lay.data}"


def sweep_overrides(estimate: LayoutEstimate) -> tuple[str, ...]:
    """The method overrides that run ``estimate``'s layout with the mesh3d engine."""
    lay = estimate.layout
    out = ["method.engine=mesh3d", f"method.tp={lay.tensor}", f"method.pp={lay.pipeline}"]
    if lay.pipeline > 1:
        out.append(f"method.pp_microbatches={estimate.num_micro_batches}")
        if lay.pp_schedule != MethodConfig.pp_schedule:
            out.append(f"method.pp_schedule={lay.pp_schedule}")
        if lay.pp_chunks != MethodConfig.pp_chunks:
            out.append(f"method.pp_chunks={lay.pp_chunks}")
    out.append(f"method.micro_batch_size={lay.micro_batch_size}")
    if lay.activation_checkpointing:
        out.append("method.activation_checkpointing=true")
        if lay.selective:
            out.append("method.checkpoint_policy=selective")
    if lay.dp_replicate > 1:
        out.append(f"method.dp_replicate={lay.dp_replicate}")
    for key, on in (("tp_sequence_parallel", lay.sequence_parallel), ("tp_loss_parallel", lay.loss_parallel)):
        if on:
            out.append(f"method.{key}=true")
    return tuple(out)


def gpu_hours(step_time_s: float, train_steps: int, num_gpus: int) -> float:
    return step_time_s * train_steps * num_gpus / 3600.0


def offer(
    cell: Config, data_parallel_gpu_hours: float | None, data_parallel_cells: int = 1,
    efficiency: float = DEFAULT_EFFICIENCY,
) -> Offer | None:  # fmt: skip
    """The fastest mesh3d layout to offer for ``cell``'s model, GPUs and count (:func:`near_offers`' first)."""
    found = near_offers(cell, data_parallel_gpu_hours, data_parallel_cells, efficiency)
    return found[0] if found else None


def near_offers(
    cell: Config, data_parallel_gpu_hours: float | None, data_parallel_cells: int = 1,
    efficiency: float = DEFAULT_EFFICIENCY,
) -> list[Offer]:  # fmt: skip
    """The mesh3d layouts to offer for ``cell``'s model, GPUs and count: the fastest that fits, and up to
    :data:`MOST_OFFERED` in all of the other tensor × pipeline splits within :data:`NEAR` of its step time (each at
    its fastest micro-batch and checkpointing). Data parallelism alone is one of the splits: mesh3d's FSDP2 with
    HSDP or selective checkpointing may beat the plan's own data-parallel cells. None on a device with no peak,
    where no layout fits, or where one is no cheaper than ``data_parallel_gpu_hours``."""
    gpu, model = cell.gpu, cell.model
    if gpu.accelerator != "cuda" or not (gpu.peak_tflops_bf16 or gpu.peak_tflops_fp16):
        return []
    if model.family not in SPLIT_FAMILIES:  # an encoder, a vision model, a mixture of experts: mesh3d cannot run it
        return []
    network = network_for(gpu, cell.cluster)
    per_node = max(1, cell.num_gpus // max(cell.num_nodes, 1))
    if per_node < network.gpus_per_node:  # tensor parallelism stays inside the cell's nodes
        network = network.__class__(
            network.intra_node_gbytes_s, network.inter_node_gbytes_s_per_gpu, per_node, network.source
        )
    ranked = ranked_layouts(model, gpu, cell.num_gpus, model.global_batch_size, network, efficiency, engine="mesh3d")
    if not ranked:
        return []
    out: list[Offer] = []
    splits: set[tuple[int, int]] = set()
    for est in ranked:
        split = (est.layout.tensor, est.layout.pipeline)
        if split in splits:
            continue
        if len(out) == MOST_OFFERED or est.step_time_s > NEAR * ranked[0].step_time_s:
            break
        hours = gpu_hours(est.step_time_s, model.train_steps, cell.num_gpus)
        if data_parallel_gpu_hours is not None and hours >= data_parallel_gpu_hours:
            break
        splits.add(split)
        offered = Offer(model.name, gpu.name, cell.num_gpus, cell.num_nodes, est, hours, data_parallel_gpu_hours,
                        data_parallel_cells, sweep_overrides(est))  # fmt: skip
        out.append(offered)
    return out


def offers(cells: Iterable[tuple[Config, Mapping[str, object]]]) -> list[Offer]:
    """One offer per model × GPU type × GPU count × nodes of a plan's cells (their configs and predictions, empty
    for a refused cell), where data parallelism alone does not fit, cannot run, or is slower; in the plan's
    order."""
    groups: dict[tuple[str, str, int, int], list[tuple[Config, Mapping[str, object]]]] = {}
    for cfg, prediction in cells:
        groups.setdefault((cfg.model.name, cfg.gpu.name, cfg.num_gpus, cfg.num_nodes), []).append((cfg, prediction))
    out = []
    for members in groups.values():
        data_parallel = [p for c, p in members if c.method.engine in DATA_PARALLEL_ENGINES]
        fitting = [_hours(p) for p in data_parallel if p.get("predicted_fits") is True]
        best = min((h for h in fitting if h is not None), default=None)
        out.extend(near_offers(members[0][0], best, len(data_parallel)))
    return out


def _hours(prediction: Mapping[str, object]) -> float | None:
    value = prediction.get("predicted_gpu_hours")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(float(value)) else None


def offer_rows(found: Sequence[Offer]) -> list[Row]:
    """The offers as a table's rows."""
    return [
        {
            "model": o.model,
            "gpu": o.gpu,
            "num_gpus": o.num_gpus,
            "nodes": o.num_nodes,
            "layout": o.layout,
            "mb": o.estimate.layout.micro_batch_size,
            "mem_gib": o.estimate.memory_gib,
            "step_s": o.estimate.step_time_s,
            "bubble": o.estimate.bubble_fraction,
            "mfu": o.estimate.mfu,
            "gpu_h": o.gpu_hours,
            "dp_gpu_h": o.data_parallel_gpu_hours
            if o.data_parallel_gpu_hours is not None
            else ("none fits" if o.data_parallel_cells else "none planned"),
        }
        for o in found
    ]
