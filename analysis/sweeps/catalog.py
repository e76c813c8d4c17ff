"""The model and GPU configs of ``conf/``, by name, and the typed cell a stored config describes.

A record carries its own copy of the cell's config; what an old or truncated record lacks comes from today's
``conf/``, and a GPU's prices always do, so that an updated price reaches old sweeps. :meth:`Catalog.cell` then
types the whole as the schema's dataclasses (``to_config``), leniently where the config is damaged or of an older
schema, and the cells table takes the cell's columns from it (:func:`orchestrator.cells.row.row`): a field added to
``MethodConfig`` for an engine is a column without a change here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, TypeAlias, TypeVar, cast

from orchestrator.cells.row import method_column, method_defaults, method_kinds
from orchestrator.config.groups import read_group
from orchestrator.config.places import CONF_DIR
from orchestrator.config.schema import (
    ClusterConfig,
    Config,
    GpuConfig,
    MethodConfig,
    ModelConfig,
    ProbeConfig,
    to_config,
    to_section,
)
from orchestrator.config.values import Container, as_name
from orchestrator.engines.registry import method_type

# The method columns' names and kinds are the row's (orchestrator.cells.row), named here too.
__all__ = [
    "GPU_PRICE_KEYS", "Catalog", "gpu_config", "lenient_cell", "method_column", "method_defaults", "method_kinds",
    "recorded_cell", "stored_cell", "today",
]  # fmt: skip

GPU_PRICE_KEYS = (
    "board_power_w",
    "purchase_price_usd",
    "purchase_price_source",
    "purchase_price_date",
    "cloud_usd_per_gpu_hour",
    "cloud_price_source",
    "cloud_price_date",
)
"""Figures that change over time: taken from today's ``conf/gpu`` when the GPU is known there."""


@dataclass
class Catalog:
    """The model and GPU configs of ``conf/``, by name, to fill in what an old or truncated record lacks, and the
    cells stored configs describe (:meth:`cell`)."""

    models: dict[str, Container] = field(default_factory=dict)
    gpus: dict[str, Container] = field(default_factory=dict)

    _cache: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, conf_dir: Path | None = None) -> Catalog:
        """Read ``conf/model/*.yaml`` and ``conf/gpu/*.yaml``; a missing folder gives an empty catalog."""
        root = Path(conf_dir) if conf_dir is not None else CONF_DIR
        return cls(models=_read_group(root / "model"), gpus=_read_group(root / "gpu"))

    def cell(self, config: Mapping[str, object], settings: Mapping[str, object]) -> tuple[Config, list[str]]:
        """The cell a stored config describes (a record's, a ``cell.yaml``'s, an adaptive grid's), as the schema's
        dataclasses, and what is wrong with its model or GPU (the problems to report).

        Its model and GPU are completed from ``conf/`` first (:meth:`model`, :meth:`gpu`), then the whole is typed
        by ``to_config``, as every other reader of the sweep folder types it. A config ``to_config`` refuses (a
        group missing or not a mapping, a required value missing, keys of another schema), one whose model or GPU
        has no name, and one of an older schema that names no value for some of the cell's settings are typed
        leniently (:func:`lenient_cell`): what they lack comes from the record's ``settings``, else stays empty,
        never the schema's default (a cell compiled before ``compile_scope`` existed compiled its whole model, not
        a region).
        """
        model, gpu = _mapping(config.get("model")), _mapping(config.get("gpu"))
        model_name, gpu_name = as_name(model.get("name")), as_name(gpu.get("name"))
        model, model_problem, typed_model = self.model(model_name or as_name(settings.get("model")), model)
        gpu, gpu_problem, typed_gpu = self.gpu(gpu_name or as_name(settings.get("gpu")), gpu)
        cell = None
        if model_name and gpu_name and config.keys() >= _CONFIG_FIELDS:
            typed = {"model": typed_model, "gpu": typed_gpu, **{g: self._section(g, config[g]) for g in _GROUPS}}
            if all(section is not None for section in typed.values()):
                try:
                    cell = to_config({**config, **typed})
                except ValueError:
                    pass
        if cell is None:
            cell = lenient_cell({**config, "model": model, "gpu": gpu}, settings)
        return cell, [p for p in (model_problem, gpu_problem) if p]

    def model(self, name: str | None, stored: Mapping[str, object]) -> Completed:
        """A cell's model config completed from ``conf/model``, a problem to report, if any, and the completed
        config typed (``to_section``; None where it refuses it).

        A record's own copy of the config comes first: it is what was measured. What it lacks (or holds as null)
        comes from today's ``conf/model``. Read only: it is shared by every cell of the same model.
        """

        def build() -> Completed:
            known = self.models.get(name or "")
            merged = {**known, **{k: v for k, v in stored.items() if v is not None}} if known else dict(stored)
            problem = None
            if not known and name and not all(merged.get(k) for k in ("num_layers", "hidden_size", "vocab_size")):
                problem = (
                    f"model {name!r} is not in conf/model and its config has no shape; "
                    "FLOPs and predictions are left empty"
                )
            return merged, problem, _typed("model", merged)

        return self._cached(("model", name, *stored.items()), build)

    def gpu(self, name: str | None, stored: Mapping[str, object]) -> Completed:
        """A cell's GPU config completed from ``conf/gpu``, a problem to report, if any, and the completed config
        typed (None where ``to_section`` refuses it).

        Hardware figures come from the record's own config first; prices and board power of a GPU that
        ``conf/gpu`` knows always come from there, so that an updated price reaches old sweeps. Read only.
        """

        def build() -> Completed:
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
            return merged, problem, _typed("gpu", merged)

        return self._cached(("gpu", name, *stored.items()), build)

    def _section(self, group: str, value: object) -> object | None:
        """A group the catalog does not complete (the method, the cluster, the probe), typed once per distinct
        one; None where ``to_section`` refuses it, and for a method that names no value for some of its fields
        (an older schema's)."""
        if not isinstance(value, Mapping):
            return None

        def build() -> object | None:
            older = group == "method" and not value.keys() >= _METHOD_FIELDS
            return None if older else _typed(group, value)

        return self._cached((group, *value.items()), build)

    def _cached(self, key: tuple[object, ...], build: Callable[[], _V]) -> _V:
        # Thousands of cells share a handful of model, GPU and method configs: complete and type each once.
        try:
            hit = self._cache.get(key, _UNSEEN)
        except TypeError:  # an unhashable value somewhere in the config: no caching for it
            return build()
        if hit is _UNSEEN:
            hit = self._cache[key] = build()
        return cast(_V, hit)


Completed: TypeAlias = tuple[Mapping[str, object], str | None, object | None]
"""A model or GPU config completed from ``conf/``, the problem to report, and the config typed."""
_V = TypeVar("_V")
_UNSEEN = object()
_GROUPS = ("method", "cluster", "probe")


def _typed(group: str, value: object) -> object | None:
    """``to_section(group, value)``, None where it refuses it."""
    try:
        typed: object = to_section(group, value)
    except ValueError:
        return None
    return typed


_CONFIG_FIELDS = frozenset(f.name for f in fields(Config))
_METHOD_FIELDS = frozenset(f.name for f in fields(MethodConfig))


def stored_cell(config: Mapping[str, object], settings: Mapping[str, object] | None = None) -> Config:
    """A stored config (a record's, a ``cell.yaml``'s, a test's) as the schema's dataclasses, by
    :meth:`Catalog.cell`'s rules but completed from nothing: typed by ``to_config``, leniently where it is damaged
    or of an older schema."""
    return Catalog().cell(config, settings or {})[0]


def recorded_cell(config: Mapping[str, object], settings: Mapping[str, object] | None = None) -> Config:
    """A record's stored config as :func:`analysis.sweeps.records.load_cells` reads it: completed from today's
    ``conf/`` (what it lacks or holds as null, and a GPU's prices), then typed as :func:`stored_cell` types it."""
    return today().cell(config, settings or {})[0]


@cache
def today() -> Catalog:
    """Today's ``conf/`` (:meth:`Catalog.load`), read once."""
    return Catalog.load()


def gpu_config(name: str) -> GpuConfig:
    """A GPU type of today's ``conf/gpu`` as the schema's dataclass; :class:`KeyError` naming it where there is none."""
    typed = today().gpu(name, {})[2] if name in today().gpus else None
    if not isinstance(typed, GpuConfig):
        raise KeyError(f"GPU {name!r} is not in conf/gpu (known: {', '.join(sorted(today().gpus))})")
    return typed


BEFORE_THE_FIELD: Mapping[str, object] = {"fsdp_accumulation": "unsharded"}
"""What a cell stored before a method field existed ran, where that is not the field's default: FSDP accumulated
gradients unsharded until ``fsdp_accumulation`` made ``sharded`` the default (another engine's cell leaves the
field's column empty all the same: ``orchestrator.cells.row``)."""


def lenient_cell(config: Mapping[str, object], settings: Mapping[str, object]) -> Config:
    """A stored config that ``to_config`` refuses, or of an older schema, as the schema's dataclasses all the same:
    each field its stored value, else (the method's fields, the cell's model, GPU and counts) the record's
    ``settings``', else None, never the schema's default (nothing says the cell had it); keys the schema does not
    know are left out. Its values may be anything: :func:`orchestrator.cells.row.row` coerces each to its
    field's kind."""
    model, gpu = _mapping(config.get("model")), _mapping(config.get("gpu"))
    values = {
        "model": _every_field(ModelConfig, {**model, "name": as_name(model.get("name")) or settings.get("model")}),
        "gpu": _every_field(GpuConfig, {**gpu, "name": as_name(gpu.get("name")) or settings.get("gpu")}),
        "method": _every_field(method_type(), _mapping(config.get("method")), {**BEFORE_THE_FIELD, **settings}),
        "cluster": _every_field(ClusterConfig, _mapping(config.get("cluster"))),
        "probe": _every_field(ProbeConfig, _mapping(config.get("probe"))),
        "num_gpus": config.get("num_gpus", settings.get("num_gpus")),
        "num_nodes": config.get("num_nodes", settings.get("num_nodes")),
        "name": as_name(config.get("name")) or Config.name,
    }
    return Config(**cast(Mapping[str, Any], values))  # any value at all: what a damaged file holds


_T = TypeVar("_T", ModelConfig, GpuConfig, MethodConfig, ClusterConfig, ProbeConfig)


def _every_field(cls: type[_T], values: Mapping[str, object], fallback: Mapping[str, object] | None = None) -> _T:
    """``cls`` with every field given: from ``values``, else from ``fallback``, else None."""
    fallback = fallback or {}
    given = {f.name: values.get(f.name, fallback.get(f.name)) for f in fields(cls)}
    return cls(**cast(Mapping[str, Any], given))


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _read_group(folder: Path) -> dict[str, Container]:
    """The group's readable files by the name they give (else their file's), as the catalog makes do with them."""
    return {str(data.get("name", stem)): data for stem, data in read_group(folder, strict=False).items()}
