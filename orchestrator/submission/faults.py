"""Fault injection for tests: ``GPUDAYS_FAULT=<point>`` makes gpudays kill itself (SIGKILL) at that point.

The points are where a submission can be cut short (``orchestrator.submission.launch``, ``orchestrator.submission.local``):

- ``before-intent``: the cells' attempts are numbered, nothing is written;
- ``before-sbatch``: the intents are on disk, the scheduler has not been asked;
- ``during-sbatch``: the process is killed ``GPUDAYS_FAULT_DELAY_S`` (default 0.05 s) after sbatch is started,
  wherever it then is (sbatch itself, a child, runs on);
- ``after-sbatch``: the scheduler has the jobs, their ids are not written;
- ``after-attempt``: the job ids of the first array are written, the rest of the command is not done;
- ``local-started``: a local cell's job has started, its process id is not written.

``GPUDAYS_FAULT=<point>@<n>`` kills at the n-th time the point is reached (default the first). Unset, each point
costs one dictionary look-up.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

FAULT_ENV = "GPUDAYS_FAULT"
POINTS = ("before-intent", "before-sbatch", "during-sbatch", "after-sbatch", "after-attempt", "local-started")

_reached: Counter[str] = Counter()


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def point(name: str) -> None:
    """Kill this process here if ``GPUDAYS_FAULT`` names this point (and this is its n-th time)."""
    wanted = os.environ.get(FAULT_ENV)
    if not wanted:
        return
    where, _, nth = wanted.partition("@")
    if where != name:
        return
    _reached[name] += 1
    if _reached[name] != (int(nth) if nth.isdigit() else 1):
        return
    if name == "during-sbatch":
        threading.Timer(float(os.environ.get("GPUDAYS_FAULT_DELAY_S", "0.05")), _die).start()
        return
    _die()
