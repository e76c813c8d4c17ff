"""How cell states are shown: colours, the one-line summary and the table of ``gpudays status``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from orchestrator.states import ACTIVE, ANSWERS, STATES, State


class CellState(Protocol):
    """What is shown of a cell (``orchestrator.status.CellState`` has it)."""

    cell_id: str
    state: State
    attempt: int
    job_id: str | None
    reason: str | None
    label: str | None

STATE_STYLE = {
    State.NEW: "white",
    State.PENDING: "cyan",
    State.HELD: "yellow",
    State.RUNNING: "blue",
    State.OK: "green",
    State.DOES_NOT_FIT: "yellow",
    State.OOM: "yellow",
    State.INVALID: "red",
    State.FAILED: "red",
    State.HOST_OOM: "red",
    State.TIMEOUT: "magenta",
    State.PREEMPTED: "magenta",
    State.NODE_FAIL: "magenta",
    State.CANCELLED: "bright_black",
    State.CORRUPT: "red",
    State.LOST: "red",
    State.UNKNOWN: "white",
}
# Problems first, then what waits for a person, then what is still going on, then the answers.
_SHOW_ORDER = {
    s: i
    for i, s in enumerate(
        (State.CORRUPT, State.LOST, State.INVALID, State.FAILED, State.HOST_OOM, State.TIMEOUT, State.NODE_FAIL)
        + (State.PREEMPTED, State.CANCELLED, State.HELD, State.NEW, State.UNKNOWN)
        + tuple(sorted(ACTIVE))
        + tuple(sorted(ANSWERS))
    )
}


def counts(states: Sequence[CellState]) -> dict[str, int]:
    """How many cells are in each state, in the order of STATES, leaving out states with none."""
    c = Counter(s.state for s in states)
    return {k.value: c[k] for k in STATES if c[k]}


def summary_line(states: Sequence[CellState], markup: bool = True) -> str:
    """``12 cells: ok 9, running 2, failed 1`` (with rich markup colouring each state)."""
    parts = []
    for state, n in counts(states).items():
        parts.append(f"[{STATE_STYLE[State(state)]}]{state} {n}[/]" if markup else f"{state} {n}")
    return f"{len(states)} cell(s): " + (", ".join(parts) if parts else "none")


def table(states: Sequence[CellState], only: set[str] | None = None, max_rows: int | None = None) -> Any:
    """A rich Table of the cells, problems first; ``only`` keeps those states, ``max_rows`` cuts the rest."""
    from rich.table import Table

    shown = [s for s in states if only is None or s.state in only]
    shown.sort(key=lambda s: (_SHOW_ORDER.get(s.state, 99), s.label or "", s.cell_id))
    t = Table(show_edge=False, pad_edge=False, header_style="bold")
    t.add_column("cell", no_wrap=True)
    t.add_column("state", no_wrap=True)
    t.add_column("try", justify="right")
    t.add_column("job", no_wrap=True)
    t.add_column("settings")
    t.add_column("reason", overflow="fold")
    for s in shown[:max_rows] if max_rows is not None else shown:
        reason = s.reason if s.reason and s.state is not State.OK else ""
        if s.state is State.INVALID:
            reason = f"{reason} (a rerun cannot fix this; not resubmitted)" if reason else "a rerun cannot fix this"
        t.add_row(
            s.cell_id,
            f"[{STATE_STYLE.get(s.state, 'white')}]{s.state}[/]",
            str(s.attempt),
            s.job_id or "-",
            s.label or "",
            reason,
        )
    if max_rows is not None and len(shown) > max_rows:
        t.caption = f"... and {len(shown) - max_rows} more (gpudays status shows all)"
    return t
