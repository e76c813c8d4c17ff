"""The model and GPU configs of ``conf/``, by name, and the columns they and the method give a cell in the
report's table.

A record carries its own copy of the cell's config; what an old or truncated record lacks comes from today's
``conf/``, and a GPU's prices always do, so that an updated price reaches old sweeps. The method's columns are its
fields, each converted by the kind its type declares (:mod:`analysis.sweeps.columns`): a field added to ``MethodConfig``
for an engine is a column without a change here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from analysis.sweeps.columns import as_int, coerce, columns_of, field_kinds
from orchestrator.cells.cell import IDENTITY_METHOD_KEYS, IDENTITY_METHOD_KEYS_IF_SET
from orchestrator.config.places import CONF_DIR
from orchestrator.config.schema import GpuConfig, ModelConfig, compile_scope_of
from orchestrator.config.values import Container, Row
from orchestrator.engines.registry import DEFAULT_ENGINE, engine_specs, method_type

try:  # libyaml's loader is about ten times faster; fall back to the pure-Python one where it is missing
    _YamlLoader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _YamlLoader = yaml.SafeLoader


SETTING_KEYS = (*IDENTITY_METHOD_KEYS, *IDENTITY_METHOD_KEYS_IF_SET)
"""The method settings of a cell in the order of a record's settings (the columns' order; a field outside them,
an engine's registered from outside the package, comes after)."""
RENAMED_METHOD_COLUMNS = {"micro_batch_size": "micro_batch_size_setting"}
"""Method fields whose column has another name: the table's ``micro_batch_size`` is the one the probe measured."""
GPU_PRICE_KEYS = (
    "board_power_w", "purchase_price_usd", "purchase_price_source", "purchase_price_date", "cloud_usd_per_gpu_hour",
    "cloud_price_source", "cloud_price_date",
)
"""Figures that change over time: taken from today's ``conf/gpu`` when the GPU is known there."""


@dataclass
class Catalog:
    """The model and GPU configs of ``conf/``, by name, to fill in what an old or truncated record lacks."""

    models: dict[str, Container] = field(default_factory=dict)
    gpus: dict[str, Container] = field(default_factory=dict)

    _cache: dict[tuple[object, ...], tuple[Row, str | None]] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, conf_dir: Path | None = None) -> Catalog:
        """Read ``conf/model/*.yaml`` and ``conf/gpu/*.yaml``; a missing folder gives an empty catalog."""
        root = Path(conf_dir) if conf_dir is not None else CONF_DIR
        return cls(models=_read_group(root / "model"), gpus=_read_group(root / "gpu"))

    def _cached(self, key: tuple[object, ...], build: Callable[[], tuple[Row, str | None]]) -> tuple[Row, str | None]:
        # Thousands of cells share a handful of model and GPU configs: flatten each distinct one once.
        try:
            hit = self._cache.get(key)
        except TypeError:  # an unhashable value somewhere in the config: no caching for it
            return build()
        if hit is None:
            hit = self._cache[key] = build()
        return hit

    def method_columns(self, method: Mapping[str, Any], settings: Mapping[str, Any]) -> Row:
        """The settings columns of a cell, one per method field (:func:`method_kinds`), each converted by its kind:
        from its config's method, else from the record's settings. A record naming no engine is the default
        engine's; the fields of another engine that join an id only where set (``EngineSpec.identity_if_set``:
        FSDP's, under DeepSpeed) are empty in its row: not applicable."""
        kinds = method_kinds()

        def build() -> tuple[Row, str | None]:
            columns: Row = {}
            for key, kind in kinds.items():
                value = method.get(key, settings.get(key))
                if key == "micro_batch_size":  # a positive integer or auto
                    columns[method_column(key)] = "auto" if value in (None, "auto") else (as_int(value) or str(value))
                else:
                    columns[method_column(key)] = as_int(value) if kind == "int" else coerce(kind, value)
            columns["compile_scope"] = compile_scope_of(columns)
            engine = columns["engine"] = columns["engine"] or DEFAULT_ENGINE
            for spec in engine_specs():
                if spec.name != engine:
                    columns.update(dict.fromkeys(spec.identity_if_set))
            return columns, None

        key: tuple[object, ...] = ("method", method_type(), *method.items())
        if not all(k in method for k in kinds):  # settings fill the gaps, so they are part of the key
            key = (*key, "settings", *settings.items())
        return self._cached(key, build)[0]

    def model_columns(self, name: str | None, stored: Mapping[str, Any]) -> tuple[Row, str | None]:
        """The ``model_*`` columns of a cell, and a problem to report, if any.

        A record's own copy of the config comes first: it is what was measured. What it lacks comes from
        today's ``conf/model``.
        """

        def build() -> tuple[Row, str | None]:
            known = self.models.get(name or "")
            merged = {**known, **{k: v for k, v in stored.items() if v is not None}} if known else dict(stored)
            problem = None
            if not known and name and not all(merged.get(k) for k in ("num_layers", "hidden_size", "vocab_size")):
                problem = (
                    f"model {name!r} is not in conf/model and its config has no shape; "
                    "FLOPs and predictions are left empty"
                )
            return columns_of(ModelConfig, "model", merged), problem

        return self._cached(("model", name, *stored.items()), build)

    def gpu_columns(self, name: str | None, stored: Mapping[str, Any]) -> tuple[Row, str | None]:
        """The ``gpu_*`` columns of a cell, and a problem to report, if any.

        Hardware figures come from the record's own config first; prices and board power of a GPU that
        ``conf/gpu`` knows always come from there, so that an updated price reaches old sweeps.
        """

        def build() -> tuple[Row, str | None]:
            known = self.gpus.get(name or "")
            problem = None
            if known:
                merged = {**known, **{k: v for k, v in stored.items() if v is not None}}
                merged.update({k: known.get(k) for k in GPU_PRICE_KEYS})
            else:
                merged = dict(stored)
                if name and self.gpus:
                    kept = any(stored.get(k) is not None for k in GPU_PRICE_KEYS)
                    tail = "used the figures stored with the cell" if kept else "costs and energy are left empty"
                    problem = f"GPU {name!r} is not in conf/gpu (known: {', '.join(sorted(self.gpus))}); {tail}"
            columns = columns_of(GpuConfig, "gpu", merged)
            return columns, problem

        return self._cached(("gpu", name, *stored.items()), build)


def method_kinds() -> Mapping[str, str]:
    """Every method field with its kind (``str``, ``bool``, ``int``, ``float`` or ``any``, from its type): the
    fields of ``MethodConfig``, or of the subclass an engine registered from outside the package declares its own
    in (``orchestrator.engines.registry.method_type``), in the order of a record's settings."""
    cls = method_type()
    if cls not in _METHOD_KINDS:
        kinds, order = field_kinds(cls), {key: i for i, key in enumerate(SETTING_KEYS)}
        _METHOD_KINDS[cls] = {key: kinds[key] for key in sorted(kinds, key=lambda key: order.get(key, len(order)))}
    return _METHOD_KINDS[cls]


_METHOD_KINDS: dict[type, Mapping[str, str]] = {}


def method_defaults() -> Row:
    """Every method field's default (None where it has none), by field name."""
    return {f.name: None if f.default is MISSING else f.default for f in fields(method_type())}


def method_column(name: str) -> str:
    """The cells table's column of method field ``name``: its name, but for :data:`RENAMED_METHOD_COLUMNS`."""
    return RENAMED_METHOD_COLUMNS.get(name, name)


def _read_group(folder: Path) -> dict[str, Container]:
    out: dict[str, Container] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.yaml")):
        try:
            data = yaml.load(path.read_text(), Loader=_YamlLoader)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            data.pop("defaults", None)
            out[str(data.get("name", path.stem))] = data
    return out
