"""Device memory every engine's model shares: bytes per parameter, the activations of one sequence, the caching
allocator's overhead, the reserved peak and the micro-batch that fits. Pure arithmetic; what an engine keeps of the
model states and which buffers it adds is its own ``<engine>/memory.py``.

Every function of arrays works element-wise on numpy arrays as on scalars, so the predictor evaluates thousands
of cells at once with this same arithmetic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from orchestrator.config.batch import divisors
from orchestrator.engines.allocator import allocator_conf, expandable_segments
from orchestrator.models import family_module, language_family
from orchestrator.models.sequences import compiled_loss

if TYPE_CHECKING:
    from orchestrator.config.schema import Config, MethodConfig, ModelConfig

GIB = 2**30
ALLOCATOR_OVERHEAD = 1.12
"""Reserved over allocated bytes of PyTorch's CUDA caching allocator without expandable segments (fragmentation,
rounding to blocks): the median of the 14 H100 records in tests/data/gpu-records (1.117; 1.021 to 1.167; the
reserved peak is what a GPU runs out of), in-sample for them. Multiplies everything the step allocates. One figure
for every setting: these records do not support a gap by setting. By compile, 7 records each: 1.145 compiled
(1.021 to 1.149), 1.111 not (1.038 to 1.167); by micro-batch, 1.039 at 8 (2 records), 1.136 at 16 (6), 1.113 at
32 (6); none checkpointed. The same cell (pythia-160m, free-lunch, auto) measured twice gave 1.026 and 1.146, a
spread as wide as any between settings."""
EXPANDABLE_OVERHEAD = 1.07
"""The gap with expandable segments (:data:`DEFAULT_CUDA_ALLOC_CONF`, the probe's default), neither checkpointed
nor compiled block by block: the median of the 14 such H200 records (tests/data/gpu-records/h200*: 1.066; 1.022
to 1.114, the highest pythia-160m's three at micro-batch 32), in-sample for them."""
EXPANDABLE_OVERHEAD_CHECKPOINTED = 1.13
"""The gap with expandable segments and activation checkpointing: the four checkpointed H200 records (pythia-410m,
1b and 1.4b under DeepSpeed, 1.4b under FSDP2) show 1.117 to 1.141, median 1.125, in-sample. Checkpointing frees
each layer's activations as the backward passes it and makes them again, a churn of blocks of many sizes."""
ALLOCATOR_OVERHEAD_REGIONAL_COMPILE = 1.03
"""The gap of a cell compiled block by block (``compile_scope: regional``, the engines' default) with expandable
segments: 1.011 to 1.031 over the H200's five such records (pythia-160m under DeepSpeed twice and FSDP2, 410m and
1.4b under DeepSpeed), the highest taken. The H100's compiled records compiled the whole engine, without
expandable segments (1.021 to 1.149), and keep :data:`ALLOCATOR_OVERHEAD`."""
CPU_RUNTIME_GIB = 0.04
"""What a CPU probe's process holds beyond the model's terms, whatever the model: its "device memory" is the
growth of the resident set from before the model was built (orchestrator.job.metering), which takes in the engine's
and autograd's own allocations. Measured with pythia-tiny on gpu=cpu (DeepSpeed, ZeRO-0, bf16): a peak of 0.0436
GiB at micro-batch 1 and 0.0760 at 16, where the model's terms come to 0.0038 and 0.0231: 0.04 GiB at either end
once the activations' slope is taken out. Counted as buffers, so a memory limit judges ``auto`` and a fixed
micro-batch alike."""
DEFAULT_MARGIN = 0.10
"""Share of GPU memory kept free for the CUDA context, NCCL and what the model leaves out. A cell fits where its
central reserved peak is within the rest, not the upper end of the peak's 90% interval: on the 14 H100 records of
tests/data/gpu-records (79.2 GiB, so 71.3 usable) the uncalibrated upper end (+9.6%) would refuse four cells that
ran beside the two the central peak already refuses (pythia-160m at default settings, micro-batch 32: 73.1 GiB,
66.1 and 67.1 measured; pythia-1b free-lunch at 16: 74.0, 69.8 measured), the margin and the interval counting
the same doubt twice."""


def precision_bytes(precision: ArrayLike) -> np.ndarray | float:
    """Bytes per parameter of the 16-bit copies (4 in fp32)."""
    out = np.where(np.asarray(precision, dtype=object) == "fp32", 4.0, 2.0)
    return scalar_or_array(out)


def activation_bytes_per_sequence(model: ModelConfig, method: MethodConfig) -> float:
    """Bytes of the activations one sample (a sequence, an image) adds to the peak of a training step, its output
    and loss included: the family's own count (``activation_bytes_per_sample``; for a language model
    ``orchestrator.models.sequences.activation_bytes_per_sample``), or with selective checkpointing
    (``method.checkpoint_policy``, mesh3d's) :func:`selective_bytes_per_sequence`."""
    if method.activation_checkpointing and method.checkpoint_policy == "selective":
        return selective_bytes_per_sequence(model, method)
    return float(family_module(model.family).activation_bytes_per_sample(model, method))


def recomputes_layers(checkpointing: ArrayLike, checkpoint_policy: ArrayLike) -> np.ndarray | bool:
    """Where activation checkpointing reruns the layers' matrix products in the backward (hardware FLOPs with
    ``recompute``), element-wise: full checkpointing does; selective keeps their outputs and reruns only the
    cheap operators between them."""
    rerun = np.asarray(checkpointing, dtype=bool) & (np.asarray(checkpoint_policy, dtype=object) != "selective")
    return rerun if rerun.ndim else bool(rerun)


GATED_FAMILIES = ("llama", "qwen3", "olmo2")
"""The decoder families whose MLP is gated (SwiGLU: a gate and an up projection), the others' one projection up."""


def selective_layer_bytes(model: ModelConfig) -> float:
    """Bytes per token a decoder layer keeps under selective checkpointing, 16-bit: what the matrix products and
    attention output (``mesh3d.config.SELECTIVE_SAVED_OPS``) beside the layer's input, 2 bytes each:
    ``2·(h + (a·d + 2k·d) + a·d + h + g·f + h) + 4a``: the input, the q/k/v projections, attention's output (and
    its fp32 log-sum-exp per head), the output projection, the MLP's ``g`` up projections (two where gated) and
    its down projection; the norms, the activation function and the rotary embedding are recomputed."""
    h, a = model.hidden_size, model.num_heads
    d = model.head_dim or h // a
    k = model.num_kv_heads or a
    f = model.intermediate_size or 4 * h
    g = 2 if model.family in GATED_FAMILIES else 1
    return float(2 * (h + (a * d + 2 * k * d) + a * d + h + g * f + h) + 4 * a)


def selective_bytes_per_sequence(model: ModelConfig, method: MethodConfig) -> float:
    """:func:`activation_bytes_per_sequence` under selective checkpointing: every layer keeps
    :func:`selective_layer_bytes` (at most all it would keep unchecked); the peak is the larger of the loss and
    one layer's recomputed rest in its backward (as full checkpointing's, ``sequences.activation_bytes_per_sample``)."""
    fam = language_family(model, "selective checkpointing")
    seq, scale = model.seq_length, 2.0 if method.precision == "fp32" else 1.0
    whole = float(fam.activation_bytes_per_token_per_layer(model, method.attention, False))
    kept = min(selective_layer_bytes(model), whole)
    logits = float(fam.logit_bytes_per_token(model, compiled_loss(method))) * seq
    return float(model.num_layers * kept * seq * scale + max(logits, (whole - kept) * seq * scale))


def allocator_overhead(
    accelerator: ArrayLike,
    regional_compile: ArrayLike = False,
    checkpointing: ArrayLike = False,
    expandable: ArrayLike = True,
) -> np.ndarray | float:
    """Reserved over allocated bytes on a CUDA device: with expandable segments (the probe's default),
    :data:`ALLOCATOR_OVERHEAD_REGIONAL_COMPILE` where the cell compiles block by block, else
    :data:`EXPANDABLE_OVERHEAD_CHECKPOINTED` where it checkpoints, else :data:`EXPANDABLE_OVERHEAD`; without them,
    :data:`ALLOCATOR_OVERHEAD` (the regional figure where compiled so); 1 on the CPU, which has no caching
    allocator. Element-wise."""
    regional = np.asarray(regional_compile, dtype=bool)
    grown = np.where(np.asarray(checkpointing, dtype=bool), EXPANDABLE_OVERHEAD_CHECKPOINTED, EXPANDABLE_OVERHEAD)
    plain = np.where(np.asarray(expandable, dtype=bool), grown, ALLOCATOR_OVERHEAD)
    on_gpu = np.where(regional, ALLOCATOR_OVERHEAD_REGIONAL_COMPILE, plain)
    return scalar_or_array(np.where(np.asarray(accelerator, dtype=object) == "cpu", 1.0, on_gpu))


def compiles_regionally(compiled: ArrayLike, scope: ArrayLike) -> np.ndarray:
    """Whether each cell compiles block by block: ``compile`` on with ``compile_scope: regional``."""
    out: np.ndarray = np.asarray(compiled, dtype=bool) & (np.asarray(scope, dtype=object) == "regional")
    return out


def peak_bytes(
    fixed_bytes: ArrayLike,
    per_sequence_bytes: ArrayLike,
    micro_batch_size: ArrayLike,
    accelerator: ArrayLike = "cuda",
    regional_compile: ArrayLike = False,
    checkpointing: ArrayLike = False,
    expandable: ArrayLike = True,
) -> np.ndarray | float:
    """The reserved peak per GPU: what is allocated (model states, buffers, activations) times the allocator's
    overhead (:func:`allocator_overhead`)."""
    allocated = np.asarray(fixed_bytes, dtype=float) + np.asarray(per_sequence_bytes, dtype=float) * np.asarray(
        micro_batch_size, dtype=float
    )
    overhead = allocator_overhead(accelerator, regional_compile, checkpointing, expandable)
    return scalar_or_array(np.asarray(overhead) * allocated)


def sequences_that_fit(
    usable_bytes: ArrayLike,
    fixed_bytes: ArrayLike,
    per_sequence_bytes: ArrayLike,
    accelerator: ArrayLike = "cuda",
    regional_compile: ArrayLike = False,
    checkpointing: ArrayLike = False,
    expandable: ArrayLike = True,
) -> np.ndarray | float:
    """The most sequences per micro-batch whose :func:`peak_bytes` is within ``usable_bytes`` (0 if none; NaN
    where the usable memory is unknown)."""
    overhead = np.asarray(allocator_overhead(accelerator, regional_compile, checkpointing, expandable))
    with np.errstate(divide="ignore", invalid="ignore"):
        room = (np.asarray(usable_bytes, dtype=float) / overhead - np.asarray(fixed_bytes, dtype=float)) / (
            np.asarray(per_sequence_bytes, dtype=float)
        )
    return scalar_or_array(np.where(np.isfinite(room), np.maximum(np.floor(room), 0.0), np.nan))


def largest_fitting_divisor(per_gpu_batch: ArrayLike, fitting: ArrayLike) -> np.ndarray | float:
    """The micro-batch ``auto`` ends at: the largest divisor of the per-GPU batch that is at most ``fitting``
    sequences, or 1 when none fits (every divisor is a candidate, as in the probe's search; not only powers of
    two). ``fitting`` NaN (unknown memory) gives the whole per-GPU batch."""
    per_gpu = np.asarray(per_gpu_batch, dtype=float)
    limit = np.asarray(fitting, dtype=float)
    per_gpu, limit = np.broadcast_arrays(per_gpu, limit)
    out = np.ones(per_gpu.shape)
    for value in np.unique(per_gpu[np.isfinite(per_gpu) & (per_gpu >= 1)]):
        rows = per_gpu == value
        options = np.array(divisors(int(value)), dtype=float)
        index = np.searchsorted(options, np.where(np.isnan(limit[rows]), value, limit[rows]), side="right") - 1
        out[rows] = options[np.maximum(index, 0)]
    return scalar_or_array(out)


def largest_unit(
    num_parameters: ArrayLike, vocab_matrix: ArrayLike, largest_weight: ArrayLike, num_layers: ArrayLike
) -> np.ndarray | float:
    """Parameters of the largest unit the FSDP and mesh3d builds initialise whole on each rank
    (orchestrator/engines/materialising.py): a block (the parameters outside the input and
    output embeddings over the layers) or the largest weight (an embedding)."""
    psi = np.asarray(num_parameters, dtype=float)
    e = np.minimum(np.nan_to_num(np.asarray(vocab_matrix, dtype=float)), psi / 2.0)
    block = (psi - 2.0 * e) / np.maximum(np.asarray(num_layers, dtype=float), 1.0)
    return scalar_or_array(np.maximum(block, np.asarray(largest_weight, dtype=float)))


def micro_batch_that_fits(
    cfg: Config, memory_gib: float, fixed_bytes: float, accumulated_bytes: float = 0.0, per_gpu: int = 0
) -> int:
    """The most sequences per micro-batch that fit in ``memory_gib`` per GPU (at least 1), leaving
    :data:`DEFAULT_MARGIN` free, given the engine's ``fixed_bytes`` (what does not grow with the micro-batch), of
    which ``accumulated_bytes`` are held only while a step accumulates: the whole per-GPU batch ``per_gpu`` in one
    micro-step holds none of them, so it is tried without them first.

    Where the probe's search starts (each engine's ``estimate_micro_batch_size``); what decides is the measured
    trial, not this number. The predictor applies the same rule (:func:`largest_fitting_divisor`).
    """

    def fitting(fixed: float) -> float:
        return float(
            sequences_that_fit(
                memory_gib * GIB * (1.0 - DEFAULT_MARGIN),
                fixed,
                activation_bytes_per_sequence(cfg.model, cfg.method),
                regional_compile=compiles_regionally(cfg.method.compile, cfg.method.compile_scope),
                checkpointing=cfg.method.activation_checkpointing,
                expandable=expandable_segments(allocator_conf(cfg.cluster.env, cfg.gpu.accelerator)),
            )
        )

    if accumulated_bytes > 0 and per_gpu >= 1 and fitting(fixed_bytes - accumulated_bytes) >= per_gpu:
        return per_gpu
    return max(1, int(fitting(fixed_bytes)))


def scalar_or_array(value: np.ndarray | float) -> np.ndarray | float:
    """Scalars in, float out; arrays in, arrays out."""
    return float(value) if np.ndim(value) == 0 else value
