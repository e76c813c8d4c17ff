"""A cell's config (``cell.yaml``): its one reader (moved out of ``orchestrator.store.record``, which re-exports
it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.values import Container
from orchestrator.store.paths import read_regular_file

_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser where PyYAML has it


class _CellLoader(_BaseLoader):  # type: ignore[misc]
    """YAML 1.1 as PyYAML reads it, but ``1e-05`` is a float (as JSON and OmegaConf read it), not a string."""


_CellLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


class BadCellConfig(ValueError):
    """A ``cell.yaml`` that is missing or cannot be read as a mapping; the message names the file and why."""


def read_cell_config(path: Path) -> Container:
    """The resolved config of a cell (its ``cell.yaml``, written by the sweep before submission).

    Raises BadCellConfig naming the file when it is missing, not UTF-8, not YAML, or not a mapping.
    """
    try:
        text = read_regular_file(path).decode("utf-8")
    except FileNotFoundError:
        raise BadCellConfig(f"{path} is missing") from None
    except OSError as e:
        raise BadCellConfig(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise BadCellConfig(f"{path} is not UTF-8 text (byte {e.start}); damaged") from None
    try:
        data = yaml.load(text, Loader=_CellLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise BadCellConfig(f"{path} is not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise BadCellConfig(f"{path} holds a {type(data).__name__}, expected a mapping (the cell's config)")
    return data
