"""Untyped mappings stay at the edges where gpudays meets another library's plain data.

Past those edges a cell is the schema's dataclasses, a record's metrics are ``Metrics``, a table row is
``orchestrator.config.values.Row`` and a config tree is ``orchestrator.config.values.Container``. ``dict[str, Any]`` is left only
where a library hands over or takes untyped keyword data; each such module is named here with its edge, so a new
one is a decision a reviewer sees, not a drift.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNTYPED = "dict[str, Any]"

EDGES = {
    "orchestrator/store/record.py": "a record's JSON metrics, checked one by one, into Metrics(**values)",
    "orchestrator/config/schema.py": "a composed YAML/OmegaConf mapping into Config(**values)",
    "orchestrator/submission/launch.py": "submitit's SLURM executor parameters",
    "orchestrator/submission/local.py": "submitit's local executor parameters",
    "orchestrator/cluster/processes.py": "the local cluster's daemon list, JSON",
    "orchestrator/cluster/daemons.py": "the local cluster's daemon list, JSON",
    "analysis/sweeps/columns.py": "a pandas row's columns into a config dataclass",
    "orchestrator/cli/display/console.py": "rows handed to rich's table",
}
MOST = 20


def _uses() -> dict[str, int]:
    out: dict[str, int] = {}
    for package in ("orchestrator", "analysis"):
        for path in sorted((ROOT / package).rglob("*.py")):
            count = path.read_text().count(UNTYPED)
            if count:
                out[path.relative_to(ROOT).as_posix()] = count
    return out


def test_untyped_mappings_only_at_named_edges() -> None:
    uses = _uses()
    elsewhere = sorted(set(uses) - set(EDGES))
    assert not elsewhere, (
        f"{UNTYPED} in {', '.join(elsewhere)}: give the data a type (a dataclass, a TypedDict, "
        "orchestrator.config.values.Row or Container), or name the library edge in EDGES"
    )
    assert sum(uses.values()) <= MOST, f"{sum(uses.values())} uses of {UNTYPED}, at most {MOST}: {uses}"

