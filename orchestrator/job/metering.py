"""Peak memory of a region of work: the CUDA caching allocator's peak on a GPU, the growth of the resident set on
the CPU.

On a GPU, peak memory is the allocator's peak (allocated, and reserved: what the process took from the device);
``probe.memory_limit_gib`` is compared with the reserved peak (:func:`over_limit`), of the search's trials, of the
warm-up and of the timed steps alike: a longer run can peak higher than the few steps before it (the allocator's
cache fragments as steps go on: a GPU's reserved blocks, a CPU's freed heap not all handed back), so a size that
fitted its trial and warm-up is judged again on the peak its timed steps reached. On the CPU there is no device allocator, so "device
memory" is the growth of the process's resident set: the kernel's high-water mark (``VmHWM`` in /proc/self/status,
reset before each region by writing 5 to /proc/self/clear_refs, after returning freed heap to the kernel with
``malloc_trim``) minus the resident set before the model was built. That is real memory the step needed, which is
what a limit on a CPU-only test should bound.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

GIB = 2**30


def gib(value: float | None) -> float | None:
    """Bytes in GiB; None stays None."""
    return None if value is None else value / GIB


def _proc_status_bytes(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status in bytes (Linux), else None."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _rss_bytes() -> int:
    value = _proc_status_bytes("VmRSS")
    if value is not None:
        return value
    import psutil

    return int(psutil.Process().memory_info().rss)


@dataclass(frozen=True)
class MemoryPeak:
    """Peak memory over a region, in bytes (see the module docstring for what each means on CPU and GPU)."""

    allocated: int
    reserved: int | None
    host_rss: int

    @property
    def limited(self) -> int:
        """The figure ``probe.memory_limit_gib`` is compared with: reserved on a GPU, allocated on the CPU."""
        return self.reserved if self.reserved is not None else self.allocated


def over_limit(peak_bytes: float, limit_bytes: float | None, micro_batch_size: int | None, where: str) -> str | None:
    """Why a peak (:attr:`MemoryPeak.limited`, the largest over ranks) at ``micro_batch_size`` (None: work of no
    micro-batch, the build) does not fit under ``probe.memory_limit_gib`` (``limit_bytes``), naming ``where``
    (``trial step``, ``warm-up``, ``timed steps``, the build), the peak and the limit; None where it fits, or no
    limit is set."""
    if limit_bytes is None or peak_bytes <= limit_bytes:
        return None
    at = where if micro_batch_size is None else f"micro-batch {micro_batch_size}, {where}"
    return f"{at}: peak {peak_bytes / GIB:.3f} GiB over probe.memory_limit_gib={limit_bytes / GIB:g}"


class MemoryMeter:
    """Peak device memory (CUDA allocator) or peak resident-set growth (CPU) between ``reset`` and ``peak``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.use_cuda = getattr(device, "type", "cpu") == "cuda"
        self._libc: ctypes.CDLL | None = None
        with contextlib.suppress(OSError):
            self._libc = ctypes.CDLL("libc.so.6")
        self.baseline_rss = 0
        self.rebase()

    def rebase(self) -> None:
        """Take the resident set now, before a model is built, as the CPU's zero of "device memory"."""
        gc.collect()
        if self._libc is not None:
            self._libc.malloc_trim(0)
        self.baseline_rss = _rss_bytes()

    def reset(self) -> None:
        """Start a new region: its peak counts from what is held now, not from what an earlier region cached."""
        gc.collect()
        if self.use_cuda:
            import torch

            torch.cuda.synchronize(self.device)
            # Blocks cached by a larger earlier trial would otherwise count in this one's reserved peak.
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        if self._libc is not None:
            # Freed heap stays resident until trimmed; without this a trial would inherit the previous one's peak.
            self._libc.malloc_trim(0)
        with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set (Linux >= 4.0)

    def in_use(self) -> int:
        """Bytes held now: the CUDA allocator's allocated bytes, or the resident set's growth on the CPU."""
        if self.use_cuda:
            import torch

            torch.cuda.synchronize(self.device)
            return int(torch.cuda.memory_allocated(self.device))
        return max(0, _rss_bytes() - self.baseline_rss)

    def peak(self) -> MemoryPeak:
        high_water = _proc_status_bytes("VmHWM") or _rss_bytes()
        if self.use_cuda:
            import torch

            torch.cuda.synchronize(self.device)
            return MemoryPeak(
                allocated=int(torch.cuda.max_memory_allocated(self.device)),
                reserved=int(torch.cuda.max_memory_reserved(self.device)),
                host_rss=high_water,
            )
        return MemoryPeak(allocated=max(0, high_water - self.baseline_rss), reserved=None, host_rss=high_water)
