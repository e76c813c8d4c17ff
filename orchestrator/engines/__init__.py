"""Training engines: each runs the probe's steps its own way and owns the rules and the memory model of its sharding.

``deepspeed/`` holds DeepSpeed (ZeRO stages 0-3, offload), ``fsdp/`` PyTorch's FSDP2 (``fully_shard``: full,
grad-op, no and hybrid sharding, CPU offload). ``method.engine`` picks one. An engine is one folder: ``spec.py``
(its ``MethodConfig`` fields, their refusals, its label, its memory and step-time terms; found by
:mod:`orchestrator.engines.registry`), ``engine.py`` (the runtime the probe creates), ``memory.py`` and
``step_time.py`` (its arithmetic). What every engine's memory shares is :mod:`orchestrator.engines.memory`; the
probe's search, warm-up and timing loop does not know which engine runs a step.
"""

from __future__ import annotations

import pkgutil


def engine_folders() -> tuple[str, ...]:
    """The engine folders under orchestrator/engines/, sorted: the names ``method.engine`` accepts. Reads the
    folder only, so orchestrator.config.schema can name them without importing any engine."""
    return tuple(sorted(info.name for info in pkgutil.iter_modules(__path__) if info.ispkg))
