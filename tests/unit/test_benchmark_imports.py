"""Every script of benchmarks/ imports names that exist: a module moved or a name renamed in orchestrator/ or
analysis/ breaks a benchmark the moment it is run, and no other test runs most of them (they time real probes).

Checked without running the scripts: each ``from X import Y`` of the project's packages (or of a sibling script) is
looked up, so the check costs no probe and no second interpreter."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PROJECT = ("orchestrator", "analysis")
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def _top_level_names(path: Path) -> set[str]:
    """The names a script defines or imports at its top level (what ``from script import name`` can find)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _missing(script: Path) -> list[str]:
    """``module: name`` for each imported name of ``script`` that cannot be found."""
    missing = []
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT:
                    try:
                        importlib.import_module(alias.name)
                    except ImportError:
                        missing.append(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            root = node.module.split(".")[0]
            sibling = BENCHMARKS / f"{node.module}.py"
            if root in PROJECT:
                try:
                    module = importlib.import_module(node.module)
                except ImportError:
                    missing.append(node.module)
                    continue
                for alias in node.names:
                    if not hasattr(module, alias.name):
                        try:
                            importlib.import_module(f"{node.module}.{alias.name}")
                        except ImportError:
                            missing.append(f"{node.module}: {alias.name}")
            elif sibling.is_file():
                defined = _top_level_names(sibling)
                missing += [f"{node.module}: {a.name}" for a in node.names if a.name not in defined]
    return missing


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_every_name_a_benchmark_imports_exists(script: Path) -> None:
    assert _missing(script) == []


def test_a_moved_name_is_found_missing(tmp_path: Path) -> None:
    script = tmp_path / "moved.py"
    script.write_text(
        "from orchestrator.config.schema import register_configs\n"
        "from orchestrator.planning.compose_cache import register_configs as kept\n"
        "import orchestrator.no_such_module\n"
    )
    assert _missing(script) == ["orchestrator.config.schema: register_configs", "orchestrator.no_such_module"]
