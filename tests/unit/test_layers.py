"""The layers of the two packages, read from the source: no import goes up a layer, and no two modules import each
other, however indirectly.

    core  <-  runtime  <-  analysis  <-  command line

- core: the config and its domains, a cell and its id, the model families, records, states, the sweep folder's
  paths, batch arithmetic, SLURM's words;
- runtime: planning, submitting, running and classifying cells (sweep, launch, local, status, the job side, the
  probe, the engines, the throwaway cluster);
- analysis: the ``analysis`` package (predictor, tables, report);
- command line: ``gpudays``'s commands and what they print.

A module imports from its own layer and the layers below, never above. Every ``import`` statement counts:

- at the top of a module, and inside a function (an import deferred for start-up time is still a dependence);
- under ``if TYPE_CHECKING:`` too. A type-only import makes the module's signatures name the other module's types,
  so what the module means depends on it; with ``from __future__ import annotations`` it costs nothing to turn into
  a runtime import; and no module needs one that goes up.

Only the modules of the two packages are graphed; an import names the deepest of them it reaches
(``from orchestrator import status`` is ``orchestrator.status``; ``from orchestrator.models import FAMILIES`` is
``orchestrator.models``). Imports by name at run time (``importlib.import_module``) are not seen.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "analysis")

CORE, RUNTIME, ANALYSIS, COMMAND = range(4)
LAYER_NAMES = {CORE: "core", RUNTIME: "runtime", ANALYSIS: "analysis", COMMAND: "command line"}

LAYERS: dict[str, int] = {
    # ``name``: that module (a package: its __init__); ``name.*``: it and every module under it.
    "orchestrator": CORE,
    "orchestrator.schema": CORE,
    "orchestrator.prices": CORE,
    "orchestrator.values": CORE,
    "orchestrator.passthrough": CORE,
    "orchestrator.sbatch_template": CORE,
    "orchestrator.domains": CORE,
    "orchestrator.cells": CORE,
    "orchestrator.refusal": CORE,
    "orchestrator.models.*": CORE,
    "orchestrator.record": CORE,
    "orchestrator.states": CORE,
    "orchestrator.paths": CORE,
    "orchestrator.durable": CORE,
    "orchestrator.faults": CORE,
    "orchestrator.attempts": CORE,
    "orchestrator.adaptive_state": CORE,
    "orchestrator.batch": CORE,
    "orchestrator.slurm": CORE,
    "orchestrator.slurm_errors": CORE,
    "orchestrator.slurm_site": CORE,
    "orchestrator.job_env": CORE,
    "orchestrator.sweep": RUNTIME,
    "orchestrator.compose_cache": RUNTIME,
    "orchestrator.launch": RUNTIME,
    "orchestrator.quota": RUNTIME,
    "orchestrator.admission": RUNTIME,
    "orchestrator.probe_data": RUNTIME,
    "orchestrator.local": RUNTIME,
    "orchestrator.status": RUNTIME,
    "orchestrator.intents": RUNTIME,
    "orchestrator.jobside": RUNTIME,
    "orchestrator.probe": RUNTIME,
    "orchestrator.ranks": RUNTIME,
    "orchestrator.timing": RUNTIME,
    "orchestrator.search": RUNTIME,
    "orchestrator.metering": RUNTIME,
    "orchestrator.failures": RUNTIME,
    "orchestrator.build_cache": RUNTIME,
    "orchestrator.engines.*": RUNTIME,
    "orchestrator.cluster.*": RUNTIME,
    "analysis.*": ANALYSIS,
    "orchestrator.cli": COMMAND,
    "orchestrator.lifecycle": COMMAND,
    "orchestrator.console": COMMAND,
    "orchestrator.budget_cli": COMMAND,
    "orchestrator.prediction": COMMAND,
    "orchestrator.views": COMMAND,
    "orchestrator.tabular": COMMAND,
    "orchestrator.answers": COMMAND,
    "orchestrator.adaptive": COMMAND,
    "orchestrator.preview": COMMAND,
}

ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    # (importing module, imported module): why it stays for now. Each entry is a debt; remove it with the import.
    ("orchestrator.cells", "orchestrator.engines.registry"): (
        "a cell's checks, id and label ask every engine's spec (its options, the keys of its identity); the specs "
        "are pure rules beside each engine's runtime, so either they move down to core or the engines' rules are "
        "handed to cells by their caller: a change to orchestrator/engines/ and orchestrator/cells.py"
    ),
}


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


def _all_imports() -> list[Import]:
    return [
        imp
        for module, path in MODULES.items()
        for imp in imports_of(module, path.read_text(encoding="utf-8"), path.name == "__init__.py")
    ]


IMPORTS = _all_imports()


def layer_of(module: str) -> int | None:
    if module in LAYERS:
        return LAYERS[module]
    name = module
    while name:
        if f"{name}.*" in LAYERS:
            return LAYERS[f"{name}.*"]
        name = name.rpartition(".")[0]
    return None


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in MODULES if layer_of(m) is None)
    assert not missing, f"give these modules a layer in LAYERS (tests/unit/test_layers.py): {', '.join(missing)}"


def test_no_import_goes_up_a_layer() -> None:
    upward = []
    for imp in IMPORTS:
        low, high = layer_of(imp.importer), layer_of(imp.imported)
        if low is None or high is None or high <= low or (imp.importer, imp.imported) in ALLOWED_UPWARD:
            continue
        upward.append(
            f"{imp.where()}: {imp.importer} ({LAYER_NAMES[low]}) imports {imp.imported} ({LAYER_NAMES[high]})"
        )
    assert not upward, "imports that go up a layer:\n  " + "\n  ".join(upward)


def test_every_allowed_upward_import_is_still_there() -> None:
    present = {(imp.importer, imp.imported) for imp in IMPORTS}
    gone = [f"{a} -> {b}" for a, b in ALLOWED_UPWARD if (a, b) not in present]
    assert not gone, f"no longer imported; remove from ALLOWED_UPWARD: {', '.join(gone)}"


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
    for imp in IMPORTS:
        edges[imp.importer].add(imp.imported)
    said = []
    for component in _cycles(edges):
        members = set(component)
        lines = [
            f"    {imp.where()}: {imp.importer} imports {imp.imported}"
            for imp in IMPORTS
            if imp.importer in members and imp.imported in members
        ]
        said.append(f"  {' <-> '.join(component)}:\n" + "\n".join(lines))
    assert not said, "modules that import each other:\n" + "\n".join(said)


def test_the_reader_sees_local_type_checking_and_relative_imports() -> None:
    source = """
from typing import TYPE_CHECKING
import numpy
if TYPE_CHECKING:
    from analysis.report import Report
def f():
    from orchestrator import status, states
    import orchestrator.engines.base
from . import config
from .. import base
"""
    found = {(i.line, i.imported) for i in imports_of("orchestrator.engines.fsdp.memory", source)}
    assert found == {
        (5, "analysis.report"),
        (7, "orchestrator.status"),
        (7, "orchestrator.states"),
        (8, "orchestrator.engines.base"),
        (9, "orchestrator.engines.fsdp.config"),
        (10, "orchestrator.engines.base"),
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
