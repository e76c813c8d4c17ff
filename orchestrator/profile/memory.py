"""The device memory's streaming rate: a large copy (one buffer read, one written) and an add (two read, one
written), the traffic of the element-wise work of a step (norms, activations, the optimizer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.profile.record import MemoryTime
from orchestrator.profile.timing import median_seconds, slowest

if TYPE_CHECKING:
    import torch


def measure(nbytes: int, device: torch.device, min_run_s: float, threads: int) -> list[MemoryTime]:
    """Copy and add over fp32 buffers of ``nbytes`` each, the slowest rank's median time."""
    import torch

    n = max(1, nbytes // 4)
    a, b, c = (torch.full((n,), 1.0 + i, device=device) for i in range(3))
    on_gpu = device.type != "cpu"
    copy = median_seconds(lambda: c.copy_(a), min_run_s, threads, on_gpu)
    add = median_seconds(lambda: torch.add(a, b, out=c), min_run_s, threads, on_gpu)
    copy, add = slowest([copy, add], device)
    return [MemoryTime("copy", 2 * 4 * n, copy), MemoryTime("add", 3 * 4 * n, add)]
