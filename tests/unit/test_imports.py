"""Every module of the two packages imports: a module removed or renamed under another's import is found here.

The type checker ignores imports it cannot resolve (third-party packages without stubs), so it cannot be relied on
to notice a missing project module.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import pytest
from benchmark_loader import load_benchmark

import analysis
import orchestrator

MODULES = sorted(
    info.name
    for package in (orchestrator, analysis)
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.")
    if not info.name.endswith(".__main__")  # runs its command when imported, by design
)


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name: str) -> None:
    importlib.import_module(name)


def test_the_submission_benchmark_says_when_the_launcher_it_compares_against_is_missing() -> None:
    module = load_benchmark("submit_1000")
    # With no hydra_plugins package installed, importlib's find_spec raises instead of answering None.
    assert module._launcher_installed() is (importlib.util.find_spec("hydra_plugins") is not None)


def test_a_job_pickled_before_the_packages_moved_still_unpickles() -> None:
    """A sweep submitted before the move pickled ``orchestrator.jobside.CellJob``; its held and requeued jobs
    unpickle that name after an upgrade, and get the job's entry as it is now."""
    import pickle

    from orchestrator.job.entry import CellJob

    job = CellJob("/sweeps/s", "abc123", 2)
    CellJob.__module__ = "orchestrator.jobside"  # pickle it as the old code did
    try:
        old = pickle.dumps(job)
    finally:
        CellJob.__module__ = "orchestrator.job.entry"
    assert b"orchestrator.jobside" in old
    back = pickle.loads(old)
    assert type(back) is CellJob and (back.sweep_root, back.cell_id, back.attempt) == ("/sweeps/s", "abc123", 2)
