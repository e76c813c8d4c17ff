"""The host's load while a cell is timed: load averages, the cores given, and other processes' CPU use on them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from orchestrator.job.host_load import HostLoadMeter


def test_another_process_busy_on_the_cells_cores_is_seen() -> None:
    quiet = HostLoadMeter()
    time.sleep(0.3)
    idle = quiet.end()
    assert idle.host_cpus_given == len(os.sched_getaffinity(0))
    assert idle.load_avg_1m_start is not None and idle.load_avg_1m_end is not None
    assert idle.other_cpu_use is not None and 0.0 <= idle.other_cpu_use <= 1.0

    # A busy loop pinned to one of the given cores: at least part of that core's time is someone else's.
    core = min(os.sched_getaffinity(0))
    spin = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os,time; os.sched_setaffinity(0,{{{core}}}); t=time.time()\nwhile time.time()-t<3: pass",
        ]
    )
    try:
        time.sleep(0.5)
        busy = HostLoadMeter()
        time.sleep(1.0)
        seen = busy.end()
    finally:
        spin.kill()
        spin.wait()
    assert seen.other_cpu_use is not None
    assert seen.other_cpu_use >= 0.5 / seen.host_cpus_given, seen
