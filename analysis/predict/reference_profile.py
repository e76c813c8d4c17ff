"""The cited machine profile: what a GPU type without a measured profile is predicted with.

One machine was profiled and probed together (``tests/data/gpu-records/h200``: an NVIDIA H200, with the records of
its cells). Its profile, ``reference/nvidia-h200.json`` beside this module (the unmodified file), gives the share
of the dense peak each of a model's matrix products and attention reached, and the share of the datasheet's
memory bandwidth its streams reached. A GPU type with no profile of its own is predicted with that profile carried
to it by its datasheet:

- each product and attention at the reference's seconds × (the reference's dense peak / the GPU's), for bf16 and
  fp16 (the precisions the reference measured; fp16's tensor peak is bf16's on every GPU of ``conf/gpu``), so at
  the same share of its own peak;
- the memory streams at the reference's seconds × (the reference's datasheet bandwidth / the GPU's, its config's
  ``memory_gbytes_s``), so at the same share of its own bandwidth;
- no collectives: the links stay the cited defaults of :mod:`analysis.predict.network`.

The step-time model (:mod:`analysis.predict.step_time`) then takes the same structure with or without a measured
profile: the products at their shape's rate (:mod:`analysis.predict.measured_compute`), the memory-bound work as
bytes over bandwidth (:mod:`analysis.predict.memory_bound`), a small fixed cost per micro-step. Checked on the
H100 (the same GH100 die as the H200, with 3,350 GB/s of memory instead of 4,800): its seven records without
compile, which set nothing, are predicted within a median 2.5% and at most 5.3% (``python benchmarks/scorecard.py``,
part 1, "Uncalibrated"; the seven compiled ones set what whole compile leaves,
:data:`analysis.predict.memory_bound.COMPILED_SHARE`). A GPU type whose config gives no ``memory_gbytes_s`` (or no
dense peak) is not carried to: its compute stays at the peak times the default efficiency.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import cache
from pathlib import Path

import numpy as np

from analysis.predict.measured_compute import product_rates
from analysis.predict.network import MeasuredProfile
from analysis.sweeps.catalog import gpu_config
from orchestrator.profile.record import Profile, read_profile

REFERENCE = Path(__file__).with_name("reference") / "nvidia-h200.json"
"""The reference machine's profile: ``tests/data/gpu-records/h200/profile``'s file, unmodified."""
REFERENCE_GPU = "h200"
"""The reference machine's GPU type in ``conf/gpu``: its dense peak and datasheet bandwidth (989 TFLOP/s bf16,
4,800 GB/s; its profile's streams reached 4,384 GB/s) are what the profile is carried from."""
PRECISIONS = ("bf16", "fp16")
"""The precisions the reference's products and attention were measured in, and carried to."""


@cache
def reference_profile() -> Profile:
    return read_profile(REFERENCE)


def _reference_peak_tflops() -> float:
    peak = gpu_config(REFERENCE_GPU).peak_tflops_bf16
    assert peak is not None, f"conf/gpu/{REFERENCE_GPU}.yaml has no peak_tflops_bf16"
    return peak


def _reference_gbytes_s() -> float:
    bandwidth = gpu_config(REFERENCE_GPU).memory_gbytes_s
    assert bandwidth is not None, f"conf/gpu/{REFERENCE_GPU}.yaml has no memory_gbytes_s"
    return bandwidth


def widest_product_share(dtype: str = PRECISIONS[0]) -> float:
    """The share of the dense peak the reference's widest products reached (the median of those whose smaller
    fixed dimension is the largest measured): the rate a wider product is taken at
    (:class:`analysis.predict.measured_compute.ProductRates`)."""
    _, per_flop = product_rates(reference_profile()).largest[dtype]
    return 1.0 / (per_flop * _reference_peak_tflops() * 1e12)


@cache
def carried_profile(peak_tflops: float, memory_gbytes_s: float) -> Profile:
    """The reference profile carried to a GPU of ``peak_tflops`` (dense bf16/fp16) and ``memory_gbytes_s``."""
    reference = reference_profile()
    compute, memory = _reference_peak_tflops() / peak_tflops, _reference_gbytes_s() / memory_gbytes_s
    matmuls = tuple(
        dataclasses.replace(t, dtype=dtype, seconds=t.seconds * compute)
        for dtype in PRECISIONS
        for t in reference.matmuls
        if t.dtype == PRECISIONS[0]
    )
    attention = tuple(
        dataclasses.replace(a, dtype=dtype, forward_s=a.forward_s * compute, backward_s=a.backward_s * compute)
        for dtype in PRECISIONS
        for a in reference.attention
        if a.dtype == PRECISIONS[0]
    )
    streams = tuple(dataclasses.replace(m, seconds=m.seconds * memory) for m in reference.memory)
    return dataclasses.replace(reference, matmuls=matmuls, attention=attention, memory=streams, collectives=())


def cited_profiles(
    gpu: np.ndarray,
    precision: np.ndarray,
    reference_tflops: np.ndarray,
    memory_bytes_s: np.ndarray,
    measured: Mapping[str, MeasuredProfile] | None,
) -> dict[str, Profile]:
    """A carried profile for every GPU type of the cells that has none measured (``measured``, by GPU name), a
    datasheet bandwidth (``memory_bytes_s``) and a dense peak in a precision the reference measured; by GPU name.
    A GPU type's first such cell gives its figures (its config's: the same in every cell of it)."""
    out: dict[str, Profile] = {}
    names = gpu.astype(str)
    carried = np.isin(precision.astype(str), PRECISIONS) & np.isfinite(reference_tflops) & np.isfinite(memory_bytes_s)
    for name in np.unique(names[carried]).tolist():
        if name in (measured or {}):
            continue
        row = int(np.flatnonzero(carried & (names == name))[0])
        out[name] = carried_profile(float(reference_tflops[row]), float(memory_bytes_s[row]) / 1e9)
    return out


__all__ = (
    "REFERENCE", "REFERENCE_GPU", "carried_profile", "cited_profiles", "reference_profile",
    "widest_product_share",
)  # fmt: skip
