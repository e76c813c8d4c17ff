"""The plain values where gpudays meets tables and JSON: a cell's flat settings, a row of a table.

A table row (``cells.csv``, a terminal table, a planner's answer) holds one scalar per column; pandas reads and
writes rows of these. Anything richer (a model, a method, a record) is a dataclass of its own module.
"""

from __future__ import annotations

from typing import TypeAlias

Scalar: TypeAlias = str | int | float | bool | None
"""One value of a table's column or of a flat setting: text, a number, a flag, or missing."""

Row: TypeAlias = dict[str, Scalar]
"""One row of a table by column name, or a cell's flat settings by key (``model.num_layers``, ``gpu``)."""

ConfigValue: TypeAlias = "str | int | float | bool | None | list[ConfigValue] | dict[str, ConfigValue]"
"""A value of a config tree as YAML and OmegaConf's containers hold it: a scalar, a list or a mapping of them."""

Container: TypeAlias = "dict[str, ConfigValue]"
"""A composed config as plain data: what ``cell.yaml`` and a record's ``config`` hold, and what Hydra composes
before :func:`orchestrator.config.schema.to_config` makes it the schema's dataclasses."""
