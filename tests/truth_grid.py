"""A synthetic grid whose truth the predictor cannot fit by construction: physics of its own, not the predictor's.

``tests/synthetic.py``'s truth is the predictor's own step terms with one coefficient vector per GPU type, so a
replay on it shows only the estimator recovering its own coefficients. Here a step is built from first principles
with effects the predictor's form (compute + communication + offload + micro-steps, each times one coefficient per
GPU type) cannot express: matrix-product efficiency that depends on the shape (hidden size, tokens per micro-batch,
tile quantization, head size), memory-bound element-wise work and the loss on the GPU's memory bandwidth, kernel
launches that hide behind the GPU's work or not, a latency per collective plus size over bandwidth with the real
count of collectives of each ZeRO stage and FSDP mode (ZeRO-2 reducing every micro-step, ZeRO-3 and FSDP gathering
every layer), 70% overlap of ZeRO-3's and FSDP's communication with compute, at most as long as the compute, and
the contention it causes, networks between nodes slower than inside them and slower still as nodes are added, the
slowest rank's wait, a family's kernel mix, checkpointing's recomputation, ``torch.compile``'s fusion, and noise.
The micro-batch is this module's own memory model's (the largest divisor of the per-GPU batch that fits).

Nothing here imports :mod:`analysis.predict` or the engines' step-time terms (nor ``tests/synthetic.py``, which
does): the model's parameter and FLOP counts come from :mod:`orchestrator.models` (measured facts about the model,
checked against the built modules), the cells from ``conf/``, the records from the job side's writer
(:mod:`orchestrator.store.record`), in the format of ``tests/synthetic.py``'s records.

Every constant says why it has its value. They are round figures of the right order from public datasheets and
benchmarks, not fits; the H100 anchor: at the default and free-lunch settings on one H100 the generator gives
pythia-160m 6.6 / 5.7 s, 410m 15.3 / 13.8 s, 1b 26.8 / 25.0 s, 1.4b 40.1 s a step, where
``tests/data/gpu-records`` measured 7.2 / 5.9, 16.3 / 15.5, 28.1 / 29.3 and 40.6 s (noise left out).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysis.sweeps.records import Catalog
from orchestrator.config.schema import MethodConfig, ModelConfig, to_config
from orchestrator.models import flops_per_sample, num_parameters
from orchestrator.store.paths import SweepPaths
from orchestrator.store.record import Metrics, Record, write_record
from orchestrator.store.states import RecordStatus

GIB = 2.0**30

# ---------------------------------------------------------------------------------------------------------------
# The GPUs and their networks
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuTruth:
    """What the catalog (``conf/gpu``) does not say about a GPU and the cluster it sits in."""

    gemm_share: float
    """Share of the catalog's dense bf16 peak that the largest bf16 matrix products reach (cuBLAS with fp32
    accumulation, at the clocks the board's power allows)."""
    hbm_gbytes_s: float
    """Memory bandwidth (datasheet)."""
    intra_busbw_gbytes_s: float
    """NCCL ring bus bandwidth inside a node of eight."""
    inter_busbw_gbytes_s: float
    """NCCL ring bus bandwidth of a ring that crosses nodes: what the node's network cards carry, together."""


GPUS: dict[str, GpuTruth] = {
    # Datasheet 3.35 TB/s HBM3; cuBLAS reaches 650-750 of the 989 dense TFLOP/s before the 700 W cap lowers the
    # clocks; NVLink 4 all-reduce bus bandwidth of nccl-tests is 350-480 GB/s; a node with four 400 Gb/s NDR cards
    # (200 GB/s) at 80% of line rate.
    "h100-80gb": GpuTruth(0.68, 3350.0, 370.0, 160.0),
    # 2.0 TB/s HBM2e; 250-270 of 312 TFLOP/s in large GEMMs; NVLink 3 all-reduce about 230 GB/s; four 200 Gb/s
    # HDR cards (100 GB/s) at 80%.
    "a100-80gb": GpuTruth(0.80, 2039.0, 230.0, 80.0),
    # 864 GB/s GDDR6; an Ada board at 350 W holds its boost clock for less of a GEMM than an SXM part; no NVLink,
    # peer to peer through PCIe 4 switches (about 18 GB/s ring); two 100 GbE RoCE cards (25 GB/s) at 70%.
    "l40s": GpuTruth(0.55, 864.0, 18.0, 17.0),
    # 768 GB/s GDDR6; GA102 keeps its clocks better at 300 W; PCIe 4 across two CPU sockets (about 12 GB/s ring);
    # one 100 GbE card over TCP sockets (12.5 GB/s) at 60%.
    "a6000": GpuTruth(0.70, 768.0, 12.0, 7.5),
}

# ---------------------------------------------------------------------------------------------------------------
# Compute: matrix products, attention, element-wise work, the loss, launches
# ---------------------------------------------------------------------------------------------------------------

HIDDEN_HALF = 384.0
"""Hidden size at which a layer's products reach half their large-shape rate: a (tokens x h) by (h x h) product
splits into tiles of 128 x 128 or 256 x 128, and a small h gives each of the 100-plus SMs too few, too short
tiles (at h = 768 the products run at 67% of the large-shape rate, at h = 2048 at 84%)."""
TOKENS_HALF = 1024.0
"""Tokens per micro-batch at which the products reach half their rate: the tokens are the products' long side,
and fewer than a few thousand leave waves of tiles part empty (one 2048-token sequence: 67%; eight: 94%)."""
TILE = 128
"""cuBLAS tile edge: a dimension that is not a multiple of it wastes the rest of its last tile (576 -> 90%)."""
HEAD_HALF = 48.0
"""Head size at which flash attention's rate is half the products' rate: its inner products are head-sized, so
64-wide heads run at 57% and 128-wide at 73% of the GEMM rate (FlashAttention-2's reported share)."""
CAUSAL_SHARE = 0.5
"""Flash attention skips the masked half of a causal score matrix that the FLOP count charges in full."""
ELEMENTWISE_PASSES_H = 48.0
ELEMENTWISE_PASSES_F = 12.0
"""Bytes per token per layer that element-wise kernels (norms, residual adds, rotary, activation, dropout-free
copies) read and write, per hidden and per intermediate unit: about 16 h-wide and 4 f-wide 16-bit tensors read
and written once in the forward, twice that in the backward (3 passes x 2 bytes x 2 directions x (4h + f))."""
HBM_SHARE = 0.8
"""Share of the memory bandwidth that streaming element-wise kernels reach."""
LOSS_BYTES_PER_LOGIT = 30.0
"""Bytes per logit of the loss: bf16 logits written and read, upcast to fp32, log-softmax read and written, its
gradient the same way back (2 + 2 + 4 + 8 + 4 + 8 + 2)."""
KERNELS_PER_LAYER = 90
"""Kernels one layer launches per micro-step (about 30 in the forward, twice that in the backward)."""
LOSS_KERNELS = 25
LAUNCH_S = 5e-6
"""Host time to launch one kernel through PyTorch's dispatcher; the GPU waits only where its kernels are shorter."""
FIXED_S_PER_MICRO_STEP: dict[str, float] = {"deepspeed": 0.008, "fsdp": 0.004}
"""Python per micro-step that launches nothing (DeepSpeed's engine bookkeeping, loss scaling checks and hooks;
FSDP2's lighter pre/post hooks)."""
HOOK_S_PER_LAYER: dict[str, float] = {"zero3": 2.5e-4, "fsdp": 1.0e-4}
"""Per layer per micro-step, the hooks that gather and free a sharded layer (DeepSpeed ZeRO-3's partition
bookkeeping is the heavier)."""
FAMILY_GEMM: dict[str, float] = {"gpt_neox": 1.0, "llama": 0.97, "qwen3": 0.94, "olmo2": 0.95}
"""The products' rate by family: GPT-NeoX's parallel attention and MLP keep the GPU busiest; a gated MLP's three
narrower products and grouped-query attention's narrow key/value products run a little slower."""
FAMILY_ELEMENTWISE: dict[str, float] = {"gpt_neox": 1.0, "llama": 1.0, "qwen3": 1.15, "olmo2": 1.15}
"""Element-wise bytes by family: Qwen3's and OLMo 2's query/key norms add two normalisations per layer."""
RECOMPUTE = 4.0 / 3.0
"""Checkpointing reruns each layer's forward: a third more element-wise work and launches (its FLOPs are the
family's own recompute count)."""
COMPILE_ELEMENTWISE = 0.45
"""Inductor fuses chains of element-wise kernels, reading each input once: about half the bytes move."""
COMPILE_LAUNCHES = 0.3
"""and a compiled block launches a few fused kernels in place of dozens."""
COMPILE_LOSS = 0.6
"""The compiled loss skips the upcast copies of the logits."""

# ---------------------------------------------------------------------------------------------------------------
# Communication and the optimizer step
# ---------------------------------------------------------------------------------------------------------------

ALPHA_S = 12e-6
"""Fixed latency of one NCCL collective (the kernel's launch and the proxy's handshake)."""
HOP_S_INTRA = 1.5e-6
HOP_S_INTER = 6e-6
"""Latency of each step of the ring, inside a node (NVLink or PCIe peer to peer) and through the network."""
CONTENTION_PER_DOUBLING = 0.08
"""Each doubling of the nodes a ring crosses costs this share of the network's bandwidth (more switch hops and
oversubscribed uplinks in a two-level fat tree)."""
BUCKET_ELEMENTS = 5e8
"""DeepSpeed's reduce and all-gather bucket size (elements), its default: one collective per bucket."""
OVERLAP = 0.7
"""Share of ZeRO-3's and FSDP's communication that runs under compute (prefetch on a side stream); ZeRO-0 to 2
overlap nothing (the project's DeepSpeed config leaves ``overlap_comm`` at its default, off below stage 3)."""
INTERFERENCE = 0.1
"""Compute slows by this share of the communication it hides (NCCL's kernels take SMs and memory bandwidth)."""
JITTER = 0.015
"""Relative spread of one rank's micro-step: a step waits for the slowest of N, about sqrt(2 ln N) spreads more."""
OPTIMIZER_BYTES_PER_PARAM = 36.0
"""Adam's step per parameter: fp32 master, moments read and written (24), the gradient read for the norm and
for the update (4 + 4), the 16-bit parameter written (2), rounded up for the clipping's scale pass."""
OPTIMIZER_HBM_SHARE = 0.5
"""Multi-tensor Adam reaches about half the memory bandwidth over thousands of small tensors."""

# ---------------------------------------------------------------------------------------------------------------
# Memory (to find the micro-batch), the probe's cost, noise
# ---------------------------------------------------------------------------------------------------------------

ACTIVATION_BYTES_ATTENTION_H = 15.0
"""Bytes per token per layer the attention half and the norms keep for the backward with SDPA (Korthikanti et
al. 2022: 11sbh for attention less its score matrix, 4sbh for the two norms)."""
LOGIT_BYTES = 12.0
"""Bytes per logit kept: bf16 logits, their fp32 upcast, its fp32 gradient and the bf16 one (2 + 4 + 4 + 2)."""
COMPILE_LOGIT_BYTES = 8.0
COMPILE_ACTIVATIONS = 0.9
"""A compiled block keeps fewer intermediates; the compiled loss keeps no fp32 copy of the logits (2 + 4 + 2)."""
ALLOCATOR = 1.08
"""Reserved over allocated: the caching allocator's blocks and fragmentation."""
CONTEXT_GIB = 0.8
NCCL_GIB = 0.6
"""Device memory beside PyTorch's allocator: the CUDA context and cuBLAS workspaces; NCCL's buffers."""
USABLE_SHARE = 0.99
"""Of the catalog's memory, what the device shows (79.2 GiB of an 80 GB H100)."""
STARTUP_S = 15.0
STARTUP_S_PER_DOUBLING = 4.0
"""Process start and rendezvous; each doubling of the ranks adds a round of the store's handshakes."""
TRIAL_S = 2.0
"""A micro-batch trial's build and allocation, beside its micro-steps."""
COMPILE_WARMUP_S = 40.0
"""Inductor's compilation of a block in the warm-up."""
NOISE_SD = 0.015
"""A measurement's own noise (log): twin records of tests/data/gpu-records differ by 0.1-2%."""
SHAPE_SD = 0.03
"""Per model and GPU type (log): which kernels cuBLAS and the attention backend pick for the shapes."""
NETWORK_SD = 0.03
"""Per cell across nodes (log): the job's placement on the fabric and the traffic beside it."""


@dataclass(frozen=True)
class Cell:
    """One cell of the grid: its id and resolved config (as ``cell.yaml``)."""

    cell_id: str
    config: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    """What the probe would have recorded for a cell."""

    fits: bool
    micro_batch: int
    accum: int
    step_time_s: float
    micro_step_s: float
    allocated_gib: float
    wall: dict[str, float]


MODELS = ("pythia-70m", "pythia-410m", "pythia-1.4b", "pythia-2.8b", "smollm2-135m", "qwen3-0.6b", "olmo2-1b")
"""Three families, 70M to 2.8B parameters, hidden 512 to 2560, sequences of 2048 and 4096 (pythia-2.8b's states
alone fill a 48 GB card unsharded)."""
GPU_NAMES = ("a100-80gb", "h100-80gb", "l40s", "a6000")
LAYOUTS = ((1, 1), (2, 1), (8, 1), (16, 2), (32, 4))
"""(num_gpus, num_nodes): one GPU, two and eight in a node, two and four nodes of eight."""
METHODS: tuple[dict[str, Any], ...] = (
    *({"engine": "deepspeed", "zero_stage": stage} for stage in (0, 1, 2, 3)),
    {"engine": "fsdp", "fsdp_sharding": "full"},
    {"engine": "fsdp", "fsdp_sharding": "grad_op"},
)


def cells(
    models: Sequence[str] = MODELS,
    gpus: Sequence[str] = GPU_NAMES,
    layouts: Sequence[tuple[int, int]] = LAYOUTS,
    methods: Sequence[dict[str, Any]] = METHODS,
    checkpointing: Sequence[bool] = (False, True),
    compile_: Sequence[bool] = (False, True),
    catalog: Catalog | None = None,
) -> list[Cell]:
    """Every combination (no ZeRO or FSDP on one GPU: that cell would be refused)."""
    catalog = catalog if catalog is not None else Catalog.load()
    out = []
    for model, gpu, (n, nodes), method, ckpt, comp in itertools.product(
        models, gpus, layouts, methods, checkpointing, compile_
    ):
        if n == 1 and (method["engine"] != "deepspeed" or method.get("zero_stage", 0) > 0):
            continue
        label = f"zero{method['zero_stage']}" if method["engine"] == "deepspeed" else f"fsdp-{method['fsdp_sharding']}"
        settings = {**method, "activation_checkpointing": ckpt, "compile": comp}
        config = {
            "model": dict(catalog.models[model]),
            "gpu": dict(catalog.gpus[gpu]),
            "method": {**asdict(MethodConfig()), **settings},
            "cluster": {"backend": "local"},
            "probe": {"warmup_steps": 2, "min_steps": 5, "max_steps": 50, "memory_limit_gib": None},
            "num_gpus": n,
            "num_nodes": nodes,
            "name": "truth",
        }
        suffix = f"{'ckpt' if ckpt else 'nockpt'}_{'compile' if comp else 'eager'}"
        out.append(Cell(f"{model}_{gpu}_{n}x{nodes}_{label}_{suffix}", config))
    return out


@dataclass(frozen=True)
class _Model:
    layers: int
    hidden: int
    inner: int
    vocab: int
    seq: int
    batch: int
    heads: int
    head_dim: int
    params: float
    family: str
    gated: bool
    flops: float
    recompute_flops: float


def _model(config: ModelConfig) -> _Model:
    h = config.hidden_size
    head_dim = config.head_dim or h // config.num_heads
    return _Model(
        layers=config.num_layers,
        hidden=h,
        inner=config.intermediate_size or 4 * h,
        vocab=config.vocab_size,
        seq=config.seq_length,
        batch=config.global_batch_size,
        heads=config.num_heads,
        head_dim=head_dim,
        params=float(num_parameters(config)),
        family=config.family,
        gated=config.family != "gpt_neox",
        flops=flops_per_sample(config),
        recompute_flops=flops_per_sample(config, recompute=True),
    )


def _tile(d: int) -> float:
    return d / (math.ceil(d / TILE) * TILE)


def _collective(kind: str, nbytes: float, count: float, n: int, nodes: int, gpu: GpuTruth) -> float:
    """Seconds of ``count`` collectives over ``n`` ranks moving ``nbytes`` in all (the unsharded size)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    hops = (2.0 if kind == "all_reduce" else 1.0) * (n - 1)
    if nodes > 1:
        bw = gpu.inter_busbw_gbytes_s * 1e9 / (1.0 + CONTENTION_PER_DOUBLING * math.log2(nodes))
        hop = HOP_S_INTER
    else:
        bw, hop = gpu.intra_busbw_gbytes_s * 1e9, HOP_S_INTRA
    return count * (ALPHA_S + hops * hop) + hops / n * nbytes / bw


def allocated_gib(m: _Model, method: dict[str, Any], n: int, micro: int, accum: int) -> float:
    """Peak allocated memory per GPU at this micro-batch (this module's own memory model)."""
    psi, stage = m.params, int(method.get("zero_stage") or 0)
    fsdp = method.get("engine") == "fsdp"
    layer_params = 2.0 * (4 * m.hidden**2 + (3 if m.gated else 2) * m.hidden * m.inner)  # 16-bit bytes of one layer
    if fsdp:
        states = 16.0 * psi / n + (2.0 * layer_params if method.get("fsdp_sharding") == "full" else 2.0 * psi)
        states += 2.0 * psi if accum > 1 else 0.0  # gradients held whole through the accumulation
    elif stage >= 3:
        states = 16.0 * psi / n + 2.0 * layer_params
    else:
        states = 2.0 * psi + (2.0 * psi if stage < 2 else 2.0 * psi / n) + (12.0 * psi if stage < 1 else 12.0 * psi / n)
    mlp = (2 * m.hidden + 6 * m.inner) if m.gated else (3 * m.hidden + 4 * m.inner)
    layer = ACTIVATION_BYTES_ATTENTION_H * m.hidden + mlp
    compiled = bool(method.get("compile"))
    layer *= COMPILE_ACTIVATIONS if compiled else 1.0
    if method.get("activation_checkpointing"):
        layers = 2.0 * m.hidden * m.layers + layer  # each layer's input, and one layer rebuilt
    else:
        layers = layer * m.layers
    logits = (COMPILE_LOGIT_BYTES if compiled else LOGIT_BYTES) * m.vocab
    return (states + micro * m.seq * (layers + logits)) / GIB


def step_time_s(m: _Model, gpu: GpuTruth, peak_tflops: float, method: dict[str, Any], n: int, nodes: int,
                micro: int, accum: int) -> tuple[float, float]:  # fmt: skip
    """One optimizer step and one micro-step of the cell, in seconds, before noise."""
    ckpt, compiled = bool(method.get("activation_checkpointing")), bool(method.get("compile"))
    engine, stage = str(method.get("engine")), int(method.get("zero_stage") or 0)
    sharding = method.get("fsdp_sharding")
    h, f, L = m.hidden, m.inner, m.layers
    tokens = micro * m.seq
    # The products: the family's FLOP count less its attention, at a rate set by the shape.
    attention = micro * m.seq * L * 4.0 * m.seq * m.heads * m.head_dim * (4.0 if ckpt else 3.0)
    flops = micro * (m.recompute_flops if ckpt else m.flops)
    dense = max(flops - attention, 0.3 * flops)  # a floor in case a family counts attention otherwise
    shape = (_tile(h) + _tile(f)) / 2.0 * h / (h + HIDDEN_HALF) * tokens / (tokens + TOKENS_HALF)
    gemm_rate = peak_tflops * 1e12 * gpu.gemm_share * shape * FAMILY_GEMM[m.family]
    attention_rate = gemm_rate * m.head_dim / (m.head_dim + HEAD_HALF)
    compute = dense / gemm_rate + CAUSAL_SHARE * attention / attention_rate
    hbm = gpu.hbm_gbytes_s * 1e9 * HBM_SHARE
    elementwise = tokens * L * (ELEMENTWISE_PASSES_H * h + ELEMENTWISE_PASSES_F * f) * FAMILY_ELEMENTWISE[m.family]
    elementwise *= (RECOMPUTE if ckpt else 1.0) * (COMPILE_ELEMENTWISE if compiled else 1.0) / hbm
    loss = tokens * m.vocab * LOSS_BYTES_PER_LOGIT * (COMPILE_LOSS if compiled else 1.0) / hbm
    gpu_s = compute + elementwise + loss
    launches = (L * KERNELS_PER_LAYER * (RECOMPUTE if ckpt else 1.0) * (COMPILE_LAUNCHES if compiled else 1.0)
                + LOSS_KERNELS) * LAUNCH_S  # fmt: skip
    busy = max(gpu_s, launches)
    hooks = FIXED_S_PER_MICRO_STEP.get(engine, 0.008)
    hooks += L * (HOOK_S_PER_LAYER["zero3"] if engine == "deepspeed" and stage >= 3 else 0.0)
    hooks += L * (HOOK_S_PER_LAYER["fsdp"] if engine == "fsdp" else 0.0)
    psi = m.params
    buckets = math.ceil(psi / BUCKET_ELEMENTS)

    def coll(kind: str, nbytes: float, count: float) -> float:
        return _collective(kind, nbytes, count, n, nodes, gpu)

    # Communication each micro-step (exposed, or overlapped) and at the boundary.
    exposed_micro, overlapped_micro, boundary_comm, boundary_overlapped = 0.0, 0.0, 0.0, 0.0
    if engine == "fsdp":
        overlapped_micro = (2.0 if sharding == "full" else 1.0) * coll("all_gather", 2.0 * psi, L + 1)
        boundary_overlapped = coll("reduce_scatter", 4.0 * psi, L + 1)  # fp32 reduction, once per step
    elif stage == 0:
        boundary_comm = coll("all_reduce", 2.0 * psi, buckets)
    elif stage in (1, 2):
        reduce = coll("reduce_scatter", 2.0 * psi, buckets)
        exposed_micro = reduce if stage == 2 else 0.0  # ZeRO-2 reduces into its partition every micro-step
        boundary_comm = (reduce if stage == 1 else 0.0) + coll("all_gather", 2.0 * psi, buckets)
    else:
        overlapped_micro = 2.0 * coll("all_gather", 2.0 * psi, L + 1) + coll("reduce_scatter", 2.0 * psi, L + 1)
    hidden = min(OVERLAP * overlapped_micro, gpu_s)
    micro_step = busy + hooks + exposed_micro + (overlapped_micro - hidden) + INTERFERENCE * hidden
    hidden_boundary = min(OVERLAP * boundary_overlapped, 2.0 / 3.0 * gpu_s)  # under the last backward (2/3 of it)
    shard = psi / n if (engine == "fsdp" or stage >= 1) else psi
    optimizer = OPTIMIZER_BYTES_PER_PARAM * shard / (gpu.hbm_gbytes_s * 1e9 * OPTIMIZER_HBM_SHARE)
    norm = coll("all_reduce", 4.0, 1) if (engine == "fsdp" or stage >= 1) else 0.0  # the gradient norm's scalar
    boundary = boundary_comm + boundary_overlapped - hidden_boundary + optimizer + norm
    step = accum * micro_step + boundary
    step *= 1.0 + (JITTER * math.sqrt(2.0 * math.log(n)) if n > 1 else 0.0)
    return step, micro_step


def measure(cell: Cell, model: _Model | None = None) -> Outcome:
    """The cell as the probe would find it: the largest micro-batch that fits, and its step (before noise)."""
    config = cell.config
    m = model if model is not None else _model(to_config(config).model)
    gpu_conf, method = config["gpu"], config["method"]
    gpu = GPUS[gpu_conf["name"]]
    n, nodes = int(config["num_gpus"]), int(config["num_nodes"])
    per_gpu = max(m.batch // n, 1)
    usable = gpu_conf["memory_gib"] * USABLE_SHARE - CONTEXT_GIB - (NCCL_GIB if n > 1 else 0.0)
    startup = STARTUP_S + STARTUP_S_PER_DOUBLING * math.log2(n)
    micro, allocated = 0, math.nan
    trials = 0
    for size in sorted((d for d in range(1, per_gpu + 1) if per_gpu % d == 0), reverse=True):
        trials += 1
        peak = allocated_gib(m, method, n, size, per_gpu // size)
        if peak * ALLOCATOR <= usable:
            micro, allocated = size, peak
            break
    if not micro:
        wall = {"startup_s": startup, "search_s": TRIAL_S * 2, "probe_wall_s": startup + TRIAL_S * 2}  # two trials
        return Outcome(False, 1, per_gpu, math.nan, math.nan, math.nan, wall)
    accum = per_gpu // micro
    step, micro_step = step_time_s(m, gpu, float(gpu_conf["peak_tflops_bf16"]), method, n, nodes, micro, accum)
    # The search doubles the micro-batch up to the first that does not fit, three micro-steps a trial; the
    # warm-up runs two micro-steps and a boundary; composed timing times five samples of at least 2 s of
    # micro-steps and five boundaries, within the probe's 300 s budget (the H100 records: 10-13 s timed).
    search = (math.log2(micro) + 2.0) * (TRIAL_S + 3.0 * micro_step)
    boundary = step - accum * micro_step
    warmup = 2.0 * micro_step + boundary + (COMPILE_WARMUP_S if method.get("compile") else 0.0)
    timed = min(300.0, 5.0 * max(2.0, 3.0 * micro_step) + 5.0 * max(boundary, 0.0))
    wall = {"startup_s": startup, "search_s": search, "warmup_s": warmup, "timed_s": timed}
    wall["probe_wall_s"] = sum(wall.values())
    return Outcome(True, micro, accum, step, micro_step, allocated, wall)


def write_grid(sweep_dir: Path, seed: int = 0, grid: Sequence[Cell] | None = None) -> int:
    """Measure every cell of ``grid`` (default :func:`cells`) with noise drawn from ``seed`` and write its folder
    and record into ``sweep_dir`` as the job side does. Returns the number of cells."""
    grid = list(grid) if grid is not None else cells()
    rng = np.random.default_rng(seed)
    models: dict[str, _Model] = {}
    shape_effect: dict[tuple[str, str], float] = {}
    paths = SweepPaths(sweep_dir)
    for cell in grid:
        config = cell.config
        name, gpu = config["model"]["name"], config["gpu"]["name"]
        if name not in models:
            models[name] = _model(to_config(config).model)
        outcome = measure(cell, models[name])
        effect = shape_effect.setdefault((name, gpu), float(rng.normal(0.0, SHAPE_SD)))
        network = float(rng.normal(0.0, NETWORK_SD)) if config["num_nodes"] > 1 else 0.0
        noise = math.exp(effect + network + float(rng.normal(0.0, NOISE_SD)))
        folder = paths.cell_dir(cell.cell_id)
        folder.mkdir(parents=True, exist_ok=True)
        # JSON is valid YAML and about a hundred times faster to write than yaml.safe_dump.
        paths.cell_config(cell.cell_id).write_text(json.dumps(config, indent=1) + "\n")
        write_record(paths.record(cell.cell_id), _record(cell, outcome, noise, models[name]), durable=False)
    return len(grid)


def _record(cell: Cell, outcome: Outcome, noise: float, m: _Model) -> Record:
    config = cell.config
    n = int(config["num_gpus"])
    per_gpu = max(m.batch // n, 1)
    tokens = m.batch * m.seq
    if outcome.fits:
        step = outcome.step_time_s * noise
        metrics = Metrics(
            num_parameters=int(m.params),
            per_gpu_batch_size=per_gpu,
            micro_batch_size=outcome.micro_batch,
            grad_accum_steps=outcome.accum,
            step_time_s=step,
            step_time_mean_s=step,
            step_time_std_s=step * NOISE_SD,
            step_time_iqr_s=step * NOISE_SD * 1.35,
            step_time_ci95_pct=1.5,  # what the probe's CI target (2%) leaves, as in tests/synthetic.py
            steps_timed=5,
            tokens_per_step=tokens,
            tokens_per_s=tokens / step,
            tokens_per_s_per_gpu=tokens / step / n,
            peak_memory_allocated_gib=outcome.allocated_gib,
            peak_memory_reserved_gib=outcome.allocated_gib * ALLOCATOR,
            host_rss_gib=3.0,  # not read by anything here
            **outcome.wall,
        )
        status, reason = RecordStatus.OK, None
    else:
        metrics = Metrics(num_parameters=int(m.params), per_gpu_batch_size=per_gpu, micro_batch_size=1, **outcome.wall)
        status, reason = RecordStatus.DOES_NOT_FIT, "micro-batch 1 does not fit"
    method = config["method"]
    return Record(
        cell_id=cell.cell_id,
        sweep="truth",
        status=status,
        reason=reason,
        settings={
            "model": config["model"]["name"],
            "gpu": config["gpu"]["name"],
            "num_gpus": n,
            "num_nodes": config["num_nodes"],
            **method,
        },  # fmt: skip
        config=config,
        metrics=metrics,
        environment={
            "hostnames": [f"node{i + 1}" for i in range(int(config["num_nodes"]))],
            "device_name": config["gpu"]["name"],
            "world_size": n,
        },  # fmt: skip
        started_at="2026-11-22T00:10:00+00:00",
        finished_at="2026-11-22T00:10:14+00:00",
    )
