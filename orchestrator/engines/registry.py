"""Every training engine, found by its folder: ``orchestrator/engines/<name>/spec.py`` and its ``SPEC``.

The cells' checks and id (orchestrator.cells.cell), the probe (orchestrator.engines.base.create_engine), the predictor
(analysis/predict/inputs.py, analysis/predict/step_time.py), the report's labels (analysis/report/tables.py) and its engine columns
(analysis/sweeps/catalog.py, analysis/report/writer.py, analysis/report/scaling.py) ask this module, never an engine by name; adding an
engine is adding its folder (and its ``MethodConfig`` fields and ``conf/method/`` presets). The engine that
``MethodConfig.engine`` defaults to comes first; a row of the cells table naming no engine, or one no longer
registered, is predicted as that one (records from before there was a choice).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.config.refusal import Refusal
from orchestrator.config.schema import MethodConfig
from orchestrator.config.values import Scalar
from orchestrator.engines.spec import EngineSpec

if TYPE_CHECKING:
    import numpy as np

    from orchestrator.config.schema import Config
    from orchestrator.engines.spec import Terms

DEFAULT_ENGINE: str = MethodConfig.engine


def engine_folders() -> tuple[str, ...]:
    """The engine folders under orchestrator/engines/, sorted: the names ``method.engine`` accepts (read from the
    folder, so that no engine's runtime is imported to list them)."""
    here = [str(Path(__file__).parent)]
    return tuple(sorted(info.name for info in pkgutil.iter_modules(here) if info.ispkg))


def _discover() -> dict[str, EngineSpec]:
    found: dict[str, EngineSpec] = {}
    for name in engine_folders():
        module_name = f"{__package__}.{name}.spec"
        spec = getattr(importlib.import_module(module_name), "SPEC", None)
        if not isinstance(spec, EngineSpec) or spec.name != name:
            raise TypeError(f"{module_name}.SPEC must be an EngineSpec named {name!r}")
        found[spec.name] = spec
    if DEFAULT_ENGINE not in found:
        raise LookupError(f"MethodConfig.engine defaults to {DEFAULT_ENGINE!r}, which has no engine folder")
    return {DEFAULT_ENGINE: found.pop(DEFAULT_ENGINE), **found}


_SPECS = _discover()

ENGINES: tuple[str, ...] = tuple(_SPECS)
"""The engines found in orchestrator/engines/, the default first."""


def engine_names() -> tuple[str, ...]:
    """The engines registered now: :data:`ENGINES` and any added by :func:`registered`."""
    return tuple(_SPECS)


def engine_specs() -> tuple[EngineSpec, ...]:
    """Every registered engine's spec, the default first."""
    return tuple(_SPECS.values())


def engine_spec(name: str) -> EngineSpec:
    """The spec of the engine ``method.engine`` names; a ValueError naming the accepted ones for any other."""
    try:
        return _SPECS[name]
    except (KeyError, TypeError):
        raise ValueError(f"method.engine={name!r}: accepted are {', '.join(_SPECS)}") from None


_METHOD_TYPES: list[type[MethodConfig]] = [MethodConfig]


def method_type() -> type[MethodConfig]:
    """The dataclass of a cell's method, whose fields the cells table, the catalog and the predictor carry:
    ``MethodConfig``, where every engine of orchestrator/engines/ declares its fields, or the subclass an engine
    registered from outside declares its own in (:func:`registered`)."""
    return _METHOD_TYPES[-1]


@contextmanager
def registered(spec: EngineSpec, method: type[MethodConfig] | None = None) -> Iterator[EngineSpec]:
    """``spec`` registered while the block runs: an engine defined outside orchestrator/engines/ (a test's).

    ``method``, a subclass of :func:`method_type`, declares the engine's fields where ``MethodConfig`` does not:
    it is :func:`method_type` while the block runs."""
    if spec.name in _SPECS:
        raise ValueError(f"an engine named {spec.name!r} is already registered")
    method = method or method_type()
    if not issubclass(method, method_type()):
        raise TypeError(f"{method.__name__} must subclass {method_type().__name__}")
    undeclared = set(spec.fields) - {f.name for f in fields(method)}
    if undeclared:
        raise ValueError(f"engine {spec.name!r}: {', '.join(sorted(undeclared))} not fields of {method.__name__}")
    _SPECS[spec.name] = spec
    _METHOD_TYPES.append(method)
    try:
        yield spec
    finally:
        del _SPECS[spec.name]
        _METHOD_TYPES.pop()


def identity_keys() -> tuple[str, ...]:
    """Engine fields that join every cell's id, even at their defaults (DeepSpeed's, from before FSDP)."""
    return tuple(key for spec in _SPECS.values() for key in spec.identity_always)


def identity_keys_if_set() -> tuple[str, ...]:
    """Engine fields that join a cell's id only where they differ from their defaults, so no existing id moves."""
    return tuple(key for spec in _SPECS.values() for key in spec.identity_if_set)


def identity_keys_own(engine: str) -> tuple[str, ...]:
    """Fields that join the id of a cell naming ``engine`` at any value (``EngineSpec.identity_own``); none for
    an engine not registered (the cell is refused for it)."""
    spec = _SPECS.get(engine)
    return spec.identity_own if spec is not None else ()


def sharding_keys() -> tuple[str, ...]:
    """Every engine's fields that say how a cell shards and offloads (``EngineSpec.sharding``), the default
    engine's first: a line each of the scaling table."""
    return tuple(key for spec in _SPECS.values() for key in spec.sharding)


def check_engine_options(cell: Config) -> list[Refusal]:
    """The method's engine options that do not exist together: every other engine's fields set off their defaults
    (each engine's own settings refused under another), then the named engine's own refusals; each names the key
    and what would be accepted. Nothing for an engine not registered (its name is outside ``method.engine``'s
    domain, an input error)."""
    method = cell.method
    spec = _SPECS.get(method.engine)
    if spec is None:
        return []
    defaults = _defaults(method)
    out = [
        Refusal(f"method.{key}", spec.foreign(other, getattr(method, key), defaults[key]))
        for other in _SPECS.values()
        if other is not spec
        for key in other.fields
        if getattr(method, key) != defaults[key]
    ]
    if method.compile and method.compile_scope not in spec.compile_scopes:
        out.append(
            Refusal(
                "method.compile_scope",
                f"{method.compile_scope} is not a scope method.engine={spec.name} compiles; use "
                + " or ".join(spec.compile_scopes)
                + " (regional: each block compiled, the engine's hooks between them)",
            )
        )
    out.extend(spec.check(cell))
    return out


def check_batch(cell: Config) -> list[Refusal]:
    """Refusals of a cell whose global batch does not split as its engine splits it (``EngineSpec.batch_check``);
    an engine not registered is checked as the default engine (its name is refused as an input error)."""
    return _SPECS.get(cell.method.engine, _SPECS[DEFAULT_ENGINE]).batch_check(cell)


def method_label(settings: Mapping[str, Scalar]) -> str:
    """How a cell shards, from its method settings (a ``MethodConfig``'s fields or a row of the cells table), by
    its engine's label: ``zero2 offload-opt``, ``fsdp-grad_op offload reduce-bf16``. Settings naming no engine
    are the default engine's; an engine not registered is named before the default engine's label."""
    engine = settings.get("engine")
    default = _SPECS[DEFAULT_ENGINE]
    if not isinstance(engine, str) or not engine:
        return default.label(settings)
    spec = _SPECS.get(engine)
    return spec.label(settings) if spec is not None else f"{engine} {default.label(settings)}"


def by_engine(engines: np.ndarray, terms: Callable[[EngineSpec], Terms]) -> Terms:
    """Per-cell arrays from each cell's engine: ``terms(spec)`` evaluates one engine's terms for every cell (the
    predictor's arrays, element-wise), and each cell keeps those of the engine ``engines`` names for it; a cell
    naming no registered engine keeps the default engine's. Only engines some cell names are evaluated."""
    import numpy as np

    names = np.asarray(engines, dtype=object)
    default = _SPECS[DEFAULT_ENGINE]
    out = dict(terms(default))
    for spec in _SPECS.values():
        if spec is default:
            continue
        rows = names == spec.name
        if rows.any():
            out.update({key: np.where(rows, value, out[key]) for key, value in terms(spec).items()})
    return out


_METHOD_DEFAULTS: dict[str, object] = {f.name: f.default for f in fields(MethodConfig)}


def _defaults(method: MethodConfig) -> dict[str, object]:
    # A subclass of MethodConfig (an engine defined outside the schema, as in a test) adds its own fields.
    return _METHOD_DEFAULTS if type(method) is MethodConfig else {f.name: f.default for f in fields(method)}
