"""Analytic data × tensor × pipeline layouts (Megatron-style): memory per GPU, step time, and the best layout.

Every figure here is a prediction from formulas, never a measurement. Notation: Ψ parameters, L layers, h hidden
size, V vocabulary, s sequence length, b micro-batch (sequences), m micro-batches per pipeline per step, and the
layout d (data) × t (tensor) × p (pipeline) GPUs.

Memory per GPU (bytes):
- model states of the GPU's share Ψ_gpu = Ψ_stage / t, where the largest stage holds its layers and one embedding
  matrix (both when p = 1), the layers split over the stages balanced by cost, the end stages' embedding and output
  layer weighed on them (``orchestrator.engines.mesh3d.config.stage_sizes``: the stages need not divide the layers): 2Ψ_gpu parameters + 2Ψ_gpu gradients + 12Ψ_gpu/d optimizer states (ZeRO-1 over data
  parallelism; Rajbhandari et al. 2020, via :func:`orchestrator.engines.deepspeed.memory.model_state_bytes`);
- activations with tensor-sequence parallelism and fused attention (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", §4: ``34·s·b·h/t`` a layer; the ``5·a·s²·b`` scores are
  not kept by flash/SDPA attention); with full recomputation ``2·s·b·h/t`` a layer plus one layer being rerun.
  Under 1F1B stage i holds min(p − i, m) micro-batches of its layers in flight (Narayanan et al. 2021, "Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"), the last one micro-batch plus its
  logits (12 bytes per token and vocabulary entry, split by t).

Step time under 1F1B: (m + p − 1) × (compute + tensor-parallel + pipeline-send time of one micro-batch on the
slowest stage, which sets the pace: the mean stage's compute times ``pipeline_imbalance``) + the data-parallel gradient reduction; the bubble is (p − 1)/(m + p − 1) of the step (Narayanan et al.
2021). Tensor parallelism (kept inside a node) all-reduces the ``2·s·b·h`` bytes of a layer's activations
twice forward and twice backward (Shoeybi et al. 2019, fig. 4; sequence parallelism replaces each by a
reduce-scatter and an all-gather of the same volume), three times forward with recomputation; ring all-reduce moves
2(n − 1)/n of the bytes per GPU. ZeRO-1's reduce-scatter plus all-gather of the 16-bit gradients and parameters
moves what one all-reduce does. Tensor-parallel and pipeline communication is counted as not overlapped with
compute (an upper bound on time); the gradient reduction overlaps the last micro-batch's backward pass only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from analysis.predict.network import LINK_EFFICIENCY, Network
from analysis.predict.step_time import DEFAULT_EFFICIENCY
from orchestrator.config.schema import GpuConfig, ModelConfig
from orchestrator.engines.deepspeed.memory import model_state_bytes
from orchestrator.engines.memory import GIB
from orchestrator.engines.mesh3d import config as mesh3d_config
from orchestrator.engines.mesh3d.config import TP_PLANS, end_weight
from orchestrator.engines.mesh3d.memory import build_bytes as mesh3d_build_bytes
from orchestrator.engines.mesh3d.memory import memory_terms as mesh3d_memory_terms
from orchestrator.engines.mesh3d.memory import rank_parameters, tensor_activation_share
from orchestrator.models import flops_per_token, language_family, num_parameters

PREDICTOR = (
    "layout model (analysis/predict/parallelism.py: data x tensor x pipeline layouts at an assumed share of the peak)"
)
"""What ``budget`` and ``shortest`` predict with, named beside their figures: ``plan`` predicts a cell with another
model (:data:`analysis.predict.predictor.PREDICTOR`), so the GPU-hours of the two differ for the same model and GPUs."""

# DEFAULT_EFFICIENCY, the achieved share of the dense bf16 peak in the matrix products when nothing is measured,
# is the predictor's uncalibrated figure (set by the H100 records); Megatron-LM reached 44-52% on A100s for
# 18B-1T models (Narayanan et al. 2021) and BLOOM-176B about 48% (150 of 312 TFLOP/s, BigScience 2022).
MEMORY_MARGIN = 0.10
"""Share of GPU memory kept free for the CUDA context, NCCL and fragmentation (as ``analysis.predict.predictor``)."""
INTRA_NODE_LATENCY_S = 10e-6
"""Fixed cost of one collective inside a node (order of nccl-tests' small-message latency over NVLink)."""
INTER_NODE_LATENCY_S = 25e-6
"""Fixed cost of one collective or send across nodes (order of nccl-tests' small-message latency over InfiniBand)."""
MICRO_BATCH_CHOICES = (1, 2, 4, 8, 16)


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
    """Virtual stages a rank holds: 2 under interleaved 1F1B, whose bubble is 1/v of 1F1B's."""
    engine: str = "megatron"
    """Whose data parallelism and activations: ``megatron`` (ZeRO-1 over the replicas, sequence parallelism with
    tensor parallelism) or ``mesh3d`` (gpudays' engine: FSDP2 over the replicas, no sequence parallelism; its
    model states as ``orchestrator/engines/mesh3d/memory.py`` counts them)."""
    loss_parallel: bool = False
    """mesh3d's ``tp_loss_parallel``: the vocabulary matrices and the logits split over the tensor ranks, as
    Megatron-LM always splits them."""
    sequence_parallel: bool = False
    """mesh3d's ``tp_sequence_parallel``: every activation of a layer split over the tensor ranks (Megatron's
    always are), and the vocabulary matrices too."""

    @property
    def num_gpus(self) -> int:
        return self.data * self.tensor * self.pipeline

    def describe(self) -> str:
        ckpt = " ckpt" if self.activation_checkpointing else ""
        return f"dp{self.data} tp{self.tensor} pp{self.pipeline} mb{self.micro_batch_size}{ckpt}"


@dataclass(frozen=True)
class LayoutEstimate:
    """Predicted memory per GPU (GiB) and step time (s) of one layout; every figure analytic."""

    layout: Layout
    global_batch_size: int
    """Sequences per optimizer step over all GPUs."""
    num_micro_batches: int
    """Micro-batches per pipeline per step (m)."""
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    memory_gib: float
    usable_memory_gib: float
    bubble_fraction: float
    compute_s: float
    tensor_comm_s: float
    pipeline_comm_s: float
    data_comm_s: float
    exposed_data_comm_s: float
    """The part of the gradient reduction not hidden behind the last backward pass."""
    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float

    build_memory_gib: float = 0.0
    """Per GPU while the model is built (mesh3d: its shards and one layer whole; 0 where not modelled)."""

    @property
    def fits(self) -> bool:
        """Both the step and the build fit."""
        return max(self.memory_gib, self.build_memory_gib) <= self.usable_memory_gib


@lru_cache(maxsize=65536)
def stage_sizes(num_layers: int, num_stages: int, weight: float) -> tuple[int, ...]:
    """The engine's split (:func:`orchestrator.engines.mesh3d.config.stage_sizes`), kept per model and pipeline: a
    planner weighs thousands of layouts of a few dozen models, and each split searches every pair of end sizes."""
    return tuple(mesh3d_config.stage_sizes(num_layers, num_stages, weight))


@lru_cache(maxsize=65536)
def pipeline_imbalance(num_layers: int, num_stages: int, weight: float) -> float:
    """The engine's :func:`orchestrator.engines.mesh3d.config.pipeline_imbalance`, kept as :func:`stage_sizes` is."""
    return mesh3d_config.pipeline_imbalance(num_layers, num_stages, weight)


def stage_parameters(model: ModelConfig, pipeline: int) -> float:
    """Parameters of the largest pipeline stage: its layers and, on an end stage, one embedding matrix (all of them
    when p = 1), the layers split as :func:`stage_sizes` balances them."""
    total = float(num_parameters(model))
    embedding = float(model.vocab_size * model.hidden_size)
    if pipeline == 1:
        return total
    per_layer = (total - 2.0 * embedding) / model.num_layers
    sizes = stage_sizes(model.num_layers, pipeline, end_weight(model))
    return max(n * per_layer + (embedding if i in (0, pipeline - 1) else 0.0) for i, n in enumerate(sizes))


def activation_bytes_per_gpu(model: ModelConfig, layout: Layout, num_micro_batches: int) -> float:
    """Activations the busiest stage keeps for the backward pass (Korthikanti et al. 2022, with sequence parallel).

    A layer's bytes per token and the logits' come from the model's family (measured on the real module); tensor
    parallelism with sequence parallelism splits both over the ``t`` ranks.
    """
    s, t, b = model.seq_length, layout.tensor, layout.micro_batch_size
    family = language_family(model, "the tensor/pipeline-parallel layouts")
    sizes = stage_sizes(model.num_layers, layout.pipeline, end_weight(model))
    split = tensor_share(t, sequence_parallel=layout.engine == "megatron" or layout.sequence_parallel)
    full_layer = family.activation_bytes_per_token_per_layer(model, "sdpa", False) * s * b * split
    if layout.activation_checkpointing:
        per_layer = family.activation_bytes_per_token_per_layer(model, "sdpa", True) * s * b / t
        working = full_layer
    else:
        per_layer = full_layer
        working = 0.0
    # mesh3d keeps the output layer whole on every tensor rank unless it splits the vocabulary (loss_parallel).
    logits = (
        family.logit_bytes_per_token(model) * s * b / (t if layout.engine == "megatron" or layout.loss_parallel else 1)
    )
    if layout.pipeline == 1:
        return sizes[0] * per_layer + working + logits
    p = layout.pipeline
    held = max(n * per_layer * min(p - i, num_micro_batches) for i, n in enumerate(sizes[:-1]))
    last = sizes[-1] * per_layer + logits
    return max(held, last) + working


def tensor_share(tensor: int, sequence_parallel: bool) -> float:
    """A tensor rank's share of one layer's activations: all of them split with sequence parallelism; without it
    the norms' and the residual's stay whole (:func:`orchestrator.engines.mesh3d.memory.tensor_activation_share`)."""
    return 1.0 / tensor if sequence_parallel else float(tensor_activation_share(tensor))


def _ring_allreduce_s(num_bytes: float, group: int, gbytes_s: float, latency_s: float) -> float:
    if group <= 1:
        return 0.0
    return 2.0 * (group - 1) / group * num_bytes / (gbytes_s * 1e9 * LINK_EFFICIENCY) + latency_s


def estimate_layout(
    model: ModelConfig,
    gpu: GpuConfig,
    layout: Layout,
    global_batch_size: int,
    network: Network,
    efficiency: float = DEFAULT_EFFICIENCY,
) -> LayoutEstimate:
    """Memory per GPU and 1F1B step time of ``layout`` at ``global_batch_size`` sequences (see the module doc).

    Raises ValueError for a layout that cannot run this batch (the data-parallel size must divide it, the
    micro-batch the per-replica batch) or a GPU without a bf16/fp16 peak.
    """
    d, t, p, b = layout.data, layout.tensor, layout.pipeline, layout.micro_batch_size
    if global_batch_size % (d * b):
        raise ValueError(f"{layout.describe()}: {global_batch_size} sequences do not split into {d} x micro-batch {b}")
    peak = gpu.peak_tflops_bf16 or gpu.peak_tflops_fp16
    if not peak:
        raise ValueError(f"GPU {gpu.name!r} has no bf16 or fp16 peak in conf/gpu; nothing to estimate from")
    m = global_batch_size // (d * b)
    k = layout.schedule_micro_batches if p > 1 and layout.schedule_micro_batches else m  # per schedule
    if m % k:
        raise ValueError(f"{layout.describe()}: {m} micro-batches a step do not make schedules of {k}")
    schedules, v = m // k, layout.stages_per_rank
    if layout.engine == "mesh3d":
        split = layout.loss_parallel or layout.sequence_parallel  # the vocabulary matrices over the tensor ranks
        states = mesh3d_memory_terms(
            num_parameters(model), model.vocab_size * model.hidden_size,
            language_family(model, "the tensor/pipeline-parallel layouts").largest_weight_elements(model), model.num_layers, layout.num_gpus, t, p,
            "bf16", split,
        )  # fmt: skip
        params, grads = float(states["params"]), float(states["grads"])
        optimizer = float(states["optimizer"] + states["buffers"])  # gathered copies counted with the optimizer's
        psi_gpu = float(
            rank_parameters(num_parameters(model), model.vocab_size * model.hidden_size, t, p, model.num_layers, split)
        )
        largest = language_family(model, "the tensor/pipeline-parallel layouts").largest_weight_elements(model)
        vocab = model.vocab_size * model.hidden_size
        build = float(
            mesh3d_build_bytes(num_parameters(model), vocab, largest, model.num_layers, layout.num_gpus, t, p, split)
        )
    else:
        build = 0.0
        psi_gpu = stage_parameters(model, p) / t
        params, grads, optimizer = model_state_bytes(psi_gpu, 1, d)
    activations = activation_bytes_per_gpu(model, layout, k)
    memory = (params + grads + optimizer + activations) / GIB

    s, h = model.seq_length, model.hidden_size
    stage_layers = max(stage_sizes(model.num_layers, p, end_weight(model)))
    hw_flops = flops_per_token(model, recompute=layout.activation_checkpointing)
    pace = pipeline_imbalance(model.num_layers, p, end_weight(model))  # the slowest stage's over the mean one's
    compute_micro = b * s * hw_flops / (p * t) / (efficiency * peak * 1e12)
    stage_micro = compute_micro * pace
    passes = 6 if layout.activation_checkpointing else 4
    tensor_micro = (
        stage_layers * passes * _ring_allreduce_s(2.0 * s * b * h, t, network.intra_node_gbytes_s, INTRA_NODE_LATENCY_S)
    )
    if p > 1:
        crosses_nodes = t * p > network.gpus_per_node
        link = network.inter_node_gbytes_s_per_gpu if crosses_nodes else network.intra_node_gbytes_s
        latency = INTER_NODE_LATENCY_S if crosses_nodes else INTRA_NODE_LATENCY_S
        # Each of a rank's v stages sends a micro-batch's activations on and their gradients back.
        pipeline_micro = v * 2.0 * (2.0 * s * b * h / t / (link * 1e9 * LINK_EFFICIENCY) + latency)
    else:
        pipeline_micro = 0.0
    in_node = layout.num_gpus <= network.gpus_per_node
    data_link = network.intra_node_gbytes_s if in_node else network.inter_node_gbytes_s_per_gpu
    data_latency = INTRA_NODE_LATENCY_S if in_node else INTER_NODE_LATENCY_S
    if layout.engine == "mesh3d":
        # FSDP2: the bf16 stage gathered once a schedule (twice a micro-batch without a pipeline, as it reshards),
        # the fp32 gradients reduce-scattered once: each half a ring all-reduce. Gathers are prefetched behind
        # the layers' compute; what the step's compute does not hide is exposed.
        gathers, reductions = (float(schedules), float(schedules)) if p > 1 else (2.0 * m, 1.0)
        moved = (gathers * 2.0 + reductions * 4.0) * psi_gpu * (d - 1) / d  # all-gather, reduce-scatter: (d − 1)/d
        data_s = moved / (data_link * 1e9 * LINK_EFFICIENCY) + (data_latency if d > 1 else 0.0)
        exposed_data_s = max(0.0, data_s - m * compute_micro)
    else:
        data_s = _ring_allreduce_s(2.0 * psi_gpu, d, data_link, data_latency)
        # The gradient reduction starts as the last micro-batch's backward pass produces gradients (DeepSpeed's
        # overlap_comm, Megatron's overlap_grad_reduce): that backward, two thirds of its compute, hides part of it.
        exposed_data_s = max(0.0, data_s - compute_micro * 2.0 / 3.0)
    # Each schedule: k micro-batch slots and the bubble's (p − 1)/v (Narayanan et al. 2021, interleaved: §2.2.2).
    slots = schedules * (k + (p - 1) / v)
    step = slots * (stage_micro + tensor_micro + pipeline_micro) + exposed_data_s
    tokens = global_batch_size * s
    model_tflops = tokens * flops_per_token(model) / step / layout.num_gpus / 1e12
    return LayoutEstimate(
        layout=layout,
        global_batch_size=global_batch_size,
        num_micro_batches=m,
        params_gib=params / GIB,
        grads_gib=grads / GIB,
        optimizer_gib=optimizer / GIB,
        activations_gib=activations / GIB,
        memory_gib=memory,
        usable_memory_gib=gpu.memory_gib * (1.0 - MEMORY_MARGIN),
        build_memory_gib=build / GIB,
        bubble_fraction=(p - 1) / (v * k + p - 1),
        compute_s=m * compute_micro,
        tensor_comm_s=slots * tensor_micro,
        pipeline_comm_s=slots * pipeline_micro,
        data_comm_s=data_s,
        exposed_data_comm_s=exposed_data_s,
        step_time_s=step,
        tokens_per_s_per_gpu=tokens / step / layout.num_gpus,
        model_tflops_per_gpu=model_tflops,
        mfu=model_tflops / peak,
    )


def candidate_layouts(
    model: ModelConfig, num_gpus: int, global_batch_size: int, gpus_per_node: int, engine: str = "megatron"
) -> list[Layout]:
    """Every layout of ``num_gpus`` that can run the batch: tensor parallel inside a node and dividing the heads
    (and the key/value heads), pipeline stages of at least one layer each (they need not divide the layers), at
    least one sequence per data-parallel replica; under ``mesh3d`` only the tensor splits its families have (``TP_PLANS``)."""
    out: list[Layout] = []
    kv_heads = model.num_kv_heads or model.num_heads
    for t in (1, 2, 4, 8, 16):
        if t > gpus_per_node or model.num_heads % t or kv_heads % t or num_gpus % t:
            continue
        if t > 1 and engine == "mesh3d" and model.family not in TP_PLANS:
            continue
        for p in range(1, model.num_layers + 1):
            if num_gpus % (t * p):
                continue
            d = num_gpus // (t * p)
            if global_batch_size % d:
                continue
            for b in MICRO_BATCH_CHOICES:
                if (global_batch_size // d) % b:
                    continue
                for ckpt in (False, True):
                    out.append(Layout(d, t, p, b, ckpt, engine=engine))
    return out


def ranked_layouts(
    model: ModelConfig,
    gpu: GpuConfig,
    num_gpus: int,
    global_batch_size: int,
    network: Network,
    efficiency: float = DEFAULT_EFFICIENCY,
    data_parallel_only: bool = False,
    engine: str = "megatron",
) -> list[LayoutEstimate]:
    """Every layout of ``num_gpus`` that fits in memory, the fastest first; ties go to the layout with less model
    parallelism. ``data_parallel_only`` keeps t = p = 1; ``engine`` is :attr:`Layout.engine`."""
    found = []
    for layout in candidate_layouts(model, num_gpus, global_batch_size, network.gpus_per_node, engine):
        if data_parallel_only and (layout.tensor > 1 or layout.pipeline > 1):
            continue
        est = estimate_layout(model, gpu, layout, global_batch_size, network, efficiency)
        if est.fits:
            found.append(est)
    return sorted(found, key=lambda e: (e.step_time_s, e.layout.tensor * e.layout.pipeline))


def best_layout(
    model: ModelConfig,
    gpu: GpuConfig,
    num_gpus: int,
    global_batch_size: int,
    network: Network,
    efficiency: float = DEFAULT_EFFICIENCY,
    data_parallel_only: bool = False,
    engine: str = "megatron",
) -> LayoutEstimate | None:
    """The fastest layout of ``num_gpus`` that fits in memory (:func:`ranked_layouts`' first); None when none fits
    or none can run the batch."""
    ranked = ranked_layouts(model, gpu, num_gpus, global_batch_size, network, efficiency, data_parallel_only, engine)
    return ranked[0] if ranked else None


def min_gpus_to_fit(
    model: ModelConfig,
    gpu: GpuConfig,
    global_batch_size: int,
    network: Network,
    max_gpus: int = 1 << 16,
) -> int | None:
    """The fewest GPUs (a power of two) on which some layout fits; None up to ``max_gpus``."""
    n = 1
    while n <= max_gpus:
        if best_layout(model, gpu, n, global_batch_size, network) is not None:
            return n
        n *= 2
    return None


def with_batch(model: ModelConfig, global_batch_size: int) -> ModelConfig:
    """``model`` trained at another global batch (sequences)."""
    return replace(model, global_batch_size=int(global_batch_size))
