"""Data × tensor × pipeline layouts: each one a cell of the engine that runs it, predicted by the one predictor.

A layout of ``num_gpus`` GPUs (d data × t tensor × p pipeline, a micro-batch of b sequences, with or without
activation checkpointing) is the cell gpudays would run for it: mesh3d (FSDP2 over the replicas, tensor and
pipeline parallelism on a device mesh) where t > 1 or p > 1, DeepSpeed ZeRO-1 data parallelism otherwise, on
ceil(n / gpus_per_node) nodes of the network of :mod:`analysis.predict.network`. Its memory per GPU and step time
are :mod:`analysis.predict.predictor`'s for that cell, the figures ``gpudays plan`` gives it, so ``budget``,
``shortest``, the layouts a plan offers and ``plan`` cost the same cell alike. A pipeline runs all of a replica's
micro-batches in one schedule (m = B / (d·b), as Megatron-LM does) unless the layout says otherwise.

Every figure here is a prediction, never a measurement. The predictor is vectorised, so every candidate layout of
every GPU count a search looks at is predicted in one call (:func:`estimate_layouts`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd

from analysis.predict.calibration import Calibration, GpuCalibration
from analysis.predict.network import Network
from analysis.predict.predictor import prediction_detail
from analysis.predict.step_time import DEFAULT_EFFICIENCY, DEFAULT_OVERHEAD_S_PER_MICRO_STEP
from orchestrator.cells.row import method_column
from orchestrator.cells.row import row as cell_row
from orchestrator.config.schema import ClusterConfig, Config, GpuConfig, MethodConfig, ModelConfig
from orchestrator.config.values import Row
from orchestrator.engines.mesh3d.pipeline import INTERLEAVED, ZERO_BUBBLE_SHARE, bubble_share
from orchestrator.models import flops_per_token

PREDICTOR = (
    "step-time model (analysis/predict/predictor.py: each layout predicted as the cell that runs it, "
    "mesh3d for tensor or pipeline parallelism, DeepSpeed ZeRO-1 otherwise, as `gpudays plan` predicts it)"
)
"""What ``budget`` and ``shortest`` predict with, named beside their figures: ``plan``'s model."""

MICRO_BATCH_CHOICES = (1, 2, 4, 8, 16)
DATA_PARALLEL_ZERO_STAGE = 1
"""The data-parallel cell of a layout without model parallelism: DeepSpeed ZeRO-1 (optimizer states sharded over
the replicas, as Megatron-LM's distributed optimizer)."""


@dataclass(frozen=True)
class Layout:
    """How ``num_gpus`` GPUs split the work: data × tensor × pipeline, and the micro-batch each runs."""

    data: int
    tensor: int
    pipeline: int
    micro_batch_size: int = 1
    activation_checkpointing: bool = False
    schedule_micro_batches: int = 0
    """Micro-batches one pipeline schedule runs (mesh3d's ``pp_microbatches``); 0: all of a replica's step in
    one schedule, as Megatron-LM runs it. A step of more runs several schedules, each with its bubble."""
    stages_per_rank: int = 1
    """Virtual stages a rank holds: ``v`` under an interleaved schedule (mesh3d's ``pp_chunks``), whose bubble is
    1/v of 1F1B's."""
    schedule: str = ""
    """mesh3d's ``pp_schedule``; empty: ``1f1b`` with one stage a rank, ``interleaved_1f1b`` with more."""
    engine: str = "auto"
    """The engine whose cell it is: ``auto`` (mesh3d with tensor or pipeline parallelism, DeepSpeed ZeRO-1
    without) or ``mesh3d`` (every layout, data parallelism alone as FSDP2)."""
    loss_parallel: bool = False
    """mesh3d's ``tp_loss_parallel``: the vocabulary matrices and the logits split over the tensor ranks."""
    sequence_parallel: bool = False
    """mesh3d's ``tp_sequence_parallel``: every activation of a layer split over the tensor ranks."""
    checkpoint_policy: str = "full"
    """mesh3d's ``checkpoint_policy`` with ``activation_checkpointing``: ``full`` reruns each layer, ``selective``
    all but its matrix products and attention."""
    dp_replicate: int = 1
    """mesh3d's ``dp_replicate``: HSDP, FSDP2 sharding inside ``data / dp_replicate`` replicas, replicating across
    ``dp_replicate`` groups; 1: every replica shards."""

    @property
    def num_gpus(self) -> int:
        return self.data * self.tensor * self.pipeline

    @property
    def cell_engine(self) -> str:
        """The engine of the cell that runs it."""
        if self.engine == "mesh3d" or self.tensor > 1 or self.pipeline > 1:
            return "mesh3d"
        return "deepspeed"

    @property
    def pp_schedule(self) -> str:
        """The schedule of the cell that runs it."""
        return self.schedule or ("1f1b" if self.stages_per_rank == 1 else "interleaved_1f1b")

    @property
    def pp_chunks(self) -> int:
        """mesh3d's ``pp_chunks`` of that cell: its stages a rank under an interleaved schedule, else the default."""
        return self.stages_per_rank if self.pp_schedule in INTERLEAVED else MethodConfig.pp_chunks

    @property
    def selective(self) -> bool:
        """Checkpointing that reruns no matrix product (``checkpoint_policy=selective``)."""
        return self.activation_checkpointing and self.checkpoint_policy == "selective"

    def describe(self) -> str:
        """``dp16 tp8 pp8 v2 zb mb1 ckpt:sel hsdp2``: the sizes, the stages a rank and a zero-bubble schedule, the
        micro-batch, checkpointing (``ckpt`` full, ``ckpt:sel`` selective), HSDP groups and ``sp`` (sequence and
        loss parallelism)."""
        parts = [f"dp{self.data} tp{self.tensor} pp{self.pipeline}"]
        if self.pipeline > 1 and self.pp_schedule in INTERLEAVED:
            parts.append(f"v{self.stages_per_rank}")
        if self.pipeline > 1 and self.pp_schedule in ZERO_BUBBLE_SHARE:
            parts.append("zb")
        parts.append(f"mb{self.micro_batch_size}")
        if self.activation_checkpointing:
            parts.append("ckpt:sel" if self.selective else "ckpt")
        if self.dp_replicate > 1:
            parts.append(f"hsdp{self.dp_replicate}")
        if self.sequence_parallel:
            parts.append("sp")
        return " ".join(parts)


@dataclass(frozen=True)
class LayoutEstimate:
    """The predictor's memory per GPU (GiB) and step time (s) of one layout's cell."""

    layout: Layout
    global_batch_size: int
    """Sequences per optimizer step over all GPUs."""
    num_micro_batches: int
    """Micro-batches per replica per step (m)."""
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    memory_gib: float
    """The reserved peak per GPU (the predictor's ``peak_memory_gib``)."""
    usable_memory_gib: float
    build_memory_gib: float
    """Per GPU while the model is built; it must fit too."""
    fits: bool
    """Both the step and the build fit (the predictor's verdict)."""
    bubble_fraction: float
    compute_s: float
    """The step's compute at the efficiency (recomputation included), stretched by a pipeline's bubble and slowest
    stage."""
    communication_s: float
    """The engine's communication of the step (the pipeline's bubble and imbalance are in ``compute_s``)."""
    overhead_s: float
    """The fixed cost of the step's micro-steps."""
    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    cell: Row
    """The cell's row as the predictor read it (``gpudays plan`` of the same row gives the same figures)."""


def layout_cell(model: ModelConfig, gpu: GpuConfig, layout: Layout, global_batch_size: int, network: Network) -> Config:
    """The cell that runs ``layout``: the engine of :attr:`Layout.cell_engine`, the model at ``global_batch_size``,
    on ``ceil(n / gpus_per_node)`` nodes of ``network``."""
    d, b, p = layout.data, layout.micro_batch_size, layout.pipeline
    m = global_batch_size // (d * b) if d * b else 0
    mesh3d = layout.cell_engine == "mesh3d"
    method = MethodConfig(
        engine=layout.cell_engine,
        zero_stage=0 if mesh3d else DATA_PARALLEL_ZERO_STAGE,
        precision="bf16" if gpu.peak_tflops_bf16 or not gpu.peak_tflops_fp16 else "fp16",
        micro_batch_size=b,
        activation_checkpointing=layout.activation_checkpointing,
        tp=layout.tensor,
        pp=p,
        pp_microbatches=(layout.schedule_micro_batches or max(m, 1)) if p > 1 else MethodConfig.pp_microbatches,
        pp_schedule=layout.pp_schedule,
        pp_chunks=layout.pp_chunks,
        tp_loss_parallel=layout.loss_parallel,
        tp_sequence_parallel=layout.sequence_parallel,
        checkpoint_policy=layout.checkpoint_policy if layout.activation_checkpointing else "full",
        dp_replicate=layout.dp_replicate,
    )
    per_node = network.gpus_per_node
    cluster = ClusterConfig(
        gpus_per_node=per_node, inter_node_gbits_s=network.inter_node_gbytes_s_per_gpu * 8 * per_node
    )
    return Config(
        model=with_batch(model, global_batch_size),
        gpu=gpu,
        method=method,
        cluster=cluster,
        num_gpus=layout.num_gpus,
        num_nodes=max(1, math.ceil(layout.num_gpus / per_node)),
    )


def efficiency_calibration(gpu: GpuConfig, efficiency: float) -> Calibration | None:
    """The predictor's coefficients at ``efficiency`` of the peak (None at the uncalibrated default)."""
    if efficiency == DEFAULT_EFFICIENCY:
        return None
    gcal = GpuCalibration(efficiency=efficiency, overhead_s_per_micro_step=DEFAULT_OVERHEAD_S_PER_MICRO_STEP)
    return Calibration({gpu.name: gcal})


def estimate_layouts(
    model: ModelConfig,
    gpu: GpuConfig,
    layouts: Sequence[Layout],
    global_batch_size: int,
    network: Network,
    efficiency: float = DEFAULT_EFFICIENCY,
) -> list[LayoutEstimate]:
    """:func:`estimate_layout` of every layout, in one call of the predictor."""
    peak = gpu.peak_tflops_bf16 or gpu.peak_tflops_fp16
    if not peak:
        raise ValueError(f"GPU {gpu.name!r} has no bf16 or fp16 peak in conf/gpu; nothing to estimate from")
    for layout in layouts:
        if global_batch_size % (layout.data * layout.micro_batch_size):
            raise ValueError(
                f"{layout.describe()}: {global_batch_size} sequences do not split into {layout.data} x micro-batch "
                f"{layout.micro_batch_size}"
            )
    if not layouts:
        return []
    rows = _rows(model, gpu, layouts, global_batch_size, network)
    p = prediction_detail(pd.DataFrame(rows), efficiency_calibration(gpu, efficiency))
    tokens = global_batch_size * model.seq_length
    model_flops = tokens * flops_per_token(model)
    out = []
    for i, layout in enumerate(layouts):
        step = float(p["step_time_s"][i])
        comp, comm, offl = (float(p[k][i]) for k in ("compute_s", "communication_s", "offload_s"))
        m = global_batch_size // (layout.data * layout.micro_batch_size)
        k = (layout.schedule_micro_batches or m) if layout.pipeline > 1 else 1
        n = layout.num_gpus
        out.append(
            LayoutEstimate(
                layout=layout, global_batch_size=global_batch_size, num_micro_batches=m,
                params_gib=float(p["params_gib"][i]), grads_gib=float(p["grads_gib"][i]),
                optimizer_gib=float(p["optimizer_gib"][i] + p["buffers_gib"][i]),
                activations_gib=float(p["activations_gib"][i]), memory_gib=float(p["peak_memory_gib"][i]),
                usable_memory_gib=float(p["usable_memory_gib"][i]), build_memory_gib=float(p["build_peak_gib"][i]),
                fits=bool(p["fits"][i]),
                bubble_fraction=bubble_share(layout.pipeline, k, layout.pp_chunks, layout.pp_schedule),
                compute_s=comp, communication_s=comm + offl, overhead_s=step - comp - comm - offl,
                step_time_s=step, tokens_per_s_per_gpu=tokens / step / n,
                model_tflops_per_gpu=model_flops / step / n / 1e12, mfu=model_flops / step / n / 1e12 / peak,
                cell=rows[i],
            )
        )  # fmt: skip
    return out


def estimate_layout(
    model: ModelConfig,
    gpu: GpuConfig,
    layout: Layout,
    global_batch_size: int,
    network: Network,
    efficiency: float = DEFAULT_EFFICIENCY,
) -> LayoutEstimate:
    """Memory per GPU and step time of ``layout`` at ``global_batch_size`` sequences: the predictor's for the cell
    that runs it (:func:`layout_cell`).

    Raises ValueError for a layout that cannot run this batch (the data-parallel size times the micro-batch must
    divide it) or a GPU without a bf16/fp16 peak.
    """
    return estimate_layouts(model, gpu, [layout], global_batch_size, network, efficiency)[0]


def _rows(
    model: ModelConfig, gpu: GpuConfig, layouts: Sequence[Layout], global_batch_size: int, network: Network
) -> list[Row]:
    """Each layout's cell as a row, the model's and GPU's columns built once and the layout's set on a copy."""
    base: dict[tuple[str, int, int], Row] = {}
    out = []
    for layout in layouts:
        cfg = layout_cell(model, gpu, layout, global_batch_size, network)
        key = (layout.cell_engine, min(layout.tensor, 2), min(layout.pipeline, 2))
        if key not in base:
            base[key] = cell_row(cfg)
        row = dict(base[key])
        row.update(_varying(cfg))
        out.append(row)
    return out


_VARYING = ("micro_batch_size", "activation_checkpointing", "tp", "pp", "pp_microbatches", "pp_schedule",
            "pp_chunks", "tp_loss_parallel", "tp_sequence_parallel", "checkpoint_policy", "dp_replicate")  # fmt: skip


def _varying(cfg: Config) -> Row:
    """The columns that differ between the layouts of one model and GPU."""
    m = cfg.method
    out: Row = {"num_gpus": cfg.num_gpus, "num_nodes": cfg.num_nodes, "micro_batch_size_setting": m.micro_batch_size}
    for key in _VARYING[1:]:
        out[method_column(key)] = getattr(m, key)
    return out


def with_batch(model: ModelConfig, global_batch_size: int) -> ModelConfig:
    """``model`` trained at another global batch (sequences); ``model`` itself where it already is (a search
    builds thousands of cells of one model)."""
    if model.global_batch_size == global_batch_size:
        return model
    return replace(model, global_batch_size=int(global_batch_size))
