"""The layout search: which data × tensor × pipeline layouts of a GPU count ``budget``, ``shortest`` and the
layouts a plan offers try, in which large-run settings of the mesh3d engine, and the fastest that fits.

Every candidate is a cell the engine's own validation accepts (:func:`accepted`); each is predicted as that cell
(:mod:`analysis.predict.parallelism`). The settings: the pipeline schedule (``1f1b``, ``interleaved_1f1b`` and
``interleaved_zb`` with 2 or 4 stages a rank), checkpointing (none, full, selective), HSDP over the nodes a stage's
replicas span, sequence with loss parallelism. The search is pruned in two rounds (:func:`best_by_count`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np

from analysis.predict.network import Network
from analysis.predict.parallelism import (
    MICRO_BATCH_CHOICES,
    Layout,
    LayoutEstimate,
    estimate_layouts,
    layout_cell,
    with_batch,
)
from analysis.predict.step_time import DEFAULT_EFFICIENCY
from orchestrator.config.schema import GpuConfig, ModelConfig
from orchestrator.engines.mesh3d.config import SPLIT_FAMILIES, TP_PLANS
from orchestrator.engines.registry import check_batch, check_engine_options


def candidate_layouts(
    model: ModelConfig, num_gpus: int, global_batch_size: int, gpus_per_node: int, engine: str = "auto",
    gpu: GpuConfig | None = None, settings: bool = True,
) -> list[Layout]:  # fmt: skip
    """Every layout of ``num_gpus`` that can run the batch, each a cell the engine's own validation accepts
    (:func:`accepted`): tensor parallel inside a node and dividing the heads (and the key/value heads) on a family
    mesh3d splits by tensor (``TP_PLANS``), pipeline stages of at least one layer each on a family it builds
    (``SPLIT_FAMILIES``), at least one sequence per data-parallel replica; with ``settings``, each also in every
    large-run setting of :func:`variants`, else with and without full checkpointing under the default schedule."""
    return [
        lay
        for d, t, p in splits(model, num_gpus, global_batch_size, gpus_per_node)
        for b in MICRO_BATCH_CHOICES
        if (global_batch_size // d) % b == 0
        for lay in variants(Layout(d, t, p, b, engine=engine), gpus_per_node, settings)
        if accepted(model, lay, global_batch_size, gpus_per_node, gpu)
    ]


def splits(model: ModelConfig, num_gpus: int, global_batch_size: int, gpus_per_node: int) -> list[tuple[int, int, int]]:
    """The data × tensor × pipeline sizes ``(d, t, p)`` of ``num_gpus`` worth trying: t a power of two inside a
    node dividing the heads, p at most the layers, d dividing the batch."""
    out = []
    kv_heads = model.num_kv_heads or model.num_heads
    for t in (1, 2, 4, 8, 16):
        if t > gpus_per_node or model.num_heads % t or kv_heads % t or num_gpus % t:
            continue
        if t > 1 and model.family not in TP_PLANS:
            continue
        for p in range(1, model.num_layers + 1):
            if num_gpus % (t * p) or (p > 1 and model.family not in SPLIT_FAMILIES):
                continue
            if global_batch_size % (num_gpus // (t * p)) == 0:
                out.append((num_gpus // (t * p), t, p))
    return out


PIPELINE_SCHEDULES = (("", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4), ("interleaved_zb", 2),
                      ("interleaved_zb", 4))  # fmt: skip
"""The schedules (mesh3d's ``pp_schedule``, empty for its default) and stages a rank a pipelined layout tries."""
CHECKPOINTING = ((False, "full"), (True, "full"), (True, "selective"))
"""Activation checkpointing (and its policy) a layout tries: none, full, selective (mesh3d cells only)."""


def variants(layout: Layout, gpus_per_node: int, settings: bool = True) -> list[Layout]:
    """``layout`` under each setting a run of its sizes may use, not yet validated: checkpointing none or full;
    with ``settings`` also selective on a mesh3d cell, every schedule of :data:`PIPELINE_SCHEDULES` with a
    pipeline, HSDP over the nodes a stage's replicas span where they span several (each group the replicas of one
    node), and sequence with loss parallelism for tensor parallelism without a pipeline."""
    d, t, p = layout.data, layout.tensor, layout.pipeline
    mesh3d = layout.cell_engine == "mesh3d"
    schedules = PIPELINE_SCHEDULES if settings and p > 1 else PIPELINE_SCHEDULES[:1]
    ckpts = CHECKPOINTING if settings and mesh3d else CHECKPOINTING[:2]
    nodes = d * t // gpus_per_node if d * t > gpus_per_node and (d * t) % gpus_per_node == 0 else 1
    groups = (1, nodes) if settings and mesh3d and nodes > 1 else (1,)
    split_seq = (False, True) if settings and t > 1 and p == 1 else (False,)
    return [
        replace(
            layout,
            schedule=sched,
            stages_per_rank=v,
            activation_checkpointing=ckpt,
            checkpoint_policy=policy,
            dp_replicate=r,
            sequence_parallel=sp,
            loss_parallel=sp,
        )  # fmt: skip
        for sched, v in schedules
        for ckpt, policy in ckpts
        for r in groups
        for sp in split_seq
    ]


_ANY_BF16_GPU = GpuConfig(name="any-bf16", architecture="hopper", memory_gib=80.0, peak_tflops_bf16=1.0)
"""The GPU :func:`accepted` judges a layout on when none is named: the engines refuse nothing of a bf16 GPU."""


def accepted(
    model: ModelConfig, layout: Layout, global_batch_size: int, gpus_per_node: int, gpu: GpuConfig | None = None
) -> bool:
    """Whether the engine runs ``layout``'s cell: its own option and batch checks
    (``orchestrator.engines.registry``) refuse nothing of it."""
    network = Network(1.0, 1.0, gpus_per_node, "layout validation")
    cell = layout_cell(model, gpu or _ANY_BF16_GPU, layout, global_batch_size, network)
    return not check_engine_options(cell) and not check_batch(cell)


REFINED_SPLITS = 3
"""Tensor × pipeline splits of each GPU count whose large-run settings :func:`best_by_count` tries: the fastest."""


def best_by_count(
    model: ModelConfig,
    gpu: GpuConfig,
    counts: Iterable[int],
    global_batch_size: int,
    network: Network,
    efficiency: float = DEFAULT_EFFICIENCY,
    data_parallel_only: bool = False,
    engine: str = "auto",
    refine: bool = True,
) -> dict[int, list[LayoutEstimate]]:
    """Every fitting layout found of each GPU count, the fastest first (ties to less model parallelism), in three
    calls of the predictor:

    1. every split at every micro-batch, with and without full checkpointing, under the default schedule
       (:func:`candidate_layouts` without ``settings``);
    2. where ``refine``, the fastest layout of each of the :data:`REFINED_SPLITS` fastest splits of each count in
       every schedule, HSDP grouping and sequence parallelism (:func:`settings_of`); of every other split, its
       fastest with and its fastest without checkpointing, in HSDP, sequence parallelism and selective
       checkpointing only (which may lift a split that plain FSDP held back);
    3. the fastest layout of each of the ``2 ×`` :data:`REFINED_SPLITS` fastest splits now, at half, the same and
       twice its micro-batch with each checkpointing (:func:`batch_and_checkpointing`).

    The settings change a split's bubble, communication and memory by less than the splits differ, and a
    micro-batch further off lost by more than a setting wins; predicting every layout of :func:`candidate_layouts`
    would take several times as long (about 5 times the cells for Llama 2 70B on 1,024 A100s)."""
    counts, per_node, model = list(counts), network.gpus_per_node, with_batch(model, global_batch_size)
    found: dict[int, list[LayoutEstimate]] = {n: [] for n in counts}
    seen: set[Layout] = set()

    def predict(layouts: Iterable[Layout], checked: bool = False) -> None:
        """Predict the layouts not yet predicted; ``checked``: the engine accepted them already (:func:`accepted`)."""
        fresh = [lay for lay in dict.fromkeys(layouts) if lay not in seen]
        seen.update(fresh)
        if not checked:
            fresh = [lay for lay in fresh if accepted(model, lay, global_batch_size, per_node, gpu)]
        for est in estimate_layouts(model, gpu, fresh, global_batch_size, network, efficiency):
            if est.fits and np.isfinite(est.step_time_s):
                found[est.layout.num_gpus].append(est)

    predict(
        [
            lay
            for n in counts
            for lay in candidate_layouts(model, n, global_batch_size, per_node, engine, gpu, settings=False)
            if not (data_parallel_only and (lay.tensor > 1 or lay.pipeline > 1))
        ],
        checked=True,
    )
    if refine:
        predict(
            lay
            for n in counts
            for lead, every in _leading(found[n])
            for lay in settings_of(lead, per_node, schedules=every)
        )
        predict(
            lay
            for n in counts
            for lead, every in _leading(found[n], 2 * REFINED_SPLITS)
            if every
            for lay in batch_and_checkpointing(lead, global_batch_size)
        )
    return {n: sorted(f, key=lambda e: (e.step_time_s, e.layout.tensor * e.layout.pipeline)) for n, f in found.items()}


def _leading(estimates: Sequence[LayoutEstimate], limit: int = REFINED_SPLITS) -> list[tuple[Layout, bool]]:
    """The fastest layout of each split of ``estimates`` (one count's) with whether the split is of the ``limit``
    fastest, and of the other splits also their fastest with the other checkpointing (a
    split whose fastest recomputes may lose that need with HSDP's or sequence parallelism's share of memory)."""
    splits: dict[tuple[int, int, int], Layout] = {}
    others: dict[tuple[int, int, int, bool], Layout] = {}
    for est in sorted(estimates, key=lambda e: e.step_time_s):
        lay = est.layout
        splits.setdefault((lay.data, lay.tensor, lay.pipeline), lay)
        others.setdefault((lay.data, lay.tensor, lay.pipeline, lay.activation_checkpointing), lay)
    lead = list(splits.values())[:limit]
    return [(lay, True) for lay in lead] + [(lay, False) for lay in others.values() if lay not in lead]


def settings_of(layout: Layout, gpus_per_node: int, schedules: bool = True) -> list[Layout]:
    """``layout`` at its micro-batch in every HSDP grouping and sequence parallelism of :func:`variants` and,
    with ``schedules``, every schedule; at its checkpointing and, where it checkpoints, selective checkpointing
    too."""
    ckpt = {(layout.activation_checkpointing, layout.checkpoint_policy)}
    if layout.activation_checkpointing:
        ckpt.add((True, "selective"))
    return [
        lay
        for lay in variants(layout, gpus_per_node)
        if (lay.activation_checkpointing, lay.checkpoint_policy) in ckpt
        and (schedules or (lay.pp_schedule, lay.stages_per_rank) == (layout.pp_schedule, layout.stages_per_rank))
    ]


def batch_and_checkpointing(layout: Layout, global_batch_size: int) -> list[Layout]:
    """``layout`` at half, the same and twice its micro-batch (of :data:`MICRO_BATCH_CHOICES`, dividing a
    replica's sequences), each with every checkpointing of :data:`CHECKPOINTING` its engine runs."""
    ckpts = CHECKPOINTING if layout.cell_engine == "mesh3d" else CHECKPOINTING[:2]
    share = global_batch_size // layout.data
    return [
        replace(layout, micro_batch_size=b, activation_checkpointing=ckpt, checkpoint_policy=policy)
        for b in (layout.micro_batch_size // 2, layout.micro_batch_size, 2 * layout.micro_batch_size)
        if b in MICRO_BATCH_CHOICES and share % b == 0
        for ckpt, policy in ckpts
    ]


def ranked_layouts(
    model: ModelConfig,
    gpu: GpuConfig,
    num_gpus: int,
    global_batch_size: int,
    network: Network,
    efficiency: float = DEFAULT_EFFICIENCY,
    data_parallel_only: bool = False,
    engine: str = "auto",
) -> list[LayoutEstimate]:
    """Every layout of ``num_gpus`` that fits in memory, the fastest first; ties go to the layout with less model
    parallelism. ``data_parallel_only`` keeps t = p = 1; ``engine`` is :attr:`Layout.engine`."""
    args = (global_batch_size, network, efficiency, data_parallel_only, engine)
    return best_by_count(model, gpu, [num_gpus], *args)[num_gpus]


def best_layout(
    model: ModelConfig,
    gpu: GpuConfig,
    num_gpus: int,
    global_batch_size: int,
    network: Network,
    efficiency: float = DEFAULT_EFFICIENCY,
    data_parallel_only: bool = False,
    engine: str = "auto",
) -> LayoutEstimate | None:
    """The fastest layout of ``num_gpus`` that fits in memory (:func:`ranked_layouts`' first); None when none fits
    or none can run the batch."""
    ranked = ranked_layouts(model, gpu, num_gpus, global_batch_size, network, efficiency, data_parallel_only, engine)
    return ranked[0] if ranked else None


def powers_of_two(start: int, limit: int) -> list[int]:
    """``start``, 2·``start``, ... up to ``limit``."""
    out, n = [], max(start, 1)
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def min_gpus_to_fit(
    model: ModelConfig,
    gpu: GpuConfig,
    global_batch_size: int,
    network: Network,
    max_gpus: int = 1 << 16,
) -> int | None:
    """The fewest GPUs (a power of two) on which some layout fits; None up to ``max_gpus``. Of the first round of
    :func:`best_by_count` only: full checkpointing under 1F1B keeps the least memory but for sequence parallelism
    (selective checkpointing keeps more, interleaving and HSDP more), so a count where only a sequence-parallel
    layout fits is passed over."""
    n = 1
    while n <= max_gpus:  # a handful of counts at a time: most models fit on few GPUs
        counts = powers_of_two(n, min(max_gpus, n * 16))
        found = best_by_count(model, gpu, counts, global_batch_size, network, refine=False)
        fitting = [c for c in counts if found[c]]
        if fitting:
            return fitting[0]
        n = counts[-1] * 2
    return None
