"""The probe's synthetic data: random micro-batches of the family's own kind (token sequences, images), made once
per micro-batch size on each rank and cycled through while the probe times steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.models import family_module

if TYPE_CHECKING:
    import torch

    from orchestrator.config.schema import Config

DATA_BATCHES = 2
"""Distinct synthetic micro-batches cycled through, so no step reuses the previous step's input tensor."""
TRAINING_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""The dtype of a batch's floating inputs (an image's pixels) under each ``method.precision``."""


def seed_of(cell: Config, rank: int) -> int:
    """The random seed of a rank's data: different data on each rank, the same on every rerun of the cell."""
    return cell.probe.seed * 1000 + rank + 1


def synthetic_batches(
    cell: Config, rank: int, micro_batch_size: int, device: torch.device
) -> list[dict[str, torch.Tensor]]:
    """:data:`DATA_BATCHES` micro-batches of ``micro_batch_size`` samples on ``device``, as the family's model
    takes them (keyword arguments by name). Where the search tries sizes (``method.micro_batch_size: auto``) the
    batch dimension is marked dynamic: torch.compile then builds one graph for every size it tries, instead of a
    static one and then a dynamic one at the second size (sizes of 1 are always specialised)."""
    import torch

    generator = torch.Generator().manual_seed(seed_of(cell, rank))
    family = family_module(cell.model.family)
    dtype = getattr(torch, TRAINING_DTYPES[cell.method.precision])
    batches = [
        {
            key: value.to(device)
            for key, value in family.synthetic_batch(cell.model, micro_batch_size, generator, dtype).items()
        }
        for _ in range(DATA_BATCHES)
    ]
    if cell.method.micro_batch_size == "auto":
        for batch in batches:
            for value in batch.values():
                torch._dynamo.maybe_mark_dynamic(value, 0)
    return batches
