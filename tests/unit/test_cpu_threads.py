"""Threads of a CPU rank (orchestrator/job/env.py ``cpu_threads``): what the scheduler gave it, never more than the
cores it may run on, so that a node claiming more CPUs than its host has does not time the scheduler."""

from __future__ import annotations

import os

import pytest

from orchestrator.job.env import cpu_threads


def host(monkeypatch: pytest.MonkeyPatch, cores: int, affinity: int) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)))


def test_an_honest_node_gives_each_rank_what_the_scheduler_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    host(monkeypatch, cores=64, affinity=64)  # unbound: the whole node, shared by 8 ranks of 8 cores each
    assert cpu_threads(8, local_ranks=8) == 8
    host(monkeypatch, cores=64, affinity=8)  # bound (--cpu-bind=cores) to the 8 cores given
    assert cpu_threads(8, local_ranks=8) == 8


def test_an_overcommitted_node_shares_the_cores_it_has(monkeypatch: pytest.MonkeyPatch) -> None:
    # A test cluster whose nodes claim 8 CPUs on a 2-core host: 4 threads a rank were 8 on 2 cores for two ranks.
    host(monkeypatch, cores=2, affinity=2)
    assert cpu_threads(4, local_ranks=1) == 2
    assert cpu_threads(4, local_ranks=2) == 1
    assert cpu_threads(4, local_ranks=4) == 1, "never none"
    host(monkeypatch, cores=4, affinity=2)  # bound to 2 cores of its own while asking for 4
    assert cpu_threads(4, local_ranks=2) == 2
    host(monkeypatch, cores=64, affinity=16)  # confined to the job's 16 cores of this node, 2 ranks of 8
    assert cpu_threads(8, local_ranks=2) == 8
