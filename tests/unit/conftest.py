"""Unit-tier settings.

One torch thread: these tests count FLOPs and bytes on tiny modules, they never time them, and on a shared 2-core
machine OpenMP's second thread spins waiting for a core another process holds (a 256×64 matmul took 20 ms instead
of 0.2 ms under load). The probe's own thread choice (``orchestrator/job/ranks.py``) is untouched: it runs in its own
processes, which read ``OMP_NUM_THREADS`` and the cores they are given, not this setting.
"""

from __future__ import annotations

try:
    import torch
except ImportError:  # pragma: no cover - torch is a dependency; the tests that need it say so themselves
    torch = None

if torch is not None:
    torch.set_num_threads(1)
