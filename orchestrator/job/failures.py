"""How a probe ends and what its record says: what happened (:class:`Ending`: measured, nothing fits, out of
memory, a communication or compile error, another exception, a refused config), told apart from an exception with
a one-line reason for a table cell and a traceback short enough for a record; and the record's status, decided
here and nowhere else (:func:`decide_status`) from what happened and the time-limit signal the job got, if any.

Everything a job hands to its record is one :class:`ProbeOutcome`, built by :func:`outcome_of`: the probe's, and the
job side's own (a refused config, ``probe.kind=sleep``, an exception no probe caught). Pure functions over
exceptions and tracebacks; the probe's loop, every engine and the job side use them alike.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from orchestrator.engines.base import UnsupportedError
from orchestrator.store.record import Metrics
from orchestrator.store.states import ANSWERS, RecordStatus, state_of_record

MAX_REASON_CHARS = 500
MAX_TRACEBACK_CHARS = 32_000
"""A compiler's output can run to 100 kB of warnings; the record keeps the start and the end."""


class Ending(str, Enum):
    """What happened to a probe (or to the job around it), before the job's signals are weighed."""

    COMPLETED = "completed"
    """Ran to its end: measured (or, ``probe.kind=sleep``, slept)."""
    NOTHING_FITS = "nothing_fits"
    """The search found no micro-batch that fits."""
    OUT_OF_MEMORY = "out_of_memory"
    """Device memory ran out: at a fixed micro-batch, or an out-of-memory error outside the search's trials."""
    COMM_ERROR = "comm_error"
    """A collective failed or timed out."""
    COMPILE_ERROR = "compile_error"
    """Building a native op or compiling the model failed."""
    RAISED = "raised"
    """Any other exception."""
    REFUSED = "refused"
    """The cell's config was refused before anything was built."""


_OOM_MARKERS = ("out of memory", "can't allocate memory", "cublas_status_alloc_failed", "failed to allocate")
_COMM_MARKERS = (
    "nccl",
    "gloo",
    "processgroup",
    "connection closed by peer",
    "connection reset by peer",
    "socket timeout",
    "timed out",
    "rendezvous",
)
_COMPILE_MARKERS = ("error building extension", "inductor", "dynamo", "backendcompilerfailed", "ninja")


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and those it was raised from or during, innermost last, without cycles."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


_BUILD_FRAMES = ("torch/utils/cpp_extension.py", "deepspeed/ops/op_builder/")
"""Code that compiles native ops (DeepSpeed's cpu_adam, fused_adam, shm comm): a failure inside is a compile error."""


def _in_op_build(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if any(marker in tb.tb_frame.f_code.co_filename.replace(os.sep, "/") for marker in _BUILD_FRAMES):
            return True
        tb = tb.tb_next
    return False


def _type_names(exc: BaseException) -> list[str]:
    return [f"{klass.__module__}.{klass.__name__}".lower() for klass in type(exc).__mro__]


def classify_failure(exc: BaseException) -> Ending:
    """What an exception says happened: OUT_OF_MEMORY, COMM_ERROR, COMPILE_ERROR or RAISED.

    Decided by the exception types along the cause chain (torch.OutOfMemoryError, MemoryError,
    torch.distributed.DistError, TimeoutError; torch._dynamo / torch._inductor errors), by where it was raised
    (inside the building of a native op), and by the message, since DeepSpeed and the collective libraries often
    re-raise as RuntimeError. OOM wins over the others: an NCCL call that could not allocate is an OOM.
    """
    chain = _chain(exc)
    names = [name for e in chain for name in _type_names(e)]
    messages = " | ".join(f"{type(e).__name__}: {e}" for e in chain).lower()
    if any(n.endswith(("outofmemoryerror", ".memoryerror")) for n in names) or any(m in messages for m in _OOM_MARKERS):
        return Ending.OUT_OF_MEMORY
    if (
        any(n.startswith(("torch._dynamo", "torch._inductor")) for n in names)
        or any(m in messages for m in _COMPILE_MARKERS)
        or any(_in_op_build(e) for e in chain)
    ):
        return Ending.COMPILE_ERROR
    if any(n.startswith("torch.distributed") or n.endswith(".timeouterror") for n in names) or any(
        m in messages for m in _COMM_MARKERS
    ):
        return Ending.COMM_ERROR
    return Ending.RAISED


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, short enough for a table cell.

    A compiler's output (a C++ or op build failure) starts with warnings; its first ``error:`` line is what a user
    needs, so it is appended.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    line = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    compiler_error = next((entry for entry in lines[1:] if " error: " in f" {entry} "), None)
    if compiler_error:
        line = f"{line} ({compiler_error})"
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 3] + "..."


def short_traceback(text: str) -> str:
    """A traceback capped at MAX_TRACEBACK_CHARS: its start (where it was called) and its end (what failed)."""
    if len(text) <= MAX_TRACEBACK_CHARS:
        return text
    head = MAX_TRACEBACK_CHARS // 4
    tail = MAX_TRACEBACK_CHARS - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters left out ...]\n{text[-tail:]}"


@dataclass(frozen=True)
class Happened:
    """What happened, with the reason and traceback that say it: the input of :func:`decide_status`."""

    ending: Ending
    reason: str | None = None
    traceback: str | None = None


@dataclass
class Failure:
    """A failure of the cell on one rank, as the ranks exchange it."""

    ending: Ending
    reason: str
    traceback: str | None
    rank: int

    def happened(self) -> Happened:
        return Happened(self.ending, self.reason, self.traceback)


def failure_from(exc: BaseException, rank: int) -> Failure:
    """The record's view of an exception raised on ``rank``."""
    if isinstance(exc, UnsupportedError):
        return Failure(Ending.RAISED, one_line(exc), None, rank)
    tb = short_traceback("".join(traceback.format_exception(exc)))
    return Failure(classify_failure(exc), one_line(exc), tb, rank)


class CellFailed(Exception):
    """A failure every rank has agreed on; ends the probe with what the failure says happened."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.reason)
        self.failure = failure


# ---- the record's status ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeSignal:
    """SLURM's time-limit warning, its SIGTERM at the limit, the SIGTERM of a cancel, or Ctrl-C's SIGINT, as it
    reached the job."""

    name: str
    """``SIGUSR2`` (the warning), ``SIGTERM`` or ``SIGINT`` (Ctrl-C in the terminal of a local sweep)."""
    at: float
    """When, as ``time.time()``."""
    cancelled: bool = False
    """The SIGTERM of ``scancel``: the scheduler said the job was cancelled when it came (not the time limit)."""


UNFIXABLE_ERRORS = (
    "StrictDataclassClassValidationError",
    "StrictDataclassFieldValidationError",
    "omegaconf.errors.ValidationError",
)
"""Exceptions that say the cell's config cannot be built (transformers validates an architecture this way): the
same config fails the same way on every rerun, so the record says ``invalid``."""

_STATUS_OF = {
    Ending.COMPLETED: RecordStatus.OK,
    Ending.NOTHING_FITS: RecordStatus.DOES_NOT_FIT,
    Ending.OUT_OF_MEMORY: RecordStatus.OOM,
    Ending.COMM_ERROR: RecordStatus.COMM_ERROR,
    Ending.COMPILE_ERROR: RecordStatus.COMPILE_ERROR,
    Ending.RAISED: RecordStatus.FAILED,
    Ending.REFUSED: RecordStatus.INVALID,
}


def decide_status(happened: Happened, time_signal: TimeSignal | None = None) -> tuple[RecordStatus, str | None]:
    """The record's status and reason: the one place a status is decided.

    An answer (measured, nothing fits, out of memory) stands. SLURM's signals reach every process of the job, so
    a compiler or a collective dies of them and the probe reports that death as its own failure: a failure after
    the SIGTERM of a cancel, or after Ctrl-C's SIGINT, is ``cancelled`` (the scheduler said so when it came), one after
    SIGTERM at the limit is ``timeout`` (the job is out of time whatever failed), and so is one that names the
    time-limit warning (``ninja ... died with <Signals.SIGUSR2: 12>``); a failure of its own after the warning
    keeps its status. An exception that says the config cannot be built (UNFIXABLE_ERRORS) is ``invalid``.
    """
    status, reason = _STATUS_OF[happened.ending], happened.reason
    if state_of_record(status) in ANSWERS:
        return status, reason
    if time_signal is not None and _caused_by(time_signal.name, happened):
        when = dt.datetime.fromtimestamp(time_signal.at, dt.timezone.utc).strftime("%H:%M:%S")
        what = f"{status.value}: {reason}" if reason else status.value
        if time_signal.name == "SIGINT":
            # The interrupt itself needs no repeating; what failed of it (a compiler, a collective) is said.
            then = "" if "KeyboardInterrupt" in (reason or "") else f"; the probe then ended ({what})"
            return RecordStatus.CANCELLED, f"interrupted (Ctrl-C: SIGINT at {when} UTC), not a probe failure{then}"
        if time_signal.cancelled:
            return (
                RecordStatus.CANCELLED,
                f"the job was cancelled (scancel): {time_signal.name} at {when} UTC; the probe then ended ({what})",
            )
        return (
            RecordStatus.TIMEOUT,
            f"SLURM's time limit: {time_signal.name} at {when} UTC; the probe then ended ({what})",
        )
    if status is RecordStatus.FAILED:
        invalid = unfixable_reason(happened.traceback)
        if invalid is not None:
            return RecordStatus.INVALID, f"the cell's config cannot be built: {invalid}"
    return status, reason


def _caused_by(signal_name: str, happened: Happened) -> bool:
    """Whether a failure came from SLURM's time-limit signal: SIGTERM at the limit always; the warning when the
    failure names it (a child process that died of it)."""
    if signal_name in ("SIGTERM", "SIGINT"):
        return True
    number = signal.Signals[signal_name].value if signal_name in signal.Signals.__members__ else -1
    text = f"{happened.reason or ''}\n{happened.traceback or ''}"
    return re.search(rf"\b{signal_name}\b|signal {number}\b|<Signals\.{signal_name}", text) is not None


def final_exception(traceback_text: str | None) -> str | None:
    """The last exception of a formatted traceback, every line of its message (``Type: line1\n  line2``)."""
    if not traceback_text:
        return None
    lines = traceback_text.rsplit("Traceback (most recent call last):", 1)[-1].splitlines()
    # Frames are indented; the exception starts at the first line that is not (its message may be indented).
    start = next((i for i, line in enumerate(lines) if line.strip() and not line[0].isspace()), None)
    if start is None:
        return None
    return "\n".join(line for line in lines[start:] if line.strip())


def unfixable_reason(traceback_text: str | None) -> str | None:
    """The reason of a failure no rerun can fix (see UNFIXABLE_ERRORS), whole, on one line; None for others."""
    exc = final_exception(traceback_text)
    if exc is None:
        return None
    type_name = exc.split(":", 1)[0].strip()
    if not any(type_name == name or type_name.endswith(f".{name}") for name in UNFIXABLE_ERRORS):
        return None
    text = " ".join(line.strip() for line in exc.splitlines())
    text = type_name.rsplit(".", 1)[-1] + text[len(type_name) :]
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


@dataclass(frozen=True)
class ProbeOutcome:
    """A probe's part of the record, or what the job side says in its place (a refused config, a sleep, an
    exception no probe caught): one value, built by :func:`outcome_of`, which decides the status."""

    status: RecordStatus
    reason: str | None = None
    traceback: str | None = None
    metrics: Metrics = field(default_factory=Metrics)
    environment: dict[str, object] = field(default_factory=dict)
    """Library versions, the device and the engine's settings, as torch and the engine describe them."""

    def to_json(self) -> dict[str, object]:
        """As ``python -m orchestrator.job.by_hand --out`` writes it: the record's fields of the same names."""
        return {
            "status": self.status.value,
            "reason": self.reason,
            "traceback": self.traceback,
            "metrics": self.metrics.to_json(),
            "environment": self.environment,
        }


def outcome_of(
    happened: Happened,
    metrics: Metrics | None = None,
    environment: Mapping[str, Any] | None = None,
    time_signal: TimeSignal | None = None,
) -> ProbeOutcome:
    """The one way a ProbeOutcome is made: the status decided from what happened and the time-limit signal."""
    status, reason = decide_status(happened, time_signal)
    return ProbeOutcome(status, reason, happened.traceback, metrics or Metrics(), dict(environment or {}))
