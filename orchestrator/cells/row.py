"""A cell as one row of a table: the columns every table of cells shares, read off the typed cell.

cells.csv (``analysis.sweeps.records``), the plan's rows (``gpudays plan``), the predictor's inputs
(``analysis.predict.inputs.flat_cell``) and the terminal's tables take a cell's columns from :func:`row`, so that
they agree on every column they share. The columns are the dataclasses' fields, none listed by hand:

- ``model``, ``gpu``, ``num_gpus`` and ``num_nodes``: what the cell is;
- every method field (:func:`method_kinds`), in the order of a record's settings, ``micro_batch_size`` as
  ``micro_batch_size_setting`` (a table's ``micro_batch_size`` is the one measured): ``compile_scope`` is empty
  where nothing is compiled, a cell naming no engine is the default engine's, and the fields of every other
  engine that join an id only where set (``EngineSpec.identity_if_set``) are empty, not applicable (a DeepSpeed
  cell has no FSDP sharding);
- every ``ModelConfig`` field as ``model_<field>``, every ``GpuConfig`` field as ``gpu_<field>``, the network the
  cell's nodes share (``cluster_gpus_per_node``, ``cluster_inter_node_gbits_s``), the cluster's ``cluster_goodput``,
  ``probe_memory_limit_gib``, and ``allocator_expandable_segments``: whether the CUDA caching allocator grows its
  segments in place (``orchestrator.engines.allocator.allocator_conf``; empty on the CPU; a measured row says what
  its probe ran with).

Each value is coerced by its field's kind (:func:`orchestrator.config.values.coerce`), so that a column is one kind
of thing whatever a stored config held (``to_config`` checks a config's keys, not its values). A record's own
``settings`` (:func:`orchestrator.cells.cell.settings`) are no row: they keep what the cell held, as it held it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from typing import TypeVar

from orchestrator.cells.cell import IDENTITY_METHOD_KEYS, IDENTITY_METHOD_KEYS_IF_SET
from orchestrator.config.schema import Config, GpuConfig, MethodConfig, ModelConfig, compile_scope_of
from orchestrator.config.values import Row, as_int, as_name, as_number, coerce, field_kinds
from orchestrator.engines.allocator import allocator_conf, expandable_segments
from orchestrator.engines.registry import DEFAULT_ENGINE, engine_names, engine_specs, method_type

SETTING_KEYS = (*IDENTITY_METHOD_KEYS, *IDENTITY_METHOD_KEYS_IF_SET)
"""The method settings of a cell in the order of a record's settings (the columns' order; a field outside them,
an engine's registered from outside the package, comes after)."""
RENAMED_METHOD_COLUMNS = {"micro_batch_size": "micro_batch_size_setting"}
"""Method fields whose column has another name: a table's ``micro_batch_size`` is the one the probe measured."""
CELL_KEYS = ("model", "gpu", "num_gpus", "num_nodes")
"""The columns that say what the cell is, first in every row."""


def row(cell: Config) -> Row:
    """The cell as one row of a table (see the module docstring): :func:`setting_columns`, then
    :func:`figure_columns`."""
    out = setting_columns(cell)
    out.update(figure_columns(cell))
    return out


def setting_columns(cell: Config) -> Row:
    """The row's first part: :data:`CELL_KEYS` and the method's columns."""
    out: Row = {
        "model": as_name(cell.model.name),
        "gpu": as_name(cell.gpu.name),
        "num_gpus": as_int(cell.num_gpus),
        "num_nodes": as_int(cell.num_nodes) or 1,
    }
    out.update(_once(cell.method, _method_columns, (method_type(), engine_names())))
    return out


def figure_columns(cell: Config) -> Row:
    """The row's second part: the model's and the GPU's fields (``model_*``, ``gpu_*``) and
    ``probe_memory_limit_gib``. A table with columns of its own (cells.csv's status and metrics) puts them
    between the two parts."""
    out = dict(_once(cell.model, _model_columns))
    out.update(_once(cell.gpu, _gpu_columns))
    # The network the cell's nodes share, as the predictor reads it (analysis.predict.network).
    out["cluster_gpus_per_node"] = as_int(cell.cluster.gpus_per_node)
    out["cluster_inter_node_gbits_s"] = as_number(cell.cluster.inter_node_gbits_s)
    out["cluster_goodput"] = as_number(cell.cluster.goodput)
    out["probe_memory_limit_gib"] = as_number(cell.probe.memory_limit_gib)
    env = cell.cluster.env  # a damaged record's, typed leniently, may hold anything
    conf = allocator_conf(env if isinstance(env, Mapping) else None, str(cell.gpu.accelerator))
    out["allocator_expandable_segments"] = None if conf is None else expandable_segments(conf)
    return out


def method_column(name: str) -> str:
    """The column of method field ``name``: its name, but for :data:`RENAMED_METHOD_COLUMNS`."""
    return RENAMED_METHOD_COLUMNS.get(name, name)


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


def _method_columns(method: MethodConfig) -> Row:
    columns: Row = {}
    for key, kind in method_kinds().items():
        value = getattr(method, key, None)
        if key == "micro_batch_size":  # a positive integer or auto
            columns[method_column(key)] = "auto" if value in (None, "auto") else (as_int(value) or str(value))
        else:
            columns[method_column(key)] = as_int(value) if kind == "int" else coerce(kind, value)
    columns["compile_scope"] = compile_scope_of(columns)
    engine = columns["engine"] = columns["engine"] or DEFAULT_ENGINE
    for spec in engine_specs():
        if spec.name != engine:
            columns.update(dict.fromkeys(spec.identity_if_set))
    return columns


def _prefixed(cls: type, prefix: str) -> Callable[[object], Row]:
    """The columns of a section of type ``cls``, ``<prefix>_<field>``, each coerced by its field's kind."""
    named = [(f"{prefix}_{name}", name, kind) for name, kind in field_kinds(cls).items()]

    def columns(section: object) -> Row:
        return {column: coerce(kind, getattr(section, name, None)) for column, name, kind in named}

    return columns


_model_columns = _prefixed(ModelConfig, "model")
_gpu_columns = _prefixed(GpuConfig, "gpu")

_ONCE: dict[tuple[object, ...], Row] = {}
_ONCE_MOST = 4096
_VALUES: dict[type, Callable[[object], tuple[object, ...]]] = {}
_S = TypeVar("_S")


def _once(section: _S, build: Callable[[_S], Row], context: object = None) -> Row:
    """``build(section)``, once per distinct section (its fields' values and their types, and ``context``): a
    sweep's thousands of cells share a handful of models, GPUs and methods. Read only: callers copy it."""
    cls = type(section)
    values = _VALUES.get(cls)
    if values is None:
        values = _VALUES[cls] = operator.attrgetter(*(f.name for f in fields(cls)))  # type: ignore[arg-type]
    held = values(section)
    key = (build, context, cls, held, tuple(map(type, held)))
    try:
        hit = _ONCE.get(key)
    except TypeError:  # an unhashable value (a list where a number belongs): built every time
        return build(section)
    if hit is None:
        if len(_ONCE) >= _ONCE_MOST:
            _ONCE.clear()
        hit = _ONCE[key] = build(section)
    return hit
