"""A cell's record (``record.json``) and config (``cell.yaml``): one type, one writer, one reader each.

The job side writes a :class:`Record` with :func:`write_record` (atomically: a reader sees the old file or the
whole new one); synthetic sweeps build Records and write them the same way. :func:`read_record` is the only
reader, used by ``status``, ``report`` and ``resume`` alike, so they agree on every file: whatever is wrong with
one (bytes that are not UTF-8, truncated JSON, a field of the wrong type, a required field missing, a status this
version does not know, a newer schema) comes back as a :class:`BadRecord` with the reason, never as an exception.

Record fields (schema version 2): ``schema_version``, ``cell_id``, ``attempt`` and ``status`` are required; the
rest may be missing or null: ``sweep``, ``reason``, ``traceback``, ``settings``, ``config`` (the whole resolved
cell config), ``metrics`` (one key per :class:`Metrics` field), ``environment`` (library versions, device, nodes,
SLURM ids), ``started_at``, ``finished_at`` (ISO 8601); from version 2, ``gpudays_version`` (the gpudays that
wrote it, ``orchestrator.store.version``) and ``host_load`` (the host while timed, ``orchestrator.job.host_load``);
version 1 reads as before, without them. A probe hands its part over as one ``ProbeOutcome`` (job.failures).
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import GenericAlias
from typing import Any, TypeGuard

from orchestrator.config.schema import Config, to_config
from orchestrator.config.values import Container, Row
from orchestrator.store.cell_config import BadCellConfig as BadCellConfig
from orchestrator.store.cell_config import read_cell_config as read_cell_config
from orchestrator.store.durable import write_json_atomic
from orchestrator.store.paths import SweepPaths, read_regular_file
from orchestrator.store.states import RecordStatus, State, state_of_record

RECORD_SCHEMA_VERSION = 2
"""The version this code writes and the newest it reads; bump it when a field changes meaning."""


def _is_number(value: object) -> bool:
    """A finite int or float (a bool is no number), one a float can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def _finite(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and _is_number(value) else None


def _whole(value: object) -> int | None:
    """A whole number (an int, or a float without a fraction); None for anything else."""
    if isinstance(value, (int, float)) and _is_number(value) and float(value).is_integer():
        return int(value)
    return None


@dataclass(frozen=True)
class Trial:
    """One micro-batch size the search tried: an entry of the metrics' ``search_tried``."""

    micro_batch_size: int
    outcome: str
    """``ok`` (it fitted) or ``oom`` (out of memory, or a peak over ``probe.memory_limit_gib``)."""
    peak_memory_gib: float | None
    """Largest peak over ranks; None after a real out-of-memory error."""
    reason: str | None = None
    rest_memory_gib: float | None = None
    """Device memory still allocated after the trial step (the model states); None where not measured."""

    @classmethod
    def from_json(cls, data: object) -> Trial | None:
        """The trial a record holds; None where the entry is not one (older fields missing are None)."""
        if not isinstance(data, Mapping):
            return None
        size, outcome = _whole(data.get("micro_batch_size")), data.get("outcome")
        if size is None or not isinstance(outcome, str):
            return None
        peak, rest, reason = data.get("peak_memory_gib"), data.get("rest_memory_gib"), data.get("reason")
        return cls(size, outcome, _finite(peak), reason if isinstance(reason, str) else None, _finite(rest))


_CHECKED, _WITH = "checked", "written_with"


def _metric(checked: bool = False, written_with: str | None = None) -> Any:
    """A metric's field, None until measured. ``checked``: a record holding anything but a finite number or null
    for it is corrupt (the rule since schema version 1). ``written_with``: written to JSON, null included,
    whenever that other metric is (a null there says "not applicable", not "not measured")."""
    return field(default=None, metadata={_CHECKED: checked, _WITH: written_with})


def _timed(checked: bool = False) -> Any:
    """A figure of the timed steps: measured together, written together."""
    return _metric(checked, written_with="steps_timed")


@dataclass(frozen=True)
class Metrics:
    """Everything the probe measures: a record's ``metrics``, one key per field, of the same name.

    None is a figure not measured (the probe ended before it) or not applicable (no MFU without a published peak,
    no composed parts for whole cycles). In JSON, a metric that is None is left out, except the timed steps'
    figures, written together, null included, and ``memory_limit_gib`` beside ``per_gpu_batch_size``.
    """

    # ---- the model and the batch
    num_parameters: int | None = _metric(checked=True)
    """Parameters of the built model."""
    per_gpu_batch_size: int | None = _metric(checked=True)
    """Sequences one GPU processes per optimizer step (``model.global_batch_size`` over the GPUs)."""
    memory_limit_gib: float | None = _metric(written_with="per_gpu_batch_size")
    """``probe.memory_limit_gib``, which trials and the warm-up were held to; None where there was no limit."""
    build_peak_memory_gib: float | None = _metric()
    """Peak memory per GPU while the model and its engine were built, the largest over ranks (the figure the limit
    judges: reserved on a GPU, the resident growth on the CPU); held to ``memory_limit_gib`` as every step is."""
    micro_batch_estimate: int | None = _metric()
    """The engine's estimate of the largest micro-batch that fits, where the search started (``auto`` only)."""
    search_tried: list[Trial] | None = _metric()
    """Each trial of the search, in order, and a size the warm-up refused after it (``auto`` only)."""
    micro_batch_size: int | None = _metric(checked=True)
    """Sequences per GPU per forward pass: the size timed; for does_not_fit and oom, the size that did not fit."""
    grad_accum_steps: int | None = _metric(checked=True)
    """Micro-steps per optimizer step."""

    # ---- the timed steps
    step_time_s: float | None = _timed(checked=True)
    """Median optimizer-step time of the timed samples, each the slowest rank's."""
    step_time_mean_s: float | None = _timed(checked=True)
    step_time_std_s: float | None = _timed(checked=True)
    """Sample standard deviation (n - 1) of the step times; 0 for a single step."""
    step_time_iqr_s: float | None = _timed(checked=True)
    """Interquartile range of the step times."""
    step_time_ci95_pct: float | None = _timed(checked=True)
    """Half-width of the 95% confidence interval of the mean, in % of the mean; None for a single step."""
    steps_timed: int | None = _timed(checked=True)
    """Timed samples, each one optimizer step."""
    step_time_method: str | None = _timed()
    """``composed`` (micro-steps and the boundary step timed apart) or ``whole`` (whole accumulation cycles)."""
    micro_step_time_s: float | None = _timed()
    """Median steady micro-step of the composed samples; None for whole cycles."""
    boundary_time_s: float | None = _timed()
    """Median of a composed cycle's cost beyond its steady micro-steps (reduction, optimizer step); None for whole."""
    micro_steps_timed: int | None = _timed()
    """Micro-steps run by the timed samples."""
    stop_reason: str | None = _timed()
    """Why timing stopped: ``max_steps``, ``target_ci`` or ``time_budget``."""
    step_times_s: list[float] | None = _timed()
    """Every timed sample's step time, in order."""
    step_cpu_time_s: float | None = _timed()
    """Median host CPU time of a step (this process, all its threads; a composed sample's scaled to a step)."""
    step_cpu_times_s: list[float] | None = _timed()
    """Every timed sample's host CPU time, in order."""
    throughput_unit: str | None = _metric()
    """What the model's throughput is counted in: ``tokens`` (language models) or ``images`` (vision models)."""
    samples_per_s: float | None = _metric()
    """Samples (sequences, images) per second over all GPUs."""
    tokens_per_step: int | None = _timed(checked=True)
    """Tokens of one optimizer step over all GPUs; None for a model whose samples are not tokens (images)."""
    tokens_per_s: float | None = _timed(checked=True)
    tokens_per_s_per_gpu: float | None = _timed(checked=True)
    model_flops_per_step: float | None = _timed()
    """Training FLOPs of one optimizer step over all GPUs (forward and backward, once)."""
    model_tflops_per_gpu: float | None = _timed(checked=True)
    """Model FLOPs per second of one GPU, in TFLOP/s."""
    hardware_tflops_per_gpu: float | None = _timed(checked=True)
    """As ``model_tflops_per_gpu``, with the forward that activation checkpointing recomputes."""
    peak_tflops_per_gpu: float | None = _timed()
    """The GPU's dense peak for the cell's precision, in TFLOP/s; None where it has none (a CPU)."""
    mfu: float | None = _timed(checked=True)
    """Model FLOPs utilisation, a fraction of ``peak_tflops_per_gpu``; None without a peak."""
    hfu: float | None = _timed(checked=True)
    """Hardware FLOPs utilisation, a fraction of ``peak_tflops_per_gpu``; None without a peak."""
    peak_memory_allocated_gib: float | None = _timed(checked=True)
    """Peak device memory allocated from the warm-up to the end of timing, largest rank (CPU: resident-set growth)."""
    peak_memory_reserved_gib: float | None = _timed(checked=True)
    """Peak memory the CUDA caching allocator reserved, largest rank; None on a CPU."""
    host_rss_gib: float | None = _timed(checked=True)
    """Peak resident set of a rank's process, largest rank."""
    final_loss: float | None = _timed()
    """Loss of the last timed micro-step (random tokens: near ln(vocabulary)); None where no step returned one."""
    skipped_steps_timed: int | None = _timed()
    """Optimizer steps the engine skipped while timed (fp16 loss-scale overflows)."""

    # ---- where the probe's time went
    startup_s: float | None = _metric(checked=True)
    """The process group and, for a fixed micro-batch, building the engine."""
    search_s: float | None = _metric(checked=True)
    """Every trial of the micro-batch search, and the engine's build."""
    warmup_s: float | None = _metric(checked=True)
    """The warm-up steps (and compilation)."""
    timed_s: float | None = _metric(checked=True)
    """The timed samples with their exchanges."""
    probe_wall_s: float | None = _metric(checked=True)
    """The whole probe on rank 0, from its start to its outcome."""

    def get(self, name: str) -> object:
        """The metric called ``name`` in record.json; None where it was not measured or is no metric. For
        readers that take names from elsewhere (a list of columns); code that knows the metric reads it."""
        return getattr(self, name) if name in METRIC_KINDS else None

    def to_json(self) -> Container:
        """The metrics as ``record.json`` holds them (see the class docstring for the keys left out)."""
        out: Container = {}
        for name, anchor in _WRITTEN_WITH.items():
            value = getattr(self, name)
            if value is None and (anchor is None or getattr(self, anchor) is None):
                continue
            out[name] = [asdict(v) if isinstance(v, Trial) else v for v in value] if isinstance(value, list) else value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Metrics:
        """The metrics a record holds: keys this version does not know are left out, and a value that is not of
        its metric's kind is None (the checked numbers were checked before, see :func:`record_from_json`)."""
        values: dict[str, Any] = {}  # JSON's values, each checked against its field's type below
        for key, value in data.items():
            kind = METRIC_KINDS.get(key)
            if kind is not None and value is not None:
                values[key] = _as_kind(kind, value)
        return cls(**values)


METRIC_KINDS: dict[str, type | GenericAlias] = {
    f.name: next(a for a in typing.get_args(typing.get_type_hints(Metrics)[f.name]) if a is not type(None))
    for f in fields(Metrics)
}
"""Every metric's name and the type of its value (``int | None`` -> int): int, float, str, list[float], list[Trial]."""
CHECKED_METRICS: tuple[str, ...] = tuple(f.name for f in fields(Metrics) if f.metadata[_CHECKED])
"""Metrics that must be a finite number (or null) when present: a record saying otherwise is corrupt."""
_WRITTEN_WITH: dict[str, str | None] = {f.name: f.metadata[_WITH] for f in fields(Metrics)}


def _as_kind(kind: type | GenericAlias, value: object) -> object:
    """``value`` as a metric of ``kind``, or None where it is not one."""
    if kind is int:
        return _whole(value)
    if kind is float:  # NaN stays NaN where no check refused it (a diverged loss)
        return value if isinstance(value, float) or _is_number(value) else None
    if kind is str:
        return value if isinstance(value, str) else None
    if not isinstance(value, list):
        return None
    if kind == list[Trial]:
        return [trial for trial in map(Trial.from_json, value) if trial is not None]
    numbers = all(isinstance(v, float) or _is_number(v) for v in value)
    return list(value) if numbers else None


@dataclass(frozen=True)
class Record:
    """What one attempt of one cell measured, or why it could not."""

    cell_id: str
    status: RecordStatus
    attempt: int = 1
    sweep: str | None = None
    reason: str | None = None
    traceback: str | None = None
    settings: Row = field(default_factory=dict)
    config: Container = field(default_factory=dict)
    """The resolved cell config the attempt ran with (as ``cell.yaml``)."""
    metrics: Metrics = field(default_factory=Metrics)
    environment: dict[str, object] = field(default_factory=dict)
    started_at: str | None = None
    finished_at: str | None = None
    schema_version: int = RECORD_SCHEMA_VERSION
    gpudays_version: str | None = None
    host_load: dict[str, object] = field(default_factory=dict)
    """Load averages, cores given, others' CPU use while timed (orchestrator.job.host_load); empty where untimed."""

    @property
    def state(self) -> State:
        """The cell's state when this record belongs to its latest attempt."""
        return state_of_record(self.status)

    def typed_config(self) -> Config | None:
        """The cell the attempt ran, as the schema's Config; None where the stored config is none (a record of
        an older gpudays, whose config holds keys this one does not know, or of a config that is not a cell)."""
        try:
            return to_config(self.config)
        except (ValueError, TypeError):
            return None

    def to_json(self) -> dict[str, object]:
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
            "metrics": self.metrics.to_json(),
            "environment": self.environment,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "gpudays_version": self.gpudays_version,
            "host_load": self.host_load,
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
        raw = read_regular_file(path)
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


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional(data: Mapping[str, object], key: str, kind: type, what: str) -> str | None:
    value = data.get(key)
    if value is None or isinstance(value, kind):
        return None
    return f"record field {key!r} is a {type(value).__name__}, expected {what}"


def record_from_json(data: object, cell_id: str | None = None) -> Record | BadRecord:
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
    texts = ("sweep", "reason", "traceback", "started_at", "finished_at", "gpudays_version")
    objects = ("settings", "config", "metrics", "environment", "host_load")
    for key, kind, what in [*((k, str, "a string") for k in texts), *((k, dict, "an object") for k in objects)]:
        problem = _optional(data, key, kind, what)
        if problem:
            return BadRecord(problem)
    metrics = data.get("metrics") or {}
    for key in CHECKED_METRICS:
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
        metrics=Metrics.from_json(metrics),
        environment=data.get("environment") or {},
        started_at=data.get("started_at"),
        finished_at=data.get("finished_at"),
        schema_version=version,
        gpudays_version=data.get("gpudays_version"),
        host_load=data.get("host_load") or {},
    )


def aside_path(paths: SweepPaths, cell_id: str, found: Record | BadRecord, damaged_attempt: int) -> Path:
    """Where the record now at the cell's place is kept aside beside a newer one: under its own attempt's name, or,
    for a damaged record (which names no attempt), under ``damaged_attempt``'s, marked corrupt."""
    if isinstance(found, Record):
        return paths.archived_record(cell_id, found.attempt)
    return paths.archived_record(cell_id, damaged_attempt, corrupt=True)
