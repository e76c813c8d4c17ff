"""The cited profile (analysis/predict/reference_profile.py): a GPU type without a measured profile is predicted
with the reference machine's, carried by its datasheet's peak and memory bandwidth; a measured one replaces it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.predict.inputs import Inputs, inputs_from_columns
from analysis.predict.measured_compute import ProductRates
from analysis.predict.memory_bound import stream_bytes_s
from analysis.predict.reference_profile import (
    REFERENCE,
    carried_profile,
    cited_profiles,
    reference_profile,
    widest_product_share,
)
from analysis.predict.step_time import step_terms

ROOT = Path(__file__).resolve().parents[3]
ACCUM = np.array([8.0])


A100 = 2039.0
"""The A100 SXM4 80GB's memory bandwidth, GB/s (conf/gpu/a100-80gb.yaml)."""


def cell(gpu: str = "a100-80gb", peak: float | None = 312.0, bandwidth: float | None = A100, **columns: Any) -> Inputs:
    base: dict[str, Any] = {
        "model_family": "gpt_neox", "model_num_layers": 16, "model_hidden_size": 2048, "model_num_heads": 8,
        "model_vocab_size": 50304, "model_seq_length": 2048, "model_global_batch_size": 64, "gpu": gpu,
        "gpu_architecture": "ampere", "gpu_memory_gib": 80, "gpu_peak_tflops_bf16": peak,
        "gpu_memory_gbytes_s": bandwidth,
        "gpu_peak_tflops_fp32": 19.5, "num_gpus": 8, "num_nodes": 1, "precision": "bf16",
    }  # fmt: skip
    return inputs_from_columns({k: [v] for k, v in {**base, **columns}.items()}, 1)


def test_the_reference_is_the_h200_records_profile_unmodified() -> None:
    (measured,) = (ROOT / "tests/data/gpu-records/h200/profile").glob("nvidia-h200-*.json")
    assert REFERENCE.read_bytes() == measured.read_bytes()


def test_a_carried_profile_is_the_reference_at_the_gpus_peak_and_bandwidth() -> None:
    reference, a100 = reference_profile(), carried_profile(312.0, 2039.0)
    for dtype in ("bf16", "fp16"):
        carried = [t for t in a100.matmuls if t.dtype == dtype]
        assert len(carried) == len(reference.matmuls)
        for mine, theirs in zip(carried, reference.matmuls, strict=True):
            assert mine.seconds == pytest.approx(theirs.seconds * 989.0 / 312.0)
    assert stream_bytes_s(a100) == pytest.approx(stream_bytes_s(reference) * 2039.0 / 4800.0)
    # the same share of the peak and of the bandwidth as the reference reached
    assert stream_bytes_s(a100) / 2039e9 == pytest.approx(stream_bytes_s(reference) / 4800e9)
    assert a100.collectives == ()


def test_a_gpu_without_a_measured_profile_is_predicted_with_its_carried_one() -> None:
    x = cell()
    cited = step_terms(x, ACCUM)
    given = step_terms(x, ACCUM, {"a100-80gb": carried_profile(312.0, A100)})
    assert cited[0] == pytest.approx(given[0])
    # and differs from the peak's term: the products at their shapes' rates, the memory-bound work at the bandwidth
    unlisted = step_terms(cell(bandwidth=None), ACCUM)
    assert cited[0, 0] != pytest.approx(unlisted[0, 0], rel=1e-3)
    assert cited[0, 3] < unlisted[0, 3]  # the fixed cost per micro-step is only what neither explains


def test_a_measured_profile_replaces_the_cited_one() -> None:
    x = cell()
    slower = carried_profile(312.0 / 2, A100 / 2)
    assert step_terms(x, ACCUM, {"a100-80gb": slower})[0, 0] == pytest.approx(2 * step_terms(x, ACCUM)[0, 0])


def test_a_slower_memory_makes_the_same_products_slower_by_their_memory_bound_work() -> None:
    h100 = step_terms(cell(gpu="h100-80gb", peak=989.0, bandwidth=3350.0), ACCUM)[0, 0]
    h200 = step_terms(cell(gpu="h200", peak=989.0, bandwidth=4800.0), ACCUM)[0, 0]
    assert h100 > h200  # 3,350 GB/s against 4,800, the same GH100 peak


def test_what_the_reference_did_not_measure_keeps_the_peaks_term() -> None:
    # fp32 was not measured: no cited profile for it, the peak's term stays (as without a datasheet bandwidth)
    fp32 = step_terms(cell(precision="fp32"), ACCUM)[0]
    assert fp32 == pytest.approx(step_terms(cell(bandwidth=None, precision="fp32"), ACCUM)[0])
    for x in (cell(peak=None), cell(bandwidth=None)):
        assert cited_profiles(x.gpu, x.precision, x.reference_tflops, x.memory_bytes_s, None) == {}
    x = cell()
    assert cited_profiles(x.gpu, x.precision, x.reference_tflops, x.memory_bytes_s, {"a100-80gb": object()}) == {}
    assert cited_profiles(x.gpu, x.precision, x.reference_tflops, x.memory_bytes_s, None)["a100-80gb"] == (
        carried_profile(312.0, A100)
    )


def test_a_product_wider_than_every_measured_one_takes_the_widest_ones_rate() -> None:
    rates = ProductRates(reference_profile())
    widest, per_flop = rates.largest["bf16"]
    assert widest == 2048  # pythia-1b's shapes
    assert rates.seconds_per_flop(("outer", 4096, 11008), "bf16", 4096) == per_flop
    assert rates.seconds_per_flop(("inner", 4096, 4096), "bf16", 4096) == per_flop
    # one no wider than the widest measured and not measured itself: none (the peak's rate then serves)
    assert rates.seconds_per_flop(("outer", 2048, 5632), "bf16", 4096) is None
    assert rates.seconds_per_flop(("outer", 512, 8192), "bf16", 4096) is None
    assert 0.6 < widest_product_share() < 0.7  # the H200's 2048-wide products reached 63-72% of its peak


def test_every_gpu_with_a_peak_has_its_datasheet_bandwidth() -> None:
    import yaml

    for path in sorted((ROOT / "conf/gpu").glob("*.yaml")):
        gpu = yaml.safe_load(path.read_text())
        if gpu.get("peak_tflops_bf16") or gpu.get("peak_tflops_fp16"):
            assert gpu.get("memory_gbytes_s", 0) > 0, path.name
    assert yaml.safe_load((ROOT / "conf/gpu/h200.yaml").read_text())["memory_gbytes_s"] == 4800  # the reference


def test_carrying_keeps_every_other_figure() -> None:
    a100 = carried_profile(312.0, 2039.0)
    reference = reference_profile()
    assert a100.identity == reference.identity and len(a100.attention) == 2 * len(reference.attention)
    assert [dataclasses.replace(m, seconds=0.0) for m in a100.memory] == [
        dataclasses.replace(m, seconds=0.0) for m in reference.memory
    ]
