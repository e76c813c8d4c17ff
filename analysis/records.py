"""Read sweep folders into one table: a row per cell, with its settings, status, measurements and inputs.

Each cell folder holds ``cell.yaml`` (the resolved config, written before submission) and, once its job ran,
``record.json`` (written by the probe). Anything can be wrong with either: a record that is missing (job still
queued, or lost), truncated or not JSON, a metric that is absent or null, a GPU that ``conf/gpu`` no longer
knows. None of that stops the table: the cell gets a status that says so and a line in ``problems``.

Rows are flattened to scalars as each record is read, and the parsed JSON is dropped at once, so memory grows
with the table, not with the records' size. Several sweeps merge on the cell id: a cell measured more than once
keeps its newest ``ok`` record (or, with none ok, its newest record of any kind).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from orchestrator.cells import IDENTITY_METHOD_KEYS
from orchestrator.paths import CELL_CONFIG_NAME, RECORD_NAME, SweepPaths

try:  # libyaml's loader is about ten times faster; fall back to the pure-Python one where it is missing
    _YamlLoader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _YamlLoader = yaml.SafeLoader

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

NO_RECORD = "no_record"
CORRUPT_RECORD = "corrupt_record"
MEASURED_FITS = frozenset({"ok"})
MEASURED_DOES_NOT_FIT = frozenset({"does_not_fit", "oom"})
RESULT_STATUSES = MEASURED_FITS | MEASURED_DOES_NOT_FIT
"""Statuses that are an answer about the cell; every other status is a problem to look at."""

SUPPORTED_SCHEMA_VERSION = 1

SETTING_KEYS = IDENTITY_METHOD_KEYS
"""The method settings of a cell, as the orchestrator names them."""
METRIC_KEYS = (
    "step_time_s",
    "step_time_mean_s",
    "step_time_std_s",
    "step_time_iqr_s",
    "step_time_ci95_pct",
    "steps_timed",
    "micro_batch_size",
    "grad_accum_steps",
    "per_gpu_batch_size",
    "tokens_per_step",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "model_tflops_per_gpu",
    "hardware_tflops_per_gpu",
    "mfu",
    "hfu",
    "peak_memory_allocated_gib",
    "peak_memory_reserved_gib",
    "host_rss_gib",
    "num_parameters",
    "probe_wall_s",
)
MODEL_KEYS = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "vocab_size",
    "intermediate_size",
    "seq_length",
    "global_batch_size",
    "train_steps",
    "num_parameters",
)
GPU_KEYS = (
    "accelerator",
    "architecture",
    "memory_gib",
    "peak_tflops_bf16",
    "peak_tflops_fp16",
    "peak_tflops_tf32",
    "peak_tflops_fp32",
    "supports_bf16",
    "supports_tf32",
    "board_power_w",
    "purchase_price_usd",
    "cloud_usd_per_gpu_hour",
)
GPU_PRICE_KEYS = ("board_power_w", "purchase_price_usd", "cloud_usd_per_gpu_hour")
"""Figures that change over time: taken from today's ``conf/gpu`` when the GPU is known there."""


@dataclass
class Catalog:
    """The model and GPU configs of ``conf/``, by name, to fill in what an old or truncated record lacks."""

    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)

    _cache: dict[tuple[Any, ...], tuple[dict[str, Any], str | None]] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, conf_dir: Path | None = None) -> Catalog:
        """Read ``conf/model/*.yaml`` and ``conf/gpu/*.yaml``; a missing folder gives an empty catalog."""
        root = Path(conf_dir) if conf_dir is not None else CONF_DIR
        return cls(models=_read_group(root / "model"), gpus=_read_group(root / "gpu"))

    def _cached(self, key: tuple[Any, ...], build: Any) -> tuple[dict[str, Any], str | None]:
        # Thousands of cells share a handful of model and GPU configs: flatten each distinct one once.
        try:
            hit = self._cache.get(key)
        except TypeError:  # an unhashable value somewhere in the config: no caching for it
            return build()
        if hit is None:
            hit = self._cache[key] = build()
        return hit

    def method_columns(self, method: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
        """The settings columns of a cell: from its config's method, else from the record's settings."""

        def build() -> tuple[dict[str, Any], str | None]:
            columns: dict[str, Any] = {}
            for key in SETTING_KEYS:
                value = method.get(key, settings.get(key))
                if key == "zero_stage":
                    columns[key] = _int(value)
                elif key == "micro_batch_size":
                    columns["micro_batch_size_setting"] = (
                        "auto" if value in (None, "auto") else (_int(value) or str(value))
                    )
                elif key in ("precision", "attention"):
                    columns[key] = _name(value)
                else:
                    columns[key] = _bool(value)
            return columns, None

        key: tuple[Any, ...] = ("method", *method.items())
        if not all(k in method for k in SETTING_KEYS):  # settings fill the gaps, so they are part of the key
            key = (*key, "settings", *settings.items())
        return self._cached(key, build)[0]

    def model_columns(self, name: str | None, stored: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The ``model_*`` columns of a cell, and a problem to report, if any.

        A record's own copy of the config comes first: it is what was measured. What it lacks comes from
        today's ``conf/model``.
        """

        def build() -> tuple[dict[str, Any], str | None]:
            known = self.models.get(name or "")
            merged = {**known, **{k: v for k, v in stored.items() if v is not None}} if known else dict(stored)
            problem = None
            if not known and name and not all(merged.get(k) for k in ("num_layers", "hidden_size", "vocab_size")):
                problem = (
                    f"model {name!r} is not in conf/model and its config has no shape; "
                    "FLOPs and predictions are left empty"
                )
            return {f"model_{k}": _num(merged.get(k)) for k in MODEL_KEYS}, problem

        return self._cached(("model", name, *stored.items()), build)

    def gpu_columns(self, name: str | None, stored: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The ``gpu_*`` columns of a cell, and a problem to report, if any.

        Hardware figures come from the record's own config first; prices and board power of a GPU that
        ``conf/gpu`` knows always come from there, so that an updated price reaches old sweeps.
        """

        def build() -> tuple[dict[str, Any], str | None]:
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
            columns: dict[str, Any] = {}
            for key in GPU_KEYS:
                value = merged.get(key)
                if key in ("accelerator", "architecture"):
                    columns[f"gpu_{key}"] = _name(value)
                elif key.startswith("supports"):
                    columns[f"gpu_{key}"] = _bool(value)
                else:
                    columns[f"gpu_{key}"] = _num(value)
            return columns, problem

        return self._cached(("gpu", name, *stored.items()), build)


def _read_group(folder: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
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


SKIPPED_COLUMNS = ("sweep", "cell_id", "label", "reasons")


@dataclass
class LoadedCells:
    """What :func:`load_cells` found: the table, the cells refused before submission, and the problems."""

    frame: pd.DataFrame
    problems: list[str]
    skipped: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(SKIPPED_COLUMNS)))


WAITING_STATES = frozenset({"new", "pending", "running"})
"""Scheduler states of a cell that is simply not done yet: not a problem."""


def read_skipped(paths: SweepPaths, problems: list[str]) -> list[dict[str, Any]]:
    """The cells a sweep refused before submission (``skipped.jsonl``), one dict per line that can be read."""
    try:
        lines = paths.skipped.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"sweep {paths.root}: cannot read {paths.skipped.name}: {exc}")
        return []
    out, bad = [], 0
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if not isinstance(entry, dict):
            bad += 1
            continue
        reasons = entry.get("reasons")
        out.append(
            {
                "sweep": paths.root.name,
                "cell_id": _name(entry.get("cell_id")),
                "label": _name(entry.get("label")),
                "reasons": "; ".join(map(str, reasons)) if isinstance(reasons, list) else _name(reasons),
            }
        )
    if bad:
        problems.append(f"sweep {paths.root}: {bad} line(s) of {paths.skipped.name} could not be read")
    return out


def read_json(path: Path | str, label: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """Parse a JSON object from ``path``: ``(data, None)``, or ``(None, why not)`` naming it ``label`` (or path).

    A missing file raises ``FileNotFoundError`` (the caller decides what absence means).
    """
    name = label or str(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        what = "is empty" if not text.strip() else f"is not valid JSON ({exc.msg} at line {exc.lineno})"
        return None, f"{name} {what}; perhaps truncated when its job was killed"
    if not isinstance(data, dict):
        return None, f"{name} holds a JSON {type(data).__name__}, expected an object"
    return data, None


def read_yaml(path: Path | str, label: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """Parse a YAML mapping from ``path``: ``(data, None)``, or ``(None, why not)`` naming it ``label`` (or path)."""
    name = label or str(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=_YamlLoader)
    except FileNotFoundError:
        return None, f"{name} is missing"
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}"
    except yaml.YAMLError as exc:
        return None, f"{name} is not valid YAML ({str(exc).splitlines()[0]})"
    if not isinstance(data, dict):
        return None, f"{name} holds no mapping"
    return data, None


def _num(value: Any) -> float | None:
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


def _int(value: Any) -> int | None:
    out = _num(value)
    return int(out) if out is not None and out == int(out) else None


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    return None


def _section(config: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = config.get(key)
    return value if isinstance(value, Mapping) else {}


def _name(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def flatten_cell(
    cell_id: str,
    sweep: str,
    config: Mapping[str, Any],
    record: Mapping[str, Any] | None,
    catalog: Catalog,
    problems: list[str],
) -> dict[str, Any]:
    """One table row from a cell's config and (optional) record; appends what was wrong to ``problems``."""
    settings = record.get("settings") if record else None
    settings = settings if isinstance(settings, Mapping) else {}
    model, gpu, method, probe = (_section(config, key) for key in ("model", "gpu", "method", "probe"))

    model_name = _name(model.get("name")) or _name(settings.get("model"))
    gpu_name = _name(gpu.get("name")) or _name(settings.get("gpu"))
    where = f"cell {cell_id} (sweep {sweep})"

    model_columns, model_problem = catalog.model_columns(model_name, model)
    if model_problem:
        problems.append(f"{where}: {model_problem}")
    gpu_columns, gpu_problem = catalog.gpu_columns(gpu_name, gpu)
    if gpu_problem:
        problems.append(f"{where}: {gpu_problem}")

    row: dict[str, Any] = {"sweep": sweep, "cell_id": cell_id, "model": model_name, "gpu": gpu_name}
    row["num_gpus"] = _int(config.get("num_gpus", settings.get("num_gpus")))
    row["num_nodes"] = _int(config.get("num_nodes", settings.get("num_nodes"))) or 1
    row.update(catalog.method_columns(method, settings))

    metrics: Mapping[str, Any] = {}
    environment: Mapping[str, Any] = {}
    if record is not None:
        status = record.get("status")
        row["status"] = str(status) if isinstance(status, str) and status else CORRUPT_RECORD
        if row["status"] == CORRUPT_RECORD:
            row["reason"] = "record has no status"
        else:
            row["reason"] = _name(record.get("reason"))
        row["attempt"] = _int(record.get("attempt"))
        raw_metrics = record.get("metrics")
        metrics = raw_metrics if isinstance(raw_metrics, Mapping) else {}
        raw_env = record.get("environment")
        environment = raw_env if isinstance(raw_env, Mapping) else {}
        version = record.get("schema_version")
        if version is not None and _int(version) != SUPPORTED_SCHEMA_VERSION:
            problems.append(
                f"{where}: record schema_version {version!r}, this report reads version "
                f"{SUPPORTED_SCHEMA_VERSION}; fields it does not know are ignored"
            )
        if row["status"] == "ok" and _num(metrics.get("step_time_s")) is None:
            problems.append(f"{where}: status ok but no step_time_s in its metrics; estimates left empty")
    for key in METRIC_KEYS:
        value = _num(metrics.get(key))
        out_key = "peak_memory_gib" if key == "peak_memory_allocated_gib" else key
        row[out_key] = value
    for key in ("steps_timed", "micro_batch_size", "grad_accum_steps", "per_gpu_batch_size", "num_parameters"):
        row[key] = _int(row[key])

    hostnames = environment.get("hostnames")
    row["hostnames"] = " ".join(map(str, hostnames)) if isinstance(hostnames, list) else _name(hostnames)
    row["device_name"] = _name(environment.get("device_name"))
    row["torch_version"] = _name(environment.get("torch"))
    row["deepspeed_version"] = _name(environment.get("deepspeed"))
    row["slurm_job_id"] = _name(environment.get("slurm_job_id"))
    row["started_at"] = _name(record.get("started_at")) if record else None
    row["finished_at"] = _name(record.get("finished_at")) if record else None

    row.update(model_columns)
    row.update(gpu_columns)
    row["probe_memory_limit_gib"] = _num(probe.get("memory_limit_gib"))
    return row


def _cell_config(cell_dir: str, record: Mapping[str, Any] | None, problems: list[str], where: str) -> Mapping[str, Any]:
    config = record.get("config") if record else None
    if isinstance(config, Mapping) and config:
        return config
    data, error = read_yaml(Path(cell_dir, CELL_CONFIG_NAME), f"cells/{Path(cell_dir).name}/{CELL_CONFIG_NAME}")
    if error:
        problems.append(f"{where}: {error}; its settings are taken from the record, if any")
    return data or {}


def _cell_dirs(cells_dir: Path) -> list[tuple[str, str]]:
    """(cell id, folder) of every folder under ``cells/``, sorted; plain strings, as pathlib costs add up."""
    try:
        entries = [(e.name, e.path) for e in os.scandir(cells_dir) if e.is_dir()]
    except FileNotFoundError:
        return []
    return sorted(entries)


def _rank(row: Mapping[str, Any], has_record: bool, order: int) -> tuple[int, int, str, int]:
    """Which of two rows for the same cell wins: ok over not ok, a record over none, then the newest."""
    return (int(row.get("status") == "ok"), int(has_record), str(row.get("finished_at") or ""), order)


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsing thousands of records makes millions of short-lived objects
    without a single reference cycle, and the collector's passes over them cost a tenth of the load time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_cells(
    sweep_dirs: Iterable[Path],
    states: Mapping[str, str] | None = None,
    catalog: Catalog | None = None,
) -> LoadedCells:
    """Read every cell of every sweep folder into one table (see the module docstring).

    ``states`` maps a cell id to a scheduler state (``PENDING``, ``RUNNING``...) used as the status of a cell
    that has no record yet; without one such a cell's status is ``no_record``.
    """
    with _no_cyclic_gc():
        return _load_cells(sweep_dirs, states, catalog)


def _load_cells(sweep_dirs: Iterable[Path], states: Mapping[str, str] | None, catalog: Catalog | None) -> LoadedCells:
    catalog = catalog if catalog is not None else Catalog.load()
    problems: list[str] = []
    best: dict[str, tuple[tuple[int, int, str, int], dict[str, Any]]] = {}
    seen: set[Path] = set()
    skipped: list[dict[str, Any]] = []
    for order, sweep_dir in enumerate(sweep_dirs):
        paths = SweepPaths(Path(sweep_dir))
        if paths.root in seen:
            continue
        seen.add(paths.root)
        sweep = paths.root.name
        if not paths.root.is_dir():
            problems.append(f"sweep {paths.root}: folder does not exist")
            continue
        refused = read_skipped(paths, problems)
        skipped.extend(refused)
        cell_dirs = _cell_dirs(paths.cells_dir)
        found = 0
        for cell_id, cell_dir in cell_dirs:
            where = f"cell {cell_id} (sweep {sweep})"
            cell_problems: list[str] = []
            record: dict[str, Any] | None = None
            record_error: str | None = None
            try:
                record, record_error = read_json(os.path.join(cell_dir, RECORD_NAME), f"cells/{cell_id}/{RECORD_NAME}")
            except FileNotFoundError:
                if not os.path.isfile(os.path.join(cell_dir, CELL_CONFIG_NAME)):
                    continue  # not a cell (SweepPaths.cell_ids has the same rule)
            found += 1
            config = _cell_config(cell_dir, record, cell_problems, where)
            row = flatten_cell(cell_id, sweep, config, record, catalog, cell_problems)
            if record is None:
                if record_error:
                    row["status"], row["reason"] = CORRUPT_RECORD, record_error
                    cell_problems.append(f"{where}: {record_error}")
                else:
                    state = (states or {}).get(cell_id)
                    row["status"], row["reason"] = (state or NO_RECORD), None
                    if str(state).lower() not in WAITING_STATES:
                        cell_problems.append(f"{where}: no record" + (f" (state {state})" if state else " yet"))
            elif isinstance(record.get("cell_id"), str) and record["cell_id"] != cell_id:
                cell_problems.append(f"{where}: its record names cell {record['cell_id']!r}; kept under {cell_id}")
            if row["status"] not in RESULT_STATUSES and record is not None and not record_error:
                reason = f": {row['reason']}" if row.get("reason") else ""
                cell_problems.append(f"{where}: status {row['status']}{reason}")
            rank = _rank(row, record is not None, order)
            previous = best.get(cell_id)
            if previous is None or rank > previous[0]:
                row["_problems"] = cell_problems
                best[cell_id] = (rank, row)
        if not found and not refused:
            problems.append(f"sweep {paths.root}: no cells in it (expected cells/<cell_id>/cell.yaml)")
    rows = []
    for _, row in best.values():
        problems.extend(row.pop("_problems"))
        rows.append(row)
    frame = pd.DataFrame(rows)
    refused = pd.DataFrame(skipped, columns=list(SKIPPED_COLUMNS)).drop_duplicates(["cell_id"], keep="last")
    return LoadedCells(frame=frame, problems=problems, skipped=refused.reset_index(drop=True))


def rows_of(frame: pd.DataFrame, columns: Iterable[str]) -> list[dict[str, Any]]:
    """The rows of ``frame`` as plain dicts of the given columns (those it has); missing values stay NaN or NA.

    Much faster than ``DataFrame.to_dict("records")`` on wide frames, which boxes every value of every column.
    """
    names = [c for c in dict.fromkeys(columns) if c in frame.columns]
    values = [frame[c].tolist() for c in names]
    return [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)] if names else [{}] * len(frame)
