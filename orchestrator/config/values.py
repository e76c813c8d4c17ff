"""The plain values where gpudays meets tables and JSON: a cell's flat settings, a row of a table.

A table row (``cells.csv``, a terminal table, a planner's answer) holds one scalar per column; pandas reads and
writes rows of these. Anything richer (a model, a method, a record) is a dataclass of its own module. A column is
one kind of thing (:func:`coerce`): text, a flag, a finite number, or missing, whatever a stored config held.
"""

from __future__ import annotations

import math
import typing
from dataclasses import fields
from typing import Any, TypeAlias, cast

Scalar: TypeAlias = str | int | float | bool | None
"""One value of a table's column or of a flat setting: text, a number, a flag, or missing."""

Row: TypeAlias = dict[str, Scalar]
"""One row of a table by column name, or a cell's flat settings by key (``model.num_layers``, ``gpu``)."""

ConfigValue: TypeAlias = "str | int | float | bool | None | list[ConfigValue] | dict[str, ConfigValue]"
"""A value of a config tree as YAML and OmegaConf's containers hold it: a scalar, a list or a mapping of them."""

Container: TypeAlias = "dict[str, ConfigValue]"
"""A composed config as plain data: what ``cell.yaml`` and a record's ``config`` hold, and what Hydra composes
before :func:`orchestrator.config.schema.to_config` makes it the schema's dataclasses."""


_KINDS: dict[type, dict[str, str]] = {}


def field_kinds(cls: type) -> dict[str, str]:
    """Each field of dataclass ``cls`` with its value kind, ``str``, ``bool``, ``int``, ``float`` or ``any``, from
    its annotation (``Optional[int]`` is ``int``)."""
    if cls in _KINDS:
        return _KINDS[cls]
    hints = typing.get_type_hints(cls)
    out: dict[str, str] = {}
    for f in fields(cls):
        args = [a for a in typing.get_args(hints[f.name]) if a is not type(None)] or [hints[f.name]]
        kind = args[0]
        out[f.name] = kind.__name__ if kind in (str, bool, int, float) else "any"
    _KINDS[cls] = out
    return out


def coerce(kind: str, value: object) -> Scalar:
    """``value`` as the given kind, or None where it is missing or cannot be one (NaN, a bool for a number); a
    value of kind ``any`` as it is."""
    if kind == "str":
        return as_name(value)
    if kind == "bool":
        return as_bool(value)
    if kind in ("int", "float"):
        return as_number(value)
    return cast(Scalar, value)


def as_number(value: Any) -> float | None:
    """A finite float, or None for anything missing, non-numeric or not finite (bools are not numbers here)."""
    kind = type(value)
    if kind is float:  # the common cases first: this runs for every field of every record
        return value if math.isfinite(value) else None
    if kind is int:
        return float(value)
    if value is None or kind is bool:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def as_int(value: object) -> int | None:
    """A whole number, or None for anything else (see :func:`as_number`)."""
    out = as_number(value)
    return int(out) if out is not None and out == int(out) else None


def as_bool(value: object) -> bool | None:
    """A flag: a bool, ``true``/``false`` in any case, or 0 and 1; None for anything else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    return None


def as_name(value: object) -> str | None:
    """Text, or None for anything missing, empty or NaN."""
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)
