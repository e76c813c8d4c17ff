"""A cell's record (``record.json``) and config (``cell.yaml``): one type, one writer, one reader each.

The job side writes a :class:`Record` with :func:`write_record` (atomically: a reader sees the old file or the
whole new one); synthetic sweeps build Records and write them the same way. :func:`read_record` is the only
reader, used by ``status``, ``report`` and ``resume`` alike, so they agree on every file: whatever is wrong with
one (bytes that are not UTF-8, truncated JSON, a field of the wrong type, a required field missing, a status this
version does not know, a newer schema) comes back as a :class:`BadRecord` with the reason, never as an exception.

Record fields (schema version 1): ``schema_version``, ``cell_id``, ``attempt`` and ``status`` are required; the
rest may be missing or null: ``sweep``, ``reason``, ``traceback``, ``settings``, ``config`` (the whole resolved
cell config), ``metrics`` (the :class:`Metrics` fields, and any others the probe adds), ``environment`` (library
versions, device, nodes, SLURM ids), ``started_at``, ``finished_at`` (ISO 8601).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import yaml

from orchestrator.paths import write_json_atomic
from orchestrator.states import RecordStatus, State, state_of_record

RECORD_SCHEMA_VERSION = 1
"""The version this code writes and the newest it reads; bump it when a field changes meaning."""


class Metrics(TypedDict, total=False):
    """The probe's measurements (all optional; the probe may add more, e.g. per-step times and phase times)."""

    step_time_s: float | None
    step_time_mean_s: float | None
    step_time_std_s: float | None
    step_time_iqr_s: float | None
    step_time_ci95_pct: float | None
    steps_timed: int | None
    micro_batch_size: int | None
    grad_accum_steps: int | None
    per_gpu_batch_size: int | None
    tokens_per_step: int | None
    tokens_per_s: float | None
    tokens_per_s_per_gpu: float | None
    model_tflops_per_gpu: float | None
    hardware_tflops_per_gpu: float | None
    mfu: float | None
    hfu: float | None
    peak_memory_allocated_gib: float | None
    peak_memory_reserved_gib: float | None
    host_rss_gib: float | None
    num_parameters: int | None
    probe_wall_s: float | None
    startup_s: float | None
    search_s: float | None
    warmup_s: float | None
    timed_s: float | None


NUMERIC_METRICS: tuple[str, ...] = tuple(Metrics.__annotations__)
"""Metrics that must be a number (or null) when present: a record saying otherwise is corrupt."""


@dataclass(frozen=True)
class Record:
    """What one attempt of one cell measured, or why it could not."""

    cell_id: str
    status: RecordStatus
    attempt: int = 1
    sweep: str | None = None
    reason: str | None = None
    traceback: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    """The resolved cell config the attempt ran with (as ``cell.yaml``)."""
    metrics: Metrics = field(default_factory=lambda: Metrics())
    environment: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    finished_at: str | None = None
    schema_version: int = RECORD_SCHEMA_VERSION

    @property
    def state(self) -> State:
        """The cell's state when this record belongs to its latest attempt."""
        return state_of_record(self.status)

    def to_json(self) -> dict[str, Any]:
        """The record as ``record.json`` holds it."""
        return {
            "schema_version": self.schema_version,
            "cell_id": self.cell_id,
            "sweep": self.sweep,
            "attempt": self.attempt,
            "status": self.status.value,
            "reason": self.reason,
            "traceback": self.traceback,
            "settings": self.settings,
            "config": self.config,
            "metrics": dict(self.metrics),
            "environment": self.environment,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


@dataclass(frozen=True)
class BadRecord:
    """A ``record.json`` that cannot be used; the cell's state is ``corrupt`` and ``reason`` says why."""

    reason: str
    state: State = State.CORRUPT


def write_record(path: Path, record: Record, durable: bool = True) -> None:
    """Write ``record.json`` atomically (a reader sees the old file or the whole new one); ``durable=False``:
    without the fsync, for made-up folders only (see ``write_json_atomic``)."""
    write_json_atomic(path, record.to_json(), durable=durable)


def read_record(path: Path, cell_id: str | None = None) -> Record | BadRecord | None:
    """The record at ``path``; a BadRecord saying why it cannot be used; None when there is no file.

    ``cell_id``: the folder's cell; a record naming another cell is bad. Never raises for the file's content.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        return BadRecord(f"record unreadable: {e.strerror or type(e).__name__}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return BadRecord(f"record is not UTF-8 text (byte {e.start} of {len(raw)}); damaged")
    if not text.strip():
        return BadRecord("record is empty; perhaps its job was killed while writing it")
    try:
        data = json.loads(text)
    except ValueError as e:
        msg = getattr(e, "msg", str(e))
        return BadRecord(f"record is not valid JSON ({msg}; {len(raw)} bytes): half-written or damaged")
    return record_from_json(data, cell_id)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _optional(data: Mapping[str, Any], key: str, kind: type, what: str) -> str | None:
    value = data.get(key)
    if value is None or isinstance(value, kind):
        return None
    return f"record field {key!r} is a {type(value).__name__}, expected {what}"


def record_from_json(data: Any, cell_id: str | None = None) -> Record | BadRecord:
    """Check a parsed ``record.json`` and build the Record (every check ``read_record`` makes after parsing)."""
    if not isinstance(data, dict):
        return BadRecord(f"record holds a JSON {type(data).__name__}, expected an object")
    missing = [k for k in ("schema_version", "cell_id", "attempt", "status") if data.get(k) is None]
    if missing:
        return BadRecord(f"record lacks required field(s) {', '.join(missing)}")
    version = data["schema_version"]
    if not _is_int(version):
        return BadRecord(f"record's schema_version {version!r} is not a whole number")
    if version > RECORD_SCHEMA_VERSION:
        return BadRecord(
            f"record has schema_version {version}, newer than this gpudays reads ({RECORD_SCHEMA_VERSION}); upgrade"
        )
    if not isinstance(data["cell_id"], str):
        return BadRecord(f"record's cell_id {data['cell_id']!r} is not a string")
    if cell_id is not None and data["cell_id"] != cell_id:
        return BadRecord(f"record belongs to cell {data['cell_id']!r}, not to this cell")
    if not _is_int(data["attempt"]) or data["attempt"] < 1:
        return BadRecord(f"record's attempt {data['attempt']!r} is not a whole number from 1")
    try:
        status = RecordStatus(data["status"])
    except ValueError:
        known = ", ".join(s.value for s in RecordStatus)
        return BadRecord(f"record has unknown status {data['status']!r} (known: {known})")
    for key, kind, what in (
        ("sweep", str, "a string"),
        ("reason", str, "a string"),
        ("traceback", str, "a string"),
        ("started_at", str, "a string"),
        ("finished_at", str, "a string"),
        ("settings", dict, "an object"),
        ("config", dict, "an object"),
        ("metrics", dict, "an object"),
        ("environment", dict, "an object"),
    ):
        problem = _optional(data, key, kind, what)
        if problem:
            return BadRecord(problem)
    metrics = data.get("metrics") or {}
    for key in NUMERIC_METRICS:
        value = metrics.get(key)
        if value is not None and not _is_number(value):
            return BadRecord(f"record metric {key!r} is {value!r}, expected a finite number or null")
    return Record(
        cell_id=data["cell_id"],
        status=status,
        attempt=data["attempt"],
        sweep=data.get("sweep"),
        reason=data.get("reason"),
        traceback=data.get("traceback"),
        settings=data.get("settings") or {},
        config=data.get("config") or {},
        metrics=Metrics(**metrics),  # type: ignore[typeddict-item]  # the probe may add metrics of its own
        environment=data.get("environment") or {},
        started_at=data.get("started_at"),
        finished_at=data.get("finished_at"),
        schema_version=version,
    )


# ---- cell.yaml ------------------------------------------------------------------------------------------------


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


def read_cell_config(path: Path) -> dict[str, Any]:
    """The resolved config of a cell (its ``cell.yaml``, written by the sweep before submission).

    Raises BadCellConfig naming the file when it is missing, not UTF-8, not YAML, or not a mapping.
    """
    try:
        text = path.read_bytes().decode("utf-8")
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
