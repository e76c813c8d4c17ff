"""A small soak on the real local cluster: a sweep of two dozen cells under cancellations, a requeue, a node
killed for a while and gpudays itself killed mid-submission, then resumed; every cell must end ok exactly once,
with one job per attempt. ``benchmarks/soak.py`` is the full size."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import ModuleType

import pytest
from benchmark_loader import load_benchmark

from orchestrator.cluster import LocalCluster

pytestmark = pytest.mark.slurm


def load_soak() -> ModuleType:
    return load_benchmark("soak")


def test_a_sweep_under_faults_ends_with_every_cell_ok_once(slurm_cluster: LocalCluster) -> None:
    soak = load_soak()
    # Cells sleep 4 s, so that tasks cancelled or requeued while running are caught before they end.
    settings = soak.SoakSettings(cells=24, seed=1, sleep_s=4.0, node_down_s=25.0, drain_timeout_s=240.0,
                                 resume_timeout_s=120.0, max_resumes=2)  # fmt: skip
    # Not pytest's tmp_path: the jobs write records into the sweep folder as they run, like users' folders.
    with tempfile.TemporaryDirectory(prefix="gpudays-soak-test-") as work:
        result = soak.run_soak(slurm_cluster, Path(work) / "sweep", settings)
        print(soak.report(result))
    assert any("before it started" in fault for fault in result.faults), result.faults
    # gpudays itself was SIGKILLed mid-submission, the sweep and a resume (benchmarks/soak.py's kill_gpudays).
    assert any(fault.startswith("killed gpudays sweep after its second sbatch") for fault in result.faults)
    assert any(fault.startswith("gpudays resume killed after its first sbatch") for fault in result.faults)
    assert result.drained_s is not None, result.problems
    # The cancelled array (6 cells), the cancelled tasks and those on the killed node needed another attempt.
    assert len(result.reruns) >= 6
    assert result.problems == []
