"""The cells table's model and GPU columns, and the typed configs back from a row of them.

A cell's model is the whole :class:`~orchestrator.config.schema.ModelConfig`: every one of its fields is a ``model_*``
column, and every ``gpu_*`` column is a :class:`~orchestrator.config.schema.GpuConfig` field. The row is made by
:func:`orchestrator.cells.row.row`, and no list of keys is written by hand, so a field added to the schema reaches
the table, the calibration and the predictor by itself (the predictor once dropped ``num_kv_heads``, ``head_dim``
and ``tie_word_embeddings`` this way, and costed llama-3.2-1b at 1.60B parameters instead of 1.24B).

Values are coerced by the field's declared type (:func:`orchestrator.config.values.coerce`, named here too): text
for ``str``, a bool for ``bool``, a finite float (or None) for numbers, so that a column is one kind of thing
whatever the record held.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any, TypeVar

from orchestrator.config.schema import GpuConfig, ModelConfig
from orchestrator.config.values import as_bool, as_int, as_name, as_number, coerce, field_kinds

__all__ = [
    "ARCHITECTURE_FIELDS", "GPU_COLUMNS", "GPU_FIELDS", "MODEL_COLUMNS", "MODEL_FIELDS", "RUN_FIELDS", "as_bool",
    "as_int", "as_name", "as_number", "coerce", "config_of", "field_kinds", "model_of_row",
]  # fmt: skip

T = TypeVar("T", ModelConfig, GpuConfig)

MODEL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ModelConfig))
GPU_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(GpuConfig))
MODEL_COLUMNS: tuple[str, ...] = tuple(f"model_{name}" for name in MODEL_FIELDS)
GPU_COLUMNS: tuple[str, ...] = tuple(f"gpu_{name}" for name in GPU_FIELDS)

RUN_FIELDS = ("name", "num_parameters", "train_steps", "global_batch_size", "lr")
"""Model fields that describe the training run or label it, not the architecture a family builds."""
ARCHITECTURE_FIELDS: tuple[str, ...] = tuple(name for name in MODEL_FIELDS if name not in RUN_FIELDS)
"""Every field a family may read to count parameters, FLOPs and bytes (with ``seq_length``)."""


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
