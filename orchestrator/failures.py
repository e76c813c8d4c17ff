"""How a failed cell is told apart and reported: its status (oom, comm_error, compile_error, failed), a one-line
reason for a table cell, and a traceback short enough for a record.

Pure functions over exceptions; the probe's loop and every engine use them alike.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass

from orchestrator.engines.base import UnsupportedError

MAX_REASON_CHARS = 500
MAX_TRACEBACK_CHARS = 32_000
"""A compiler's output can run to 100 kB of warnings; the record keeps the start and the end."""


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


def classify_failure(exc: BaseException) -> str:
    """The record status of an exception: oom, comm_error, compile_error or failed.

    Decided by the exception types along the cause chain (torch.OutOfMemoryError, MemoryError,
    torch.distributed.DistError, TimeoutError; torch._dynamo / torch._inductor errors), by where it was raised
    (inside the building of a native op), and by the message, since DeepSpeed and the collective libraries often
    re-raise as RuntimeError. OOM wins over the others: an NCCL call that could not allocate is an OOM.
    """
    chain = _chain(exc)
    names = [name for e in chain for name in _type_names(e)]
    messages = " | ".join(f"{type(e).__name__}: {e}" for e in chain).lower()
    if any(n.endswith(("outofmemoryerror", ".memoryerror")) for n in names) or any(m in messages for m in _OOM_MARKERS):
        return "oom"
    if (
        any(n.startswith(("torch._dynamo", "torch._inductor")) for n in names)
        or any(m in messages for m in _COMPILE_MARKERS)
        or any(_in_op_build(e) for e in chain)
    ):
        return "compile_error"
    if any(n.startswith("torch.distributed") or n.endswith(".timeouterror") for n in names) or any(
        m in messages for m in _COMM_MARKERS
    ):
        return "comm_error"
    return "failed"


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


@dataclass
class Failure:
    """A failure of the cell on one rank, as it goes into the record."""

    status: str
    reason: str
    traceback: str | None
    rank: int


def failure_from(exc: BaseException, rank: int) -> Failure:
    """The record's view of an exception raised on ``rank``."""
    if isinstance(exc, UnsupportedError):
        return Failure("failed", one_line(exc), None, rank)
    tb = short_traceback("".join(traceback.format_exception(exc)))
    return Failure(classify_failure(exc), one_line(exc), tb, rank)


class CellFailed(Exception):
    """A failure every rank has agreed on; ends the probe with the failure's status."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.reason)
        self.failure = failure
