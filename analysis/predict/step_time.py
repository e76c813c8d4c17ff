"""The step-time model: the raw terms of one optimizer step and their uncalibrated coefficients.

Step time = Σ coefficient × term over :data:`TERMS`: seconds of compute at the reference rate (the matrix products
at the rate of each shape in the GPU's profile, :mod:`analysis.predict.measured_compute`: its measured one, or,
for a GPU type without one, the reference machine's carried to it by its datasheet,
:mod:`analysis.predict.reference_profile`), nominal seconds of communication and of offload, and the micro-steps
(the coefficient is a fixed cost per micro-step). The compute term also holds the memory-bound work as bytes over
the profile's bandwidth, and the micro-steps count only what neither explains (:mod:`analysis.predict.memory_bound`);
compile takes its share off either (``compiled_share``). A GPU type with neither a profile nor a datasheet
bandwidth (``gpu.memory_gbytes_s``; the CPU before its profile) has its step's hardware FLOPs over its dense peak,
and a fixed cost per micro-step that stands for the memory-bound work too. Uncalibrated, the coefficients are
:data:`DEFAULT_COEFFICIENTS`; :func:`analysis.predict.calibration.calibrate` fits them per GPU type to measured records.

Compute is the same for every engine, and so are micro-steps but for a pipeline, whose ranks each run a micro-batch
through their stages only (``micro_step_share``, :func:`analysis.predict.inputs.layout_terms`), and compute is
stretched by a pipeline's bubble and slowest stage (``compute_stretch``, costed at the achieved rate); the nominal seconds of communication and offload are each
cell's engine's (``EngineSpec.step_time_terms``, in ``orchestrator/engines/<name>/step_time.py``), given the
links of :func:`analysis.predict.network.links_for` (cited defaults, or a measured profile per GPU).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from analysis.predict.inputs import Inputs, layout_terms
from analysis.predict.measured_compute import profiled_compute
from analysis.predict.memory_bound import FIXED_S_PER_MICRO_STEP, compiled_share, memory_bound_s
from analysis.predict.network import MeasuredProfile, links_for
from analysis.predict.reference_profile import cited_profiles
from orchestrator.engines.memory import recomputes_layers
from orchestrator.engines.registry import by_engine

DEFAULT_EFFICIENCY = 0.54
"""Achieved share of the dense peak, before calibration, where no profile gives a rate (a GPU type without a
profile or a datasheet bandwidth; the FLOPs a profile did not measure), and the unit of the compute term: its
seconds are at this share of the peak. Set by the H100 records in tests/data/gpu-records (pythia-160m, 410m and
1b, free-lunch settings, bf16) before the cited profile existed: the step times of 410m and 1b, which share a
micro-step count (64), give 0.54 and :data:`DEFAULT_OVERHEAD_S_PER_MICRO_STEP` together."""
DEFAULT_OVERHEAD_S_PER_MICRO_STEP = 0.074
"""Seconds per micro-step that do not scale with FLOPs (kernel launches, the loss, DeepSpeed's hooks, and the
memory-bound work no bandwidth accounts for), set with :data:`DEFAULT_EFFICIENCY` by the same H100 records: 4.76 s
over 64 micro-steps. Where a profile (measured or cited) gives the memory's bandwidth the micro-step term is
scaled so that this coefficient gives :data:`analysis.predict.memory_bound.FIXED_S_PER_MICRO_STEP`."""

OVERLAP = 0.8
"""Share of a step's compute that communication issued beside it (``overlappable_s`` of an engine's terms:
prefetched gathers, asynchronous gradient reductions) can hide behind, on a GPU. Chosen, then checked on the
published pre-training runs (``benchmarks/published_runs.toml``, the scorecard's third part), since none of the
committed GPU records has more than one GPU: the published layouts the planner expresses are predicted with a
median error of 64% with no overlap, 54% at 0.5 and 34% at 0.8, the fastest settings' within ±30% 53%, 68% and
68%: the published runs' figures are therefore not independent evidence of this value. Not 1, as NCCL's kernels share the SMs and memory with the compute they overlap. The synthetic truth of
``tests/truth_grid.py``, whose own overlap leaves 30% of the communication exposed, prefers none (its adaptive
sweep's median error at 5% measured: 9.0% with none, 9.7% at 0.5, 9.5% at 0.8). Calibration leaves it alone (it
fits a coefficient on the exposed communication). What stays exposed is never below the engine's
``overlap_floor_s`` (the first gather, the last bucket) and never negative."""
OVERLAP_BY_ARCH: dict[str, float] = {"cpu": 0.0}
"""The CPU's gloo collectives run on the cores that compute (the probes' ranks use every core): nothing hides."""

TERMS = ("compute_s_at_reference", "communication_s", "offload_s", "micro_steps")
"""The raw step-time terms the coefficients multiply: seconds of compute at the reference rate (the dense peak,
or 1 TFLOP/s where none is known), nominal seconds of communication and of offload, and micro-steps."""
DEFAULT_COEFFICIENTS = np.array([1.0 / DEFAULT_EFFICIENCY, 1.0, 1.0, DEFAULT_OVERHEAD_S_PER_MICRO_STEP])
"""The uncalibrated multipliers of :data:`TERMS`."""


def step_terms(x: Inputs, accum: np.ndarray, profiles: Mapping[str, MeasuredProfile] | None = None) -> np.ndarray:
    """The raw terms of one optimizer step, one row per cell, columns as in :data:`TERMS`; ``profiles``: a measured
    profile by GPU name, whose links replace the cited defaults for that GPU's cells."""
    flops = x.batch * x.flops_per_sample
    reference = np.where(np.isnan(x.reference_tflops), 1.0, x.reference_tflops)
    # A family slower than the decoders per FLOP (its own COMPUTE_EFFICIENCY) scales its compute term by the ratio,
    # so one calibrated efficiency per GPU serves every family.
    family = np.where(np.isnan(x.family_efficiency), 1.0, DEFAULT_EFFICIENCY / x.family_efficiency)
    compute = flops / x.num_gpus / (reference * 1e12) * family
    # What compile leaves of the work outside the products: the fixed cost per micro-step stands for it.
    per_micro_step = compiled_share(x.compile, x.method["compile_scope"], x.arch)
    # A GPU type without a measured profile takes the reference machine's, carried to it by its datasheet.
    rates = {**cited_profiles(x.gpu, x.precision, x.reference_tflops, x.memory_bytes_s, profiles), **(profiles or {})}
    if rates:
        compute, structured = _profiled(x, accum, compute, family, rates, per_micro_step)
        # Where the profile gives the products and the memory's bandwidth, the memory-bound work is in the
        # compute term, and a micro-step's fixed cost is only what neither explains.
        per_micro_step = np.where(
            structured, per_micro_step * FIXED_S_PER_MICRO_STEP / DEFAULT_OVERHEAD_S_PER_MICRO_STEP, per_micro_step
        )
    links = links_for(x.gpu, x.arch, x.inter_node_bytes_s, profiles)
    engine = by_engine(x.engine, lambda spec: spec.step_time_terms(x, accum, links))
    # A micro-step's fixed cost, for the share of the model one micro-step of the cell's ranks runs (a pipeline
    # rank runs each of a schedule's micro-batches through its stages only).
    layout = layout_terms(x)
    micro_steps = accum.astype(float) * np.asarray(layout["micro_step_share"], dtype=float) * per_micro_step
    communication = engine["communication_s"] + exposed(
        engine["overlappable_s"], engine["overlap_floor_s"], compute / DEFAULT_EFFICIENCY, x.arch
    )
    # A pipeline's bubble and slowest stage stretch its compute: the wait is costed at the achieved rate.
    stretched = compute * np.asarray(layout["compute_stretch"], dtype=float)
    return np.column_stack([stretched, communication, engine["offload_s"], micro_steps])


def _profiled(
    x: Inputs,
    accum: np.ndarray,
    compute: np.ndarray,
    family: np.ndarray,
    profiles: Mapping[str, MeasuredProfile],
    compiled: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The compute term of the cells whose GPU has a profile, from its measured rates
    (:mod:`analysis.predict.measured_compute`), with the memory-bound work at its measured bandwidth
    (:mod:`analysis.predict.memory_bound`): the profiled seconds times :data:`DEFAULT_EFFICIENCY`, the FLOPs the
    profile lacks at the peak times that efficiency (or, without a peak, the profile's median rate); and whether
    the memory-bound work is in it (a profile with a bandwidth, a model with tokens, width and depth). ``compiled``:
    the share of that work compile leaves (``compiled_share``)."""
    micro_tokens = x.per_gpu_batch / np.maximum(accum.astype(float), 1.0) * x.tokens_per_sample
    recompute = np.asarray(recomputes_layers(x.checkpointing, x.method["checkpoint_policy"]), dtype=bool)
    seconds, rest, median = profiled_compute(x.models, x.gpu, x.precision, recompute, micro_tokens, profiles)
    fallback = np.where(np.isnan(x.reference_tflops), median, x.reference_tflops * 1e12 * DEFAULT_EFFICIENCY)
    profiled = x.batch / x.num_gpus * (seconds + rest * family / fallback)
    token_layers = x.batch * x.tokens_per_sample * x.hidden * x.layers / x.num_gpus
    memory = memory_bound_s(x.gpu, token_layers, recompute, profiles)
    memory *= compiled
    structured = np.isfinite(profiled) & np.isfinite(memory)
    profiled = np.where(structured, profiled + memory, profiled)
    out: np.ndarray = np.where(np.isfinite(profiled), DEFAULT_EFFICIENCY * profiled, compute)
    return out, structured


def exposed(overlappable: np.ndarray, floor: np.ndarray, compute_s: np.ndarray, arch: np.ndarray) -> np.ndarray:
    """Seconds of ``overlappable`` communication the compute (``compute_s``, at the default efficiency) leaves
    exposed: ``max(overlappable − overlap × compute, floor)``, at most all of it, never negative; ``overlap`` is
    :data:`OVERLAP`, or the device's own (:data:`OVERLAP_BY_ARCH`)."""
    overlap = np.array([OVERLAP_BY_ARCH.get(str(a), OVERLAP) for a in arch], dtype=float)
    hidden_left = overlappable - overlap * np.nan_to_num(compute_s)
    out: np.ndarray = np.clip(np.maximum(hidden_left, np.minimum(floor, overlappable)), 0.0, None)
    return out
