"""Memory metering on the CPU: the resident set's high-water mark above a baseline."""

from __future__ import annotations

import torch

from orchestrator.job.metering import GIB, MemoryMeter


def test_memory_meter_sees_a_host_allocation() -> None:
    meter = MemoryMeter(torch.device("cpu"))
    meter.rebase()
    meter.reset()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    peak = meter.peak()
    del block
    assert peak.allocated >= 60 * 2**20
    assert peak.reserved is None and peak.limited == peak.allocated
    assert peak.host_rss > peak.allocated
    meter.reset()
    assert meter.peak().allocated < peak.allocated, "reset forgets the previous peak"
    assert GIB == 2**30
