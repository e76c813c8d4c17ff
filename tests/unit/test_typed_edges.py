"""Untyped values stay at the edges where gpudays meets another library's plain data.

Past those edges a cell is the schema's dataclasses, a record's metrics are ``Metrics``, a table row is
``orchestrator.config.values.Row``, a config tree is ``orchestrator.config.values.Container``, a plan is
``orchestrator.planning.plan.Plan`` and a cell's state ``orchestrator.submission.status.CellState``.
``dict[str, Any]`` is left only where a library hands over or takes untyped keyword data; each such module is named
here with its edge, so a new one is a decision a reviewer sees, not a drift.

Every other ``Any`` is counted too, with ``Mapping[str, Any]`` and ``dict[str, object]`` (an untyped mapping by
other names), each under a ceiling set just above what is left: a new one where a project type exists fails here.
The arithmetic that takes one cell's figures or a whole column's (a float or a numpy array, the same formula) is
counted apart: it is typed ``ArrayLike`` in, ``np.ndarray | float`` out, and no ``Any`` is left there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "analysis")
UNTYPED = "dict[str, Any]"

EDGES = {
    "orchestrator/store/record.py": "a record's JSON metrics, checked one by one, into Metrics(**values)",
    "orchestrator/config/schema.py": "a composed YAML/OmegaConf mapping into Config(**values)",
    "orchestrator/cluster/processes.py": "the local cluster's daemon list, JSON",
    "orchestrator/cluster/daemons.py": "the local cluster's daemon list, JSON",
    "analysis/sweeps/columns.py": "a pandas row's columns into a config dataclass",
    "orchestrator/engines/materialising.py": "transformers' models by module name (their _init_weights is untyped)",
}
MOST = 6

ARITHMETIC = {
    "orchestrator/engines/memory.py": "bytes and fitting micro-batches of a cell or a column",
    "orchestrator/engines/deepspeed/memory.py": "ZeRO's bytes of a cell or a column",
    "orchestrator/engines/fsdp/memory.py": "FSDP's bytes of a cell or a column",
    "orchestrator/engines/mesh3d/memory.py": "a 3D layout's bytes of a cell or a column",
    "orchestrator/engines/mesh3d/step_time.py": "a pipeline's bubble of a cell or a column",
    "analysis/predict/estimates.py": "tokens, steps, days, GPU-hours and costs of a cell or a column",
}
"""Modules of arithmetic on a float or a numpy array (typed ``ArrayLike``, no ``Any``), with what they compute."""
ANY_MOST = 77
"""``Any`` outside :data:`ARITHMETIC`: torch, transformers, pandas and matplotlib objects, JSON and YAML data.
Lowered from 168 when ``engines.spec``'s link bandwidths, ``build_bytes`` and ``foreign`` were typed (6 uses), from
155 when the engines' runtime modules (compiling, materialising, the three engines, mesh3d's parallelize and the
engines' specs) were typed with torch's, DeepSpeed's and transformers' own types (52 uses), and from 103 when the
record's reader, the sweeps' table rows, the predictor's inputs and the model builders took ``object``, ``Row``,
``Container``, ``ConfigValue`` and transformers' ``PreTrainedConfig`` (26 uses)."""
ARITHMETIC_ANY_MOST = 0
"""Lowered from 159 to 47 when the DeepSpeed, FSDP and mesh3d memory models (and
``engines.memory.scalar_or_array``) were typed ``ArrayLike`` in, ``np.ndarray | float`` out, and to 0 when
engines/memory.py's (13) and analysis/predict/estimates.py's (34) were typed the same way."""
MAPPING_ANY_MOST = 9
"""Lowered from 32 (19 were left) when a record's fields as read, its environment and host load, the sweeps' table
rows, the stored configs and the predictor's columns took their values' types (``object``, ``Scalar``,
``ConfigValue``, a column's ``Iterable[object]``) or became ``Container`` (10 uses)."""
DICT_OBJECT_MOST = 22
"""Lowered from 47 (43 were left) when the sweeps' table rows became ``Row``, a record's metrics and the families'
transformers config arguments ``Container``, and the metrics' kinds ``type | GenericAlias`` (21 uses)."""

MAPPING_ANY = re.compile(r"Mapping\[str,\s*Any\]")
DICT_OBJECT = re.compile(r"dict\[str,\s*object\]")


def _sources() -> dict[str, str]:
    return {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _is_any(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any")


def any_uses(source: str) -> int:
    """Uses of the name ``Any`` in ``source``: in annotations, casts and aliases, and inside an annotation or a
    type alias written as a string (``X: TypeAlias = "dict[str, Any]"``); never in prose or an import."""
    tree = ast.parse(source)
    count = sum(1 for node in ast.walk(tree) if _is_any(node))
    quoted: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            quoted.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            quoted.append(node.returns)
        if isinstance(node, ast.AnnAssign) and node.value is not None and "TypeAlias" in ast.unparse(node.annotation):
            quoted.append(node.value)
    for expr in quoted:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            try:
                inner = ast.parse(expr.value, mode="eval")
            except SyntaxError:
                continue
            count += sum(1 for node in ast.walk(inner) if _is_any(node))
    return count


def _counts() -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {"any": {}, "arithmetic": {}, "mapping": {}, "dict_object": {}}
    for name, text in _sources().items():
        kind = "arithmetic" if name in ARITHMETIC else "any"
        for key, n in (
            (kind, any_uses(text)),
            ("mapping", len(MAPPING_ANY.findall(text))),
            ("dict_object", len(DICT_OBJECT.findall(text))),
        ):
            if n:
                found[key][name] = n
    return found


def _uses() -> dict[str, int]:
    return {name: n for name, text in _sources().items() if (n := text.count(UNTYPED))}


def test_untyped_mappings_only_at_named_edges() -> None:
    uses = _uses()
    elsewhere = sorted(set(uses) - set(EDGES))
    assert not elsewhere, (
        f"{UNTYPED} in {', '.join(elsewhere)}: give the data a type (a dataclass, a TypedDict, "
        "orchestrator.config.values.Row or Container), or name the library edge in EDGES"
    )
    assert sum(uses.values()) <= MOST, f"{sum(uses.values())} uses of {UNTYPED}, at most {MOST}: {uses}"


def test_every_named_edge_is_still_there() -> None:
    uses = _uses()
    gone = sorted(name for name in EDGES if name not in uses)
    assert not gone, f"no {UNTYPED} left in {', '.join(gone)}: remove it from EDGES"


def _most_first(uses: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(uses.items(), key=lambda kv: -kv[1])[:12])


def test_any_stays_under_its_ceilings() -> None:
    counts = _counts()
    for key, most, what in (
        ("any", ANY_MOST, "Any outside the arithmetic"),
        ("arithmetic", ARITHMETIC_ANY_MOST, "Any in the arithmetic (ARITHMETIC)"),
        ("mapping", MAPPING_ANY_MOST, "Mapping[str, Any]"),
        ("dict_object", DICT_OBJECT_MOST, "dict[str, object]"),
    ):
        total = sum(counts[key].values())
        assert total <= most, (
            f"{total} uses of {what}, at most {most}: give the value its project type (a dataclass, Plan, "
            f"CellState, Row, Container, Metrics) rather than raise the ceiling; most in {_most_first(counts[key])}"
        )


def test_every_arithmetic_module_is_still_there() -> None:
    sources = _sources()
    gone = sorted(name for name in ARITHMETIC if name not in sources)
    assert not gone, f"no longer there; remove from ARITHMETIC: {', '.join(gone)}"


def test_the_count_sees_every_spelling_of_any_and_no_prose() -> None:
    source = '''
"""Any value may come: prose is not counted."""
import typing
from typing import Any, TypeAlias
X: TypeAlias = "dict[str, Any]"
def f(a: Any, b: "list[Any]", c: typing.Any) -> Any:
    return typing.cast(Any, a)  # Any in a comment is not counted either
'''
    assert any_uses(source) == 6
