"""The cells table's model and GPU columns, derived from the schema's dataclasses, and the typed configs back.

A cell's model is the whole :class:`~orchestrator.config.schema.ModelConfig`: every one of its fields is a ``model_*``
column, and every ``gpu_*`` column is a :class:`~orchestrator.config.schema.GpuConfig` field. No list of keys is written
by hand, so a field added to the schema reaches the table, the calibration and the predictor by itself (the
predictor once dropped ``num_kv_heads``, ``head_dim`` and ``tie_word_embeddings`` this way, and costed
llama-3.2-1b at 1.60B parameters instead of 1.24B).

Values are coerced by the field's declared type: text for ``str``, a bool for ``bool``, a finite float (or None)
for numbers, so that a column is one kind of thing whatever the record held.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any, TypeVar

from orchestrator.config.schema import GpuConfig, ModelConfig
from orchestrator.config.values import Row

T = TypeVar("T", ModelConfig, GpuConfig)

MODEL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ModelConfig))
GPU_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(GpuConfig))
MODEL_COLUMNS: tuple[str, ...] = tuple(f"model_{name}" for name in MODEL_FIELDS)
GPU_COLUMNS: tuple[str, ...] = tuple(f"gpu_{name}" for name in GPU_FIELDS)

RUN_FIELDS = ("name", "num_parameters", "train_steps", "global_batch_size", "lr")
"""Model fields that describe the training run or label it, not the architecture a family builds."""
ARCHITECTURE_FIELDS: tuple[str, ...] = tuple(name for name in MODEL_FIELDS if name not in RUN_FIELDS)
"""Every field a family may read to count parameters, FLOPs and bytes (with ``seq_length``)."""


_KINDS: dict[type, dict[str, str]] = {}


def field_kinds(cls: type) -> dict[str, str]:
    """Each field's value kind, ``str``, ``bool``, ``int``, ``float`` or ``any``, from its annotation."""
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


def coerce(kind: str, value: Any) -> Any:
    """``value`` as the given kind, or None where it is missing or cannot be one (NaN, a bool for a number)."""
    if kind == "str":
        return as_name(value)
    if kind == "bool":
        return as_bool(value)
    if kind in ("int", "float"):
        return as_number(value)
    return value


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


def as_int(value: Any) -> int | None:
    out = as_number(value)
    return int(out) if out is not None and out == int(out) else None


def as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    return None


def as_name(value: Any) -> str | None:
    """Text, or None for anything missing, empty or NaN."""
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def columns_of(cls: type, prefix: str, values: Mapping[str, Any]) -> Row:
    """One config section (a mapping of ``cls``'s fields) as ``<prefix>_<field>`` columns, each value coerced."""
    kinds = field_kinds(cls)
    return {f"{prefix}_{name}": coerce(kind, values.get(name)) for name, kind in kinds.items()}


def config_of(cls: type[T], values: Mapping[str, Any], name: str = "unnamed") -> T | None:
    """The dataclass from its fields' values (a row's columns without prefix); None where a required field is
    missing or a value is not of its kind. Optional fields left empty take the schema's default; a missing
    ``name`` is ``name``."""
    kinds = field_kinds(cls)
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        value = coerce(kinds[f.name], values.get(f.name))
        if f.name == "name" and value is None:
            value = name
        if value is None:
            if f.default is MISSING or f.default == "???":  # omegaconf.MISSING is the string "???"
                return None
            continue
        if kinds[f.name] == "int":
            if value != int(value):
                return None
            value = int(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def model_of_row(row: Mapping[str, Any]) -> ModelConfig | None:
    """The cell's ``ModelConfig`` from a row's ``model_*`` columns (None where its architecture is incomplete)."""
    values = {k[6:]: v for k, v in row.items() if k.startswith("model_")}
    return config_of(ModelConfig, values, str(row.get("model") or "unnamed"))
