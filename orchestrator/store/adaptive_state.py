"""What an adaptive sweep remembers between rounds, in its sweep folder, written atomically.

``adaptive.json`` holds the goal (target, budget, cells per round), every round with the cells it chose, and, once
the sweep has stopped, why. ``adaptive-grid.jsonl`` holds every cell of the grid, one JSON object a line
(``cell_id`` and its resolved ``config``), written once when the sweep starts: a cell gets its ``cells/<id>/`` folder
only when a round chooses it, so ``status``, ``show`` and ``resume`` see the measured cells as in any sweep, and the
report reads the rest from here (their answer: predicted, with an interval).

A damaged file is an error that names it (:class:`BadAdaptiveState`), never a silent restart.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.config.values import Container
from orchestrator.store.durable import write_json_atomic, write_text_atomic
from orchestrator.store.paths import SweepPaths, read_regular_file

MAX_ATTEMPTS = 2
"""Attempts a chosen cell gets: a cell that failed twice is left to its prediction, and the next rounds choose
others in its place."""

STOP_TARGET = "target"
STOP_BUDGET = "budget"
STOP_ALL_MEASURED = "all measured"
STOP_STALLED = "stalled"
STOP_REASONS = {
    STOP_TARGET: "every unmeasured cell's interval is within the target",
    STOP_STALLED: "the widest unmeasured interval has stopped narrowing (what no coefficient explains is wider than "
    "the target): more rounds would not reach it",
    STOP_BUDGET: "the GPU-hour budget does not pay for another cell",
    STOP_ALL_MEASURED: "every cell is measured",
}
"""Why an adaptive sweep stopped (``Stopped.reason``), as ``status`` and the report say it."""


class BadAdaptiveState(Exception):
    """An adaptive sweep's file is missing a field, is not JSON, or holds a value of the wrong kind."""


@dataclass
class Round:
    """One round: when it was chosen, its cells, and the grid as it stood (widest unmeasured interval, spent)."""

    number: int
    at: str
    cells: list[str]
    widest_pct: float
    spent_gpu_hours: float


@dataclass
class Stopped:
    reason: str
    """A key of :data:`analysis.planners.adaptive.STOP_REASONS`: target, budget, all measured."""
    at: str
    widest_pct: float
    measured: int
    spent_gpu_hours: float


@dataclass
class AdaptiveState:
    target_pct: float
    budget_gpu_hours: float
    """inf: no budget (written as null)."""
    round_cells: int
    rounds: list[Round] = field(default_factory=list)
    stopped: Stopped | None = None

    def chosen(self) -> set[str]:
        """Every cell some round chose."""
        return {cid for r in self.rounds for cid in r.cells}


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def is_adaptive(paths: SweepPaths) -> bool:
    return paths.adaptive_state.is_file()


def write_state(paths: SweepPaths, state: AdaptiveState) -> None:
    payload = asdict(state)
    payload["budget_gpu_hours"] = None if math.isinf(state.budget_gpu_hours) else state.budget_gpu_hours
    write_json_atomic(paths.adaptive_state, payload)


def read_state(paths: SweepPaths) -> AdaptiveState:
    """The sweep's adaptive state; BadAdaptiveState naming the file and what is wrong in it."""
    where = paths.adaptive_state
    try:
        data = json.loads(read_regular_file(where).decode("utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"holds a {type(data).__name__}, expected an object")
        budget = data["budget_gpu_hours"]
        rounds = [Round(int(r["number"]), str(r["at"]), [str(c) for c in r["cells"]], float(r["widest_pct"]),
                        float(r["spent_gpu_hours"])) for r in data["rounds"]]  # fmt: skip
        stop = data.get("stopped")
        stopped = None
        if stop is not None:
            stopped = Stopped(str(stop["reason"]), str(stop["at"]), float(stop["widest_pct"]), int(stop["measured"]),
                              float(stop["spent_gpu_hours"]))  # fmt: skip
        return AdaptiveState(
            float(data["target_pct"]),
            math.inf if budget is None else float(budget),
            int(data["round_cells"]),
            rounds,
            stopped,
        )
    except FileNotFoundError:
        raise BadAdaptiveState(f"{where} is missing: the folder is not an adaptive sweep") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise BadAdaptiveState(f"{where} cannot be used ({type(e).__name__}: {e}); it is written by "
                               "`gpudays sweep --adaptive` and its rounds") from None  # fmt: skip


def write_grid(paths: SweepPaths, cells: Iterable[tuple[str, Container]]) -> None:
    """Every cell of the grid, once, when the sweep starts."""
    lines = (json.dumps({"cell_id": cid, "config": config}, sort_keys=True) for cid, config in cells)
    write_text_atomic(paths.adaptive_grid, "".join(line + "\n" for line in lines))


def read_grid(path: Path) -> list[tuple[str, Container]]:
    """(cell id, resolved config) of every cell of an adaptive sweep's grid; [] where the file is absent.
    BadAdaptiveState naming the file and line where one is damaged."""
    try:
        text = read_regular_file(path).decode("utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise BadAdaptiveState(f"{path} cannot be read ({e})") from None
    out: list[tuple[str, Container]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            cid, config = entry["cell_id"], entry["config"]
            if not isinstance(cid, str) or not isinstance(config, dict):
                raise TypeError("cell_id must be text and config an object")
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise BadAdaptiveState(f"{path}, line {number}: not a grid cell ({e})") from None
        out.append((cid, config))
    return out


__all__ = [
    "MAX_ATTEMPTS", "STOP_REASONS", "AdaptiveState", "BadAdaptiveState", "Round", "Stopped", "is_adaptive", "now", "read_grid",
    "read_state", "write_grid", "write_state",
]  # fmt: skip
