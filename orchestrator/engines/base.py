"""What the probe asks of a training engine, and how it finds the engine a cell names.

The probe's loop (micro-batch search, warm-up, timing, records) is the same for every engine; an engine only
builds the model for a batch plan, runs one micro-step (forward and backward, and at the accumulation boundary the
gradient reduction and the optimizer step), changes its micro-batch without a rebuild, and frees what it holds.
An engine is the module ``orchestrator/engines/<method.engine>/engine.py`` with a ``create`` function, next to the
``spec.py`` that registers it (orchestrator/engines/registry.py); adding one is adding that folder (and the method
fields it reads), nothing in the probe. ``probe.kind: deepspeed`` (the name predates a second engine) is the
training probe, whichever engine ``method.engine`` names; ``sleep`` trains nothing and never gets here.
"""

from __future__ import annotations

import gc
import importlib
from datetime import timedelta
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

    from orchestrator.config.batch import BatchPlan
    from orchestrator.config.schema import Config

# The optimizer every engine trains with, so that engines differ only in how they shard and run it.
ADAM_BETAS = (0.9, 0.95)
"""Adam betas of every Pythia run (EleutherAI/pythia models/*.yml)."""
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.01
"""Pythia's weight decay (models/*.yml)."""
GRADIENT_CLIPPING = 1.0
"""Pythia clips gradients at norm 1.0; the norm is part of a real step's cost, so the probe computes it too."""


class UnsupportedError(RuntimeError):
    """A cell this machine cannot run (a precision its CPU lacks), as an engine finds out: the reason is the whole
    story, and the record gets no traceback (orchestrator/job/failures.py)."""


class Engine(Protocol):
    """One rank's training engine for one cell. The probe calls, in this order: ``init_distributed`` once,
    ``build``, then ``micro_step`` many times (``resize`` between trials of the search), ``release``."""

    def init_distributed(self, timeout: timedelta) -> None:
        """Start the process group (every rank calls it; ``timeout`` bounds any collective)."""

    def preload(self) -> None:
        """Import what building an engine imports later, so no trial's memory counts a module being loaded."""

    def build(self, plan: BatchPlan) -> None:
        """Model (random weights, the same on every rank), optimizer and engine for ``plan``, replacing any
        previous one."""

    def estimate_micro_batch_size(self, memory_gib: float) -> int:
        """The micro-batch the engine's memory model says fits in ``memory_gib`` per GPU: where the search starts."""

    def resize(self, plan: BatchPlan) -> None:
        """Train with ``plan``'s micro-batch and accumulation from now on, on the engine already built."""

    def micro_step(self, batch: Mapping[str, torch.Tensor], boundary: bool) -> torch.Tensor:
        """Forward and backward on ``batch`` (the forward's keyword arguments, labels included: the family's
        ``synthetic_batch``); at the accumulation ``boundary`` also
        the gradient reduction and the optimizer step. Returns the loss."""

    def release(self) -> None:
        """Drop the model, its optimizer states and gradients, and give the memory back."""

    @property
    def num_parameters(self) -> int:
        """Parameters of the model built (all of them, not one rank's shard)."""

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped so far (fp16 loss-scale overflows)."""

    def describe(self) -> dict[str, object]:
        """The engine's part of the record's environment: library versions, its config, whether compiled."""


def free_device_memory(device: torch.device) -> None:
    """Give back what a released engine held: collect its objects, then empty the CUDA allocator's cache."""
    gc.collect()
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


def batch_split(engine: Engine, num_gpus: int) -> int:
    """Ways one micro-step splits the global batch: one share per GPU for a data-parallel engine; an engine whose
    ranks share their sequences says its own (``batch_split``: mesh3d's replicas × pipeline micro-batches)."""
    split = getattr(engine, "batch_split", num_gpus)
    return int(split) if isinstance(split, int) and split >= 1 else num_gpus


def engine_module_name(kind: str) -> str:
    return f"orchestrator.engines.{kind}.engine"


def engine_name(config: Config) -> str:
    """The engine that trains ``config``'s cell: ``method.engine`` under the training probe."""
    if config.probe.kind != "deepspeed":
        raise ValueError(f"probe.kind={config.probe.kind!r} trains nothing: no engine to create")
    return config.method.engine


def create_engine(config: Config, device: torch.device, rank: int) -> Engine:
    """The engine ``config.method.engine`` names, for ``rank`` on ``device``; a clear error for an unknown one."""
    from orchestrator.engines.registry import engine_spec

    name = engine_spec(engine_name(config)).name
    module_name = engine_module_name(name)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name and not module_name.startswith(f"{exc.name}."):
            raise
        raise ValueError(f"method.engine={name!r}: no engine module {module_name}") from None
    engine: Engine = module.create(config, device, rank)
    return engine
