"""Every state a cell can be in and what each means for ``resume`` (SLURM's states are read as these in
``orchestrator.submission.scheduler_states``).

This is the one vocabulary: ``status`` shows these states, ``report`` writes them, ``resume`` picks its cells by
them. Three kinds of state, decided here once:

- an **answer** about the cell (``ok``, ``does_not_fit``, ``oom``): measured; never run again by ``resume``;
- **active** (``pending``, ``running``): the scheduler says the job is queued or running; wait for it;
- everything else needs something done: ``resume`` reruns it, except a failure a rerun **cannot fix**
  (``invalid``: the cell's own config cannot be built), which is shown with its reason and not offered again,
  and a ``held`` job, which ``resume`` releases (a user hold) or cancels and resubmits (a failed launch).

``oom`` is an answer. The record status ``oom`` means the device ran out of memory at a micro-batch the user
fixed (``method.micro_batch_size=N``; with ``auto`` the search turns OOMs into a smaller micro-batch or
``does_not_fit``). A probe's memory use is deterministic for a given model, GPU, method and micro-batch, so a
rerun spends GPU-hours to learn the same thing; the report counts it, with ``does_not_fit``, as a measured "does
not fit". Running out of *host* memory is different: SLURM's ``OUT_OF_MEMORY`` is the job's memory request
(``cluster.mem_gb_per_gpu``) being too small, a fact about the allocation rather than the cell, so it is its own
state, ``host_oom``, that ``resume`` reruns. A user who doubts an ``oom`` can still ask for it by name:
``resume --only oom``.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class State(str, Enum):
    """The state of one cell (the value is what ``status`` prints and ``cells.csv`` holds)."""

    NEW = "new"
    """Written into the sweep folder, never submitted."""
    PENDING = "pending"
    """The scheduler has it queued (a requeued job is pending again)."""
    HELD = "held"
    """Queued but held: it will not start until released (``scontrol release``) or resubmitted."""
    RUNNING = "running"
    OK = "ok"
    DOES_NOT_FIT = "does_not_fit"
    """Measured: not even micro-batch 1 fits in the GPU's memory."""
    OOM = "oom"
    """Measured: the fixed micro-batch ran out of device memory (an answer; see the module docstring)."""
    INVALID = "invalid"
    """The cell's config cannot be built (e.g. heads that do not divide the hidden size): a rerun cannot fix it."""
    FAILED = "failed"
    """The probe raised (comm or compile error included), or the job ended without a record."""
    HOST_OOM = "host_oom"
    """SLURM's OUT_OF_MEMORY: the job's host memory request was too small."""
    TIMEOUT = "timeout"
    PREEMPTED = "preempted"
    NODE_FAIL = "node_fail"
    CANCELLED = "cancelled"
    CORRUPT = "corrupt"
    """The record cannot be read (not UTF-8, half-written JSON, wrong fields, unknown status, newer schema)."""
    LOST = "lost"
    """No record, and the scheduler no longer knows the job."""
    UNKNOWN = "unknown"
    """No record, and the scheduler could not be asked (shown only when it did not answer)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __hash__(self) -> int:  # equal to its value, so a State and its name are one key in sets and dicts
        return hash(self.value)


STATES: tuple[State, ...] = tuple(State)
"""Every state, in the order ``status`` counts them."""
ANSWERS = frozenset({State.OK, State.DOES_NOT_FIT, State.OOM})
"""An answer about the cell: never run again by ``resume`` unless asked for by name."""
MEASURED_FITS = frozenset({State.OK})
MEASURED_DOES_NOT_FIT = frozenset({State.DOES_NOT_FIT, State.OOM})
ACTIVE = frozenset({State.PENDING, State.RUNNING})
"""Queued or running by the scheduler's own word: something to wait for."""
UNFIXABLE = frozenset({State.INVALID})
"""Failures a rerun cannot fix: shown with their reason, never resubmitted."""


def parse_state(name: str | State) -> State:
    """``"timeout"`` -> State.TIMEOUT; raises ValueError naming every accepted state."""
    try:
        return State(str(name).strip())
    except ValueError:
        raise ValueError(f"unknown state {name!r}; use one of {', '.join(s.value for s in STATES)}") from None


def is_active(state: State) -> bool:
    return state in ACTIVE


def is_answer(state: State) -> bool:
    return state in ANSWERS


def needs_rerun(state: State) -> bool:
    """What ``resume`` acts on by default: not an answer, not queued or running, not beyond a rerun's help."""
    return state not in ANSWERS and state not in ACTIVE and state not in UNFIXABLE and state is not State.UNKNOWN


def rerun_selectable(state: State, only: Iterable[State] | None) -> bool:
    """Whether ``resume --only ONLY`` (or plain ``resume`` when ``only`` is None) acts on a cell in ``state``.

    Naming a state asks for it even when it is an answer (``--only oom``); a cell still queued or running, or one
    a rerun cannot fix, is never resubmitted.
    """
    if state in ACTIVE or state in UNFIXABLE or state is State.UNKNOWN:
        return False
    if only is None:
        return needs_rerun(state)
    return state in set(only)


def all_done(states: Iterable[State]) -> bool:
    """No cell is pending or running, or of unknown state (a held cell waits for a person, not for time)."""
    return all(s not in ACTIVE and s is not State.UNKNOWN for s in states)


# ---- record statuses ------------------------------------------------------------------------------------------


class RecordStatus(str, Enum):
    """What a record's ``status`` field may say (written inside the job)."""

    OK = "ok"
    DOES_NOT_FIT = "does_not_fit"
    OOM = "oom"
    FAILED = "failed"
    COMM_ERROR = "comm_error"
    """A collective failed or timed out."""
    COMPILE_ERROR = "compile_error"
    """Building a native op or compiling the model failed."""
    TIMEOUT = "timeout"
    """SLURM's time limit came (its warning or its kill) before the probe ended, whatever it was doing."""
    CANCELLED = "cancelled"
    """The scheduler says the job was cancelled (``scancel``) before the probe ended, whatever it was doing; or
    Ctrl-C in a local sweep's terminal interrupted the probe."""
    INVALID = "invalid"
    """The cell's config cannot be built; a rerun cannot fix it."""

    def __str__(self) -> str:
        return self.value


_STATE_OF_RECORD = {
    RecordStatus.OK: State.OK,
    RecordStatus.DOES_NOT_FIT: State.DOES_NOT_FIT,
    RecordStatus.OOM: State.OOM,
    RecordStatus.FAILED: State.FAILED,
    RecordStatus.COMM_ERROR: State.FAILED,
    RecordStatus.COMPILE_ERROR: State.FAILED,
    RecordStatus.TIMEOUT: State.TIMEOUT,
    RecordStatus.CANCELLED: State.CANCELLED,
    RecordStatus.INVALID: State.INVALID,
}


def state_of_record(status: RecordStatus) -> State:
    """The cell's state when a record of its latest attempt says ``status`` (comm and compile errors: failed)."""
    return _STATE_OF_RECORD[status]
