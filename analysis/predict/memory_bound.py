"""Memory-bound work: what a micro-step spends outside its matrix products and attention, as bytes over the
machine's measured memory bandwidth, and what compile leaves of it.

Where a cell's GPU has a profile (``gpudays profile``, or the reference machine's carried to a GPU type without one,
:mod:`analysis.predict.reference_profile`), the step-time model (:mod:`analysis.predict.step_time`) takes
its products and attention at the profiled rates (:mod:`analysis.predict.measured_compute`); what a micro-step adds
to them is, measured on one H200 (``tests/data/gpu-records/h200``, README there):

- the element-wise work of every layer (norms, activation, residual adds, bias adds, rotary, the copies between
  them), whose bytes grow with tokens × hidden size × layers: :data:`BYTES_PER_TOKEN_HIDDEN_LAYER` bytes per
  token, hidden unit and layer, moved at the profile's stream bandwidth (the faster of its ``copy`` and ``add``);
- a fixed cost per micro-step (kernel launches, the engine's hooks): :data:`FIXED_S_PER_MICRO_STEP`.

Activation checkpointing runs the forward's share of that work again (:data:`RECOMPUTED_SHARE`). Compile fuses it:
:data:`COMPILED_SHARE` is the part a compiled cell keeps, of this work where the profile is known and of the fixed
cost per micro-step that stands for it where not. A tensor-parallel or pipeline rank does its share of the layers'
work, as of their FLOPs: a step's bytes are divided among the cell's GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from analysis.predict.network import MeasuredProfile

BYTES_PER_TOKEN_HIDDEN_LAYER = 243.0
"""Bytes moved per token, hidden unit and layer by a layer's element-wise work (bf16, eager). Fitted, with
:data:`FIXED_S_PER_MICRO_STEP`, to the H200 records of pythia-160m, 410m, 1b and 1.4b without compile or
checkpointing (DeepSpeed and FSDP2): what each micro-step took beyond its products and attention at the profiled
rates grows by 0.0555 s per 10⁹ token × hidden × layer (at the profile's 4,384 GB/s) over 0.6–1.6 × 10⁹, and the
five such cells' steps (pythia-160m under both engines) are then predicted within 2.0% (in-sample); the two
checkpointed cells, not fitted, within 1.8%."""
FIXED_S_PER_MICRO_STEP = 0.017
"""Seconds per micro-step that neither FLOPs nor bytes explain, fitted with :data:`BYTES_PER_TOKEN_HIDDEN_LAYER`."""
RECOMPUTED_SHARE = 1.0 / 3.0
"""The forward's share of a layer's element-wise traffic (the backward moves about twice the forward's), run again
under activation checkpointing."""
COMPILED_SHARE: dict[str, float] = {"regional": 0.1, "whole": 0.7}
"""What compile leaves of the memory-bound work and fixed cost, by ``compile_scope``. ``regional`` (each block and the
loss compiled, the engines' default): on the H200, pythia-160m's micro-step went from 0.199 to 0.135 s (DeepSpeed)
and from 0.203 to 0.139 s (FSDP2); with the profile that leaves nothing of the memory-bound work (the compiled step
is 9% under its profiled products and attention alone), and without one it leaves 0.23 of the fixed cost per
micro-step: 0.1 lies between the two. ``whole`` (DeepSpeed's whole-engine compile; the H100 records before regional
compile existed), set on those records with the cited profile (:mod:`analysis.predict.reference_profile`): compile
took pythia-160m's step from 7.22 to 5.94-6.09 s and pythia-410m's from 16.30 to 15.45 s, but pythia-1b's from
28.13 to 29.30 s; 0.7 gives the least root mean square of log(measured / predicted) over the 14 records (0.047;
0.051 at 0.8, 0.062 at 0.9, 0.077 at 1), the seven compiled ones in-sample."""

COMPILED_SHARE_BY_ARCH: dict[str, float] = {"cpu": 1.0}
"""Where compile leaves all of it: on the CPU, Inductor's C++ code took smollm2-tiny's step from 1.099 to 1.081 s in
the real CPU grid (``tests/data/cpu-grid``), 1.7%, within the grid's noise."""


def stream_bytes_s(profile: MeasuredProfile) -> float:
    """The profile's device-memory stream bandwidth (bytes/s), the faster of its figures; NaN where it has none."""
    rates = [m.bytes_moved / m.seconds for m in profile.memory if m.seconds > 0]
    return max(rates) if rates else float("nan")


def compiled_share(compiled: np.ndarray, scope: np.ndarray, arch: np.ndarray) -> np.ndarray:
    """Per cell, the share of memory-bound work and fixed cost left: 1 without compile, else the device's own
    (:data:`COMPILED_SHARE_BY_ARCH`) or :data:`COMPILED_SHARE` of its scope (an unknown scope: regional, the
    default)."""
    share = np.array(
        [
            COMPILED_SHARE_BY_ARCH.get(str(a), COMPILED_SHARE.get(str(s), COMPILED_SHARE["regional"]))
            for s, a in zip(scope, arch, strict=True)
        ],
        dtype=float,
    )
    out: np.ndarray = np.where(np.asarray(compiled, dtype=bool), share, 1.0)
    return out


def memory_bound_s(
    gpu: np.ndarray,
    token_layers: np.ndarray,
    recompute: np.ndarray,
    profiles: Mapping[str, MeasuredProfile] | None,
) -> np.ndarray:
    """Seconds of element-wise work per GPU for ``token_layers`` (tokens × hidden × layers each GPU's share of a step
    covers), at the stream bandwidth of the cell's GPU's profile; NaN where the GPU has none."""
    bandwidth, names = np.full(len(gpu), np.nan), gpu.astype(str)
    for name, profile in (profiles or {}).items():
        bandwidth[names == name] = stream_bytes_s(profile)
    traffic = BYTES_PER_TOKEN_HIDDEN_LAYER * token_layers * np.where(recompute, 1.0 + RECOMPUTED_SHARE, 1.0)
    out: np.ndarray = traffic / bandwidth
    return out


__all__ = (
    "BYTES_PER_TOKEN_HIDDEN_LAYER", "COMPILED_SHARE", "COMPILED_SHARE_BY_ARCH", "FIXED_S_PER_MICRO_STEP", "RECOMPUTED_SHARE",
    "compiled_share", "memory_bound_s", "stream_bytes_s",
)  # fmt: skip
