"""The reserved/allocated gap by allocator setting: expandable segments (the probe's default) with and without
checkpointing against the H200 records that ran with them, the H100's records without them, and which setting a
planned cell and a measured one are predicted with."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest
import synthetic

from analysis.sweeps.records import load_cells
from orchestrator.engines.allocator import DEFAULT_CUDA_ALLOC_CONF, allocator_conf, expandable_segments
from orchestrator.engines.memory import (
    ALLOCATOR_OVERHEAD,
    ALLOCATOR_OVERHEAD_REGIONAL_COMPILE,
    EXPANDABLE_OVERHEAD,
    EXPANDABLE_OVERHEAD_CHECKPOINTED,
    allocator_overhead,
)

RECORDS = Path(__file__).resolve().parents[2] / "data" / "gpu-records"


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ("expandable_segments:True", True),
        ("max_split_size_mb:128, expandable_segments:True", True),
        ("expandable_segments:False", False),
        ("expandable_segments:True,expandable_segments:False", False),  # the last one counts
        ("expandable_segments:true", False),  # torch accepts True or False only
        ("max_split_size_mb:128", False),
        (None, False),
        ("", False),
    ],
)
def test_an_allocator_setting_says_whether_segments_expand(conf: str | None, expected: bool) -> None:
    assert expandable_segments(conf) is expected


def test_a_cell_runs_with_its_users_allocator_setting_else_the_probes() -> None:
    assert allocator_conf({}, "cuda") == DEFAULT_CUDA_ALLOC_CONF
    assert allocator_conf(None, "cuda") == DEFAULT_CUDA_ALLOC_CONF
    assert allocator_conf({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, "cuda") == (
        "expandable_segments:False"
    )
    both = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    assert allocator_conf(both, "cuda") == "expandable_segments:True", "torch reads PYTORCH_ALLOC_CONF first"
    assert allocator_conf({}, "cpu") is None


def test_the_gap_follows_the_setting() -> None:
    got = allocator_overhead(
        ["cuda"] * 5 + ["cpu"],
        [False, False, True, False, False, False],
        [False, True, False, False, True, True],
        [True, True, True, False, False, True],
    ).tolist()
    assert got == [
        EXPANDABLE_OVERHEAD, EXPANDABLE_OVERHEAD_CHECKPOINTED, ALLOCATOR_OVERHEAD_REGIONAL_COMPILE,
        ALLOCATOR_OVERHEAD, ALLOCATOR_OVERHEAD, 1.0,
    ]  # fmt: skip


def _ratios(folder_glob: str) -> dict[str, list[float]]:
    """Reserved over allocated peaks of the records under ``folder_glob``, by setting."""
    out: dict[str, list[float]] = {"plain": [], "checkpointed": [], "regional": [], "expandable": []}
    for path in sorted(RECORDS.glob(f"{folder_glob}/*.json")):
        record = json.loads(path.read_text())
        m, method, env = record["metrics"], record["config"]["method"], record["environment"]
        if record["status"] != "ok" or not m.get("peak_memory_reserved_gib"):
            continue
        conf = env.get("pytorch_alloc_conf") or env.get("pytorch_cuda_alloc_conf")
        out["expandable"].append(float(expandable_segments(conf)))
        ratio = m["peak_memory_reserved_gib"] / m["peak_memory_allocated_gib"]
        if method.get("compile") and method.get("compile_scope", "regional") == "regional":
            out["regional"].append(ratio)
        elif method.get("activation_checkpointing"):
            out["checkpointed"].append(ratio)
        else:
            out["plain"].append(ratio)
    return out


def test_the_h200_records_set_the_gap_with_expandable_segments() -> None:
    # In-sample: the figures are these records' medians (the regional one their highest).
    h200 = _ratios("h200*")
    assert h200["expandable"] and all(h200["expandable"]), "every H200 record ran with expandable segments"
    assert len(h200["plain"]) == 14 and len(h200["checkpointed"]) == 4 and len(h200["regional"]) == 6
    assert statistics.median(h200["plain"]) == pytest.approx(EXPANDABLE_OVERHEAD, abs=0.005)
    assert statistics.median(h200["checkpointed"]) == pytest.approx(EXPANDABLE_OVERHEAD_CHECKPOINTED, abs=0.01)
    assert max(h200["regional"]) <= ALLOCATOR_OVERHEAD_REGIONAL_COMPILE + 0.002
    # Checkpointing's gap is above every plain cell's but the highest (pythia-160m at micro-batch 32).
    assert min(h200["checkpointed"]) > sorted(h200["plain"])[-4]
    # Without expandable segments (the H100's records, none checkpointed): the one figure of before.
    h100 = _ratios("h100-80gb")
    assert not any(h100["expandable"])
    assert statistics.median(h100["plain"] + h100["regional"]) == pytest.approx(ALLOCATOR_OVERHEAD, abs=0.005)


def _sweep(tmp_path: Path, environment: dict[str, object] | None, cluster_env: dict[str, str]) -> object:
    config = synthetic.cell_config("pythia-160m", "h100-80gb")
    config["cluster"]["env"] = cluster_env
    record = None
    if environment is not None:
        record = synthetic.record("c1", config, "ok", synthetic.metrics(config, 1.0, 8))
        record = dataclasses.replace(record, environment={**record.environment, **environment})
    synthetic.write_cell(tmp_path, "c1", config, record)
    return load_cells([tmp_path]).frame["allocator_expandable_segments"].iloc[0]


@pytest.mark.parametrize(
    ("environment", "cluster_env", "expected"),
    [
        (None, {}, True),  # planned: the probe's default
        (None, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, False),  # planned: the user's setting
        ({"pytorch_alloc_conf": None, "pytorch_cuda_alloc_conf": DEFAULT_CUDA_ALLOC_CONF}, {}, True),
        ({"pytorch_alloc_conf": None, "pytorch_cuda_alloc_conf": None}, {}, False),  # ran with torch's default
        ({}, {}, False),  # a record made before gpudays set the allocator
    ],
    ids=["planned", "planned-user-off", "measured-default", "measured-unset", "measured-before"],
)
def test_a_cell_is_predicted_with_the_allocator_it_ran_or_will_run_with(
    tmp_path: Path, environment: dict[str, object] | None, cluster_env: dict[str, str], expected: bool
) -> None:
    assert bool(_sweep(tmp_path, environment, cluster_env)) is expected
