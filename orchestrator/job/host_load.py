"""How busy the host was while the cell was timed: the 1-minute load average at the start and end of the timed
steps, the cores this rank was given, and the other processes' CPU use on those cores (psutil).

Other processes' use is the busy time of the rank's cores over the timed steps, less this process's own CPU time,
as a fraction of those cores' time (0: nothing else ran; 1: another process took every core given). On a node
whose ranks are not bound to their cores, the other ranks of the cell count as other processes."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


def _load_1m() -> float | None:
    try:
        return float(os.getloadavg()[0])
    except OSError:
        return None


def _busy_s(cores: list[int]) -> float | None:
    """Busy (non-idle) seconds of ``cores`` since boot."""
    import psutil

    try:
        per_cpu = psutil.cpu_times(percpu=True)
    except (OSError, psutil.Error):
        return None
    total = 0.0
    for core in cores:
        if core >= len(per_cpu):
            return None
        t = per_cpu[core]
        total += sum(t) - t.idle - getattr(t, "iowait", 0.0)
    return total


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


@dataclass(frozen=True)
class HostLoad:
    load_avg_1m_start: float | None
    load_avg_1m_end: float | None
    host_cpus_given: int
    other_cpu_use: float | None


class HostLoadMeter:
    """Started before the timed steps, ended after them."""

    def __init__(self) -> None:
        self.cores = sorted(os.sched_getaffinity(0))
        self.load_start = _load_1m()
        self.busy_start = _busy_s(self.cores)
        self.own_start = _own_cpu_s()
        self.wall_start = time.monotonic()

    def end(self) -> HostLoad:
        busy_end, own_end = _busy_s(self.cores), _own_cpu_s()
        wall = time.monotonic() - self.wall_start
        other = None
        if self.busy_start is not None and busy_end is not None and wall > 0 and self.cores:
            others = (busy_end - self.busy_start) - (own_end - self.own_start)
            other = round(min(1.0, max(0.0, others / (wall * len(self.cores)))), 4)
        return HostLoad(self.load_start, _load_1m(), len(self.cores), other)
