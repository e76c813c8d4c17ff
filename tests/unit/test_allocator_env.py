"""A CUDA probe's caching allocator runs with expandable segments unless the user chose otherwise, and the record
says what it ran with (orchestrator/job/env.py)."""

from __future__ import annotations

import pytest

from orchestrator.engines.allocator import DEFAULT_CUDA_ALLOC_CONF
from orchestrator.job.env import allocator_settings, set_allocator_env


@pytest.fixture(autouse=True)
def unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)


def test_a_cuda_probe_gets_expandable_segments_and_its_record_says_so() -> None:
    set_allocator_env("cuda")
    assert DEFAULT_CUDA_ALLOC_CONF == "expandable_segments:True"
    assert allocator_settings() == {"pytorch_alloc_conf": None, "pytorch_cuda_alloc_conf": DEFAULT_CUDA_ALLOC_CONF}


@pytest.mark.parametrize("name", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_the_users_setting_wins(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "max_split_size_mb:128")
    set_allocator_env("cuda")
    settings = allocator_settings()
    assert settings[name.lower()] == "max_split_size_mb:128"
    assert DEFAULT_CUDA_ALLOC_CONF not in settings.values()


def test_a_cpu_probe_is_left_alone() -> None:
    set_allocator_env("cpu")
    assert allocator_settings() == {"pytorch_alloc_conf": None, "pytorch_cuda_alloc_conf": None}
