"""Every module of the two packages imports: a module removed or renamed under another's import is found here.

The type checker ignores imports it cannot resolve (third-party packages without stubs), so it cannot be relied on
to notice a missing project module.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

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
