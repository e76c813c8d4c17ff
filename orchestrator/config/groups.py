"""The files of a config group (``conf/<group>/*.yaml``) as plain data, by file name: how a model's, a GPU's or a
cluster's figures are read outside a Hydra composition (the catalog that completes old records, ``budget`` and
``shortest``, ``profile``).

One reader for all of them, with libyaml's loader where PyYAML was built with it (about ten times faster than the
pure-Python one). A file is parsed once while it stays as it is (same size and modification time): a process that
asks many times (a report over many sweeps, the test suite) reads each file once, and an edited file is read
again. Every call returns fresh copies, so a caller may change what it gets.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.values import Container

try:
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader

_PARSED: dict[tuple[str, int, int], object] = {}
"""Parsed files by (path, size, modification time in ns)."""


class BadGroupFile(ValueError):
    """A group file that is not YAML or not a mapping; the message names the file."""


def _parse(path: Path) -> object:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _PARSED:
        try:
            _PARSED[key] = yaml.load(path.read_text(), Loader=_Loader)
        except yaml.YAMLError as exc:
            raise BadGroupFile(f"{path}: not valid YAML ({exc})") from None
    return _PARSED[key]


def read_group(folder: Path, strict: bool = True) -> dict[str, Container]:
    """Each ``folder/*.yaml`` as a mapping, by file stem, in name order, without its ``defaults`` list (Hydra's, not
    a field). An empty file is an empty mapping. A file that is not valid YAML or not a mapping raises
    :class:`BadGroupFile` naming it, or (``strict=False``, for readers that make do with what is readable) is left
    out, as is one that cannot be read. A missing folder has no files."""
    out: dict[str, Container] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.yaml")):
        try:
            data = _parse(path)
        except (OSError, BadGroupFile):
            if strict:
                raise
            continue
        data = {} if data is None else data
        if not isinstance(data, dict):
            if strict:
                raise BadGroupFile(f"{path}: expected a mapping of {folder.name} fields, got {type(data).__name__}")
            continue
        fields = {k: copy.deepcopy(v) for k, v in data.items() if k != "defaults"}
        out[path.stem] = fields
    return out


__all__ = ("BadGroupFile", "read_group")
