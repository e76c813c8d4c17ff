"""The layers of the two packages, read from the source and keyed by package: each subpackage imports only the
packages its row below allows, no two modules import each other however indirectly, and only the job side and the
engines' runtimes import torch when their module loads.

Every ``import`` statement counts: at the top of a module, inside a function (an import deferred for start-up time
is still a dependence), and under ``if TYPE_CHECKING:`` (a type-only import makes the module's signatures name the
other package's types). An import names the deepest module of the two packages it reaches (``from
orchestrator.store import states`` is ``orchestrator.store.states``). Imports by name at run time
(``importlib.import_module``) are not seen.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "analysis")

# Each package (a module's package is the longest name here that prefixes it) and the packages it may import.
# Below these rows a package also imports itself. ``cli`` may import anything; nothing imports ``cli``.
_CONFIG, _STORE, _MODELS, _SLURM = (
    "orchestrator.config",
    "orchestrator.store",
    "orchestrator.models",
    "orchestrator.slurm",
)
_ENGINES, _CELLS, _JOB = "orchestrator.engines", "orchestrator.cells", "orchestrator.job"
_SWEEPS, _PREDICT = "analysis.sweeps", "analysis.predict"
_ANALYSIS_BASE = {_CONFIG, _STORE, _MODELS, _ENGINES, _CELLS}
MAY_IMPORT: dict[str, set[str]] = {
    _CONFIG: set(),  # typed config and its vocabulary: nothing of ours
    _STORE: {_CONFIG},  # the sweep folder on disk
    _MODELS: {_CONFIG},  # the families' arithmetic and builders
    _SLURM: {_CONFIG},  # everything said to or read from SLURM
    "orchestrator.cluster": {_CONFIG, _STORE},  # the throwaway cluster (writes its files atomically)
    _ENGINES: {_CONFIG, _MODELS},
    _CELLS: {_CONFIG, _MODELS, _ENGINES, _SLURM},  # a cell's checks ask the engines' rules and the site's options
    "orchestrator.planning": {_CONFIG, _STORE, _MODELS, _ENGINES, _CELLS, _SLURM},
    _JOB: {_CONFIG, _STORE, _MODELS, _ENGINES, _CELLS, _SLURM},  # never the submission side
    "orchestrator.profile": {_CONFIG, _STORE},  # the machine's measured rates, kept in a sweep folder
    # ... and a sweep's profile job (orchestrator.submission.profile_job) runs the profile's ranks
    "orchestrator.submission": {_CONFIG, _STORE, _MODELS, _ENGINES, _CELLS, _SLURM, _JOB, "orchestrator.profile"},
    _SWEEPS: _ANALYSIS_BASE,  # the analysis never imports the command line
    _PREDICT: _ANALYSIS_BASE | {_SWEEPS, "orchestrator.profile"},  # ... and reads the reference machine's profile
    "analysis.planners": _ANALYSIS_BASE | {_SWEEPS, _PREDICT},
    "analysis.report": _ANALYSIS_BASE | {_SWEEPS, _PREDICT, "analysis.planners"},
    "orchestrator.cli": {"*"},
}

ALLOWED: dict[tuple[str, str], str] = {
    # (importing module, imported module): why it crosses the rule.
    ("orchestrator.jobside", "orchestrator.job.entry"): (
        "the job's entry under its old path, which the pickles of sweeps submitted before the move name"
    ),
}

HEAVY = ("torch", "deepspeed", "transformers")
"""Loaded when a module loads only in the job side and the engines' runtimes; elsewhere deferred into the function
that needs it, or under ``TYPE_CHECKING``."""
HEAVY_AT_LOAD = ("orchestrator.job", "orchestrator.engines.mesh3d.parallelize")


@dataclass(frozen=True)
class Import:
    importer: str
    line: int
    imported: str

    def where(self) -> str:
        return f"{MODULES[self.importer].relative_to(ROOT)}:{self.line}"


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _deepest(name: str) -> str | None:
    """The module of the two packages that ``name`` (a module, or a name inside one) reaches."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, source: str, is_package: bool = False) -> Iterator[Import]:
    """Every import of a project module in ``source``: at the top, inside functions and under TYPE_CHECKING."""
    seen: set[Import] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".rstrip(".")
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = _deepest(name)
            found = Import(module, node.lineno, target) if target is not None and target != module else None
            if found is not None and found not in seen:
                seen.add(found)
                yield found


@functools.cache
def all_imports() -> list[Import]:
    """Every import in the two packages, read once, when a test first asks (not at collection, where both xdist
    workers would parse every module for the one that runs these tests)."""
    return [
        imp
        for module, path in MODULES.items()
        for imp in imports_of(module, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    ]


def package_of(module: str) -> str | None:
    """The longest package of ``MAY_IMPORT`` that holds ``module``; None for the two packages' own roots."""
    found = [p for p in MAY_IMPORT if module == p or module.startswith(p + ".")]
    return max(found, key=len) if found else None


def allowed(importer: str, imported: str) -> bool:
    """Whether the rule lets ``importer`` import ``imported``."""
    if (importer, imported) in ALLOWED:
        return True
    low, high = package_of(importer), package_of(imported)
    if high == "orchestrator.cli":
        return low == high
    if low is None:
        return high is None
    if high is None or high == low:
        return True
    return "*" in MAY_IMPORT[low] or high in MAY_IMPORT[low]


def test_every_module_has_a_package() -> None:
    roots = {"orchestrator", "analysis", *(a for a, _ in ALLOWED)}
    missing = sorted(m for m in MODULES if package_of(m) is None and m not in roots)
    assert not missing, f"give these modules a package in MAY_IMPORT (tests/unit/test_layers.py): {', '.join(missing)}"


def test_no_import_crosses_the_rule() -> None:
    crossing = [
        f"{imp.where()}: {imp.importer} ({package_of(imp.importer)}) imports {imp.imported} ({package_of(imp.imported)})"
        for imp in all_imports()
        if not allowed(imp.importer, imp.imported)
    ]
    assert not crossing, "imports the package rule does not allow:\n  " + "\n  ".join(crossing)


def test_every_allowed_exception_is_still_there() -> None:
    present = {(imp.importer, imp.imported) for imp in all_imports()}
    gone = [f"{a} -> {b}" for a, b in ALLOWED if (a, b) not in present]
    assert not gone, f"no longer imported; remove from ALLOWED: {', '.join(gone)}"


@pytest.mark.parametrize(
    ("importer", "imported", "ok"),
    [
        ("orchestrator.store.record", "orchestrator.config.schema", True),
        ("orchestrator.config.schema", "orchestrator.store.record", False),
        ("orchestrator.job.probe", "orchestrator.submission.launch", False),
        ("analysis.report.tables", "orchestrator.cli.display.views", False),
        ("orchestrator.submission.status", "orchestrator.cli.flow", False),
        ("orchestrator.cli.main", "orchestrator.cli.display.views", True),
        ("orchestrator.cli.flow", "analysis.report.writer", True),
        ("analysis.sweeps.records", "analysis.predict.predictor", False),
        ("orchestrator.profile.record", "orchestrator.store.paths", True),
        ("orchestrator.profile.runner", "orchestrator.job.ranks", False),
    ],
)
def test_the_rule_reads_as_written(importer: str, imported: str, ok: bool) -> None:
    assert allowed(importer, imported) is ok


def _heavy_at_load(source: str) -> Iterator[tuple[int, str]]:
    """Imports of torch, DeepSpeed or transformers that run when the module loads: at the top, not in a function
    and not under ``if TYPE_CHECKING:``."""

    def walk(nodes: list[ast.stmt]) -> Iterator[tuple[int, str]]:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.orelse)
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for block in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, block, []):
                        yield from walk(child.body if isinstance(child, ast.ExceptHandler) else [child])
            elif isinstance(node, ast.Import):
                yield from ((node.lineno, a.name) for a in node.names if a.name.split(".")[0] in HEAVY)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in HEAVY:
                yield node.lineno, node.module

    yield from walk(ast.parse(source).body)


def test_only_the_job_side_and_engine_runtimes_load_torch_with_the_module() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for module, path in MODULES.items()
        if not any(module == p or module.startswith(p + ".") for p in HEAVY_AT_LOAD) and not module.endswith(".engine")
        for line, name in _heavy_at_load(path.read_text(encoding="utf-8"))
    ]
    assert not found, "defer these into the function that needs them:\n  " + "\n  ".join(found)


def test_the_heavy_import_reader_sees_only_imports_at_load() -> None:
    source = """
import torch
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import deepspeed
try:
    from transformers import AutoConfig
except ImportError:
    pass
def f():
    import torch.nn
"""
    assert sorted(_heavy_at_load(source)) == [(2, "torch"), (7, "transformers")]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycle() -> None:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for imp in all_imports():
        edges[imp.importer].add(imp.imported)
    said = []
    for component in _cycles(edges):
        members = set(component)
        lines = [
            f"    {imp.where()}: {imp.importer} imports {imp.imported}"
            for imp in all_imports()
            if imp.importer in members and imp.imported in members
        ]
        said.append(f"  {' <-> '.join(component)}:\n" + "\n".join(lines))
    assert not said, "modules that import each other:\n" + "\n".join(said)


def test_the_reader_sees_local_type_checking_and_relative_imports() -> None:
    source = """
from typing import TYPE_CHECKING
import numpy
if TYPE_CHECKING:
    from analysis.report.writer import Report
def f():
    from orchestrator.submission import status
    from orchestrator.store import states
    import orchestrator.engines.base
from . import config
from .. import base
"""
    found = {(i.line, i.imported) for i in imports_of("orchestrator.engines.fsdp.memory", source)}
    assert found == {
        (5, "analysis.report.writer"),
        (7, "orchestrator.submission.status"),
        (8, "orchestrator.store.states"),
        (9, "orchestrator.engines.base"),
        (10, "orchestrator.engines.fsdp.config"),
        (11, "orchestrator.engines.base"),
    }


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
    ],
)
def test_cycles_are_found(edges: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert sorted(_cycles(edges)) == expected
