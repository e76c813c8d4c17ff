"""The step-time model: the raw terms of one optimizer step and their uncalibrated coefficients.

Step time = Σ coefficient × term over :data:`TERMS`: seconds of compute at the reference rate (the step's hardware
FLOPs, recomputation included, over the GPUs' dense peak), nominal seconds of communication and of offload, and the
micro-steps (the coefficient is a fixed cost per micro-step). Uncalibrated, the coefficients are
:data:`DEFAULT_COEFFICIENTS`; :func:`analysis.predict.calibration.calibrate` fits them per GPU type to measured records.

Compute is the same for every engine, and so are micro-steps but for a pipeline, whose ranks each run a micro-batch
through their stages only (``micro_step_share``, :func:`analysis.predict.inputs.layout_terms`); the nominal seconds of communication and offload are each
cell's engine's (``EngineSpec.step_time_terms``, in ``orchestrator/engines/<name>/step_time.py``), given the
bandwidths below as :class:`orchestrator.engines.spec.Links`.
"""

from __future__ import annotations

import numpy as np

from analysis.predict.inputs import Inputs, layout_terms
from orchestrator.engines.registry import by_engine
from orchestrator.engines.spec import Links

DEFAULT_EFFICIENCY = 0.54
"""Achieved share of the dense peak in the matrix products, before calibration. Set by the H100 records in
tests/data/gpu-records (pythia-160m, 410m and 1b, free-lunch settings, bf16): the step times of 410m and 1b, which
share a micro-step count (64), give 0.54 and :data:`DEFAULT_OVERHEAD_S_PER_MICRO_STEP` together; 160m then lands
within 4%."""
DEFAULT_OVERHEAD_S_PER_MICRO_STEP = 0.074
"""Seconds per micro-step that do not scale with FLOPs (kernel launches, the loss, DeepSpeed's hooks), set with
:data:`DEFAULT_EFFICIENCY` by the same H100 records: 4.76 s over 64 micro-steps."""

# Nominal bandwidths (GB/s). Orders of magnitude only, for the uncalibrated prediction: calibration rescales
# the communication and offload terms to what the records show.
INTRA_NODE_BUSBW_GBPS: dict[str, float] = {
    "v100-32gb": 130.0,  # NVLink 2 (SXM2), typical NCCL all-reduce bus bandwidth
    "a100-40gb": 230.0,  # NVLink 3 (SXM4)
    "a100-80gb": 230.0,
    "h100-80gb": 360.0,  # NVLink 4 (SXM5)
    "h200": 360.0,
    "rtx3090": 12.0,  # PCIe 4.0 through the host, no NVLink assumed
    "a6000": 12.0,
    "l40s": 12.0,
    "a40": 12.0,
    "l40": 12.0,
    "cpu": 2.0,  # gloo over shared memory between processes
}
DEFAULT_INTRA_NODE_BUSBW_GBPS = 12.0
# Between nodes: each cell's share of its cluster's network (``Inputs.inter_node_bytes_s``, from
# analysis/predict/network.py, which budget, shortest and the offered layouts read too).
HOST_LINK_GBPS: dict[str, float] = {"volta": 12.0, "ampere": 20.0, "ada": 20.0, "hopper": 40.0, "cpu": 10.0}
DEFAULT_HOST_LINK_GBPS = 12.0
CPU_ADAM_PARAMS_PER_S_PER_NODE = 1e9
"""Parameters a node's CPU-Adam updates per second (DeepSpeed CPU-Adam, order of magnitude; FSDP's offloaded
AdamW is taken to run as fast)."""

TERMS = ("compute_s_at_reference", "communication_s", "offload_s", "micro_steps")
"""The raw step-time terms the coefficients multiply: seconds of compute at the reference rate (the dense peak,
or 1 TFLOP/s where none is known), nominal seconds of communication and of offload, and micro-steps."""
DEFAULT_COEFFICIENTS = np.array([1.0 / DEFAULT_EFFICIENCY, 1.0, 1.0, DEFAULT_OVERHEAD_S_PER_MICRO_STEP])
"""The uncalibrated multipliers of :data:`TERMS`."""


def step_terms(x: Inputs, accum: np.ndarray) -> np.ndarray:
    """The raw terms of one optimizer step, one row per cell, columns as in :data:`TERMS`."""
    flops = x.batch * x.flops_per_sample
    reference = np.where(np.isnan(x.reference_tflops), 1.0, x.reference_tflops)
    # A family slower than the decoders per FLOP (its own COMPUTE_EFFICIENCY) scales its compute term by the ratio,
    # so one calibrated efficiency per GPU serves every family.
    family = np.where(np.isnan(x.family_efficiency), 1.0, DEFAULT_EFFICIENCY / x.family_efficiency)
    compute = flops / x.num_gpus / (reference * 1e12) * family
    intra = np.array([INTRA_NODE_BUSBW_GBPS.get(g, DEFAULT_INTRA_NODE_BUSBW_GBPS) for g in x.gpu], dtype=float)
    host = np.array([HOST_LINK_GBPS.get(a, DEFAULT_HOST_LINK_GBPS) for a in x.arch], dtype=float)
    links = Links(
        intra_node=intra * 1e9,
        inter_node=x.inter_node_bytes_s,
        host=host * 1e9,
        cpu_adam_params_per_s_per_node=CPU_ADAM_PARAMS_PER_S_PER_NODE,
    )
    engine = by_engine(x.engine, lambda spec: spec.step_time_terms(x, accum, links))
    # A micro-step's fixed cost, for the share of the model one micro-step of the cell's ranks runs (a pipeline
    # rank runs each of a schedule's micro-batches through its stages only).
    micro_steps = accum.astype(float) * np.asarray(layout_terms(x)["micro_step_share"], dtype=float)
    return np.column_stack([compute, engine["communication_s"], engine["offload_s"], micro_steps])
