"""The CUDA caching allocator's settings: the variables torch reads them from, what a probe runs with where the user
sets none, and whether a setting grows segments in place. Standard library only: the job side reads it before torch
is imported, and ``status`` without numpy. What each setting costs in reserved memory is
:mod:`orchestrator.engines.memory`'s.
"""

from __future__ import annotations

from collections.abc import Mapping

ALLOC_CONF_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
"""The caching allocator's settings, as torch reads them: ``PYTORCH_ALLOC_CONF`` first, the older
``PYTORCH_CUDA_ALLOC_CONF`` where that is not set (``c10/core/AllocatorConfig.h``)."""
DEFAULT_CUDA_ALLOC_CONF = "expandable_segments:True"
"""What a CUDA probe's allocator runs with where the user set neither variable (:mod:`orchestrator.job.env`):
segments that grow in place rather than new blocks beside the old, PyTorch's documented remedy for reserved memory
lost to fragmentation (torch.cuda memory management notes; its out-of-memory message suggests it). Measured on the
H200 (``orchestrator.engines.memory.EXPANDABLE_OVERHEAD``), it keeps the reserved peak 1.07 times the allocated
one where the H100's records without it show 1.12."""


def expandable_segments(conf: str | None) -> bool:
    """Whether an allocator setting (the text of :data:`ALLOC_CONF_VARIABLES`) turns expandable segments on: its last
    ``expandable_segments`` option says ``True``. Off where it names none, or where there is none (torch's default)."""
    options = [part.split(":", 1) for part in (conf or "").split(",") if ":" in part]
    said = [value.strip() for key, value in options if key.strip() == "expandable_segments"]
    return bool(said) and said[-1] == "True"


def allocator_conf(env: Mapping[str, str] | None, accelerator: str) -> str | None:
    """The allocator setting a probe runs with, from the variables its job sets (``cluster.env``): the user's, the
    first of :data:`ALLOC_CONF_VARIABLES` set, else :data:`DEFAULT_CUDA_ALLOC_CONF` on a CUDA device; None on the CPU
    (a variable in the scheduler's environment that the job inherits is not seen here: the record says)."""
    for name in ALLOC_CONF_VARIABLES:
        value = (env or {}).get(name)
        if value:
            return str(value)
    return DEFAULT_CUDA_ALLOC_CONF if accelerator == "cuda" else None


def recorded_conf(environment: Mapping[str, object]) -> str | None:
    """The allocator setting a probe ran with, from its record's ``environment`` (``pytorch_alloc_conf`` first, as
    torch reads them): None where neither was set, or where the record predates their being recorded."""
    values = [environment.get(name.lower()) for name in ALLOC_CONF_VARIABLES]
    return next((str(v) for v in values if v), None)


def recorded_expandable(environment: Mapping[str, object]) -> bool:
    """Whether a probe ran with expandable segments, by its record's ``environment`` (:func:`recorded_conf`): what
    ``cells.csv`` and the benchmarks read, whatever the cell's config asked."""
    return expandable_segments(recorded_conf(environment))
