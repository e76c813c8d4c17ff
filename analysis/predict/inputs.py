"""The predictor's inputs: the flat columns of the cells table as arrays, with the model's figures derived.

A cell's model appears as its architecture (``model_num_layers``, ``model_hidden_size``...); its parameter count,
FLOPs per token and activation bytes come from its family module (:mod:`orchestrator.models`), evaluated once per
distinct model or model × method in the table, so thousands of cells cost a handful of calls. A published
``model_num_parameters`` is never used as a figure: the architecture decides.

A cell's method is every field of ``MethodConfig`` (:func:`orchestrator.cells.row.method_kinds`), each an array
typed by the field's kind in :attr:`Inputs.method`; each engine reads its own fields there by name, so an engine's
field reaches its memory and step-time terms without a change here.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from analysis.predict.network import inter_node_bytes_s
from analysis.sweeps.catalog import stored_cell
from analysis.sweeps.columns import ARCHITECTURE_FIELDS, config_of
from orchestrator.cells import row as rows
from orchestrator.cells.row import method_column, method_defaults, method_kinds
from orchestrator.config.domains import problems as domain_problems
from orchestrator.config.schema import Config, MethodConfig, ModelConfig
from orchestrator.config.values import ConfigValue, Container, Row, Scalar
from orchestrator.engines.memory import CPU_RUNTIME_GIB, GIB, activation_bytes_per_sequence, recomputes_layers
from orchestrator.engines.registry import by_engine
from orchestrator.models import config_errors, family_module

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from orchestrator.engines.spec import EngineSpec

DEFAULT_FAMILY = ModelConfig.family


def flat_cell(cell: Config | Mapping[str, ConfigValue] | DictConfig) -> Row:
    """A cell (typed, or its config as in ``cell.yaml``, or an OmegaConf config) as one row of the cells table:
    :func:`orchestrator.cells.row.row`, the row every table of cells takes. A config is typed as the report types
    a record's (:func:`analysis.sweeps.catalog.stored_cell`): by ``to_config``, leniently where it is damaged or
    of an older schema (a model without a shape is still a row, predicted as unknown)."""
    if not isinstance(cell, Config):
        if hasattr(cell, "_get_node"):  # an OmegaConf config, as Hydra composes it
            from omegaconf import OmegaConf

            cell = cast(Container, OmegaConf.to_container(cell, resolve=True))
        cell = stored_cell(cell)
    return rows.row(cell)


@dataclass
class Inputs:
    """The predictor's inputs as arrays, one element per cell."""

    layers: np.ndarray
    hidden: np.ndarray
    heads: np.ndarray
    vocab: np.ndarray
    seq: np.ndarray
    batch: np.ndarray
    params: np.ndarray
    """Parameters, from the family's formula."""
    flops_per_sample: np.ndarray
    """Training FLOPs of one sample (a sequence, an image) with what activation checkpointing recomputes
    (hardware FLOPs)."""
    per_sequence: np.ndarray
    """Activation bytes one sample (a sequence, an image) adds to the peak (the family's figures)."""
    largest_weight: np.ndarray
    tokens_per_sample: np.ndarray
    """Tokens one sample trains on; NaN where the family's samples are not tokens (images) or unknown."""
    throughput_unit: np.ndarray
    """What each cell's throughput is counted in, ``tokens`` or ``images`` (its family's); None where unknown."""
    family_efficiency: np.ndarray
    """The share of the peak the family's step is assumed to reach before calibration (``COMPUTE_EFFICIENCY`` of
    its module, e.g. ConvNeXt's depthwise convolutions reach less); NaN where the family says nothing (the
    decoders' default applies). ``analysis.predict.step_time`` scales the compute term by it."""
    known: np.ndarray
    gpu: np.ndarray
    accelerator: np.ndarray
    arch: np.ndarray
    memory_gib: np.ndarray
    limit_gib: np.ndarray
    reference_tflops: np.ndarray
    """The dense peak for the cell's precision; NaN where the device has none."""
    memory_bytes_s: np.ndarray
    """The GPU's device-memory bandwidth as its datasheet gives it (``gpu.memory_gbytes_s``, bytes/s); NaN where
    its config has none."""
    num_gpus: np.ndarray
    num_nodes: np.ndarray
    inter_node_bytes_s: np.ndarray
    """One GPU's achieved share of its node's network (bytes/s): the cluster config's ``inter_node_gbits_s`` over
    its ``gpus_per_node``, or the default of the GPU's generation (:mod:`analysis.predict.network`)."""
    engine: np.ndarray
    """The engine whose memory and step-time terms each cell takes (the default engine's name where none)."""
    precision: np.ndarray
    attention: np.ndarray
    checkpointing: np.ndarray
    compile: np.ndarray
    expandable: np.ndarray
    """Whether the CUDA allocator grows its segments in place (``allocator_expandable_segments``; the probe's
    default where a table does not say)."""
    micro_setting: np.ndarray
    """The cell's fixed micro-batch; NaN for ``auto``."""
    method: Mapping[str, np.ndarray]
    """Every method field's array by the field's name, typed by its kind: numbers as floats, text as objects,
    flags as bools, anything else as the values themselves; the field's default where a cell has none (NaN for a
    number without one). Each engine reads its own fields here (``EngineSpec.memory_terms``)."""
    models: np.ndarray
    """Each cell's typed model (``ModelConfig``), None where unknown: where the profiled compute
    (:mod:`analysis.predict.measured_compute`) reads a model's layer shapes."""
    family: np.ndarray
    """The model's family (``gpt_neox``, ``llama``...; empty where unknown), where the discrepancy's random
    effects group cells (:mod:`analysis.predict.discrepancy`)."""

    @property
    def per_gpu_batch(self) -> np.ndarray:
        """Sequences of one micro-batch slot per optimizer step: the global batch over the ways a micro-step splits
        it (each cell's engine's ``layout_terms``; one way per GPU for the data-parallel engines)."""
        out: np.ndarray = np.maximum(np.floor(self.batch / layout_terms(self)["batch_split"]), 1.0)
        return out


def family_efficiency(model: ModelConfig | None) -> float:
    """:attr:`Inputs.family_efficiency` of one model (NaN where unknown or where the family says nothing)."""
    own = getattr(family_module(model.family), "COMPUTE_EFFICIENCY", None) if model is not None else None
    return float(own) if own else float("nan")


def inputs_from_columns(columns: Mapping[str, Iterable[object]], length: int) -> Inputs:
    """Arrays from table columns (Series or lists); anything missing or malformed becomes NaN or the default."""

    def num(name: str, default: float = np.nan) -> np.ndarray:
        values = columns.get(name)
        if values is None:
            return np.full(length, default)
        series = values if isinstance(values, pd.Series) else pd.Series(values, dtype=object)
        out = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        return np.where(np.isnan(out), default, out)

    def text(name: str, default: Scalar) -> np.ndarray:
        values = columns.get(name)
        if values is None:
            return np.full(length, default, dtype=object)
        return np.array([v if isinstance(v, str) and v else default for v in _listed(values)], dtype=object)

    def raw(name: str) -> list[object]:
        values = columns.get(name)
        return [None] * length if values is None else _listed(values)

    def flag(name: str, default: bool) -> np.ndarray:
        values = columns.get(name)
        if values is None:
            return np.full(length, default)
        return np.array(
            [bool(v) if isinstance(v, (bool, np.bool_, int)) else default for v in _listed(values)], dtype=bool
        )

    def value(name: str, default: Scalar) -> np.ndarray:
        out = np.empty(length, dtype=object)
        for row, v in enumerate(raw(name)):
            out[row] = default if _missing(v) else v
        return out

    def typed(kind: str, name: str, default: Scalar) -> np.ndarray:
        if kind in ("int", "float"):
            return num(name, np.nan if default is None else float(default))
        if kind == "str":
            return text(name, default)
        if kind == "bool":
            return flag(name, bool(default))
        return value(name, default)

    defaults = method_defaults()
    method = {key: typed(kind, method_column(key), defaults[key]) for key, kind in method_kinds().items()}
    # A compiled cell that names no scope predates regional compile: the engine then compiled the whole model.
    scopes = raw(method_column("compile_scope"))
    method["compile_scope"] = np.array([s if isinstance(s, str) and s else "whole" for s in scopes], dtype=object)

    layers, hidden, vocab = num("model_num_layers"), num("model_hidden_size"), num("model_vocab_size")
    heads, seq, batch = num("model_num_heads"), num("model_seq_length"), num("model_global_batch_size")
    # The whole architecture, one typed ModelConfig per distinct combination of its fields' columns.
    architecture = [_plain_column(columns.get(f"model_{name}"), length) for name in ARCHITECTURE_FIELDS]
    models = _models(architecture, length)
    known = np.array([m is not None for m in models], dtype=bool) & np.isfinite(batch) & (batch > 0)

    precision, attention = method["precision"], method["attention"]
    checkpointing, compiled = method["activation_checkpointing"], method["compile"]
    tf32 = method["tf32"] & flag("gpu_supports_tf32", True)
    peak_tf32 = num("gpu_peak_tflops_tf32")
    fp32_peak = np.where(tf32 & (peak_tf32 > 0), peak_tf32, num("gpu_peak_tflops_fp32"))
    reference = np.select(
        [precision == "bf16", precision == "fp16"],
        [num("gpu_peak_tflops_bf16"), num("gpu_peak_tflops_fp16")],
        default=fp32_peak,
    )

    def per_model(model: ModelConfig) -> tuple[float, ...]:
        fam = family_module(model.family)
        tokens = fam.tokens_per_sample(model)
        return (
            float(fam.num_parameters(model)),
            fam.flops_per_sample(model, False),
            fam.flops_per_sample(model, True),
            float(fam.largest_weight_elements(model)),
            float(tokens) if tokens is not None else np.nan,
        )

    def per_model_method(model: ModelConfig, key: tuple[Any, ...]) -> tuple[float, ...]:
        method = MethodConfig(
            attention=key[0], activation_checkpointing=bool(key[1]), compile=bool(key[2]), precision=key[3],
            checkpoint_policy=key[4], compile_scope=key[5],
        )  # fmt: skip
        return (activation_bytes_per_sequence(model, method),)

    methods = [attention, checkpointing, compiled, precision, method["checkpoint_policy"], method["compile_scope"]]
    params, flops, flops_recompute, largest, tokens_per_sample = _by_distinct(models, [], known, per_model, 5)
    (per_sequence,) = _by_distinct(models, methods, known, per_model_method, 1)
    micro_setting = num("micro_batch_size_setting")
    return Inputs(
        layers=layers,
        hidden=hidden,
        heads=heads,
        vocab=vocab,
        seq=seq,
        batch=batch,
        params=params,
        flops_per_sample=np.where(
            recomputes_layers(checkpointing, method["checkpoint_policy"]), flops_recompute, flops
        ),
        per_sequence=per_sequence,
        largest_weight=largest,
        tokens_per_sample=tokens_per_sample,
        throughput_unit=np.array(
            [family_module(m.family).THROUGHPUT_UNIT if m is not None else None for m in models], dtype=object
        ),
        family_efficiency=np.array([family_efficiency(m) for m in models], dtype=float),
        known=known,
        gpu=text("gpu", ""),
        accelerator=text("gpu_accelerator", "cuda"),
        arch=text("gpu_architecture", ""),
        memory_gib=num("gpu_memory_gib"),
        limit_gib=num("probe_memory_limit_gib"),
        reference_tflops=np.where(reference > 0, reference, np.nan),
        memory_bytes_s=np.where(num("gpu_memory_gbytes_s") > 0, num("gpu_memory_gbytes_s") * 1e9, np.nan),
        num_gpus=np.maximum(num("num_gpus", 1.0), 1.0),
        num_nodes=np.maximum(num("num_nodes", 1.0), 1.0),
        inter_node_bytes_s=inter_node_bytes_s(
            text("gpu_architecture", ""),
            num("gpu_nvlink_gbytes_s", 0.0) > 0,
            num("cluster_inter_node_gbits_s"),
            num("cluster_gpus_per_node"),
        ),
        engine=method["engine"],
        precision=precision,
        attention=attention,
        checkpointing=checkpointing,
        compile=compiled,
        expandable=flag("allocator_expandable_segments", True),
        micro_setting=np.where(micro_setting >= 1, np.floor(micro_setting), np.nan),
        method=method,
        models=_object_array(models),
        family=np.array([m.family if m is not None else "" for m in models], dtype=object),
    )


def memory_terms(x: Inputs) -> dict[str, np.ndarray]:
    """Allocated bytes per GPU that do not depend on the micro-batch, by holder, the activation bytes per sequence,
    what offload keeps in host memory instead, the peak of the build (``build``, ``EngineSpec.build_bytes``) and the
    part of ``grads`` held only while a step accumulates (``accumulated``, :func:`grads_held`): each cell by its engine's memory model (its
    ``EngineSpec.memory_terms``, found through orchestrator.engines.registry)."""
    terms = by_engine(x.engine, lambda spec: spec.memory_terms(x))
    holders = ("params", "grads", "optimizer", "buffers")
    per_sequence = x.per_sequence * layout_terms(x)["activation_share"]
    out = {**{k: terms[k] for k in holders}, "per_sequence": per_sequence, "offloaded": terms["offloaded"]}
    # On the CPU the measured peak is the process's resident growth, its runtime's own memory included.
    runtime = np.where(x.accelerator == "cpu", CPU_RUNTIME_GIB * GIB, 0.0)
    out["buffers"] = out["buffers"] + runtime
    # The build's peak (the model and engine being made), 0 for an engine whose build never exceeds the step's.
    zero = np.zeros(len(x.engine))
    build = by_engine(
        x.engine,
        lambda spec: {"build": np.asarray(spec.build_bytes(x)) if spec.build_bytes else zero},
    )["build"]
    out["build"] = np.asarray(build, dtype=float) * np.ones(len(x.engine)) + runtime
    # The part of the gradients held only while a step accumulates (EngineSpec.accumulated_bytes).
    kept = by_engine(
        x.engine, lambda spec: {"accumulated": spec.accumulated_bytes(x) if spec.accumulated_bytes else zero}
    )["accumulated"]
    out["accumulated"] = np.asarray(kept, dtype=float) * np.ones(len(x.engine))
    return out


def grads_held(terms: Mapping[str, np.ndarray], steps: ArrayLike) -> np.ndarray:
    """The gradients a step of ``steps`` micro-steps holds, of :func:`memory_terms` ``terms`` (bytes, or after a
    scale): ``grads`` less its ``accumulated`` part where one micro-step is the whole step."""
    out: np.ndarray = terms["grads"] - np.where(np.asarray(steps, dtype=float) > 1, 0.0, terms["accumulated"])
    return out


def layout_terms(x: Inputs) -> dict[str, np.ndarray]:
    """Each cell's ``batch_split``, ``activation_share``, ``micro_step_share`` and ``compute_stretch``
    (``EngineSpec.layout_terms``; ``num_gpus`` ways, all of the activations, one whole micro-step's fixed cost per
    micro-step and no stretch for an engine that declares none)."""
    ones = np.ones(len(x.num_gpus))

    def of(spec: EngineSpec) -> dict[str, np.ndarray]:
        own = dict(spec.layout_terms(x)) if spec.layout_terms is not None else {}
        return {"batch_split": x.num_gpus, "activation_share": ones, "micro_step_share": ones,
                "compute_stretch": ones, **own}  # fmt: skip

    return by_engine(x.engine, of)


def _models(architecture: list[list[object]], length: int) -> list[ModelConfig | None]:
    """Each row's ModelConfig, built once per distinct architecture (the columns' plain values,
    :func:`_plain_column`); None where it is incomplete, of an unknown family, or a shape its family cannot build."""
    built: dict[tuple[object, ...], ModelConfig | None] = {}
    out: list[ModelConfig | None] = []
    for key in zip(*architecture, strict=True):
        try:
            out.append(built[key])
        except KeyError:
            model = built[key] = _buildable(config_of(ModelConfig, dict(zip(ARCHITECTURE_FIELDS, key, strict=True))))
            out.append(model)
    return out


def _plain_column(values: Iterable[object] | None, length: int) -> list[object]:
    """A column (a Series or a list) as plain Python values, None where missing (None, NaN, NA): the same value is
    then the same key. A typed Series is converted at once; a column of objects value by value."""
    if values is None:
        return [None] * length
    if isinstance(values, pd.Series) and values.dtype != object:
        plain: list[object] = values.astype(object).where(values.notna(), None).tolist()
        return plain
    return [None if _missing(v) else _plain(v) for v in _listed(values)]


def _buildable(model: ModelConfig | None) -> ModelConfig | None:
    """The model where it is inside its fields' domains and its family can build it (the checks planning runs)."""
    if model is None or any(domain_problems(model)) or config_errors(model):
        return None
    return model


def _object_array(values: list[ModelConfig | None]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _listed(values: Iterable[object]) -> list[object]:
    """A column's values as a list: a Series' ``tolist`` (the values its iteration gives, without boxing each one)."""
    return values.tolist() if isinstance(values, pd.Series) else list(values)


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA


def _by_distinct(
    models: list[ModelConfig | None],
    keys: list[np.ndarray],
    known: np.ndarray,
    compute: Callable[..., tuple[float, ...]],
    width: int,
) -> list[np.ndarray]:
    """``compute(model[, key])`` once per distinct model (and key), spread back to every row (NaN where unknown)."""
    out = np.full((width, len(known)), np.nan)
    plain = [[_plain(v) for v in k.tolist()] if k.dtype == object else k.tolist() for k in keys]
    by_row = list(zip(*plain, strict=True))
    rows: dict[tuple[int, tuple[object, ...]], list[int]] = {}
    for row in np.flatnonzero(known).tolist():
        rows.setdefault((id(models[row]), by_row[row] if keys else ()), []).append(row)
    for (_, key), same in rows.items():
        model = models[same[0]]
        assert model is not None
        out[:, same] = np.asarray(compute(model, key) if keys else compute(model), dtype=float)[:, None]
    return list(out)


def _plain(value: Hashable) -> Hashable:
    # numpy scalars from the index, as plain Python values for the dataclasses.
    return value.item() if isinstance(value, np.generic) else value
